//! The URLs a login prints, found in its terminal output: the lines, without terminal escape
//! sequences, scanned for `http://` and `https://`. Pure, so the daemon and its tests agree.

use std::collections::HashSet;

/// Longest line kept while waiting for its end; past it the line is scanned as it is.
const MAX_LINE: usize = 16 * 1024;

/// Output in, new URLs out (each once).
#[derive(Default)]
pub struct UrlScanner {
    line: Vec<u8>,
    seen: HashSet<String>,
}

impl UrlScanner {
    /// Feeds terminal output; returns the URLs of the lines it completed, first seen only.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut found = Vec::new();
        for &b in bytes {
            if b == b'\n' || b == b'\r' || self.line.len() >= MAX_LINE {
                self.flush(&mut found);
            }
            if b != b'\n' && b != b'\r' {
                self.line.push(b);
            }
        }
        found
    }

    fn flush(&mut self, found: &mut Vec<String>) {
        let text = strip_escapes(&String::from_utf8_lossy(&self.line));
        self.line.clear();
        for url in urls_in(&text) {
            if self.seen.insert(url.clone()) {
                found.push(url);
            }
        }
    }
}

/// `text` without ANSI escape sequences (CSI `ESC [ … final`, OSC `ESC ] … BEL|ESC \`).
fn strip_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('[') => {
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\u{7}' || (c == '\u{1b}' && chars.next_if_eq(&'\\').is_some()) {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The `http(s)://` URLs in a line, without trailing punctuation.
fn urls_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("http") {
        let tail = &rest[i..];
        if !(tail.starts_with("http://") || tail.starts_with("https://")) {
            rest = &tail[4..];
            continue;
        }
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .unwrap_or(tail.len());
        let url = tail[..end].trim_end_matches(['.', ',', ';', ':', ')', ']', '!', '?']);
        if url.len() > "https://".len() {
            out.push(url.to_owned());
        }
        rest = &tail[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_found_once_per_completed_line() {
        let mut s = UrlScanner::default();
        assert!(s.feed(b"Open https://auth.example/x?a=1&b=2.").is_empty());
        assert_eq!(s.feed(b"\r\n"), ["https://auth.example/x?a=1&b=2"]);
        assert!(s.feed(b"again https://auth.example/x?a=1&b=2\n").is_empty());
        assert_eq!(
            s.feed(b"(see http://localhost:8085/cb) or httpx\n"),
            ["http://localhost:8085/cb"]
        );
    }

    #[test]
    fn escapes_do_not_hide_or_lengthen_urls() {
        let mut s = UrlScanner::default();
        let line =
            b"\x1b[1mhttps://a.example/p\x1b[0m \x1b]8;;https://b.example/\x07link\x1b]8;;\x07\n";
        assert_eq!(s.feed(line), ["https://a.example/p"]);
    }
}
