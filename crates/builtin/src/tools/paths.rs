//! Confinement: every path a tool touches must lie under the session's cwd or one of its
//! additional directories. Paths are first judged lexically (`..` resolved, relative ones
//! under the cwd); on the host the file is then opened beneath the root's descriptor
//! (`beneath`), so the kernel refuses symlinks that lead outside, however they got there.
//! Paths for the client are checked lexically only: they name files on the editor's machine.
//! acpd's data directory (tokens, every user's transcripts) is off limits on the host
//! whatever the roots: a root that contains it or lies in it is not opened, and a path in
//! it is refused (`session/new` already refuses such a cwd; this holds for any session).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ToolError;
use super::beneath::{Root, normalize};

#[derive(Debug, Clone)]
pub struct Roots {
    /// As the client gave them (absolute).
    pub lexical: Vec<PathBuf>,
    /// Opened on the host, with the lexical path each was given as; roots that do not
    /// exist here are left out.
    host: Vec<(PathBuf, Arc<Root>)>,
    /// acpd's data directory, as given and resolved: never opened.
    off_limits: Vec<PathBuf>,
}

/// A file on the host, as a path beneath one of the roots.
#[derive(Debug, Clone)]
pub struct HostPath {
    pub root: Arc<Root>,
    /// Relative to the root, without `..`.
    pub rel: PathBuf,
    /// Absolute, as the model and the client see it.
    pub abs: PathBuf,
}

impl HostPath {
    /// How it is shown to the model: relative to its root.
    pub fn display(&self) -> String {
        let s = self.rel.display().to_string();
        if s.is_empty() { ".".into() } else { s }
    }
}

impl Roots {
    /// The session's roots; `data_dir` is acpd's, never reachable through them.
    pub fn new(cwd: &Path, additional: &[PathBuf], data_dir: &Path) -> Roots {
        let lexical: Vec<PathBuf> = std::iter::once(cwd.to_path_buf())
            .chain(additional.iter().cloned())
            .map(|p| normalize(&p))
            .collect();
        let mut off_limits = vec![normalize(data_dir)];
        off_limits.extend(std::fs::canonicalize(data_dir).ok());
        let reaches = |p: &Path| {
            off_limits
                .iter()
                .any(|d| p.starts_with(d) || d.starts_with(p))
        };
        let host = lexical
            .iter()
            .filter(|p| !reaches(p))
            .filter_map(|p| Some((p.clone(), Arc::new(Root::open(p).ok()?))))
            .filter(|(_, root)| !reaches(&root.canonical))
            .collect();
        Roots {
            lexical,
            host,
            off_limits,
        }
    }

    /// Whether one of the roots contains acpd's data directory or lies inside it (the host
    /// shell refuses to run there).
    pub fn reach_data_dir(&self) -> bool {
        self.lexical.iter().any(|p| {
            self.off_limits
                .iter()
                .any(|d| p.starts_with(d) || d.starts_with(p))
        })
    }

    pub fn cwd(&self) -> &Path {
        &self.lexical[0]
    }

    /// The absolute, normalized path for `p` (relative paths are under the cwd).
    pub fn absolute(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            normalize(p)
        } else {
            normalize(&self.cwd().join(p))
        }
    }

    /// A path for the client's `fs/*`: absolute, and lexically inside a root.
    pub fn for_client(&self, p: &str) -> Result<PathBuf, ToolError> {
        let abs = self.absolute(p);
        if self.lexical.iter().any(|r| abs.starts_with(r)) {
            Ok(abs)
        } else {
            Err(ToolError::Outside(abs))
        }
    }

    /// A path on the host, lexically inside a root; opening it beneath that root is what
    /// keeps symlinks from leading out.
    pub fn for_host(&self, p: &str) -> Result<HostPath, ToolError> {
        let abs = self.absolute(p);
        if self.off_limits.iter().any(|d| abs.starts_with(d)) {
            return Err(ToolError::DataDir(abs));
        }
        for (lexical, root) in &self.host {
            let rel = abs
                .strip_prefix(lexical)
                .or_else(|_| abs.strip_prefix(&root.canonical));
            if let Ok(rel) = rel {
                if self
                    .off_limits
                    .iter()
                    .any(|d| root.canonical.join(rel).starts_with(d))
                {
                    return Err(ToolError::DataDir(abs));
                }
                return Ok(HostPath {
                    root: root.clone(),
                    rel: rel.to_path_buf(),
                    abs: abs.clone(),
                });
            }
        }
        Err(ToolError::Outside(abs))
    }
}

#[cfg(test)]
mod tests;
