//! Journal compaction: merges streamed text chunks into one entry per message (pure function).
//!
//! An agent streams a reply as hundreds of `agent_message_chunk` notifications; replaying them
//! one by one after a reconnect is slow and the journal grows fast. `compact` folds each run
//! of same-message text chunks into a single notification carrying the whole text. The result
//! is meant for `Store::replace_journal_range` over the same seq range.
//!
//! `Replay` forms a `session/load` replay the same way, page by page, so it reads like the
//! agent's own load: one entry per message, and the session's state (`STATE`: available
//! commands, mode, config options) once, the latest of each, after the history rather than
//! where the agent first sent it.

use acpd_protocol::method;
use serde_json::Value;

use acpd_store::JournalEntry;

/// `sessionUpdate` kinds whose text chunks concatenate into one message.
const MERGEABLE: [&str; 3] = [
    "user_message_chunk",
    "agent_message_chunk",
    "agent_thought_chunk",
];

/// `sessionUpdate` kinds that state the session's current state, in the order a load replays
/// them after the history.
pub const STATE: [&str; 3] = [
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
];

/// Forms one `session/load` replay from the journal pages read for it (pure): text chunks
/// merged per message, state updates held back to be replayed once, after the history.
#[derive(Debug, Default)]
pub struct Replay {
    /// The latest entry of each `STATE` kind read so far, in `STATE` order.
    state: [Option<JournalEntry>; 3],
}

/// What to send of one page.
#[derive(Debug, PartialEq)]
pub struct Formed {
    pub entries: Vec<JournalEntry>,
    /// The client has everything up to this seq once `entries` are sent (state entries and
    /// merged chunks included); a message that may go on in the next page is left to it.
    pub upto: i64,
}

impl Replay {
    /// A page of entries after `after`, in seq order. `last`: no page follows in this
    /// replay's read (the journal's end, or the live edge), so its trailing message is sent
    /// as far as it goes; otherwise it is left to the next page, which then has it whole
    /// (unless it fills a page by itself).
    pub fn page(&mut self, after: i64, page: Vec<JournalEntry>, last: bool) -> Formed {
        let mut upto = page.last().map_or(after, |e| e.seq.max(after));
        let mut rest = Vec::with_capacity(page.len());
        for e in page {
            match STATE.iter().position(|k| *k == &*e.kind) {
                Some(i) => self.state[i] = Some(e),
                None => rest.push(e),
            }
        }
        if !last
            && let Some(start) = trailing_run(&rest)
            && start > 0
        {
            upto = rest[start].seq - 1;
            rest.truncate(start);
        }
        Formed {
            entries: compact(&rest),
            upto,
        }
    }

    /// The session's state as the replay found it, once (later calls: nothing).
    pub fn state(&mut self) -> Vec<JournalEntry> {
        self.state.iter_mut().filter_map(Option::take).collect()
    }
}

/// Where the run of mergeable chunks that ends `entries` starts, if it ends in one.
fn trailing_run(entries: &[JournalEntry]) -> Option<usize> {
    let key = TextChunk::parse(entries.last()?)?.key;
    let mut start = entries.len() - 1;
    while start > 0 && TextChunk::parse(&entries[start - 1]).is_some_and(|c| c.key == key) {
        start -= 1;
    }
    Some(start)
}

/// Merges runs of consecutive `session/update` text chunks of the same kind, session and
/// `messageId` (or both without one) into one entry with the concatenated text.
///
/// The merged entry is the run's last entry (its seq, at_ms, kind and other fields) with the
/// concatenated text and `params._meta.acpd.seq` set to its seq, so a client replaying from any
/// seq before the run still gets the whole message and the seq it resumes after is real.
/// Everything else, including runs of one, passes through unchanged, byte for byte.
pub fn compact(entries: &[JournalEntry]) -> Vec<JournalEntry> {
    let mut out = Vec::with_capacity(entries.len());
    let mut run: Option<Run<'_>> = None;
    for entry in entries {
        let chunk = TextChunk::parse(entry);
        if let (Some(r), Some(c)) = (run.as_mut(), chunk.as_ref())
            && r.key == c.key
        {
            r.text.push_str(&c.text);
            r.last = entry;
            r.count += 1;
            continue;
        }
        if let Some(r) = run.take() {
            out.push(r.finish());
        }
        match chunk {
            Some(c) => {
                run = Some(Run {
                    key: c.key,
                    text: c.text,
                    first: entry,
                    last: entry,
                    count: 1,
                })
            }
            None => out.push(entry.clone()),
        }
    }
    if let Some(r) = run.take() {
        out.push(r.finish());
    }
    out
}

/// What two chunks must share to be merged.
#[derive(Debug, PartialEq)]
struct Key {
    kind: String,
    session_id: Value,
    message_id: Value,
}

/// A text chunk notification, parsed just enough to decide and to merge.
struct TextChunk {
    key: Key,
    text: String,
}

