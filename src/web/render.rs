//! Journal entries → blocks of conversation HTML, on the server: consecutive chunks of one
//! kind make one message, a tool call and its updates one tool block, a plan a checklist.
//!
//! Messages are Markdown (pulldown-cmark) and the HTML it yields is sanitized (ammonia, with
//! images and raw styles gone, so nothing loads from elsewhere); every other text is escaped.
//! Nothing an agent sent reaches the page as HTML without passing one of the two.
//!
//! No text from an agent or a client reaches a console page as HTML any other way: the pages'
//! own code sets every other string as text (`tests::agent_html_is_sanitized`, tests/it
//! `web_console::hardening::agent_markdown_keeps_no_file_or_protocol_relative_link`).

use std::sync::LazyLock;

use serde::Serialize;
use serde_json::Value;

use acpd_store::JournalEntry;

/// One rendered piece of conversation, as the page receives it.
#[derive(Debug, Serialize, PartialEq)]
pub struct Block {
    /// The first and last journal seq it was made of.
    pub seq: i64,
    pub last: i64,
    /// `user`, `agent`, `thought`, `tool`, `plan`, `usage`, `note`.
    pub kind: &'static str,
    /// A tool call's id (the page merges a later update into the block it has).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A tool block made of updates only (its call came in an earlier page).
    pub partial: bool,
    /// It may still grow: a message at the end of the page.
    pub open: bool,
    pub html: String,
}

/// Markdown through the sanitizer: links kept (rel noopener), images and styles dropped.
/// Only `http`, `https` and `mailto` links keep their target: a `file:` link opens the
/// viewer's own files, and a protocol-relative one (`//host`, which a browser also reads in
/// `\\host` and `/\host`) is another site dressed as a path of this one.
static CLEAN: LazyLock<ammonia::Builder<'static>> = LazyLock::new(|| {
    let mut b = ammonia::Builder::default();
    b.rm_tags(["img"])
        .url_schemes(["http", "https", "mailto"].into())
        .url_relative(ammonia::UrlRelative::Custom(Box::new(same_site_only)))
        .link_rel(Some("noopener noreferrer nofollow"));
    b
});

/// A relative URL kept as it is, unless a browser would read it as another host's.
fn same_site_only(url: &str) -> Option<std::borrow::Cow<'_, str>> {
    // Browsers drop tabs and newlines anywhere in a URL and leading spaces and controls.
    let mut chars = url
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .skip_while(|c| c.is_ascii_whitespace() || c.is_ascii_control());
    let slash = |c: Option<char>| matches!(c, Some('/' | '\\'));
    if slash(chars.next()) && slash(chars.next()) {
        return None;
    }
    Some(std::borrow::Cow::Borrowed(url))
}

pub fn markdown(text: &str) -> String {
    markdown_with(text, false)
}

/// Markdown as `markdown` does; with `keep_lines`, every line break of the source is a
/// `<br>` (a person's prompt is typed line by line, and Markdown would join its lines).
fn markdown_with(text: &str, keep_lines: bool) -> String {
    use pulldown_cmark::{Event, Options, Parser, html};
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let events = Parser::new_ext(text, opts).map(|e| match e {
        Event::SoftBreak if keep_lines => Event::HardBreak,
        e => e,
    });
    let mut out = String::new();
    html::push_html(&mut out, events);
    CLEAN.clean(&out).to_string()
}

/// Plain text for HTML text and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The `update` of a journal body (a whole notification or its params).
fn update_of(body: &Value) -> Option<&Value> {
    body.get("params")
        .unwrap_or(body)
        .get("update")
        .filter(|u| u.is_object())
}

/// A content block as Markdown source (text) or as a short escaped description.
fn content_text(block: &Value) -> String {
    match block.get("type").and_then(Value::as_str) {
        Some("text") => block["text"].as_str().unwrap_or_default().to_owned(),
        Some("resource_link") => {
            let name = block["name"].as_str().unwrap_or("link");
            let uri = block["uri"].as_str().unwrap_or_default();
            format!("[{}](<{}>)", md_escape(name), uri.replace('>', "%3E"))
        }
        Some("resource") => format!(
            "`resource {}`",
            block["resource"]["uri"].as_str().unwrap_or_default()
        ),
        Some("image") => "*(image)*".to_owned(),
        Some("audio") => "*(audio)*".to_owned(),
        _ => String::new(),
    }
}

fn md_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '[' | ']' | '\\' | '*' | '_' | '`' | '<' | '>' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

