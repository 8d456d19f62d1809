//! The daemon's end of forwarded connections: each `open` from the client becomes a TCP
//! connection to the login's loopback port on this host, its bytes carried by the link.

use std::collections::HashMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// What a forwarded connection tells the link: bytes it read, or that it closed (`None`).
pub type TunnelEvent = (u32, Option<Vec<u8>>);

/// Writes queued per connection before the link waits.
const QUEUE: usize = 32;

/// The open forwarded connections of one login, and the tasks that run them.
pub struct Tunnels {
    writers: HashMap<u32, mpsc::Sender<Vec<u8>>>,
    /// Connections whose bytes from the login are not all on the link yet.
    live: std::collections::HashSet<u32>,
    tasks: JoinSet<()>,
    events: mpsc::Sender<TunnelEvent>,
}

impl Tunnels {
    pub fn new(events: mpsc::Sender<TunnelEvent>) -> Tunnels {
        Tunnels {
            writers: HashMap::new(),
            live: Default::default(),
            tasks: JoinSet::new(),
            events,
        }
    }

    /// Opens connection `conn` to `port` on loopback.
    pub fn open(&mut self, conn: u32, port: u16) {
        let (tx, rx) = mpsc::channel(QUEUE);
        self.writers.insert(conn, tx);
        self.live.insert(conn);
        let events = self.events.clone();
        self.tasks.spawn(async move {
            let stream = match TcpStream::connect(("127.0.0.1", port)).await {
                Ok(s) => s,
                Err(_) => match TcpStream::connect(("::1", port)).await {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = events.send((conn, None)).await;
                        return;
                    }
                },
            };
            carry(conn, stream, rx, events).await;
        });
    }

    /// Bytes from the client for `conn` (dropped if it is closed already).
    pub async fn write(&mut self, conn: u32, bytes: Vec<u8>) {
        if let Some(w) = self.writers.get(&conn)
            && w.send(bytes).await.is_err()
        {
            self.writers.remove(&conn);
        }
    }

    /// The client closed `conn`: our side is shut for writing once queued bytes are out.
    pub fn close(&mut self, conn: u32) {
        self.writers.remove(&conn);
    }

    /// Our side of `conn` read its end: everything it said is on the link.
    pub fn ended(&mut self, conn: u32) {
        self.writers.remove(&conn);
        self.live.remove(&conn);
    }

    /// Whether every connection's bytes from the login are on the link (a login that
    /// answers its callback and exits at once must still have its answer delivered).
    pub fn all_carried(&self) -> bool {
        self.live.is_empty()
    }
}

/// Carries one connection both ways until both directions are done.
async fn carry(
    conn: u32,
    stream: TcpStream,
    mut from_link: mpsc::Receiver<Vec<u8>>,
    events: mpsc::Sender<TunnelEvent>,
) {
    let (mut rd, mut wr) = stream.into_split();
    let reading = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if events.send((conn, Some(buf[..n].to_vec()))).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = events.send((conn, None)).await;
    };
    let writing = async {
        while let Some(bytes) = from_link.recv().await {
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    };
    tokio::join!(reading, writing);
}
