//! Host file access confined to a root directory by the kernel: every open goes through
//! `openat2` with `RESOLVE_BENEATH` from a descriptor of the root, so neither `..`, an
//! absolute symlink, a dangling one, nor one swapped in while a tool runs can lead outside
//! (the open fails with `EXDEV`). Creating goes one name at a time below a directory opened
//! that way; writes go to a temporary file renamed over the target, so a reader never sees
//! half a file.
//!
//! Paths handed in are relative to the root and free of `..` (`paths::Roots` makes them).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Symlinks at the end of a path followed before a write gives up.
const MAX_LINKS: usize = 16;

/// A root directory, held open: renaming it away does not move the confinement.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    /// Its canonical path (for resolving a final symlink and for messages).
    pub canonical: PathBuf,
}

/// What a directory entry is (symlinks are not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Other,
}

impl Root {
    pub fn open(path: &Path) -> io::Result<Root> {
        let canonical = std::fs::canonicalize(path)?;
        let fd = rustix::fs::open(
            &canonical,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root { fd, canonical })
    }

    fn open_beneath(&self, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        // openat2 refuses O_PATH with anything but O_DIRECTORY, O_NOFOLLOW and O_CLOEXEC.
        let extra = if flags.contains(OFlags::PATH) {
            OFlags::CLOEXEC
        } else {
            OFlags::CLOEXEC | OFlags::NOCTTY
        };
        Ok(rustix::fs::openat2(
            &self.fd,
            rel,
            flags | extra,
            Mode::empty(),
            how,
        )?)
    }

    /// Fails with `EXDEV` if `rel` (following its symlinks) is outside, `ENOENT` if it
    /// does not exist.
    pub fn check(&self, rel: &Path) -> io::Result<()> {
        self.open_beneath(rel, OFlags::PATH).map(drop)
    }

    /// Checks a path about to be written: where it leads once final symlinks are followed.
    pub fn check_write(&self, rel: &Path) -> io::Result<()> {
        self.write_target(rel).map(drop)
    }

    /// The whole of a regular file, if it is at most `max` bytes.
    pub fn read(&self, rel: &Path, max: u64) -> io::Result<Vec<u8>> {
        // Non-blocking so a FIFO cannot hang the tool; it is refused below anyway.
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::NONBLOCK)?;
        let st = rustix::fs::fstat(&fd)?;
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind == FileType::Directory {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "is a directory",
            ));
        }
        if kind != FileType::RegularFile {
            return Err(io::Error::other("not a regular file"));
        }
        let len = st.st_size as u64;
        if len > max {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("{len} bytes, over the {max}-byte limit"),
            ));
        }
        let mut out = Vec::with_capacity(len as usize);
        File::from(fd).take(max + 1).read_to_end(&mut out)?;
        if out.len() as u64 > max {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("over the {max}-byte limit"),
            ));
        }
        Ok(out)
    }

    /// The entries of a directory, sorted by name, without `.` and `..`.
    pub fn list(&self, rel: &Path) -> io::Result<Vec<(PathBuf, Kind)>> {
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut out = vec![];
        for e in rustix::fs::Dir::read_from(&fd)? {
            let e = e?;
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let mut t = e.file_type();
            if t == FileType::Unknown {
                // Some file systems do not fill d_type.
                t = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|s| FileType::from_raw_mode(s.st_mode))
                    .unwrap_or(FileType::Unknown);
            }
            let kind = match t {
                FileType::Directory => Kind::Dir,
                FileType::RegularFile => Kind::File,
                _ => Kind::Other,
            };
            out.push((PathBuf::from(name), kind));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Replaces (or creates) a file atomically, creating missing directories. A final
    /// symlink is followed to where it points, if that is beneath the root; the mode of a
    /// file replaced is kept.
    pub fn write(&self, rel: &Path, content: &[u8]) -> io::Result<()> {
        let target = self.write_target(rel)?;
        let (parent, name) = split(&target)?;
        let dir = self.make_dirs(parent)?;
        let mode = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    "is a directory",
                ));
            }
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                Some(Mode::from_raw_mode(st.st_mode & 0o7777))
            }
            _ => None,
        };
        let mut tmp_name = OsStr::new(".").to_owned();
        tmp_name.push(name);
        tmp_name.push(format!(".acpd-{}.tmp", uuid::Uuid::new_v4().simple()));
        // O_EXCL: never through a link; the kernel applies the umask for a new file.
        let fd = rustix::fs::openat(
            &dir,
            &tmp_name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o666),
        )?;
        let written = (|| {
            if let Some(m) = mode {
                rustix::fs::fchmod(&fd, m)?;
            }
            let mut f = File::from(fd);
            f.write_all(content)?;
            f.sync_data()?;
            Ok::<_, io::Error>(rustix::fs::renameat(&dir, &tmp_name, &dir, name)?)
        })();
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&dir, &tmp_name, AtFlags::empty());
        }
        written
    }

    /// `rel` with final symlinks followed (each must stay beneath the root: `EXDEV`
    /// otherwise). A missing directory on the way ends the search: it will be created.
    fn write_target(&self, rel: &Path) -> io::Result<PathBuf> {
        let mut rel = rel.to_path_buf();
        for _ in 0..MAX_LINKS {
            let (parent, name) = split(&rel)?;
            let dir = match self.open_beneath(parent, OFlags::PATH | OFlags::DIRECTORY) {
                Ok(d) => d,
                Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                    return Ok(rel);
                }
                Err(e) => return Err(e),
            };
            let st = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => return Ok(rel),
                Err(e) => return Err(e.into()),
            };
            if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
                return Ok(rel);
            }
            let link = rustix::fs::readlinkat(&dir, name, Vec::new())?;
            // Where the directory really is (the kernel's view, not the path's).
            let real_parent = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()))?;
            let abs = normalize(&real_parent.join(OsStr::from_bytes(link.to_bytes())));
            rel = match abs.strip_prefix(&self.canonical) {
                Ok(r) => r.to_path_buf(),
                Err(_) => return Err(Errno::XDEV.into()),
            };
        }
        Err(Errno::LOOP.into())
    }

    /// Opens `rel` as a directory beneath the root, creating what is missing, one name at
    /// a time below a directory already opened beneath it.
    fn make_dirs(&self, rel: &Path) -> io::Result<OwnedFd> {
        let flags = OFlags::PATH | OFlags::DIRECTORY;
        let mut dir = self.open_beneath(Path::new(""), flags)?;
        let mut done = PathBuf::new();
        for c in rel.components() {
            done.push(c);
            dir = match self.open_beneath(&done, flags) {
                Ok(d) => d,
                Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                    match rustix::fs::mkdirat(
                        dir.as_fd(),
                        c.as_os_str(),
                        Mode::from_raw_mode(0o777),
                    ) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    self.open_beneath(&done, flags)?
                }
                Err(e) => return Err(e),
            };
        }
        Ok(dir)
    }
}

/// (directory, file name) of a relative path with at least one component.
fn split(rel: &Path) -> io::Result<(&Path, &OsStr)> {
    match (rel.parent(), rel.file_name()) {
        (Some(p), Some(n)) => Ok((p, n)),
        _ => Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        )),
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

/// Whether an error means "outside the root".
pub fn is_escape(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::XDEV.raw_os_error())
}

/// Whether the kernel lacks `openat2` (before Linux 5.6, or filtered by seccomp).
pub fn is_unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::NOSYS.raw_os_error())
}