/// A tool call being assembled from its call and updates.
#[derive(Default)]
struct Tool {
    id: String,
    title: Option<String>,
    kind: Option<String>,
    status: Option<String>,
    locations: Option<Vec<Value>>,
    content: Option<Vec<Value>>,
    raw_input: Option<Value>,
    partial: bool,
}

impl Tool {
    fn apply(&mut self, u: &Value) {
        let s = |k: &str| u.get(k).and_then(Value::as_str).map(str::to_owned);
        if let Some(t) = s("title") {
            self.title = Some(t);
        }
        if let Some(k) = s("kind") {
            self.kind = Some(k);
        }
        if let Some(st) = s("status") {
            self.status = Some(st);
        }
        if let Some(Value::Array(l)) = u.get("locations") {
            self.locations = Some(l.clone());
        }
        if let Some(Value::Array(c)) = u.get("content") {
            self.content = Some(c.clone());
        }
        if let Some(r) = u.get("rawInput").filter(|r| !r.is_null()) {
            self.raw_input = Some(r.clone());
        }
    }

    fn html(&self) -> String {
        let status = self.status.as_deref().unwrap_or("pending");
        let mut h = format!(
            "<div class=\"tool-head\"><span class=\"tool-kind\">{}</span> <span class=\"tool-title\">{}</span> <span class=\"status status-{}\">{}</span></div>",
            esc(self.kind.as_deref().unwrap_or("tool")),
            esc(self.title.as_deref().unwrap_or("Tool call")),
            esc(status),
            esc(status),
        );
        if let Some(locs) = &self.locations {
            h.push_str("<ul class=\"tool-locations\">");
            for l in locs {
                let path = l["path"].as_str().unwrap_or_default();
                let line = l["line"]
                    .as_u64()
                    .map(|n| format!(":{n}"))
                    .unwrap_or_default();
                h.push_str(&format!("<li><code>{}{}</code></li>", esc(path), line));
            }
            h.push_str("</ul>");
        }
        if let Some(input) = &self.raw_input {
            h.push_str(&format!(
                "<details class=\"tool-input\"><summary>Input</summary><pre>{}</pre></details>",
                esc(&serde_json::to_string_pretty(input).unwrap_or_default())
            ));
        }
        for c in self.content.iter().flatten() {
            h.push_str(&tool_content(c));
        }
        h
    }
}

fn tool_content(c: &Value) -> String {
    match c.get("type").and_then(Value::as_str) {
        Some("diff") => diff(
            c["path"].as_str().unwrap_or_default(),
            c["oldText"].as_str(),
            c["newText"].as_str().unwrap_or_default(),
        ),
        Some("terminal") => format!(
            "<div class=\"terminal\">terminal <code>{}</code></div>",
            esc(c["terminalId"].as_str().unwrap_or_default())
        ),
        Some("content") => {
            let block = &c["content"];
            match block.get("type").and_then(Value::as_str) {
                // Tool output is text as the tool printed it, not Markdown.
                Some("text") => format!(
                    "<pre class=\"tool-output\">{}</pre>",
                    esc(block["text"].as_str().unwrap_or_default())
                ),
                _ => format!(
                    "<div class=\"tool-output\">{}</div>",
                    markdown(&content_text(block))
                ),
            }
        }
        _ => String::new(),
    }
}

/// A unified line diff of a file edit.
fn diff(path: &str, old: Option<&str>, new: &str) -> String {
    let old = old.unwrap_or_default();
    let diff = similar::TextDiff::from_lines(old, new);
    let mut h = format!(
        "<div class=\"diff\"><div class=\"diff-path\">{}</div><pre>",
        esc(path)
    );
    for change in diff.iter_all_changes() {
        let (class, sign) = match change.tag() {
            similar::ChangeTag::Delete => ("del", '-'),
            similar::ChangeTag::Insert => ("ins", '+'),
            similar::ChangeTag::Equal => ("eq", ' '),
        };
        let line = change.value();
        let line = line.strip_suffix('\n').unwrap_or(line);
        // Each line is a block of its own (style.css); no newline between them in the <pre>.
        h.push_str(&format!(
            "<span class=\"{class}\">{sign}{}</span>",
            esc(line)
        ));
    }
    h.push_str("</pre></div>");
    h
}

fn plan(u: &Value) -> String {
    let mut h = String::from("<ul class=\"plan\">");
    for e in u["entries"].as_array().into_iter().flatten() {
        let status = e["status"].as_str().unwrap_or("pending");
        let mark = match status {
            "completed" => "☑",
            "in_progress" => "◐",
            _ => "☐",
        };
        h.push_str(&format!(
            "<li class=\"plan-{}\"><span class=\"mark\">{mark}</span> {}</li>",
            esc(status),
            esc(e["content"].as_str().unwrap_or_default())
        ));
    }
    h.push_str("</ul>");
    h
}

