//! One protocol vocabulary, checked: no method name is spelled outside `acpd-protocol`
//! (`crates/protocol`), and no JSON-RPC error object is built in the daemon outside its one
//! mapping (`src/error.rs`). Product code only: tests (`#[cfg(test)] mod tests`, `tests.rs`)
//! keep raw JSON, which is the wire.

use std::path::Path;

use crate::support::source::{root, rust_files};
use acpd_protocol::Method;

/// The method-name literals that are not ACP's and may stay where they are, with why.
const NOT_ACP: &[(&str, &str)] = &[
    // MCP's own handshake, in the scripted MCP servers (they speak MCP, not ACP).
    ("crates/scripted-agent/src/mcp_http.rs", "initialize"),
    (
        "crates/scripted-agent/src/bin/scripted-mcp.rs",
        "initialize",
    ),
];

/// The product source files under `root` (`src/`, `crates/*/src/`), as (path relative to
/// `root`, text without its unit tests); `crates/protocol` is the vocabulary and left out.
fn product_files(root: &Path) -> Vec<(String, String)> {
    let mut files = vec![];
    rust_files(&root.join("src"), &mut files);
    for c in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        if c.file_name() != "protocol" {
            rust_files(&c.path().join("src"), &mut files);
        }
    }
    files.sort();
    files
        .into_iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel.ends_with("/tests.rs") || rel.contains("/tests/") {
                return None;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            Some((rel, without_unit_tests(&text).to_owned()))
        })
        .collect()
}

/// `text` up to its `#[cfg(test)] mod tests {` (which ends a file, by convention).
fn without_unit_tests(text: &str) -> &str {
    let mut at = 0;
    while let Some(i) = text[at..].find("#[cfg(test)]") {
        let start = at + i;
        let rest = text[start + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod tests {") {
            return &text[..start];
        }
        at = start + 1;
    }
    text
}

/// A piece of Rust source without comments and char literals: its code (a string literal's
/// quotes inside it turned to `'`), and every string literal's line and text (`\"`
/// unescaped).
struct Lexed {
    code: String,
    strings: Vec<(usize, String)>,
}

fn lex(text: &str) -> Lexed {
    let b = text.as_bytes();
    let (mut code, mut strings) = (String::new(), vec![]);
    let (mut i, mut line) = (0, 1);
    let ident = |i: usize| i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    while i < b.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            line += rest[..end].matches('\n').count();
            i += end;
        } else if let Some(open) = raw_string_open(rest).filter(|_| !ident(i)) {
            let hashes = &rest[open
                - rest[..open]
                    .bytes()
                    .rev()
                    .take_while(|&c| c == b'#')
                    .count()..open];
            let close = format!("\"{hashes}");
            let end = rest[open + 1..].find(&close).unwrap() + open + 1;
            let s = &rest[open + 1..end];
            code.push_str(&format!("\"{}\"", s.replace('"', "'")));
            strings.push((line, s.to_owned()));
            line += rest[..end].matches('\n').count();
            i += end + close.len();
        } else if rest.starts_with('"') {
            let mut j = 1;
            let mut s = String::new();
            while rest.as_bytes()[j] != b'"' {
                if rest.as_bytes()[j] == b'\\' {
                    s.push_str(if &rest[j..j + 2] == "\\\"" {
                        "\""
                    } else {
                        &rest[j..j + 2]
                    });
                    j += 2;
                } else {
                    let c = rest[j..].chars().next().unwrap();
                    s.push(c);
                    j += c.len_utf8();
                }
            }
            code.push_str(&format!("\"{}\"", s.replace('"', "'")));
            strings.push((line, s.clone()));
            line += s.matches('\n').count();
            i += j + 1;
        } else if let Some(after) = rest.strip_prefix('\'') {
            // A char literal ('x', '\'', '\u{..}') or a lifetime ('a).
            let body = if after.starts_with('\\') { 3 } else { 1 };
            match rest[body..].find('\'') {
                Some(e) if rest[1..body + e].chars().count() == 1 || (body == 3 && e <= 8) => {
                    i += body + e + 1
                }
                _ => {
                    code.push('\'');
                    i += 1;
                }
            }
        } else {
            let c = rest.chars().next().unwrap();
            if c == '\n' {
                line += 1;
            }
            code.push(c);
            i += c.len_utf8();
        }
    }
    Lexed { code, strings }
}

