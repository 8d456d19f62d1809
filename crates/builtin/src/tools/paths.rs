//! Confinement: every path a tool touches must lie under the session's cwd or one of its
//! additional directories. On the host, symlinks are resolved (the deepest existing ancestor
//! is canonicalized) before the prefix check, so neither `..` nor a link can escape. Paths
//! for the client are checked lexically: they name files on the editor's machine.

use std::path::{Component, Path, PathBuf};

use super::ToolError;

#[derive(Debug, Clone)]
pub struct Roots {
    /// As the client gave them (absolute).
    pub lexical: Vec<PathBuf>,
    /// Canonicalized on the host; roots that do not exist here are left out.
    host: Vec<PathBuf>,
}

impl Roots {
    pub fn new(cwd: &Path, additional: &[PathBuf]) -> Roots {
        let lexical: Vec<PathBuf> = std::iter::once(cwd.to_path_buf())
            .chain(additional.iter().cloned())
            .map(|p| normalize(&p))
            .collect();
        let host = lexical
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect();
        Roots { lexical, host }
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

    /// A path on the host with symlinks resolved, inside a (canonical) root.
    pub fn for_host(&self, p: &str) -> Result<PathBuf, ToolError> {
        let abs = self.absolute(p);
        let resolved = resolve_existing_prefix(&abs);
        if self.host.iter().any(|r| resolved.starts_with(r)) {
            Ok(resolved)
        } else {
            Err(ToolError::Outside(abs))
        }
    }

    /// How a host path is shown to the model: relative to the root it is under.
    pub fn display(&self, p: &Path) -> String {
        for r in self.host.iter().chain(self.lexical.iter()) {
            if let Ok(rel) = p.strip_prefix(r) {
                let s = rel.display().to_string();
                return if s.is_empty() { ".".into() } else { s };
            }
        }
        p.display().to_string()
    }
}

/// Removes `.` and resolves `..` without touching the file system.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Canonicalizes the deepest ancestor that exists and appends the rest, so a file about to
/// be created is judged by where its directory really is.
fn resolve_existing_prefix(abs: &Path) -> PathBuf {
    let mut existing = abs.to_path_buf();
    let mut rest = vec![];
    loop {
        if let Ok(c) = std::fs::canonicalize(&existing) {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return out;
        }
        match (
            existing.file_name().map(|n| n.to_owned()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return abs.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotdot_and_symlink_escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let roots = Roots::new(&root, &[]);
        assert!(roots.for_host("a/b.txt").is_ok());
        assert!(roots.for_host("../outside/x").is_err());
        assert!(roots.for_host("link/x").is_err());
        assert!(roots.for_host(outside.to_str().unwrap()).is_err());
        assert!(roots.for_client("../x").is_err());
        assert!(roots.for_client("sub/../y").is_ok());
    }
}
