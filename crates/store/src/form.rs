//! How an entry's body is kept on disk: the store knows no ACP, so its owner may give it a
//! `BodyForm` that leaves out of a stored body what the row's own columns rebuild.
//!
//! Nearly every journal entry is a `session/update` whose text repeats the session id and the
//! seq, which the row holds anyway, inside a fixed head and tail: about half of a short
//! update's bytes. The daemon's form (`acpd::session::journal_form`) stores only the rest, so
//! each update costs half the bytes written (twice on SQLite: WAL, then the checkpoint) and
//! half the disk. Every read gives back the exact text appended.

use std::fmt::Debug;

/// A reversible way to store a body shorter, given its entry's session id and seq.
///
/// Contract: `expand(s, q, shrink(s, q, b)?, out)` appends `b` to `out` and is true, and it is
/// false (`out` untouched) for every body `shrink` declined (stored as it came). A shrunk body
/// must not look like a body stored as it came, to this form: that is how reads tell them
/// apart.
pub trait BodyForm: Debug + Send + Sync + 'static {
    /// What to store of `body`, or `None` to store it as it is.
    fn shrink<'a>(&self, session_id: &str, seq: i64, body: &'a str) -> Option<&'a str>;
    /// Appends the body that `stored` was shrunk from to `out`; false when `stored` is a body
    /// as it came. (A buffer the caller reuses: a read of a page allocates once per entry.)
    fn expand(&self, session_id: &str, seq: i64, stored: &str, out: &mut String) -> bool;
}

/// Bodies stored as they come: the store's default, for stores that journal no updates
/// (admin commands) and for tests of the store itself. A journal written with another form
/// must be opened with that form: this one returns shrunk bodies as stored.
#[derive(Debug, Default, Clone, Copy)]
pub struct Verbatim;

impl BodyForm for Verbatim {
    fn shrink<'a>(&self, _: &str, _: i64, _: &'a str) -> Option<&'a str> {
        None
    }

    fn expand(&self, _: &str, _: i64, _: &str, _: &mut String) -> bool {
        false
    }
}