impl TextChunk {
    fn parse(entry: &JournalEntry) -> Option<TextChunk> {
        // Cheap filter before parsing: most non-chunk entries are skipped without JSON work.
        if !MERGEABLE.contains(&&*entry.kind) {
            return None;
        }
        let body: Value = serde_json::from_str(&entry.body).ok()?;
        if body.get("method")?.as_str()? != method::SESSION_UPDATE || body.get("id").is_some() {
            return None;
        }
        let params = body.get("params")?;
        let update = params.get("update")?;
        let kind = update.get("sessionUpdate")?.as_str()?;
        if !MERGEABLE.contains(&kind) {
            return None;
        }
        let content = update.get("content")?;
        if content.get("type")?.as_str()? != "text" {
            return None;
        }
        Some(TextChunk {
            key: Key {
                kind: kind.to_owned(),
                session_id: params.get("sessionId").cloned().unwrap_or(Value::Null),
                message_id: update.get("messageId").cloned().unwrap_or(Value::Null),
            },
            text: content.get("text")?.as_str()?.to_owned(),
        })
    }
}

/// Consecutive mergeable chunks seen so far.
struct Run<'a> {
    key: Key,
    text: String,
    first: &'a JournalEntry,
    last: &'a JournalEntry,
    count: usize,
}

impl Run<'_> {
    fn finish(self) -> JournalEntry {
        if self.count == 1 {
            return self.first.clone();
        }
        match merged_body(&self.last.body, self.text, self.last.seq) {
            Some(body) => JournalEntry {
                body: body.into(),
                ..self.last.clone()
            },
            // Unreachable: the last body parsed as a text chunk a moment ago. Keeping only the
            // last chunk would lose text, so give up on this run rather than guess.
            None => self.last.clone(),
        }
    }
}