/// Method-name literals in `files`: a literal that is a method's name, or text (JSON) that
/// holds one in quotes.
/// Where the opening quote of a raw string (`r"`, `r#"`, `br"`…) starting `rest` is.
fn raw_string_open(rest: &str) -> Option<usize> {
    let after_r = rest.strip_prefix("br").or_else(|| rest.strip_prefix('r'))?;
    let hashes = after_r.bytes().take_while(|&c| c == b'#').count();
    after_r[hashes..]
        .starts_with('"')
        .then(|| rest.len() - after_r.len() + hashes)
}

fn method_literals(files: &[(String, String)]) -> Vec<String> {
    let mut out = vec![];
    for (path, text) in files {
        for (line, s) in lex(text).strings {
            for m in Method::ALL {
                let name = m.as_str();
                if (s == name || s.contains(&format!("\"{name}\"")))
                    && !NOT_ACP.contains(&(path.as_str(), name))
                {
                    out.push(format!("{path}:{line}: {s:?}"));
                }
            }
        }
    }
    out
}

/// Files below the mapping that answer with an error of their own: `error.rs` depends on
/// `agent` (it words `AgentError`), so `agent` cannot name `AcpError`.
const BELOW_THE_MAPPING: &[(&str, &str)] = &[(
    // The answer to an agent's request no session can take, on the agent's own link.
    "src/agent/hosted/router.rs",
    "ResponseError::method_not_found(",
)];

/// JSON-RPC error objects built in the daemon's `files` outside `src/error.rs`.
fn error_objects(files: &[(String, String)]) -> Vec<String> {
    let builds = [
        "ResponseError {",
        "ResponseError::new(",
        "ResponseError::internal(",
        "ResponseError::invalid_params(",
        "ResponseError::invalid_request(",
        "ResponseError::method_not_found(",
        "ResponseError::parse_error(",
        "ResponseError::request_cancelled(",
    ];
    let mut out = vec![];
    for (path, text) in files {
        if !path.starts_with("src/") || path == "src/error.rs" {
            continue;
        }
        let lexed = lex(text);
        for b in builds {
            // `ResponseError {` is also a return type or an impl before a block.
            let built = lexed.code.match_indices(b).any(|(i, _)| {
                let before = lexed.code[..i].trim_end();
                !(before.ends_with("->") || before.ends_with(" for") || before.ends_with("struct"))
            });
            if built && !BELOW_THE_MAPPING.contains(&(path.as_str(), b)) {
                out.push(format!("{path}: {b}"));
            }
        }
        // An error object as JSON: `"error": {` in a `json!`, or in a JSON text.
        let squeezed: String = lexed.code.split_whitespace().collect();
        if squeezed.contains("\"error\":{")
            || lexed.strings.iter().any(|(_, s)| s.contains("\"error\":{"))
        {
            out.push(format!("{path}: a JSON error object"));
        }
    }
    out
}

#[test]
fn no_method_name_is_spelled_outside_the_vocabulary() {
    let found = method_literals(&product_files(&root()));
    assert!(
        found.is_empty(),
        "method names spelled outside acpd-protocol (use acpd_protocol::method::*):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_error_reply_of_the_daemon_is_built_by_its_one_mapping() {
    let found = error_objects(&product_files(&root()));
    assert!(
        found.is_empty(),
        "JSON-RPC errors built outside src/error.rs (add an AcpError variant):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_vocabulary_checks_see_what_they_forbid() {
    // Both checks must be able to fail, and must not read comments or tests.
    let file = |text: &str| vec![("src/x.rs".to_owned(), text.to_owned())];
    let bad = [
        r#"fn f() { peer.request("session/prompt", None) }"#,
        r##"const H: &str = r#"{"jsonrpc":"2.0","method":"session/update"}"#;"##,
        "const H: &str = \"send {\\\"method\\\":\\\"_acpd/auth\\\"} first\";",
    ];
    for text in bad {
        assert_eq!(method_literals(&file(text)).len(), 1, "{text}");
    }
    let fine = [
        "// \"session/prompt\" in a comment\nfn f() {}",
        "fn f() { let c = '\"'; g(\"a session/prompt in a sentence\") }",
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    const M: &str = \"session/prompt\";\n}\n",
    ];
    for text in fine {
        let files = file(without_unit_tests(text));
        assert!(method_literals(&files).is_empty(), "{text}");
    }
    let bad = [
        "fn f() -> ResponseError { ResponseError::new(-32005, \"slow\") }",
        "fn f() -> Value { json!({ \"jsonrpc\": \"2.0\", \"error\": { \"code\": 1 } }) }",
    ];
    for text in bad {
        assert_eq!(error_objects(&file(text)).len(), 1, "{text}");
    }
    assert!(error_objects(&file("fn f() { AcpError::Busy.into() }")).is_empty());
}
