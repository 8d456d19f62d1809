//! The editor's end of the login's forwarded ports, like `ssh -L`: the shim listens on the
//! port the login listens on at the daemon host, on this machine's loopback, and carries each
//! connection over the login link.

use std::collections::HashMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
        self.tasks
            .spawn(carry(conn, stream, rx, self.events.clone()));
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
}

async fn carry(
    conn: u32,
    stream: TcpStream,
    mut from_link: mpsc::Receiver<Vec<u8>>,
    events: mpsc::Sender<Forwarded>,
) {
    let (mut rd, mut wr) = stream.into_split();
    let reading = async {
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
