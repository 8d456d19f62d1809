//! acpd-scripted-mcp: a stdio MCP server for tests, with one tool, `echo` (returns its
//! `text` argument). `--pid-file FILE` writes its pid there at start, so a test can see it
//! run and end; `--fail` exits at once with status 3; `--slow-ms N` makes each `tools/call`
//! take N ms. Ends at stdin EOF.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut slow = std::time::Duration::ZERO;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pid-file" => {
                let path = args.next().expect("--pid-file FILE");
                std::fs::write(path, std::process::id().to_string()).expect("write pid file");
            }
            "--fail" => std::process::exit(3),
            "--slow-ms" => {
                let ms = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--slow-ms N");
                slow = std::time::Duration::from_millis(ms);
            }
            other => {
                eprintln!("scripted-mcp: unknown argument {other}");
                std::process::exit(64);
            }
        }
    }
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Ok(m) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let (Some(id), Some(method)) = (m.get("id"), m["method"].as_str()) else {
            continue;
        };
        let result = match method {
            "initialize" => json!({"protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}}, "serverInfo": {"name": "scripted-mcp", "version": "0"}}),
            "tools/list" => json!({"tools": [{"name": "echo", "description": "Echo text",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}]}),
            "tools/call" => {
                std::thread::sleep(slow);
                let text = m["params"]["arguments"]["text"]
                    .as_str()
                    .unwrap_or_default();
                json!({"content": [{"type": "text", "text": text}]})
            }
            _ => {
                let e = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}});
                let mut out = stdout.lock();
                let _ = writeln!(out, "{e}");
                let _ = out.flush();
                continue;
            }
        };
        let mut out = stdout.lock();
        let _ = writeln!(
            out,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "result": result})
        );
        let _ = out.flush();
    }
}
