//! The events of one Streamable HTTP connection's SSE stream: numbered from 1 in order, each
//! with the label it is sent under as its SSE `id:` (the number itself on the connection's
//! stream, the journal seq on a session's: `Stream` in `http_stream.rs` decides), held until
//! delivered, and kept a while after so a GET with `Last-Event-ID` can replay them.
//! Pure: no I/O, no clock.

use std::collections::VecDeque;

/// `Last-Event-ID` names an event no longer held (or never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("those events are not held any more")]
pub struct Gone;

#[derive(Debug)]
pub struct EventLog {
    /// `(number, label, text)`, numbers consecutive.
    events: VecDeque<(u64, String, String)>,
    /// The id the next pushed event gets.
    next_id: u64,
    /// The id the stream delivers next.
    cursor: u64,
    bytes: usize,
    undelivered_bytes: usize,
    max_bytes: usize,
}

impl EventLog {
    pub fn new(max_bytes: usize) -> EventLog {
        EventLog {
            events: VecDeque::new(),
            next_id: 1,
            cursor: 1,
            bytes: 0,
            undelivered_bytes: 0,
            max_bytes,
        }
    }

    /// Whether another event may be taken: the undelivered ones stay under the limit (beyond
    /// it the connection stops reading, and the session layer lags it like a slow socket).
    pub fn has_room(&self) -> bool {
        self.undelivered_bytes < self.max_bytes
    }

    /// The number the next pushed event gets.
    pub fn next_number(&self) -> u64 {
        self.next_id
    }

    /// Appends an event under `label` (its number if `None`) and returns its number. Delivered
    /// events are dropped, oldest first, while the log is over its limit; undelivered ones
    /// never are.
    pub fn push(&mut self, label: Option<String>, text: String) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.bytes += text.len();
        self.undelivered_bytes += text.len();
        let label = label.unwrap_or_else(|| id.to_string());
        self.events.push_back((id, label, text));
        while self.bytes > self.max_bytes {
            match self.events.front() {
                Some((first, _, t)) if *first < self.cursor => {
                    self.bytes -= t.len();
                    self.events.pop_front();
                }
                _ => break,
            }
        }
        id
    }

    /// The next event to deliver, if any: `(label, text)`.
    pub fn next(&self) -> Option<(&str, &str)> {
        let first = self.events.front()?.0;
        let i = usize::try_from(self.cursor.checked_sub(first)?).ok()?;
        self.events.get(i).map(|(_, l, t)| (l.as_str(), t.as_str()))
    }

    /// The number of the newest held event sent under `label` (a `session/load` sends the
    /// same seqs again: the latest counts).
    pub fn find(&self, label: &str) -> Option<u64> {
        self.events
            .iter()
            .rev()
            .find(|(_, l, _)| l == label)
            .map(|(n, _, _)| *n)
    }

    /// Marks the event `next` returned as delivered.
    pub fn advance(&mut self) {
        if let Some((_, t)) = self.next() {
            self.undelivered_bytes -= t.len();
            self.cursor += 1;
        }
    }

    /// A new stream attaches. Without `last_event_id` (an event number) it goes on where the
    /// last one stopped; with it, it starts right after that event (events the old stream
    /// delivered after it are delivered again).
    pub fn resume(&mut self, last_event_id: Option<u64>) -> Result<(), Gone> {
        let Some(last) = last_event_id else {
            return Ok(());
        };
        let from = last.saturating_add(1);
        let first = self.events.front().map_or(self.next_id, |e| e.0);
        if from < first || from > self.next_id {
            return Err(Gone);
        }
        self.cursor = from;
        self.undelivered_bytes = self
            .events
            .iter()
            .filter(|(id, _, _)| *id >= from)
            .map(|(_, _, t)| t.len())
            .sum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(log: &mut EventLog) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Some((id, t)) = log.next() {
            out.push((id.to_owned(), t.to_owned()));
            log.advance();
        }
        out
    }

    #[test]
    fn events_are_numbered_and_delivered_once() {
        let mut log = EventLog::new(1000);
        assert_eq!(log.push(None, "a".into()), 1);
        assert_eq!(log.push(None, "b".into()), 2);
        assert_eq!(
            drain(&mut log),
            vec![("1".into(), "a".into()), ("2".into(), "b".into())]
        );
        assert!(log.next().is_none());
        log.push(None, "c".into());
        assert_eq!(drain(&mut log), vec![("3".into(), "c".into())]);
    }

    #[test]
    fn last_event_id_replays_what_came_after_it() {
        let mut log = EventLog::new(1000);
        for t in ["a", "b", "c"] {
            log.push(None, t.into());
        }
        drain(&mut log);
        log.resume(Some(1)).unwrap();
        assert_eq!(
            drain(&mut log),
            vec![("2".into(), "b".into()), ("3".into(), "c".into())]
        );
        log.resume(Some(3)).unwrap();
        assert!(log.next().is_none());
        log.resume(None).unwrap();
        assert!(log.next().is_none());
        assert_eq!(log.resume(Some(4)), Err(Gone));
    }

    #[test]
    fn delivered_events_go_when_over_the_limit_undelivered_stay() {
        let mut log = EventLog::new(4);
        log.push(None, "aa".into());
        log.push(None, "bb".into());
        assert!(!log.has_room());
        log.push(None, "cc".into());
        // Nothing delivered: nothing dropped.
        assert_eq!(log.next(), Some(("1", "aa")));
        log.advance();
        assert!(!log.has_room(), "bb and cc are still undelivered");
        log.advance();
        assert!(log.has_room());
        log.push(None, "dd".into());
        // "aa" and "bb" were delivered and the log was over: gone; replay of them refused.
        assert_eq!(log.resume(Some(0)), Err(Gone));
        assert_eq!(log.resume(Some(1)), Err(Gone));
        log.resume(Some(2)).unwrap();
        assert_eq!(
            drain(&mut log),
            vec![("3".into(), "cc".into()), ("4".into(), "dd".into())]
        );
    }

    #[test]
    fn events_are_found_by_their_label_the_newest_first() {
        let mut log = EventLog::new(1000);
        log.push(Some("7".into()), "a".into());
        log.push(Some("7.2".into()), "answer".into());
        log.push(Some("7".into()), "a again".into());
        drain(&mut log);
        assert_eq!(log.find("7"), Some(3));
        assert_eq!(log.find("7.2"), Some(2));
        assert_eq!(log.find("8"), None);
        log.resume(log.find("7.2")).unwrap();
        assert_eq!(drain(&mut log), vec![("7".into(), "a again".into())]);
    }
}
