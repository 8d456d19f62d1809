//! A minimal HTTP/1.1 client over a raw `TcpStream` for the Streamable HTTP tests: one request
//! per connection (`Connection: close`), chunked bodies decoded, and an SSE reader.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

async fn send_head(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut s = tokio::time::timeout(TIMEOUT, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method != "GET" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.expect("write head");
    // The server may answer (413) before it read the body: a failed write is fine.
    let _ = s.write_all(body).await;
    s
}

async fn read_head<R: AsyncBufReadExt + Unpin>(r: &mut R) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).await.expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).await.expect("header line");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers)
}

fn chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
}

/// One chunk of a chunked body; `None` at the last chunk or the end of the stream.
async fn read_chunk<R: AsyncBufReadExt + Unpin>(r: &mut R) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(line.trim(), 16).ok()?;
    if size == 0 {
        return None;
    }
    let mut buf = vec![0; size + 2];
    r.read_exact(&mut buf).await.ok()?;
    buf.truncate(size);
    Some(buf)
}

/// One request to `/acp`; the whole answer.
pub async fn request(addr: SocketAddr, method: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    request_path(addr, method, "/acp", headers, body).await
}

/// One request to `path`; the whole answer.
pub async fn request_path(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let fut = async {
        let s = send_head(addr, method, path, headers, body.as_bytes()).await;
        let mut r = BufReader::new(s);
        let (status, headers) = read_head(&mut r).await;
        let mut bytes = Vec::new();
        if chunked(&headers) {
            while let Some(c) = read_chunk(&mut r).await {
                bytes.extend(c);
            }
        } else {
            let _ = r.read_to_end(&mut bytes).await;
        }
        Resp {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    };
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .expect("HTTP answer in time")
}

/// A JSON POST to `/acp`.
pub async fn post(addr: SocketAddr, extra: &[(&str, &str)], msg: &Value) -> Resp {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend_from_slice(extra);
    request(addr, "POST", &headers, &msg.to_string()).await
}

/// An open SSE stream.
pub struct Sse {
    r: BufReader<TcpStream>,
    buf: String,
}

/// One SSE event: its `id:` and its data as JSON.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: Value,
}

impl SseEvent {
    /// The id as a number (the connection stream's, or a session stream's update seq).
    pub fn num(&self) -> Option<u64> {
        self.id.as_deref()?.parse().ok()
    }
}

impl Sse {
    /// `GET /acp` expecting a 200 stream; panics with the answer otherwise.
    pub async fn open(addr: SocketAddr, headers: &[(&str, &str)]) -> Sse {
        let s = send_head(addr, "GET", "/acp", headers, b"").await;
        Sse::read_open(s).await
    }

    /// Like `open`, with a small socket receive buffer: a reader that stops reading backs
    /// up to acpd soon.
    pub async fn open_small(addr: SocketAddr, headers: &[(&str, &str)]) -> Sse {
        let sock = tokio::net::TcpSocket::new_v4().expect("socket");
        sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let mut s = tokio::time::timeout(TIMEOUT, sock.connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        let mut head = format!("GET /acp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).await.expect("write head");
        Sse::read_open(s).await
    }

    async fn read_open(s: TcpStream) -> Sse {
        let mut r = BufReader::new(s);
        let (status, h) = tokio::time::timeout(TIMEOUT, read_head(&mut r))
            .await
            .expect("stream head in time");
        assert_eq!(status, 200, "{h:?}");
        assert!(chunked(&h), "{h:?}");
        Sse {
            r,
            buf: String::new(),
        }
    }

    /// The next event (keep-alive comments skipped); `None` when the stream ended.
    pub async fn next(&mut self) -> Option<SseEvent> {
        tokio::time::timeout(TIMEOUT, self.next_untimed())
            .await
            .expect("SSE event in time")
    }

    /// Reads until a comment-only block (a keep-alive); panics on an event before it.
    pub async fn keepalive(&mut self) {
        let block = tokio::time::timeout(TIMEOUT, self.next_block())
            .await
            .expect("a keep-alive in time")
            .expect("the stream ended");
        assert!(
            block.lines().all(|l| l.is_empty() || l.starts_with(':')),
            "an event, not a keep-alive: {block:?}"
        );
    }

    /// The next raw block up to its blank line; `None` when the stream ended.
    async fn next_block(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                return Some(self.buf.drain(..end + 2).collect());
            }
            let chunk = read_chunk(&mut self.r).await?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    async fn next_untimed(&mut self) -> Option<SseEvent> {
        loop {
            let block = self.next_block().await?;
            let mut id = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if data.is_empty() {
                continue;
            }
            let data = serde_json::from_str(&data).expect("SSE data is JSON");
            return Some(SseEvent { id, data });
        }
    }

    /// Events up to and including the answer with `id`.
    pub async fn until_answer(&mut self, id: i64) -> Vec<SseEvent> {
        let mut out = Vec::new();
        loop {
            let e = self.next().await.expect("stream ended before the answer");
            let done = e.data.get("method").is_none() && e.data["id"] == id;
            out.push(e);
            if done {
                return out;
            }
        }
    }
}
