//! The hostile-input corpus: malformed UTF-8, deep nesting, huge numbers, 100 MB frames
//! (and 1009 for frames past what is read at all), `afterSeq` past the journal, MCP server
//! shapes, session directories around acpd's data directory, unknown methods, wrong param
//! types for every session method and ids of every JSON type,
//! sent at one connection. Each input gets the right JSON-RPC error (or nothing, for what is
//! not a request), and after each one the same connection still answers `session/list` and
//! another client's session still runs a prompt turn.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

use crate::support::{Client, DEFAULT_TIMEOUT, Daemon, DaemonOptions, agent_texts};

/// What one hostile input must earn.
#[derive(Debug, Clone)]
enum Expect {
    /// An error reply with this id and code.
    Error(Value, i64),
    /// A success reply with this id.
    Ok(Value),
    /// No reply at all (checked by the next reply being the liveness probe's).
    Nothing,
}

struct Case {
    name: String,
    text: String,
    expect: Expect,
}

fn case(name: impl Into<String>, text: impl Into<String>, expect: Expect) -> Case {
    Case {
        name: name.into(),
        text: text.into(),
        expect,
    }
}

fn request(id: Value, method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string()
}

const PARSE: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// The corpus. `sid` is a live session of the same principal (so wrong params reach the
/// session and the agent, not just the router); `cwd` a real directory.
fn corpus(sid: &str, cwd: &str) -> Vec<Case> {
    use Expect::{Error, Nothing, Ok};
    let null = Value::Null;
    let mut cases = vec![
        // Not JSON, or not a message.
        case("empty frame", "", Error(null.clone(), PARSE)),
        case("truncated", r#"{"jsonrpc":"2.0","id":1,"#, Error(null.clone(), PARSE)),
        case("bare word", "nul", Error(null.clone(), PARSE)),
        case("lone surrogate", r#"{"jsonrpc":"2.0","id":2,"method":"\ud800"}"#, Error(null.clone(), PARSE)),
        case("json null", "null", Error(null.clone(), INVALID_REQUEST)),
        case("json number", "42", Error(null.clone(), INVALID_REQUEST)),
        case("json string", r#""session/list""#, Error(null.clone(), INVALID_REQUEST)),
        case("empty batch", "[]", Error(null.clone(), INVALID_REQUEST)),
        case("wrong version", r#"{"jsonrpc":"1.0","id":3,"method":"session/list"}"#, Error(json!(3), INVALID_REQUEST)),
        case("method not a string", r#"{"jsonrpc":"2.0","id":4,"method":5}"#, Error(json!(4), INVALID_REQUEST)),
        case("params a string", r#"{"jsonrpc":"2.0","id":5,"method":"session/list","params":"x"}"#, Error(json!(5), INVALID_REQUEST)),
        case("neither request nor response", r#"{"jsonrpc":"2.0"}"#, Error(null.clone(), INVALID_REQUEST)),
        case("response without result", r#"{"jsonrpc":"2.0","id":6}"#, Error(json!(6), INVALID_REQUEST)),
        case("response to nothing", r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, Nothing),
        case("error response to nothing", r#"{"jsonrpc":"2.0","id":8,"error":{"code":"x"}}"#, Nothing),
        // Deep nesting: far past the parser's depth limit, as a whole frame and inside params.
        case("100 000 [", "[".repeat(100_000), Error(null.clone(), PARSE)),
        case("100 000 {\"a\":", "{\"a\":".repeat(100_000), Error(null.clone(), PARSE)),
        case(
            "deep params",
            format!(
                r#"{{"jsonrpc":"2.0","id":9,"method":"session/list","params":{{"x":{}{}}}}}"#,
                "[".repeat(100_000),
                "]".repeat(100_000)
            ),
            Error(null.clone(), PARSE),
        ),
        case(
            "nesting under the limit",
            format!(
                r#"{{"jsonrpc":"2.0","id":10,"method":"session/list","params":{{"x":{}{}}}}}"#,
                "[".repeat(100),
                "]".repeat(100)
            ),
            Ok(json!(10)),
        ),
        // Huge numbers.
        case("id 1e400", r#"{"jsonrpc":"2.0","id":1e400,"method":"session/list"}"#, Error(null.clone(), PARSE)),
        case("id of a million digits", format!(r#"{{"jsonrpc":"2.0","id":{},"method":"session/list"}}"#, "9".repeat(1_000_000)), Error(null.clone(), PARSE)),
        case(
            "afterSeq past i64",
            request(json!(11), "_acpd/session/attach", json!({ "sessionId": sid, "afterSeq": 1e300 })),
            Error(json!(11), INVALID_PARAMS),
        ),
        case(
            "afterSeq 2^64",
            format!(r#"{{"jsonrpc":"2.0","id":12,"method":"_acpd/session/attach","params":{{"sessionId":"{sid}","afterSeq":18446744073709551616}}}}"#),
            Error(json!(12), INVALID_PARAMS),
        ),
        case(
            "afterSeq beyond the journal's end",
            request(json!(18), "_acpd/session/attach", json!({ "sessionId": sid, "afterSeq": 1_000_000_000 })),
            Error(json!(18), INVALID_PARAMS),
        ),
        // MCP servers: not objects → -32602; a stdio command is accepted and not started
        // (`mcp_hosted.rs` checks that with a marker file).
        case(
            "mcpServers of numbers",
            request(json!(19), "session/new", json!({ "cwd": cwd, "mcpServers": [5] })),
            Error(json!(19), INVALID_PARAMS),
        ),
        case(
            "stdio MCP server",
            request(json!(20), "session/new", json!({ "cwd": cwd, "mcpServers": [
                { "name": "x", "command": "sh", "args": ["-c", "exit 3"], "env": [] }] })),
            Ok(json!(20)),
        ),
        // Unknown methods.
        case("unknown method", request(json!(13), "no/such/method", json!({})), Error(json!(13), NOT_FOUND)),
        case("unknown extension", request(json!(14), "_nobody/x", json!({})), Error(json!(14), NOT_FOUND)),
        case("empty method", request(json!(15), "", json!({})), Error(json!(15), NOT_FOUND)),
        case("NUL in method", request(json!(16), "session/\u{0}list", json!({})), Error(json!(16), NOT_FOUND)),
        case("unknown notification", json!({ "jsonrpc": "2.0", "method": "no/such" }).to_string(), Nothing),
        case("cancel of nothing", json!({ "jsonrpc": "2.0", "method": "$/cancel_request", "params": { "requestId": [1] } }).to_string(), Nothing),
        // Ids of every JSON type.
        case("id string", request(json!("abc"), "session/list", json!({})), Ok(json!("abc"))),
        case("id empty string", request(json!(""), "session/list", json!({})), Ok(json!(""))),
        case("id number", request(json!(17), "session/list", json!({})), Ok(json!(17))),
        case("id float", request(json!(1.5), "session/list", json!({})), Ok(json!(1.5))),
        case("id negative", request(json!(-3), "session/list", json!({})), Ok(json!(-3))),
        // Integers within 64 bits come back exactly; longer ones would come back rounded, as
        // floats, so they are refused.
        case("id beyond u64", r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"session/list"}"#, Error(null.clone(), INVALID_REQUEST)),
        case("id 2^64", r#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"session/list"}"#, Error(null.clone(), INVALID_REQUEST)),
        case("id u64 max", r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"session/list"}"#, Ok(json!(18446744073709551615u64))),
        case("id null", request(null.clone(), "session/list", json!({})), Error(null.clone(), INVALID_REQUEST)),
        case("id object", request(json!({ "a": 1 }), "session/list", json!({})), Error(null.clone(), INVALID_REQUEST)),
        case("id array", request(json!([1]), "session/list", json!({})), Error(null.clone(), INVALID_REQUEST)),
        case("id bool", request(json!(true), "session/list", json!({})), Error(null.clone(), INVALID_REQUEST)),
        // Notifications with bad params are ignored.
        case("cancel with a numeric session", json!({ "jsonrpc": "2.0", "method": "session/cancel", "params": { "sessionId": 5 } }).to_string(), Nothing),
        case("cancel with array params", json!({ "jsonrpc": "2.0", "method": "session/cancel", "params": [1] }).to_string(), Nothing),
    ];

    // Wrong param types for every session method. Ids from 1000 on.
    let mut id = 1000;
    let mut bad = |method: &str, params: Value| {
        id += 1;
        case(
            format!("{method} {params}"),
            request(json!(id), method, params),
            Error(json!(id), INVALID_PARAMS),
        )
    };
    let prompt = json!([{ "type": "text", "text": "echo x" }]);
    for method in [
        "session/new",
        "session/load",
        "session/resume",
        "session/list",
        "session/prompt",
        "session/close",
        "session/delete",
        "session/set_mode",
        "session/set_config_option",
        "_acpd/session/attach",
    ] {
        cases.push(bad(method, json!([1, 2])));
        cases.push(bad(method, json!({ "sessionId": 5, "cwd": 5 })));
    }
    for method in [
        "session/load",
        "session/resume",
        "session/prompt",
        "session/close",
        "session/delete",
        "session/set_mode",
        "session/set_config_option",
        "_acpd/session/attach",
    ] {
        cases.push(bad(method, json!({})));
        cases.push(bad(method, json!({ "sessionId": null })));
        cases.push(bad(method, json!({ "sessionId": [sid] })));
    }
    cases.extend([
        bad("session/new", json!({ "cwd": 5, "mcpServers": [] })),
        bad("session/new", json!({ "cwd": cwd, "mcpServers": "none" })),
        bad("session/new", json!({ "cwd": [cwd], "mcpServers": [] })),
        // Around acpd's data directory (the work dir's parent holds `data/`), or `/`.
        bad(
            "session/new",
            json!({ "cwd": format!("{cwd}/.."), "mcpServers": [] }),
        ),
        bad("session/new", json!({ "cwd": "/", "mcpServers": [] })),
        bad("session/list", json!({ "cwd": 5 })),
        bad("session/list", json!({ "cursor": 5 })),
        bad("session/list", json!({ "cursor": "not a cursor" })),
        bad(
            "session/load",
            json!({ "sessionId": sid, "cwd": 5, "mcpServers": [] }),
        ),
        bad(
            "session/resume",
            json!({ "sessionId": sid, "cwd": 5, "mcpServers": [] }),
        ),
        bad(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": "echo x" }),
        ),
        bad(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": 5 }] }),
        ),
        bad(
            "session/prompt",
            json!({ "sessionId": 5, "prompt": prompt }),
        ),
        bad("session/set_mode", json!({ "sessionId": sid, "modeId": 5 })),
        bad(
            "session/set_config_option",
            json!({ "sessionId": sid, "configId": 5, "value": {} }),
        ),
        bad(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": "x" }),
        ),
        bad(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": -1 }),
        ),
        bad(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": 1.5 }),
        ),
    ]);
    cases
}

/// Next response (a message with an id and no method); notifications are skipped.
async fn next_response(client: &mut Client, what: &str) -> Value {
    loop {
        let msg = tokio::time::timeout(DEFAULT_TIMEOUT, client.recv_json())
            .await
            .unwrap_or_else(|_| panic!("no response to {what}"));
        if msg.get("method").is_none() && msg.get("id").is_some() {
            return msg;
        }
    }
}

/// The connection still answers a request, and answers it next (nothing stray before it).
async fn still_answers(client: &mut Client, probe: i64, after: &str) {
    client
        .send_text(&request(json!(probe), "session/list", json!({})))
        .await;
    let reply = next_response(client, &format!("session/list after {after}")).await;
    assert_eq!(reply["id"], probe, "after {after}: stray reply {reply}");
    assert!(
        reply["result"]["sessions"].is_array(),
        "after {after}: {reply}"
    );
}

async fn other_client_works(other: &mut Client, sid: &str, after: &str) {
    let (updates, result) = other.prompt(sid, &format!("echo ok after {after}")).await;
    assert_eq!(
        result.expect("prompt")["stopReason"],
        "end_turn",
        "after {after}"
    );
    assert_eq!(agent_texts(&updates), [format!("ok after {after}")]);
}

/// Whether `reply` is what `case` must earn; the mismatch, if not.
fn check(case: &Case, reply: &Value) -> Result<(), String> {
    let (id, code) = match &case.expect {
        Expect::Error(id, code) => (id, Some(*code)),
        Expect::Ok(id) => (id, None),
        Expect::Nothing => return Ok(()),
    };
    let right = reply["jsonrpc"] == "2.0"
        && &reply["id"] == id
        && match code {
            Some(code) => reply["error"]["code"] == code,
            None => reply.get("result").is_some(),
        };
    if right {
        Ok(())
    } else {
        let shown: String = reply.to_string().chars().take(300).collect();
        Err(format!(
            "{}: expected {:?}, got {shown}",
            case.name, case.expect
        ))
    }
}

#[tokio::test]
async fn hostile_corpus_gets_the_right_errors_and_harms_nobody() {
    let daemon = Daemon::start().await;
    let cwd = daemon.work_dir();
    let mut other = daemon.client().await;
    let other_sid = other.open_session(&cwd).await;
    let mut hostile = daemon.client().await;
    // A session of the attacker's own, for wrong params to reach the session and its agent.
    let own_sid = {
        let mut c = daemon.client().await;
        c.open_session(&cwd).await
    };

    let cases = corpus(&own_sid, &cwd.display().to_string());
    let mut wrong = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        hostile.send_text(&case.text).await;
        if !matches!(case.expect, Expect::Nothing) {
            let reply = next_response(&mut hostile, &case.name).await;
            wrong.extend(check(case, &reply).err());
        }
        still_answers(&mut hostile, 1_000_000 + n as i64, &case.name).await;
        other_client_works(&mut other, &other_sid, &case.name).await;
    }
    assert!(
        wrong.is_empty(),
        "{} wrong replies:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // The attacker's own session is still whole too.
    let (updates, result) = hostile.prompt(&own_sid, "echo intact").await;
    assert_eq!(result.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["intact"]);
}

#[tokio::test]
async fn requests_before_initialize_are_refused() {
    let daemon = Daemon::start().await;
    let mut c = daemon.connect().await;
    let cwd = daemon.work_dir();
    for (id, method, params) in [
        (1, "session/list", json!({})),
        (2, "session/new", json!({ "cwd": cwd, "mcpServers": [] })),
        (
            3,
            "session/prompt",
            json!({ "sessionId": "x", "prompt": [] }),
        ),
    ] {
        c.send_text(&request(json!(id), method, params)).await;
        let reply = next_response(&mut c, method).await;
        assert_eq!(reply["id"], id, "{reply}");
        assert_eq!(reply["error"]["code"], INVALID_REQUEST, "{reply}");
    }
    c.initialize().await;
    still_answers(&mut c, 99, "initialize").await;
}

/// A raw newline-delimited connection, for bytes that are not UTF-8.
struct RawLines {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl RawLines {
    async fn connect(daemon: &Daemon) -> RawLines {
        let addr = daemon.tcp_addr.expect("daemon started with tcp");
        let stream = tokio::time::timeout(DEFAULT_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect");
        let (r, w) = stream.into_split();
        RawLines {
            reader: BufReader::new(r),
            writer: w,
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        let write = async {
            self.writer.write_all(bytes).await?;
            self.writer.write_all(b"\n").await?;
            self.writer.flush().await
        };
        tokio::time::timeout(DEFAULT_TIMEOUT, write)
            .await
            .expect("write timed out")
            .expect("write");
    }

    async fn recv(&mut self) -> Value {
        let mut line = String::new();
        let n = tokio::time::timeout(DEFAULT_TIMEOUT, self.reader.read_line(&mut line))
            .await
            .expect("no reply within the deadline")
            .expect("read");
        assert!(n > 0, "connection closed");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("invalid JSON ({e}): {line}"))
    }

    async fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(request(json!(id), method, params).as_bytes())
            .await;
        loop {
            let msg = self.recv().await;
            if msg.get("method").is_none() {
                assert_eq!(msg["id"], id, "{msg}");
                return msg;
            }
        }
    }
}

#[tokio::test]
async fn malformed_utf8_is_a_parse_error_on_tcp_and_ignored_in_binary_frames() {
    let daemon = Daemon::start_with(DaemonOptions::default().tcp()).await;
    let mut other = daemon.client().await;
    let other_sid = other.open_session(&daemon.work_dir()).await;

    let mut raw = RawLines::connect(&daemon).await;
    let init = json!({ "protocolVersion": 1, "clientCapabilities": {} });
    assert!(
        raw.request(1, "initialize", init)
            .await
            .get("result")
            .is_some()
    );
    let bad: &[&[u8]] = &[
        b"\xff\xfe\xfd",
        b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"session/list\",\"params\":{\"cwd\":\"\xc3\x28\"}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"session/\xed\xa0\x80list\"}",
        b"\xc0\xaf",
    ];
    for (n, bytes) in bad.iter().enumerate() {
        raw.send(bytes).await;
        let reply = raw.recv().await;
        assert_eq!(reply["id"], Value::Null, "{reply}");
        assert_eq!(reply["error"]["code"], PARSE, "{reply}");
        let reply = raw.request(10 + n as i64, "session/list", json!({})).await;
        assert!(reply["result"]["sessions"].is_array(), "{reply}");
        other_client_works(&mut other, &other_sid, &format!("bad UTF-8 #{n}")).await;
    }

    // Over WebSocket a text frame must be UTF-8 (the client library will not even send one
    // that is not); the same bytes in a binary frame are ignored.
    let mut ws = daemon.client().await;
    for bytes in bad {
        ws.send_binary(bytes.to_vec()).await;
    }
    still_answers(&mut ws, 77, "binary frames").await;
}

#[tokio::test]
async fn a_100_mb_frame_costs_only_its_own_connection() {
    let daemon = Daemon::start_with(DaemonOptions::default().tcp()).await;
    let mut other = daemon.client().await;
    let other_sid = other.open_session(&daemon.work_dir()).await;
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"session/list","params":{{"x":"{}"}}}}"#,
        "a".repeat(100 * 1024 * 1024)
    );

    // WebSocket: the socket is closed (1009 at best); sending may fail halfway, which is fine.
    let (mut ws, _) = tokio_tungstenite::connect_async(daemon.ws_url())
        .await
        .expect("connect");
    let _ =
        tokio::time::timeout(Duration::from_secs(30), ws.send(Message::text(big.clone()))).await;
    let ended = tokio::time::timeout(DEFAULT_TIMEOUT, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) => return None,
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => continue,
            }
        }
    })
    .await
    .expect("the socket must be closed after a 100 MB frame");
    if let Some(code) = ended {
        assert_eq!(code, 1009, "close code");
    }
    other_client_works(&mut other, &other_sid, "a 100 MB WebSocket frame").await;

    // Newline-delimited TCP: the line is skipped and answered; the connection lives on.
    let mut tcp = daemon
        .connect_tcp()
        .await
        .with_timeout(Duration::from_secs(30));
    tcp.initialize().await;
    tcp.send_text(&big).await;
    let reply = next_response(&mut tcp, "a 100 MB line").await;
    assert_eq!(reply["error"]["code"], INVALID_REQUEST, "{reply}");
    still_answers(&mut tcp, 2, "a 100 MB line").await;
    other_client_works(&mut other, &other_sid, "a 100 MB line").await;
}

/// Sends `big` as one frame on a fresh WebSocket (resumable: offering `acpd.resume.v1`) while
/// reading; the close code that comes back.
async fn close_code_after(daemon: &Daemon, big: &str, resumable: bool) -> Option<u16> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = daemon.ws_url().into_client_request().unwrap();
    if resumable {
        let p = "acpd.resume.v1".parse().unwrap();
        req.headers_mut().insert("sec-websocket-protocol", p);
    }
    let (ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("connect");
    let (mut sink, mut stream) = ws.split();
    // Read while writing: the close frame comes while the frame is still being sent.
    let reader = tokio::spawn(async move {
        loop {
            match stream.next().await {
                None | Some(Err(_)) => return None,
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => continue,
            }
        }
    });
    let frame = Message::text(big.to_owned());
    let _ = tokio::time::timeout(Duration::from_secs(30), sink.send(frame)).await;
    tokio::time::timeout(DEFAULT_TIMEOUT, reader)
        .await
        .expect("the socket must be closed after an oversize frame")
        .unwrap()
}

#[tokio::test]
async fn a_frame_far_over_the_limit_is_closed_with_1009() {
    // 1 MiB messages: frames past 4 MiB are not read at all.
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--max-message-bytes", 1024 * 1024)).await;
    let mut other = daemon.client().await;
    let other_sid = other.open_session(&daemon.work_dir()).await;
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"session/list","params":{{"x":"{}"}}}}"#,
        "a".repeat(8 * 1024 * 1024)
    );
    assert_eq!(
        close_code_after(&daemon, &big, false).await,
        Some(1009),
        "plain"
    );
    other_client_works(&mut other, &other_sid, "an oversize WebSocket frame").await;
    let framed = format!(r#"{{"s":1,"a":0,"m":{big}}}"#);
    assert_eq!(
        close_code_after(&daemon, &framed, true).await,
        Some(1009),
        "resumable"
    );
    other_client_works(&mut other, &other_sid, "an oversize resumable frame").await;
}
