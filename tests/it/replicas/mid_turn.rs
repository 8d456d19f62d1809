//! Joining a live turn through replicas that do not own the session: a client on each of
//! three replicas, the later two loading mid-turn through a forwarder, each ends with every
//! chunk of the turn exactly once and in order (the replay, then the live tail, no gap at
//! the hand-over), also when the forwarding links drop mid-turn and are dialled again (the
//! owner advertises itself through a TCP relay of the test's, which cuts the links), and when
//! the owner cuts a link whose client stalled (before the fix: the replay, then silence).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::takeover::{replica, secret};
use crate::support::{Client, Daemon, kind, seq};

/// The turn streams `BURSTS` bursts of `PER_BURST` chunks of `SIZE` bytes, `PAUSE_MS` apart.
/// (6 s in all: the later clients load and go live well before the end, also on a busy CI box.)
const BURSTS: usize = 120;
const PER_BURST: usize = 100;
const SIZE: usize = 32;
const PAUSE_MS: u64 = 50;
const LAST: &str = "<end>";
/// The longest wait for the turn (or a client's share of it).
const WAIT: Duration = Duration::from_secs(30);

fn turn_script() -> String {
    let mut s = String::from("echo <start>\n");
    for _ in 0..BURSTS {
        s.push_str(&format!("stream {PER_BURST} {SIZE}\nsleep {PAUSE_MS}\n"));
    }
    s.push_str(&format!("echo {LAST}"));
    s
}

/// Every chunk's text in order, as the scripted agent streams them (`{i}:` padded with `x`,
/// `i` counting within each burst).
fn whole_turn() -> String {
    let mut all = String::from("<start>");
    for _ in 0..BURSTS {
        for i in 0..PER_BURST {
            let head = format!("{i}:");
            all.push_str(&format!("{head:x<SIZE$}"));
        }
    }
    all.push_str(LAST);
    all
}

/// The text of the turn's agent messages among `updates`, in order, checking their seqs
/// strictly increase (nothing twice). A replay may merge chunks into one message: the text
/// is the same.
fn turn_text(updates: &[Value]) -> String {
    let chunks: Vec<&Value> = updates
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .collect();
    let seqs: Vec<i64> = chunks.iter().map(|u| seq(u)).collect();
    if let Some(w) = seqs.windows(2).find(|w| w[0] >= w[1]) {
        panic!("seqs must strictly increase; {} then {}", w[0], w[1]);
    }
    chunks
        .iter()
        .filter_map(|u| u["update"]["content"]["text"].as_str())
        .collect()
}

fn is_last(u: &Value) -> bool {
    kind(u) == "agent_message_chunk"
        && u["update"]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.ends_with(LAST))
}

fn chunks(updates: &[Value]) -> usize {
    updates
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .count()
}

/// Collects updates up to the turn's last chunk.
async fn follow(client: &mut Client, mut updates: Vec<Value>) -> Vec<Value> {
    if !updates.iter().any(is_last) {
        let what = format!("the live tail up to {LAST}");
        let tail = client
            .collect_updates_until(&what, |more| more.iter().rev().take(64).any(is_last))
            .await;
        updates.extend(tail);
    }
    updates
}

/// Loads `sid` through `client`; the replay.
async fn load(client: &mut Client, sid: &str, cwd: &std::path::Path) -> Vec<Value> {
    let (updates, loaded) = client.load(sid, cwd).await;
    loaded.expect("load mid-turn through a non-owner");
    assert!(!updates.iter().any(is_last), "the load must come mid-turn");
    updates
}

/// A TCP relay to a daemon that the test can cut: every connection through it ends at once
/// (later ones are relayed again).
struct Relay {
    addr: SocketAddr,
    target: Arc<Mutex<Option<SocketAddr>>>,
    cut: watch::Sender<u64>,
    relayed: Arc<std::sync::atomic::AtomicUsize>,
}

impl Relay {
    async fn start() -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let target: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let (cut, _) = watch::channel(0u64);
        let relayed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (t, c, n) = (target.clone(), cut.clone(), relayed.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let Some(to) = *t.lock().expect("relay target") else {
                    continue;
                };
                let mut cut = c.subscribe();
                cut.mark_unchanged();
                n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Relay {
            addr,
            target,
            cut,
            relayed,
        }
    }

    fn relay_to(&self, daemon: &Daemon) {
        *self.target.lock().expect("relay target") = Some(daemon.addr);
    }

