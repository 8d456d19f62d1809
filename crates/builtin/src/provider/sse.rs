//! Server-sent events, parsed incrementally from the body's byte chunks (a chunk may end
//! in the middle of a line, or of a UTF-8 character).

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Event {
    pub event: Option<String>,
    pub data: String,
}

#[derive(Debug, Default)]
pub struct Parser {
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

impl Parser {
    /// Feeds bytes; returns the events they completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(bytes);
        let mut out = vec![];
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=nl).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if !self.data.is_empty() || self.event.is_some() {
                    out.push(Event {
                        event: self.event.take(),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_ref(), ""),
            };
            match field {
                "event" => self.event = Some(value.to_owned()),
                "data" => self.data.push(value.to_owned()),
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_chunks_and_crlf() {
        let mut p = Parser::default();
        assert!(p.feed(b"event: a\r\nda").is_empty());
        let evs = p.feed(b"ta: {\"x\":1}\r\n\r\ndata: one\ndata: two\n\n: comment\n");
        assert_eq!(
            evs,
            vec![
                Event {
                    event: Some("a".into()),
                    data: "{\"x\":1}".into()
                },
                Event {
                    event: None,
                    data: "one\ntwo".into()
                }
            ]
        );
    }
}
