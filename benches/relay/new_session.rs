//! The `session/new` round trip of the `rt` section: sequential `session/new`s on one
//! connection, timed one by one.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use crate::procs::LineClient;

/// Sessions opened between two rounds of `session/close` on the acpd paths, so acpd's live
/// set stays as small as an editor's (the closes are pipelined and not timed).
const NEW_BATCH: usize = 100;
/// Untimed `session/new`s before the timed ones.
const NEW_WARM: usize = 50;

/// `n` sequential `session/new` on one connection, timed one by one. The scripted agent
/// answers at once and alone (`quiet`: no `available_commands_update` before the answer,
/// which would make it two messages and stall websocat's second on Nagle, as the prompt
/// round trip does); acpd also writes the session's row and starts its actor before it
/// answers. `close`: the sessions are closed a batch at a time (acpd emulates `session/close`;
/// the scripted agent has none).
pub fn timed(c: &mut LineClient, n: usize, close: bool) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(n);
    let mut open = Vec::with_capacity(NEW_BATCH);
    for i in 0..NEW_WARM + n {
        let t = Instant::now();
        let sid = c.new_session_quiet()?;
        if i >= NEW_WARM {
            times.push(t.elapsed());
        }
        open.push(sid);
        if open.len() == NEW_BATCH || i + 1 == NEW_WARM || i + 1 == NEW_WARM + n {
            if close {
                let ids = open
                    .drain(..)
                    .map(|sid| c.send("session/close", json!({ "sessionId": sid })))
                    .collect::<Result<Vec<_>>>()?;
                c.wait_all(&ids)?;
            }
            open.clear();
        }
    }
    Ok(times)
}