fn usage(u: &Value) -> String {
    let mut parts = Vec::new();
    if let (Some(used), Some(size)) = (u["used"].as_u64(), u["size"].as_u64()) {
        parts.push(format!("context {used} / {size} tokens"));
    }
    if let Some(cost) = u.get("cost").filter(|c| c.is_object()) {
        let amount = cost["amount"].as_f64().unwrap_or_default();
        let currency = cost["currency"].as_str().unwrap_or_default();
        parts.push(format!("cost {amount:.4} {currency}"));
    }
    esc(&parts.join(" · "))
}

/// Turns entries (ascending) into blocks.
// long: one flat match over the journal entry kinds the console draws.
pub fn blocks(entries: &[JournalEntry]) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    // The message being gathered: kind, first and last seq, Markdown source.
    let mut msg: Option<(&'static str, i64, i64, String)> = None;
    let mut tools: Vec<(i64, i64, Tool)> = Vec::new();
    let flush = |msg: &mut Option<(&'static str, i64, i64, String)>, out: &mut Vec<Block>| {
        if let Some((kind, seq, last, text)) = msg.take() {
            let body = markdown_with(&text, kind == "user");
            let html = if kind == "thought" {
                format!("<details class=\"thought\"><summary>Thought</summary>{body}</details>")
            } else {
                body
            };
            out.push(Block {
                seq,
                last,
                kind,
                tool: None,
                partial: false,
                open: false,
                html,
            });
        }
    };
    for e in entries {
        let Ok(body) = serde_json::from_str::<Value>(&e.body) else {
            continue;
        };
        let Some(u) = update_of(&body) else { continue };
        let kind = u["sessionUpdate"].as_str().unwrap_or_default();
        let msg_kind = match kind {
            "user_message_chunk" => Some("user"),
            "agent_message_chunk" => Some("agent"),
            "agent_thought_chunk" => Some("thought"),
            _ => None,
        };
        if let Some(k) = msg_kind {
            let text = content_text(&u["content"]);
            match &mut msg {
                Some((mk, _, last, t)) if *mk == k => {
                    *last = e.seq;
                    t.push_str(&text);
                }
                _ => {
                    flush(&mut msg, &mut out);
                    msg = Some((k, e.seq, e.seq, text));
                }
            }
            continue;
        }
        flush(&mut msg, &mut out);
        match kind {
            "tool_call" | "tool_call_update" => {
                let id = u["toolCallId"].as_str().unwrap_or_default().to_owned();
                let at = out.len();
                if let Some((_, last, tool)) = tools.iter_mut().find(|(_, _, t)| t.id == id) {
                    tool.apply(u);
                    *last = e.seq;
                    continue;
                }
                let mut tool = Tool {
                    id,
                    partial: kind == "tool_call_update",
                    ..Tool::default()
                };
                tool.apply(u);
                // A placeholder keeps the block's place; filled in below.
                out.push(Block {
                    seq: e.seq,
                    last: e.seq,
                    kind: "tool",
                    tool: Some(tool.id.clone()),
                    partial: tool.partial,
                    open: false,
                    html: String::new(),
                });
                tools.push((at as i64, e.seq, tool));
            }
            "plan" => out.push(Block {
                seq: e.seq,
                last: e.seq,
                kind: "plan",
                tool: None,
                partial: false,
                open: false,
                html: plan(u),
            }),
            "usage_update" => out.push(Block {
                seq: e.seq,
                last: e.seq,
                kind: "usage",
                tool: None,
                partial: false,
                open: false,
                html: usage(u),
            }),
            "current_mode_update" => out.push(Block {
                seq: e.seq,
                last: e.seq,
                kind: "note",
                tool: None,
                partial: false,
                open: false,
                html: format!(
                    "mode: <code>{}</code>",
                    esc(u["currentModeId"].as_str().unwrap_or_default())
                ),
            }),
            _ => {}
        }
    }
    flush(&mut msg, &mut out);
    for (at, last, tool) in tools {
        let b = &mut out[at as usize];
        b.last = last;
        b.html = tool.html();
    }
    if let Some(b) = out.last_mut()
        && matches!(b.kind, "user" | "agent" | "thought")
    {
        b.open = true;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(seq: i64, update: Value) -> JournalEntry {
        JournalEntry {
            session_id: "s".into(),
            seq,
            kind: update["sessionUpdate"].as_str().unwrap_or_default().into(),
            body: json!({ "sessionId": "s", "update": update })
                .to_string()
                .into(),
            at_ms: 0,
        }
    }

    fn chunk(kind: &str, text: &str) -> Value {
        json!({ "sessionUpdate": kind, "content": { "type": "text", "text": text } })
    }

    #[test]
    fn a_prompt_keeps_its_line_breaks_and_an_answer_is_markdown() {
        let entries = vec![
            entry(1, chunk("user_message_chunk", "first line\nsecond *line*")),
            entry(2, chunk("agent_message_chunk", "one\ntwo")),
        ];
        let b = blocks(&entries);
        assert_eq!(b[0].html, "<p>first line<br>\nsecond <em>line</em></p>\n");
        assert_eq!(b[1].html, "<p>one\ntwo</p>\n");
    }

    #[test]
    fn plain_text_is_escaped() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
    }

    #[test]
    fn agent_html_is_sanitized() {
        let html = markdown(
            "**hi** <script>alert(1)</script><img src=\"https://evil.test/x.png\">\
             <a href=\"javascript:alert(1)\" onclick=\"x()\">l</a><p style=\"color:red\">p</p>",
        );
        assert!(html.contains("<strong>hi</strong>"), "{html}");
        for bad in ["<script", "<img", "javascript:", "onclick", "style="] {
            assert!(!html.contains(bad), "{bad} in {html}");
        }
    }

    #[test]
    fn file_and_protocol_relative_links_lose_their_target() {
        for link in [
            "[a](file:///etc/passwd)",
            "[a](FILE:///etc/passwd)",
            "[a](//evil.test/x)",
            "<a href=\"//evil.test\">a</a>",
            "<a href=\" //evil.test\">a</a>",
            "<a href=\"\\\\evil.test\">a</a>",
            "<a href=\"/\\evil.test\">a</a>",
            "<a href=\"/&#x09;/evil.test\">a</a>",
        ] {
            let html = markdown(link);
            assert!(!html.contains("href"), "{link}: {html}");
        }
        for (link, href) in [
            ("[a](https://ok.test/)", "https://ok.test/"),
            ("[a](/s/1)", "/s/1"),
            ("[a](#x)", "#x"),
            ("[a](mailto:a@b.test)", "mailto:a@b.test"),
        ] {
            let html = markdown(link);
            assert!(html.contains(&format!("href=\"{href}\"")), "{link}: {html}");
        }
    }

    #[test]
    fn chunks_merge_into_messages_and_tools_take_their_updates() {
        let entries = vec![
            entry(1, chunk("user_message_chunk", "do it")),
            entry(2, chunk("agent_message_chunk", "Hel")),
            entry(3, chunk("agent_message_chunk", "lo *there*")),
            entry(
                4,
                json!({ "sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Edit <a>", "kind": "edit", "status": "pending",
                "content": [{ "type": "diff", "path": "/x", "oldText": "a\n", "newText": "b\n" }] }),
            ),
            entry(
                5,
                json!({ "sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed" }),
            ),
            entry(
                6,
                json!({ "sessionUpdate": "tool_call_update", "toolCallId": "t0", "status": "failed" }),
            ),
            entry(
                7,
                json!({ "sessionUpdate": "plan", "entries": [{ "content": "step", "status": "completed", "priority": "high" }] }),
            ),
            entry(8, chunk("agent_thought_chunk", "hmm")),
        ];
        let b = blocks(&entries);
        let kinds: Vec<&str> = b.iter().map(|b| b.kind).collect();
        assert_eq!(
            kinds,
            ["user", "agent", "tool", "tool", "plan", "thought"],
            "{b:?}"
        );
        assert_eq!((b[1].seq, b[1].last), (2, 3));
        assert!(b[1].html.contains("Hello <em>there</em>"), "{}", b[1].html);
        assert_eq!(b[2].last, 5);
        assert!(b[2].html.contains("status-completed"), "{}", b[2].html);
        assert!(b[2].html.contains("Edit &lt;a&gt;"), "{}", b[2].html);
        assert!(b[2].html.contains("<span class=\"del\">-a</span>"));
        assert!(b[2].html.contains("<span class=\"ins\">+b</span>"));
        assert!(b[3].partial && !b[2].partial);
        assert!(b[4].html.contains("☑"));
        assert!(b[5].html.starts_with("<details class=\"thought\">") && b[5].open);
        assert!(!b[1].open);
    }
}
