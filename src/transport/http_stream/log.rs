//! The events of one Streamable HTTP connection's SSE stream: numbered from 1 (the SSE `id:`),
//! held until delivered, and kept a while after so a GET with `Last-Event-ID` can replay them.
//! Pure: no I/O, no clock.

use std::collections::VecDeque;

/// `Last-Event-ID` names an event no longer held (or never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("event {0} is not held any more: reconnect and session/load")]
pub struct Gone(pub u64);

#[derive(Debug)]
pub struct EventLog {
    /// `(id, text)`, ids consecutive.
    events: VecDeque<(u64, String)>,
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

    /// Appends an event and returns its id. Delivered events are dropped, oldest first, while
    /// the log is over its limit; undelivered ones never are.
    pub fn push(&mut self, text: String) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.bytes += text.len();
        self.undelivered_bytes += text.len();
        self.events.push_back((id, text));
        while self.bytes > self.max_bytes {
            match self.events.front() {
                Some((first, t)) if *first < self.cursor => {
                    self.bytes -= t.len();
                    self.events.pop_front();
                }
                _ => break,
            }
        }
        id
    }

    /// The next event to deliver, if any.
    pub fn next(&self) -> Option<(u64, &str)> {
        let first = self.events.front()?.0;
        let i = usize::try_from(self.cursor.checked_sub(first)?).ok()?;
        self.events.get(i).map(|(id, t)| (*id, t.as_str()))
    }

    /// Marks the event `next` returned as delivered.
    pub fn advance(&mut self) {
        if let Some((_, t)) = self.next() {
            self.undelivered_bytes -= t.len();
            self.cursor += 1;
        }
    }

    /// A new stream attaches. Without `last_event_id` it goes on where the last one stopped;
    /// with it, it starts right after that event (events the old stream delivered after it
    /// are delivered again).
    pub fn resume(&mut self, last_event_id: Option<u64>) -> Result<(), Gone> {
        let Some(last) = last_event_id else {
            return Ok(());
        };
        let from = last.saturating_add(1);
        let first = self.events.front().map_or(self.next_id, |e| e.0);
        if from < first || from > self.next_id {
            return Err(Gone(last));
        }
        self.cursor = from;
        self.undelivered_bytes = self
            .events
            .iter()
            .filter(|(id, _)| *id >= from)
            .map(|(_, t)| t.len())
            .sum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(log: &mut EventLog) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        while let Some((id, t)) = log.next() {
            out.push((id, t.to_owned()));
            log.advance();
        }
        out
    }

    #[test]
    fn events_are_numbered_and_delivered_once() {
        let mut log = EventLog::new(1000);
        assert_eq!(log.push("a".into()), 1);
        assert_eq!(log.push("b".into()), 2);
        assert_eq!(drain(&mut log), vec![(1, "a".into()), (2, "b".into())]);
        assert!(log.next().is_none());
        log.push("c".into());
        assert_eq!(drain(&mut log), vec![(3, "c".into())]);
    }

    #[test]
    fn last_event_id_replays_what_came_after_it() {
        let mut log = EventLog::new(1000);
        for t in ["a", "b", "c"] {
            log.push(t.into());
        }
        drain(&mut log);
        log.resume(Some(1)).unwrap();
        assert_eq!(drain(&mut log), vec![(2, "b".into()), (3, "c".into())]);
        log.resume(Some(3)).unwrap();
        assert!(log.next().is_none());
        log.resume(None).unwrap();
        assert!(log.next().is_none());
        assert_eq!(log.resume(Some(4)), Err(Gone(4)));
    }

    #[test]
    fn delivered_events_go_when_over_the_limit_undelivered_stay() {
        let mut log = EventLog::new(4);
        log.push("aa".into());
        log.push("bb".into());
        assert!(!log.has_room());
        log.push("cc".into());
        // Nothing delivered: nothing dropped.
        assert_eq!(log.next(), Some((1, "aa")));
        log.advance();
        assert!(!log.has_room(), "bb and cc are still undelivered");
        log.advance();
        assert!(log.has_room());
        log.push("dd".into());
        // "aa" and "bb" were delivered and the log was over: gone; replay of them refused.
        assert_eq!(log.resume(Some(0)), Err(Gone(0)));
        assert_eq!(log.resume(Some(1)), Err(Gone(1)));
        log.resume(Some(2)).unwrap();
        assert_eq!(drain(&mut log), vec![(3, "cc".into()), (4, "dd".into())]);
    }
}
