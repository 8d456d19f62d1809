//! Filesystem roots per principal: the directories a principal's sessions may name as `cwd`
//! and `additionalDirectories`. `[roots]` maps a principal's name to its directories,
//! `default_roots` is for everyone else; empty means anywhere. Whatever the roots, acpd's
//! data directory (every user's transcripts and the token file) is never reachable: a root
//! that contains it, or lies inside it, is a configuration error, and a session directory
//! that contains it (`$HOME` around `~/.local/share/acpd` too), or lies inside it, is
//! refused, roots or not. The built-in agent's tools refuse it on their own as well.
//!
//! Lexical and pure: the caller resolves symlinks first (`resolve`), so a link into the data
//! directory is judged by where it leads.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// The roots of every principal, validated against the data directory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FsRoots {
    /// By principal name.
    pub principals: BTreeMap<String, Vec<PathBuf>>,
    pub default: Vec<PathBuf>,
    /// Never reachable.
    pub data_dir: PathBuf,
}

/// Why a session's directories were refused (the -32602 message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutsideRoots {
    #[error("{0} is not an absolute path")]
    NotAbsolute(PathBuf),
    #[error("{0} is outside the directories this user may use")]
    Outside(PathBuf),
    #[error("{0} would reach acpd's data directory")]
    DataDir(PathBuf),
}

/// `..` and `.` removed without touching the disk; `None` for a relative path.
pub fn normalize(p: &Path) -> Option<PathBuf> {
    if !p.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// The path with symlinks resolved where it exists (its longest existing ancestor
/// otherwise), normalized; what `check` should be given.
pub fn resolve(p: &Path) -> Option<PathBuf> {
    let p = normalize(p)?;
    let mut existing = p.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            let mut out = real;
            out.extend(rest.iter().rev());
            return Some(out);
        }
        rest.push(existing.file_name()?.to_owned());
        existing = existing.parent()?;
    }
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// A `roots`/`default_roots` entry that cannot be a root.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    #[error("data_dir {} is not absolute", .0.display())]
    DataDirNotAbsolute(PathBuf),
    #[error("root {} is not an absolute path", .0.display())]
    NotAbsolute(PathBuf),
    #[error("root {} would reach the data directory {}", root.display(), data_dir.display())]
    ReachesDataDir { root: PathBuf, data_dir: PathBuf },
}

impl FsRoots {
    /// Validates: every root absolute, none containing or inside the data directory.
    pub fn new(
        principals: BTreeMap<String, Vec<PathBuf>>,
        default: Vec<PathBuf>,
        data_dir: &Path,
    ) -> Result<FsRoots, RootsError> {
        // Resolved like the session paths will be, so a symlink on the way does not hide
        // an overlap.
        let data_dir =
            resolve(data_dir).ok_or_else(|| RootsError::DataDirNotAbsolute(data_dir.to_owned()))?;
        let checked = |roots: Vec<PathBuf>| -> Result<Vec<PathBuf>, RootsError> {
            roots
                .into_iter()
                .map(|r| {
                    let n = resolve(&r).ok_or_else(|| RootsError::NotAbsolute(r.clone()))?;
                    if overlaps(&n, &data_dir) {
                        return Err(RootsError::ReachesDataDir {
                            root: r,
                            data_dir: data_dir.clone(),
                        });
                    }
                    Ok(n)
                })
                .collect()
        };
        let default = checked(default)?;
        let principals = principals
            .into_iter()
            .map(|(name, roots)| Ok((name, checked(roots)?)))
            .collect::<Result<_, RootsError>>()?;
        Ok(FsRoots {
            principals,
            default,
            data_dir,
        })
    }

    /// The roots of `principal` (by name); empty: anywhere but the data directory.
    pub fn of(&self, principal: &str) -> &[PathBuf] {
        self.principals.get(principal).unwrap_or(&self.default)
    }

    /// The call for `session/new|load|resume`: `cwd` and `additionalDirectories` as the
    /// client gave them, symlinks resolved, then `check`ed.
    pub fn check_session(
        &self,
        principal: &str,
        cwd: &Path,
        additional: &[PathBuf],
    ) -> Result<(), OutsideRoots> {
        let given = std::iter::once(cwd).chain(additional.iter().map(PathBuf::as_path));
        let mut resolved = Vec::new();
        for p in given {
            resolved.push(resolve(p).ok_or_else(|| OutsideRoots::NotAbsolute(p.to_owned()))?);
        }
        self.check(principal, resolved.iter().map(PathBuf::as_path))
    }

