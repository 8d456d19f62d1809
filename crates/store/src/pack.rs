//! Journal packs: how a run of entries is stored as one row, and read back (pure functions).
//!
//! A fast agent streams hundreds of updates per millisecond, and a row per update made the
//! database the bound of the whole update path (every row costs its binds, a table and an index
//! insert). So the writer stores a run of entries as one row: consecutive seqs of one session,
//! one kind and one `at_ms`, at most `PACK_MAX` of them. The row's `seq` is the first entry's,
//! `n_entries` says how many, and `body` holds their bodies joined by `'\n'`. Reading splits the
//! row back into exactly the entries that were appended, byte for byte; no caller of the store
//! sees a pack. A body that itself holds a newline is never packed (it gets a row of its own).
//!
//! Because every entry of a pack shares kind and time, and its seqs are consecutive, the
//! journal's SQL (counts, ranges, compaction's neighbour scan) still works per entry from the
//! row's columns alone: entry `i` of a row is at `seq + i`.

use std::borrow::Cow;
use std::sync::Arc;

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;

use super::JournalEntry;
use super::form::BodyForm;

/// The most entries one row holds. Reads that look for the row holding a seq start their index
/// range this far below it, so it bounds what such a read scans, and it caps one row's size.
pub(crate) const PACK_MAX: i64 = 256;

/// One journal row to insert, borrowed from a `NewEntry` or a `JournalEntry`; `body` is what
/// is stored of it (`BodyForm::shrink`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ins<'a> {
    pub session_id: &'a str,
    pub seq: i64,
    pub kind: &'a str,
    pub body: &'a str,
    pub at_ms: i64,
}

impl<'a> Ins<'a> {
    /// The entry `(session_id, seq, kind, body, at_ms)` as `form` stores it.
    pub fn new(
        form: &dyn BodyForm,
        session_id: &'a str,
        seq: i64,
        kind: &'a str,
        body: &'a str,
        at_ms: i64,
    ) -> Ins<'a> {
        Ins {
            session_id,
            seq,
            kind,
            body: form.shrink(session_id, seq, body).unwrap_or(body),
            at_ms,
        }
    }
}

/// One row to insert: `n_entries` entries from `seq` on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pack<'a> {
    pub session_id: &'a str,
    pub seq: i64,
    pub n_entries: i32,
    pub kind: &'a str,
    pub body: Cow<'a, str>,
    pub at_ms: i64,
}

/// The rows that store `entries` (any order, any sessions; a seq appears once per session).
/// Runs are cut where the session, kind or time changes, where a seq is skipped, at `PACK_MAX`,
/// and around any body holding a newline.
pub(crate) fn pack<'a>(entries: &[Ins<'a>]) -> Vec<Pack<'a>> {
    let mut sorted: Vec<&Ins<'a>> = entries.iter().collect();
    // A batch interleaves sessions; each session's entries arrive in seq order, so this is
    // cheap, and it puts every run's entries side by side.
    sorted.sort_by(|a, b| (a.session_id, a.seq).cmp(&(b.session_id, b.seq)));
    let mut out = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let first = sorted[i];
        let mut end = i + 1;
        if !first.body.contains('\n') {
            while end < sorted.len() && (end - i) < PACK_MAX as usize {
                let (prev, next) = (sorted[end - 1], sorted[end]);
                let joins = next.session_id == first.session_id
                    && next.seq == prev.seq + 1
                    && next.kind == first.kind
                    && next.at_ms == first.at_ms
                    && !next.body.contains('\n');
                if !joins {
                    break;
                }
                end += 1;
            }
        }
        let run = &sorted[i..end];
        let body = match run {
            [one] => Cow::Borrowed(one.body),
            _ => {
                let len = run.iter().map(|e| e.body.len() + 1).sum::<usize>();
                let mut joined = String::with_capacity(len);
                for (k, e) in run.iter().enumerate() {
                    if k > 0 {
                        joined.push('\n');
                    }
                    joined.push_str(e.body);
                }
                Cow::Owned(joined)
            }
        };
        out.push(Pack {
            session_id: first.session_id,
            seq: first.seq,
            n_entries: run.len() as i32,
            kind: first.kind,
            body,
            at_ms: first.at_ms,
        });
        i = end;
    }
    out
}

/// One stored row, as read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub session_id: String,
    pub seq: i64,
    pub n_entries: i32,
    pub kind: String,
    pub body: String,
    pub at_ms: i64,
}

impl Row {
    /// The seq of its last entry.
    pub fn last_seq(&self) -> i64 {
        self.seq + i64::from(self.n_entries) - 1
    }