    /// Ends every connection relayed so far; returns how many were relayed in all.
    fn cut(&self) -> usize {
        self.cut.send_modify(|g| *g += 1);
        self.relayed.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn relayed(&self) -> usize {
        self.relayed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn clients_loading_mid_turn_through_non_owners_get_every_chunk_once_across_a_dropped_link() {
    let s = secret();
    let relay = Relay::start().await;
    let a = replica("a", 2000, &s.path)
        .postgres()
        .arg("--advertise-url", format!("ws://{}", relay.addr));
    let a = Daemon::start_with(a).await;
    relay.relay_to(&a);
    let b = Daemon::start_beside(&a, replica("b", 2000, &s.path).advertise()).await;
    let c = Daemon::start_beside(&a, replica("c", 2000, &s.path).advertise()).await;
    let cwd = a.work_dir();
    let mut on_a = a.client().await.with_timeout(WAIT);
    let sid = on_a.open_session(&cwd).await;
    let turn = on_a.send_prompt(&sid, &turn_script()).await;
    let early = on_a
        .collect_updates_until("450 chunks of the turn", |u| chunks(u) > 450)
        .await;

    let mut on_b = b.client().await.with_timeout(WAIT);
    let mut on_c = c.client().await.with_timeout(WAIT);
    let on_a_follows = async {
        let (more, answer) = on_a.collect_updates_until_response(&turn).await;
        assert_eq!(answer.expect("the turn on a")["stopReason"], "end_turn");
        [early, more].concat()
    };
    // B loads, C loads a moment later; once both follow live, the links to A drop.
    let b_live = tokio::sync::Notify::new();
    let on_b_follows = async {
        let replay = load(&mut on_b, &sid, &cwd).await;
        let what = "100 live chunks through b";
        let live = on_b.collect_updates_until(what, |u| chunks(u) > 100).await;
        b_live.notify_one();
        follow(&mut on_b, [replay, live].concat()).await
    };
    let on_c_follows = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let replay = load(&mut on_c, &sid, &cwd).await;
        let live = on_c
            .collect_updates_until("100 live chunks through c", |u| chunks(u) > 100)
            .await;
        b_live.notified().await;
        assert!(!live.iter().any(is_last), "the links drop mid-turn");
        let relayed = relay.cut();
        assert!(relayed >= 2, "b and c forward through the relay: {relayed}");
        follow(&mut on_c, [replay, live].concat()).await
    };
    let (on_a_saw, on_b_saw, on_c_saw) = tokio::join!(on_a_follows, on_b_follows, on_c_follows);
    let whole = whole_turn();
    assert_eq!(turn_text(&on_a_saw), whole, "the client on a");
    assert_eq!(turn_text(&on_b_saw), whole, "the client on b");
    assert_eq!(turn_text(&on_c_saw), whole, "the client on c");
    assert!(
        relay.relayed() >= 4,
        "b and c dialled a again after the cut: {}",
        relay.relayed()
    );
}

/// The owner cuts off a forwarding link that takes nothing for its slow-client cutoff (the
/// client behind it stopped reading): once the client reads again, the forwarder has dialled
/// again and the client gets the rest of the turn, every chunk once.
#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn a_client_that_stalls_behind_a_non_owner_gets_the_rest_after_the_owner_cuts_its_link() {
    const N: usize = 10_000;
    const BIG: usize = 4096;
    let s = secret();
    let a = replica("a", 2000, &s.path)
        .postgres()
        .advertise()
        .arg("--slow-client-cutoff-ms", 500);
    let a = Daemon::start_with(a).await;
    let b = Daemon::start_beside(&a, replica("b", 2000, &s.path).advertise()).await;
    let cwd = a.work_dir();
    let mut on_a = a.client().await.with_timeout(WAIT);
    let sid = on_a.open_session(&cwd).await;
    on_a.send_prompt(
        &sid,
        &format!("echo <start>\nsleep 300\nstream {N} {BIG}\necho {LAST}"),
    )
    .await;
    on_a.updates_until_text("<start>").await;
    // The turn goes on without its prompter.
    drop(on_a);

    let mut on_b = b.client().await.with_timeout(WAIT);
    let replay = load(&mut on_b, &sid, &cwd).await;
    let live = on_b
        .collect_updates_until("some of the stream", |u| chunks(u) > 10)
        .await;
    // B's client stops reading while tens of MiB stream: everything between it and the
    // owner fills, and the owner cuts the link as too slow.
    let log = a.log_path();
    let cut = "client cannot keep up";
    let deadline = tokio::time::Instant::now() + WAIT;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains(cut)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a never cut the link"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let updates = follow(&mut on_b, [replay, live].concat()).await;
    let mut expected = String::from("<start>");
    for i in 0..N {
        let head = format!("{i}:");
        expected.push_str(&format!("{head:x<BIG$}"));
    }
    expected.push_str(LAST);
    assert!(
        turn_text(&updates) == expected,
        "every chunk once, in order"
    );
}
