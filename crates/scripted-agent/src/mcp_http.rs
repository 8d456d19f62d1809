//! `mcp NAME TOOL TEXT`: the agent uses an `http` MCP server of its session as a real agent
//! would (initialize, notifications/initialized, tools/list, tools/call), over plain HTTP/1.1
//! on a fresh connection per message. Enough for acpd's loopback tunnel; not a general client.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One tool call through the server at `url`; the text of its result, or why not.
pub async fn call_tool(url: &str, tool: &str, text: &str) -> Result<(Vec<String>, String), String> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "scripted-agent", "version": "0"}}});
    result(post(url, &init).await?)?;
    post(
        url,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;
    let list = result(
        post(
            url,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await?,
    )?;
    let tools = list["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": tool, "arguments": {"text": text}}});
    let r = result(post(url, &call).await?)?;
    let out = r["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((tools, out))
}

fn result(answer: Option<Value>) -> Result<Value, String> {
    let a = answer.ok_or("no answer")?;
    if let Some(e) = a.get("error") {
        return Err(format!(
            "{} {}",
            e["code"],
            e["message"].as_str().unwrap_or_default()
        ));
    }
    Ok(a["result"].clone())
}

/// POSTs one message; the JSON body of the answer (`None` for 202).
async fn post(url: &str, body: &Value) -> Result<Option<Value>, String> {
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let io = async {
        let mut s = tokio::net::TcpStream::connect(authority).await?;
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(30), io)
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP answer")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    match status {
        "202" => Ok(None),
        "200" => serde_json::from_str(body)
            .map(Some)
            .map_err(|e| format!("bad body: {e}")),
        s => Err(format!("HTTP {s}: {body}")),
    }
}
