//! Message framing under the test client: WebSocket text frames, or newline-delimited lines
//! (raw TCP, a child's stdio). The JSON-RPC layer above does not care which.

use anyhow::{Context, Result, bail};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// One unit received from the peer.
#[derive(Debug)]
pub enum Frame {
    Text(String),
    /// Binary frame (contents irrelevant: ACP ignores them).
    Binary,
    /// The peer closed the connection (close frame or EOF).
    Closed,
}

type BoxRead = Box<dyn AsyncRead + Unpin + Send>;
type BoxWrite = Box<dyn AsyncWrite + Unpin + Send>;

pub enum Conn {
    Ws(Box<WebSocketStream<MaybeTlsStream<TcpStream>>>),
    Lines {
        reader: BufReader<BoxRead>,
        /// `None` once closed: dropping is what closes a child's stdin.
        writer: Option<BoxWrite>,
        /// Bytes of a line not yet complete; kept across calls so that dropping a read
        /// (timeout) loses nothing.
        partial: Vec<u8>,
    },
}

impl Conn {
    pub fn ws(stream: WebSocketStream<MaybeTlsStream<TcpStream>>) -> Conn {
        Conn::Ws(Box::new(stream))
    }

    pub fn lines(
        reader: impl AsyncRead + Unpin + Send + 'static,
        writer: impl AsyncWrite + Unpin + Send + 'static,
    ) -> Conn {
        Conn::Lines {
            reader: BufReader::with_capacity(256 * 1024, Box::new(reader)),
            writer: Some(Box::new(writer)),
            partial: Vec::new(),
        }
    }

    pub async fn send_text(&mut self, text: &str) -> Result<()> {
        match self {
            Conn::Ws(ws) => ws
                .send(Message::text(text))
                .await
                .context("websocket send")?,
            Conn::Lines { writer, .. } => {
                let writer = writer.as_mut().context("connection closed by us")?;
                writer
                    .write_all(text.as_bytes())
                    .await
                    .context("line write")?;
                writer.write_all(b"\n").await.context("line write")?;
                writer.flush().await.context("line flush")?;
            }
        }
        Ok(())
    }

    pub async fn send_binary(&mut self, bytes: Vec<u8>) -> Result<()> {
        match self {
            Conn::Ws(ws) => ws
                .send(Message::binary(bytes))
                .await
                .context("websocket send")?,
            Conn::Lines { .. } => bail!("binary frames exist only on WebSocket"),
        }
        Ok(())
    }

    /// Next frame; control frames are skipped. Cancel safe.
    pub async fn recv(&mut self) -> Result<Frame> {
        match self {
            Conn::Ws(ws) => loop {
                return Ok(match ws.next().await {
                    None => Frame::Closed,
                    Some(Err(e)) => bail!("websocket receive: {e}"),
                    Some(Ok(Message::Text(t))) => Frame::Text(t.to_string()),
                    Some(Ok(Message::Binary(_))) => Frame::Binary,
                    Some(Ok(Message::Close(_))) => Frame::Closed,
                    Some(Ok(_)) => continue,
                });
            },
            Conn::Lines {
                reader, partial, ..
            } => loop {
                // `read_until` appends what it read to `partial` even when cancelled.
                let n = reader
                    .read_until(b'\n', partial)
                    .await
                    .context("line read")?;
                if n == 0 && !partial.ends_with(b"\n") {
                    return Ok(Frame::Closed);
                }
                let line =
                    String::from_utf8(std::mem::take(partial)).context("line is not UTF-8")?;
                let line = line.trim_end_matches(['\n', '\r']);
                if !line.trim().is_empty() {
                    return Ok(Frame::Text(line.to_string()));
                }
            },
        }
    }

    /// Closes the connection the polite way (close frame / shutdown of the write half).
    pub async fn close(&mut self) {
        match self {
            Conn::Ws(ws) => {
                let _ = SinkExt::close(ws.as_mut()).await;
            }
            Conn::Lines { writer, .. } => {
                if let Some(mut writer) = writer.take() {
                    let _ = writer.shutdown().await;
                }
            }
        }
    }
}
