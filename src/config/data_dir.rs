//! The data directory is private to the daemon's user: it holds every conversation (the
//! SQLite journal), the first-start token and the built-in agent's transcripts.
//!
//! The directory is created 0700; an existing one that group or others may enter is
//! tightened to its owner's bits, with a warning (only a warning when acpd does not own it,
//! e.g. a volume mounted by root). The SQLite database is created 0600 before SQLite opens it,
//! and SQLite gives its -wal and -shm files the database's own mode.
//!
//! Explicit modes rather than a 0077 process umask: hosted agents and the built-in agent's
//! tools create files in the user's work trees, and those keep the umask acpd was started
//! with.

use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Config;

/// The bits that let anyone but the owner in.
const NOT_OWNER: u32 = 0o077;

#[derive(Debug, thiserror::Error)]
#[error("cannot prepare {path}: {source}")]
pub struct DataDirError {
    pub path: PathBuf,
    pub source: io::Error,
}

/// The data directory, 0700, and for a SQLite store its database file, 0600.
pub fn prepare(config: &Config) -> Result<(), DataDirError> {
    private_dir(&config.data_dir)?;
    if let Some(db) = sqlite_file(&config.store_url) {
        private_db(&db)?;
    }
    Ok(())
}

/// Creates `dir` (and missing parents) 0700, or tightens an existing one.
fn private_dir(dir: &Path) -> Result<(), DataDirError> {
    let err = |source| DataDirError {
        path: dir.to_owned(),
        source,
    };
    match std::fs::metadata(dir) {
        Ok(_) => tighten(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err),
        Err(e) => Err(err(e)),
    }
}

/// Creates the database file 0600 unless it exists; tightens it and SQLite's side files if
/// they do. A missing parent directory is left to the store, which reports it.
fn private_db(db: &Path) -> Result<(), DataDirError> {
    if db
        .parent()
        .is_some_and(|p| !p.as_os_str().is_empty() && !p.exists())
    {
        return Ok(());
    }
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(db);
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            tighten(db)?;
            for suffix in ["-wal", "-shm"] {
                let mut side = db.as_os_str().to_owned();
                side.push(suffix);
                if Path::new(&side).exists() {
                    tighten(Path::new(&side))?;
                }
            }
            Ok(())
        }
        Err(source) => Err(DataDirError {
            path: db.to_owned(),
            source,
        }),
    }
}

/// Drops group and other bits from `path`'s mode, warning when there were any.
fn tighten(path: &Path) -> Result<(), DataDirError> {
    let mode = std::fs::metadata(path)
        .map_err(|source| DataDirError {
            path: path.to_owned(),
            source,
        })?
        .permissions()
        .mode();
    if mode & NOT_OWNER == 0 {
        return Ok(());
    }
    let tight = mode & 0o7777 & !NOT_OWNER;
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(tight)) {
        Ok(()) => tracing::warn!(
            "{} was open to other users (mode {:o}); tightened to {tight:o}",
            path.display(),
            mode & 0o7777
        ),
        Err(e) => tracing::warn!(
            "{} is open to other users (mode {:o}) and cannot be tightened ({e}): what acpd \
             keeps there is readable by them",
            path.display(),
            mode & 0o7777
        ),
    }
    Ok(())
}

/// The file a `sqlite:` URL names, the way sqlx reads it; `None` for an in-memory database
/// or a name acpd would have to decode (`%`), which is left to SQLite's own mode.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
    if name.is_empty() || name == ":memory:" || name.contains('%') || query.contains("mode=memory")
    {
        return None;
    }
    Some(PathBuf::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(
            sqlite_file("sqlite:///var/lib/acpd/acpd.db"),
            Some(PathBuf::from("/var/lib/acpd/acpd.db"))
        );
        assert_eq!(
            sqlite_file("sqlite:rel.db?mode=rwc"),
            Some(PathBuf::from("rel.db"))
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("sqlite://x.db?mode=memory"), None);
        assert_eq!(sqlite_file("postgres://u@h/db"), None);
    }
}
