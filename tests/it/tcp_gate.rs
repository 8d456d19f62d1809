//! The newline TCP listener is no door for web pages: the exact bytes a browser's
//! `fetch(…, {mode: "no-cors"})` POST sends are refused and the connection closed, nothing
//! in the body runs; without `--no-auth` the first line must carry a token.

use std::path::Path;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::security_support::{RawDaemon, local_token};
use crate::support::{Client, DEFAULT_TIMEOUT, Daemon, DaemonOptions};

/// What Chromium sends for `fetch("http://127.0.0.1:PORT/", {method: "POST", mode: "no-cors",
/// body})` with a string body: `text/plain`, a "simple" request, so no preflight.
fn browser_post(port: u16, marker: &Path) -> Vec<u8> {
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": 1, "clientCapabilities": {} } });
    let new = json!({ "jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {
        "cwd": "/usr",
        "mcpServers": [{ "name": "x", "command": "sh",
            "args": ["-c", format!("touch {}", marker.display())], "env": [] }],
    } });
    let body = format!("{init}\n{new}\n");
    format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: keep-alive\r\n\
         Content-Length: {}\r\nsec-ch-ua-platform: \"Linux\"\r\n\
         User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36\r\n\
         Content-Type: text/plain;charset=UTF-8\r\nAccept: */*\r\nOrigin: https://evil.example\r\n\
         Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\nSec-Fetch-Dest: empty\r\n\
         Referer: https://evil.example/\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n\
         Accept-Language: en-US,en;q=0.9\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Everything the daemon sends until it closes the connection (panics if it does not).
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(DEFAULT_TIMEOUT, stream.read_to_end(&mut out))
        .await
        .expect("acpd did not close the connection")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn browser_post_to_the_tcp_port_runs_nothing() {
    // The built-in agent (the default with no agent configured) starts stdio MCP servers;
    // `--no-auth` is the most open the listener can be, and the refusal still applies.
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--tcp-listen",
        "127.0.0.1:0",
        "--no-auth",
    ];
    let tcp_line = "newline-delimited TCP listener: ";
    let (daemon, addrs) = RawDaemon::start(&args, &[tcp_line]).await;
    let tcp = addrs[0];
    let marker = daemon.data_dir().join("..").join("pwned");

    let mut stream = TcpStream::connect(tcp).await.expect("connect");
    stream
        .write_all(&browser_post(tcp.port(), &marker))
        .await
        .expect("write");
    let reply = read_to_close(&mut stream).await;
    assert!(reply.starts_with("HTTP/1.1 400 "), "{reply:?}");
    assert!(!reply.contains("\"result\""), "{reply:?}");

    // The listener still serves a real client: a session the same way, which (the built-in
    // agent being the same) would have run the command by now had the POST got through.
    let mut client = Client::connect_tcp(tcp).await.expect("connect");
    client.initialize().await;
    let cwd = daemon.data_dir().join("../work");
    std::fs::create_dir_all(&cwd).expect("work dir");
    let sid = client.new_session(&cwd).await;
    assert!(!sid.is_empty());
    assert!(!marker.exists(), "the POST body ran a command");
    assert!(
        daemon.log().contains("refused an HTTP request"),
        "{}",
        daemon.log()
    );
}

#[tokio::test]
async fn the_first_tcp_line_must_be_a_json_rpc_object() {
    let daemon = Daemon::start_with(DaemonOptions::default().tcp()).await;
    let tcp = daemon.tcp_addr.expect("tcp");
    for first in ["{ not json", "null", "[1]", "GET / HTTP/1.1\r"] {
        let mut stream = TcpStream::connect(tcp).await.expect("connect");
        stream
            .write_all(format!("{first}\n{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{}}}}\n").as_bytes())
            .await
            .expect("write");
        let reply = read_to_close(&mut stream).await;
        assert!(!reply.contains("\"result\""), "{first:?}: {reply:?}");
    }
}

async fn send_line(stream: &mut TcpStream, msg: &Value) {
    stream
        .write_all(format!("{msg}\n").as_bytes())
        .await
        .expect("write");
}

#[tokio::test]
async fn the_tcp_listener_requires_a_token_on_its_first_line() {
    let daemon = Daemon::start_with(DaemonOptions::default().tcp().auth()).await;
    let tcp = daemon.tcp_addr.expect("tcp");
    let token = local_token(&daemon).await;
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": 1, "clientCapabilities": {} } });

    // No token: refused, closed, and the request never answered.
    let mut stream = TcpStream::connect(tcp).await.expect("connect");
    send_line(&mut stream, &init).await;
    let reply = read_to_close(&mut stream).await;
    let err: Value = serde_json::from_str(reply.trim()).expect("one JSON line");
    assert_eq!(
        (err["id"].clone(), err["error"]["code"].clone()),
        (Value::Null, json!(-32000)),
        "{reply}"
    );

    // A wrong token: refused the same way, with the auth request's id.
    let mut stream = TcpStream::connect(tcp).await.expect("connect");
    let auth = |id: Value, token: &str| json!({ "jsonrpc": "2.0", "id": id, "method": "_acpd/auth", "params": { "token": token } });
    send_line(&mut stream, &auth(json!(0), "acpd_wrong")).await;
    send_line(&mut stream, &init).await;
    let reply = read_to_close(&mut stream).await;
    assert!(
        reply.contains("invalid token") && !reply.contains("\"result\""),
        "{reply}"
    );

    // The token: answered `{}`, then the connection is an ordinary ACP client.
    let mut stream = TcpStream::connect(tcp).await.expect("connect");
    send_line(&mut stream, &auth(json!(0), &token)).await;
    let (r, w) = stream.into_split();
    let mut client = Client::new(crate::support::conn::Conn::lines(r, w));
    assert_eq!(
        client.recv_json().await,
        json!({ "jsonrpc": "2.0", "id": 0, "result": {} })
    );
    client.initialize().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (_, result) = client.prompt(&sid, "echo authenticated").await;
    assert_eq!(result.expect("prompt")["stopReason"], "end_turn");

    // As a notification (no id): no answer, the connection just starts.
    let stream = TcpStream::connect(tcp).await.expect("connect");
    let (r, mut w) = stream.into_split();
    let mut note = auth(Value::Null, &token);
    note.as_object_mut().expect("object").remove("id");
    w.write_all(format!("{note}\n").as_bytes())
        .await
        .expect("write");
    let mut client = Client::new(crate::support::conn::Conn::lines(r, w));
    client.initialize().await;
}

#[tokio::test]
async fn a_tcp_client_that_sends_no_first_line_is_closed_after_the_header_timeout() {
    let opts = DaemonOptions::default()
        .tcp()
        .arg("--header-read-timeout-ms", 300);
    let daemon = Daemon::start_with(opts).await;
    let mut stream = TcpStream::connect(daemon.tcp_addr.expect("tcp"))
        .await
        .expect("connect");
    stream.write_all(b"{\"jsonrpc\":").await.expect("write");
    // Closed well within the 10 s `read_to_close` allows (on main it stayed open).
    let reply = read_to_close(&mut stream).await;
    assert_eq!(reply, "");
}