    /// What is stored of each entry, in seq order, with its seq. A body that does not split
    /// into `n_entries` parts is a corrupt row, reported rather than guessed at.
    pub fn stored(&self) -> Result<Vec<(i64, &str)>, sqlx::Error> {
        let parts: Vec<&str> = match self.n_entries {
            1 => vec![self.body.as_str()],
            _ => self.body.split('\n').collect(),
        };
        if self.n_entries < 1 || parts.len() != self.n_entries as usize {
            return Err(sqlx::Error::Decode(
                format!(
                    "journal row {}#{} holds {} entries, not the {} it says",
                    self.session_id,
                    self.seq,
                    parts.len(),
                    self.n_entries
                )
                .into(),
            ));
        }
        Ok((self.seq..).zip(parts).collect())
    }

    /// Its entries, in seq order, each body as it was appended (`form` expands what it shrank).
    pub fn entries(self, form: &dyn BodyForm) -> Result<Vec<JournalEntry>, sqlx::Error> {
        let session_id: Arc<str> = self.session_id.as_str().into();
        let kind: Arc<str> = self.kind.as_str().into();
        let mut buf = String::new();
        Ok(self
            .stored()?
            .into_iter()
            .map(|(seq, stored)| {
                buf.clear();
                let body = match form.expand(&session_id, seq, stored, &mut buf) {
                    true => buf.as_str(),
                    false => stored,
                };
                JournalEntry {
                    session_id: session_id.clone(),
                    seq,
                    kind: kind.clone(),
                    body: body.into(),
                    at_ms: self.at_ms,
                }
            })
            .collect())
    }
}

/// The entries of `rows` with `from <= seq <= to`, in seq order.
pub(crate) fn entries_within(
    rows: Vec<Row>,
    from: i64,
    to: i64,
    form: &dyn BodyForm,
) -> Result<Vec<JournalEntry>, sqlx::Error> {
    let mut out = Vec::new();
    for row in rows {
        if row.last_seq() < from || row.seq > to {
            continue;
        }
        out.extend(
            row.entries(form)?
                .into_iter()
                .filter(|e| e.seq >= from && e.seq <= to),
        );
    }
    Ok(out)
}

/// A batch's packs as the six arrays an `UNNEST` of journal rows takes, in the journal's column
/// order: one statement for the whole batch, whatever its size.
pub(crate) struct Columns<'a> {
    session_ids: Vec<&'a str>,
    seqs: Vec<i64>,
    counts: Vec<i32>,
    kinds: Vec<&'a str>,
    bodies: Vec<&'a str>,
    ats: Vec<i64>,
}