/// `body` (a text chunk) with its text replaced by `text` and `_meta.acpd.seq` set to `seq`.
fn merged_body(body: &str, text: String, seq: i64) -> Option<String> {
    let mut body: Value = serde_json::from_str(body).ok()?;
    let params = body.get_mut("params")?.as_object_mut()?;
    let content = params
        .get_mut("update")?
        .get_mut("content")?
        .as_object_mut()?;
    content.insert("text".to_owned(), Value::String(text));
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()?;
    let acpd = meta
        .entry("acpd")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()?;
    acpd.insert("seq".to_owned(), Value::from(seq));
    serde_json::to_string(&body).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{Formed, Replay, compact};
    use acpd_store::JournalEntry;

    fn entry(seq: i64, body: Value) -> JournalEntry {
        let kind = body["params"]["update"]["sessionUpdate"]
            .as_str()
            .unwrap_or("other")
            .to_owned();
        JournalEntry {
            session_id: "s1".into(),
            seq,
            kind: kind.into(),
            body: body.to_string().into(),
            at_ms: 1000 + seq,
        }
    }

    fn chunk(seq: i64, kind: &str, text: &str, message_id: Option<&str>) -> JournalEntry {
        let mut update = json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}});
        if let Some(id) = message_id {
            update["messageId"] = json!(id);
        }
        entry(
            seq,
            json!({"jsonrpc": "2.0", "method": "session/update",
                   "params": {"sessionId": "s1", "update": update, "_meta": {"acpd": {"seq": seq}}}}),
        )
    }

    fn body(e: &JournalEntry) -> Value {
        serde_json::from_str(&e.body).unwrap_or(Value::Null)
    }

    #[test]
    fn merges_a_run_into_its_last_entry() {
        let out = compact(&[
            chunk(1, "agent_message_chunk", "Hel", None),
            chunk(2, "agent_message_chunk", "lo, ", None),
            chunk(3, "agent_message_chunk", "wörld", None),
        ]);
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].seq, out[0].at_ms, &*out[0].kind),
            (3, 1003, "agent_message_chunk")
        );
        let b = body(&out[0]);
        assert_eq!(b["params"]["update"]["content"]["text"], "Hello, wörld");
        assert_eq!(b["params"]["_meta"]["acpd"]["seq"], 3);
        assert_eq!(b["params"]["sessionId"], "s1");
        assert_eq!(b["method"], "session/update");
    }

    #[test]
    fn kinds_and_message_ids_split_runs() {
        let out = compact(&[
            chunk(1, "user_message_chunk", "a", None),
            chunk(2, "agent_thought_chunk", "b", None),
            chunk(3, "agent_thought_chunk", "c", None),
            chunk(4, "agent_message_chunk", "d", Some("m1")),
            chunk(5, "agent_message_chunk", "e", Some("m1")),
            chunk(6, "agent_message_chunk", "f", Some("m2")),
            chunk(7, "agent_message_chunk", "g", None),
        ]);
        let seqs: Vec<i64> = out.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 3, 5, 6, 7]);
        assert_eq!(body(&out[1])["params"]["update"]["content"]["text"], "bc");
        assert_eq!(body(&out[2])["params"]["update"]["content"]["text"], "de");
        assert_eq!(body(&out[2])["params"]["update"]["messageId"], "m1");
    }

    #[test]
    fn other_entries_pass_through_byte_for_byte_and_break_runs() {
        let tool = entry(
            2,
            json!({"jsonrpc": "2.0", "method": "session/update",
                   "params": {"sessionId": "s1", "update": {"sessionUpdate": "tool_call", "toolCallId": "t"}}}),
        );
        let image = entry(
            4,
            json!({"jsonrpc": "2.0", "method": "session/update",
                   "params": {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk",
                   "content": {"type": "image", "data": "AA==", "mimeType": "image/png"}}}}),
        );
        let mut odd = chunk(6, "agent_message_chunk", "x", None);
        odd.body = "{ \"not\": \"parsed the same\" }".into();
        let input = vec![
            chunk(1, "agent_message_chunk", "a", None),
            tool.clone(),
            chunk(3, "agent_message_chunk", "b", None),
            image.clone(),
            chunk(5, "agent_message_chunk", "c", None),
            odd.clone(),
        ];
        // No run is longer than one entry, so nothing changes at all.
        assert_eq!(compact(&input), input);
    }

    #[test]
    fn single_chunks_keep_their_exact_text() {
        let mut e = chunk(9, "agent_message_chunk", "x", None);
        e.body = format!("{}  ", e.body).into();
        assert_eq!(compact(std::slice::from_ref(&e)), vec![e]);
        assert!(compact(&[]).is_empty());
    }

    fn state(seq: i64, kind: &str) -> JournalEntry {
        entry(
            seq,
            json!({"jsonrpc": "2.0", "method": "session/update",
                   "params": {"sessionId": "s1", "update": {"sessionUpdate": kind, "n": seq}}}),
        )
    }

    fn texts(entries: &[JournalEntry]) -> Vec<String> {
        entries
            .iter()
            .map(|e| {
                let b = body(e);
                match b["params"]["update"]["content"]["text"].as_str() {
                    Some(t) => t.to_owned(),
                    None => b["params"]["update"]["sessionUpdate"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                }
            })
            .collect()
    }

    #[test]
    fn a_replay_merges_messages_and_states_the_latest_state_once_at_the_end() {
        let mut r = Replay::default();
        let formed = r.page(
            0,
            vec![
                state(1, "available_commands_update"),
                chunk(2, "user_message_chunk", "hi", None),
                chunk(3, "agent_message_chunk", "a", None),
                state(4, "current_mode_update"),
                chunk(5, "agent_message_chunk", "b", None),
                state(6, "available_commands_update"),
                tool_call(7),
            ],
            true,
        );
        // The state entries between chunks no longer split the message.
        assert_eq!(texts(&formed.entries), ["hi", "ab", "tool_call"]);
        assert_eq!(formed.upto, 7);
        let st = r.state();
        assert_eq!(
            st.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [6, 4],
            "the latest of each, commands then mode"
        );
        assert!(r.state().is_empty(), "once");
    }

    #[test]
    fn a_message_that_may_go_on_waits_for_the_next_page() {
        let mut r = Replay::default();
        let first = r.page(
            10,
            vec![
                chunk(11, "user_message_chunk", "q", None),
                chunk(12, "agent_message_chunk", "a", None),
                chunk(13, "agent_message_chunk", "b", None),
            ],
            false,
        );
        assert_eq!(texts(&first.entries), ["q"]);
        assert_eq!(first.upto, 11, "read again from the message's start");
        let next = r.page(
            first.upto,
            vec![
                chunk(12, "agent_message_chunk", "a", None),
                chunk(13, "agent_message_chunk", "b", None),
                chunk(14, "agent_message_chunk", "c", None),
            ],
            true,
        );
        assert_eq!(texts(&next.entries), ["abc"]);
        assert_eq!((next.entries[0].seq, next.upto), (14, 14));
    }

    #[test]
    fn a_page_that_is_one_message_goes_as_it_is_and_an_empty_page_keeps_the_position() {
        let mut r = Replay::default();
        let page = vec![
            chunk(1, "agent_message_chunk", "a", None),
            chunk(2, "agent_message_chunk", "b", None),
        ];
        let formed = r.page(0, page, false);
        assert_eq!(
            (texts(&formed.entries), formed.upto),
            (vec!["ab".to_owned()], 2)
        );
        let only_state = r.page(2, vec![state(3, "config_option_update")], false);
        assert_eq!((only_state.entries.len(), only_state.upto), (0, 3));
        assert_eq!(
            r.page(3, vec![], true),
            Formed {
                entries: vec![],
                upto: 3
            }
        );
        assert_eq!(r.state().len(), 1);
    }

    fn tool_call(seq: i64) -> JournalEntry {
        entry(
            seq,
            json!({"jsonrpc": "2.0", "method": "session/update",
                   "params": {"sessionId": "s1", "update": {"sessionUpdate": "tool_call", "toolCallId": "t"}}}),
        )
    }

    #[test]
    fn adds_meta_when_missing() {
        let plain = |seq: i64, text: &str| {
            entry(
                seq,
                json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
                       "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}}),
            )
        };
        let out = compact(&[plain(7, "a"), plain(8, "b")]);
        assert_eq!(out.len(), 1);
        assert_eq!(body(&out[0])["params"]["_meta"]["acpd"]["seq"], 8);
        assert_eq!(body(&out[0])["params"]["update"]["content"]["text"], "ab");
    }
}
