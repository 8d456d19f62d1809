//! The editor's end of the login's forwarded ports, like `ssh -L`: the shim listens on the
//! port the login listens on at the daemon host, on this machine's loopback, and carries each
//! connection over the login link.

use std::collections::HashMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// What the forwarding tells the login loop.
pub enum Forwarded {
    /// A connection to `port` arrived here.
    Accepted { port: u16, stream: TcpStream },
    /// Connection `conn` read bytes (`Some`) or closed (`None`).
    Bytes { conn: u32, bytes: Option<Vec<u8>> },
}

/// Writes queued per connection before the loop waits.
const QUEUE: usize = 32;

/// Listeners and connections of one login.
pub struct Forwards {
    host: String,
    next: u32,
    writers: HashMap<u32, mpsc::Sender<Vec<u8>>>,
    tasks: JoinSet<()>,
    /// The writing halves: what the daemon side sent, into the local connections.
    flushing: JoinSet<()>,
    events: mpsc::Sender<Forwarded>,
}

impl Forwards {
    /// Listens on `host` (loopback; `ACP_SHIM_FORWARD_HOST` elsewhere, for tests).
    pub fn new(host: String, events: mpsc::Sender<Forwarded>) -> Forwards {
        Forwards {
            host,
            next: 0,
            writers: HashMap::new(),
            tasks: JoinSet::new(),
            flushing: JoinSet::new(),
            events,
        }
    }

    /// Starts listening on `port`.
    pub async fn listen(&mut self, port: u16) -> std::io::Result<()> {
        let listener = TcpListener::bind((self.host.as_str(), port)).await?;
        let events = self.events.clone();
        self.tasks.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                if events
                    .send(Forwarded::Accepted { port, stream })
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(())
    }

    /// Carries an accepted connection; returns its number on the link.
    pub fn carry(&mut self, stream: TcpStream) -> u32 {
        self.next += 1;
        let conn = self.next;
        let (tx, rx) = mpsc::channel(QUEUE);
        self.writers.insert(conn, tx);
        let (rd, wr) = stream.into_split();
        self.tasks.spawn(read(conn, rd, self.events.clone()));
        self.flushing.spawn(write(wr, rx));
        conn
    }

    /// Bytes from the daemon side for `conn`.
    pub async fn write(&mut self, conn: u32, bytes: Vec<u8>) {
        if let Some(w) = self.writers.get(&conn)
            && w.send(bytes).await.is_err()
        {
            self.writers.remove(&conn);
        }
    }

    /// The daemon side closed `conn` (or refused it).
    pub fn close(&mut self, conn: u32) {
        self.writers.remove(&conn);
    }

    /// At the login's end: what the daemon side sent is written out (a callback's answer
    /// reaches the browser), for at most `within`.
    pub async fn finish(&mut self, within: std::time::Duration) {
        self.writers.clear();
        let _ = tokio::time::timeout(within, async {
            while self.flushing.join_next().await.is_some() {}
        })
        .await;
    }
}

/// The local connection's bytes to the loop, then its end.
async fn read(conn: u32, mut rd: OwnedReadHalf, events: mpsc::Sender<Forwarded>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let bytes = Some(buf[..n].to_vec());
                if events.send(Forwarded::Bytes { conn, bytes }).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = events.send(Forwarded::Bytes { conn, bytes: None }).await;
}

/// The daemon side's bytes into the local connection, then its end.
async fn write(mut wr: OwnedWriteHalf, mut from_link: mpsc::Receiver<Vec<u8>>) {
    while let Some(bytes) = from_link.recv().await {
        if wr.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = wr.shutdown().await;
}