impl<'a> Columns<'a> {
    pub(crate) fn of(rows: &'a [Pack<'a>]) -> Self {
        let mut c = Columns {
            session_ids: Vec::with_capacity(rows.len()),
            seqs: Vec::with_capacity(rows.len()),
            counts: Vec::with_capacity(rows.len()),
            kinds: Vec::with_capacity(rows.len()),
            bodies: Vec::with_capacity(rows.len()),
            ats: Vec::with_capacity(rows.len()),
        };
        for r in rows {
            c.session_ids.push(r.session_id);
            c.seqs.push(r.seq);
            c.counts.push(r.n_entries);
            c.kinds.push(r.kind);
            c.bodies.push(r.body.as_ref());
            c.ats.push(r.at_ms);
        }
        c
    }

    /// Binds the six arrays as the query's next parameters.
    pub(crate) fn bind<'q>(
        self,
        q: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments>
    where
        'a: 'q,
    {
        q.bind(self.session_ids)
            .bind(self.seqs)
            .bind(self.counts)
            .bind(self.kinds)
            .bind(self.bodies)
            .bind(self.ats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::form::Verbatim;

    /// Bodies `SID#SEQ~REST` are stored as `~REST`; others as they are.
    #[derive(Debug)]
    struct Tilde;

    impl BodyForm for Tilde {
        fn shrink<'a>(&self, session_id: &str, seq: i64, body: &'a str) -> Option<&'a str> {
            let head = format!("{session_id}#{seq}");
            body.strip_prefix(&head)
                .filter(|rest| rest.starts_with('~'))
        }

        fn expand(&self, session_id: &str, seq: i64, stored: &str, out: &mut String) -> bool {
            use std::fmt::Write as _;
            let shrunk = stored.starts_with('~');
            if shrunk {
                let _ = write!(out, "{session_id}#{seq}{stored}");
            }
            shrunk
        }
    }

    fn ins<'a>(session_id: &'a str, seq: i64, kind: &'a str, body: &'a str, at_ms: i64) -> Ins<'a> {
        Ins {
            session_id,
            seq,
            kind,
            body,
            at_ms,
        }
    }

    fn row(p: &Pack<'_>) -> Row {
        Row {
            session_id: p.session_id.into(),
            seq: p.seq,
            n_entries: p.n_entries,
            kind: p.kind.into(),
            body: p.body.to_string(),
            at_ms: p.at_ms,
        }
    }

    fn round_trip(entries: &[Ins<'_>]) -> Vec<JournalEntry> {
        let mut out: Vec<JournalEntry> = pack(entries)
            .iter()
            .flat_map(|p| row(p).entries(&Verbatim).unwrap())
            .collect();
        out.sort_by(|a, b| (&a.session_id, a.seq).cmp(&(&b.session_id, b.seq)));
        out
    }

    #[test]
    fn a_run_of_one_session_kind_and_time_is_one_row() {
        let e: Vec<Ins<'_>> = (1..=5).map(|s| ins("a", s, "k", "{\"x\":1}", 7)).collect();
        let p = pack(&e);
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].seq, p[0].n_entries), (1, 5));
        assert_eq!(round_trip(&e).len(), 5);
    }

    #[test]
    fn interleaved_sessions_are_packed_per_session() {
        let e = [
            ins("a", 1, "k", "a1", 0),
            ins("b", 9, "k", "b9", 0),
            ins("a", 2, "k", "a2", 0),
            ins("b", 10, "k", "b10", 0),
        ];
        let p = pack(&e);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].body, "a1\na2");
        assert_eq!(p[1].body, "b9\nb10");
    }

    #[test]
    fn runs_break_at_kind_time_gaps_newlines_and_the_cap() {
        let e = [
            ins("a", 1, "k", "1", 0),
            ins("a", 2, "j", "2", 0),   // kind
            ins("a", 3, "j", "3", 1),   // time
            ins("a", 5, "j", "5", 1),   // gap
            ins("a", 6, "j", "6\n", 1), // newline: alone
            ins("a", 7, "j", "7", 1),
        ];
        let p = pack(&e);
        let shape: Vec<(i64, i32)> = p.iter().map(|p| (p.seq, p.n_entries)).collect();
        assert_eq!(shape, [(1, 1), (2, 1), (3, 1), (5, 1), (6, 1), (7, 1)]);
        let bodies: Vec<String> = round_trip(&e)
            .into_iter()
            .map(|e| e.body.to_string())
            .collect();
        assert_eq!(bodies, ["1", "2", "3", "5", "6\n", "7"]);

        let long: Vec<Ins<'_>> = (0..600).map(|s| ins("a", s, "k", "b", 0)).collect();
        let sizes: Vec<i32> = pack(&long).iter().map(|p| p.n_entries).collect();
        assert_eq!(sizes, [256, 256, 88]);
        assert_eq!(round_trip(&long).len(), 600);
    }

    #[test]
    fn a_form_stores_bodies_shorter_and_reads_give_them_back_exactly() {
        let bodies: Vec<String> = (1..=4)
            .map(|s| match s {
                3 => "kept as it is".to_owned(),
                _ => format!("a#{s}~text {s}"),
            })
            .collect();
        let e: Vec<Ins<'_>> = (1..=4)
            .map(|s| Ins::new(&Tilde, "a", s, "k", &bodies[s as usize - 1], 0))
            .collect();
        let p = pack(&e);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].body, "~text 1\n~text 2\nkept as it is\n~text 4");
        let back: Vec<String> = entries_within(vec![row(&p[0])], 1, 4, &Tilde)
            .unwrap()
            .iter()
            .map(|e| e.body.to_string())
            .collect();
        assert_eq!(back, bodies);
        // A body for another seq or session is not shrunk by what it happens to start with.
        assert_eq!(Ins::new(&Tilde, "a", 9, "k", "a#1~x", 0).body, "a#1~x");
        assert_eq!(Ins::new(&Tilde, "b", 1, "k", "a#1~x", 0).body, "a#1~x");
    }

    #[test]
    fn a_row_that_does_not_split_into_its_count_is_an_error() {
        let bad = Row {
            session_id: "a".into(),
            seq: 1,
            n_entries: 3,
            kind: "k".into(),
            body: "x\ny".into(),
            at_ms: 0,
        };
        assert!(bad.entries(&Verbatim).is_err());
    }

    #[test]
    fn entries_within_cuts_rows_at_both_ends() {
        let e: Vec<Ins<'_>> = (1..=10).map(|s| ins("a", s, "k", "b", 0)).collect();
        let rows: Vec<Row> = pack(&e).iter().map(row).collect();
        let seqs: Vec<i64> = entries_within(rows, 4, 6, &Verbatim)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [4, 5, 6]);
    }
}
