//! Row decoding shared by both backends, and the opaque `session/list` cursor.

use sqlx::Row;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;

use super::pack::Row as JournalRow;
use super::{PrincipalRow, SessionRow, StoreError, TokenRow};

/// Column list matching `session_row`; every session query selects exactly these.
pub(crate) const SESSION_COLUMNS: &str = "id, principal_id, agent, agent_session_id, cwd, \
     additional_dirs, title, mode_id, config_values, meta, created_at_ms, updated_at_ms, closed, \
     last_seq, owner_instance, lease_until_ms";

/// Typed column access, implemented once per backend so the decoders below are written once.
pub(crate) trait Columns {
    fn text(&self, col: &str) -> Result<String, sqlx::Error>;
    fn opt_text(&self, col: &str) -> Result<Option<String>, sqlx::Error>;
    fn int(&self, col: &str) -> Result<i64, sqlx::Error>;
    fn int32(&self, col: &str) -> Result<i32, sqlx::Error>;
    fn opt_int(&self, col: &str) -> Result<Option<i64>, sqlx::Error>;
    fn flag(&self, col: &str) -> Result<bool, sqlx::Error>;
}

macro_rules! impl_columns {
    ($row:ty) => {
        impl Columns for $row {
            fn text(&self, col: &str) -> Result<String, sqlx::Error> {
                self.try_get(col)
            }
            fn opt_text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
                self.try_get(col)
            }
            fn int(&self, col: &str) -> Result<i64, sqlx::Error> {
                self.try_get(col)
            }
            fn int32(&self, col: &str) -> Result<i32, sqlx::Error> {
                self.try_get(col)
            }
            fn opt_int(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
                self.try_get(col)
            }
            fn flag(&self, col: &str) -> Result<bool, sqlx::Error> {
                self.try_get(col)
            }
        }
    };
}
impl_columns!(SqliteRow);
impl_columns!(PgRow);

pub(crate) fn session_row(r: &impl Columns) -> Result<SessionRow, sqlx::Error> {
    Ok(SessionRow {
        id: r.text("id")?,
        principal_id: r.text("principal_id")?,
        agent: r.text("agent")?,
        agent_session_id: r.opt_text("agent_session_id")?,
        cwd: r.text("cwd")?,
        additional_dirs: r.text("additional_dirs")?,
        title: r.opt_text("title")?,
        mode_id: r.opt_text("mode_id")?,
        config_values: r.text("config_values")?,
        meta: r.text("meta")?,
        created_at_ms: r.int("created_at_ms")?,
        updated_at_ms: r.int("updated_at_ms")?,
        closed: r.flag("closed")?,
        last_seq: r.int("last_seq")?,
        owner_instance: r.opt_text("owner_instance")?,
        lease_until_ms: r.opt_int("lease_until_ms")?,
    })
}

/// Column list matching `journal_row`.
pub(crate) const JOURNAL_COLUMNS: &str = "session_id, seq, n_entries, kind, body, at_ms";

/// One journal row: a pack of entries (`pack::Row::entries` splits it).
pub(crate) fn journal_row(r: &impl Columns) -> Result<JournalRow, sqlx::Error> {
    Ok(JournalRow {
        session_id: r.text("session_id")?,
        seq: r.int("seq")?,
        n_entries: r.int32("n_entries")?,
        kind: r.text("kind")?,
        body: r.text("body")?,
        at_ms: r.int("at_ms")?,
    })
}

pub(crate) fn token_row(r: &impl Columns) -> Result<TokenRow, sqlx::Error> {
    Ok(TokenRow {
        id: r.text("id")?,
        principal_id: r.text("principal_id")?,
        name: r.text("name")?,
        created_at_ms: r.int("created_at_ms")?,
        last_used_ms: r.opt_int("last_used_ms")?,
        revoked: r.flag("revoked")?,
    })
}

pub(crate) fn principal_row(r: &impl Columns) -> Result<PrincipalRow, sqlx::Error> {
    Ok(PrincipalRow {
        id: r.text("id")?,
        name: r.text("name")?,
        created_at_ms: r.int("created_at_ms")?,
    })
}

/// The list position after `(created_at_ms, id)`: lowercase hex of `"{created_at_ms}:{id}"`.
/// Keyset on the immutable creation key, so inserts and updates between pages never shift it.
pub(crate) fn encode_cursor(created_at_ms: i64, id: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let raw = format!("{created_at_ms}:{id}");
    let mut out = String::with_capacity(raw.len() * 2);
    for b in raw.bytes() {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

pub(crate) fn decode_cursor(cursor: &str) -> Result<(i64, String), StoreError> {
    fn nibble(c: u8) -> Result<u8, StoreError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(StoreError::InvalidCursor),
        }
    }
    let hex = cursor.as_bytes();
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return Err(StoreError::InvalidCursor);
    }
    let bytes = hex
        .chunks_exact(2)
        .map(|p| Ok((nibble(p[0])? << 4) | nibble(p[1])?))
        .collect::<Result<Vec<u8>, StoreError>>()?;
    let raw = String::from_utf8(bytes).map_err(|_| StoreError::InvalidCursor)?;
    let (created, id) = raw.split_once(':').ok_or(StoreError::InvalidCursor)?;
    let created = created
        .parse::<i64>()
        .map_err(|_| StoreError::InvalidCursor)?;
    if id.is_empty() {
        return Err(StoreError::InvalidCursor);
    }
    Ok((created, id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips() {
        let c = encode_cursor(1_700_000_000_123, "a:b-ü");
        assert_eq!(
            decode_cursor(&c).ok(),
            Some((1_700_000_000_123, "a:b-ü".to_owned()))
        );
        assert_eq!(
            decode_cursor(&c.to_uppercase()).ok(),
            Some((1_700_000_000_123, "a:b-ü".to_owned()))
        );
    }

    #[test]
    fn bad_cursors_are_rejected() {
        for bad in ["", "0", "zz", "3a", &encode_cursor(1, "")[..], "78797a"] {
            assert!(
                matches!(decode_cursor(bad), Err(StoreError::InvalidCursor)),
                "{bad}"
            );
        }
    }
}