    /// Whether `principal` may use `dirs` (resolved paths, see `resolve`).
    pub fn check<'a>(
        &self,
        principal: &str,
        dirs: impl IntoIterator<Item = &'a Path>,
    ) -> Result<(), OutsideRoots> {
        let roots = self.of(principal);
        for dir in dirs {
            let n = normalize(dir).ok_or_else(|| OutsideRoots::NotAbsolute(dir.to_owned()))?;
            // Inside it or around it: a session around it could name `data/token` as a
            // relative path (the file tools refuse it too; the session's cwd is what its
            // agent, hosted or not, is told to work in).
            if overlaps(&n, &self.data_dir) {
                return Err(OutsideRoots::DataDir(dir.to_owned()));
            }
            if !roots.is_empty() && !roots.iter().any(|r| n.starts_with(r)) {
                return Err(OutsideRoots::Outside(dir.to_owned()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn roots() -> FsRoots {
        let principals = BTreeMap::from([("alice".to_owned(), vec![p("/home/alice/src")])]);
        FsRoots::new(principals, vec![p("/srv/work")], &p("/var/lib/acpd")).unwrap()
    }

    #[test]
    fn each_principal_gets_its_roots_and_others_the_default() {
        let r = roots();
        assert_eq!(r.check("alice", [p("/home/alice/src/x").as_path()]), Ok(()));
        assert_eq!(
            r.check("alice", [p("/home/alice/src/../.ssh").as_path()]),
            Err(OutsideRoots::Outside(p("/home/alice/src/../.ssh")))
        );
        assert!(r.check("bob", [p("/home/alice/src").as_path()]).is_err());
        assert_eq!(r.check("bob", [p("/srv/work/b").as_path()]), Ok(()));
        // Every directory counts, not just the cwd.
        let dirs = [p("/srv/work"), p("/etc")];
        assert!(r.check("bob", dirs.iter().map(PathBuf::as_path)).is_err());
        assert!(matches!(
            r.check("bob", [p("work").as_path()]),
            Err(OutsideRoots::NotAbsolute(_))
        ));
    }

    #[test]
    fn the_data_directory_is_never_reachable() {
        let open = FsRoots::new(BTreeMap::new(), vec![], &p("/var/lib/acpd")).unwrap();
        assert_eq!(open.check("x", [p("/home/x").as_path()]), Ok(()));
        // Around it (a home directory holding it) is refused too, roots or not.
        for bad in [
            "/var/lib",
            "/",
            "/var/lib/acpd",
            "/var/lib/acpd/builtin",
            "/tmp/../var/lib/acpd/x",
        ] {
            assert!(
                matches!(
                    open.check("x", [p(bad).as_path()]),
                    Err(OutsideRoots::DataDir(_))
                ),
                "{bad}"
            );
        }
        for root in ["/", "/var", "/var/lib/acpd/x", "/var/lib/acpd"] {
            assert!(
                FsRoots::new(BTreeMap::new(), vec![p(root)], &p("/var/lib/acpd")).is_err(),
                "{root}"
            );
            let per = BTreeMap::from([("a".to_owned(), vec![p(root)])]);
            assert!(FsRoots::new(per, vec![], &p("/var/lib/acpd")).is_err());
        }
        assert!(FsRoots::new(BTreeMap::new(), vec![p("rel")], &p("/d")).is_err());
    }

    #[test]
    fn resolve_follows_symlinks_of_what_exists() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let real = std::fs::canonicalize(&real).unwrap();
        assert_eq!(
            resolve(&dir.path().join("link/new/x")),
            Some(real.join("new/x"))
        );
        assert_eq!(resolve(Path::new("rel")), None);
        // A link into the data directory is judged by where it leads.
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::os::unix::fs::symlink(&data, dir.path().join("innocent")).unwrap();
        let r = FsRoots::new(
            BTreeMap::new(),
            vec![],
            &std::fs::canonicalize(&data).unwrap(),
        )
        .unwrap();
        assert!(matches!(
            r.check_session("x", &dir.path().join("innocent"), &[]),
            Err(OutsideRoots::DataDir(_))
        ));
        assert_eq!(r.check_session("x", &dir.path().join("real"), &[]), Ok(()));
    }
}
