//! The editor's stdin and stdout as non-blocking pipes, when they are pipes (as editors give
//! them to their agents); anything else (a file, a terminal) through tokio's own stdio.
//!
//! tokio's `Stdin`/`Stdout` hand every read and write to a blocking thread: a thread hop of
//! latency on each request and answer, and two context switches per burst of output. A pipe
//! can be polled by the runtime itself. Making it non-blocking changes its open file
//! description, which other processes may share, so: stdout is left to tokio when stderr is
//! the same pipe (`2>&1`: our logs are blocking writes), and both are set back to blocking
//! when the shim is done with them (`restore`).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use tokio::net::unix::pipe;
use tokio_util::either::Either;

pub type Stdin = Either<pipe::Receiver, tokio::io::Stdin>;
pub type Stdout = Either<pipe::Sender, tokio::io::Stdout>;

pub fn stdin() -> Stdin {
    match dup(std::io::stdin().as_fd()).and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok()) {
        Some(p) => Either::Left(p),
        None => Either::Right(tokio::io::stdin()),
    }
}

pub fn stdout() -> Stdout {
    let out = dup(std::io::stdout().as_fd());
    let same_as_stderr = match (&out, dup(std::io::stderr().as_fd())) {
        (Some(o), Some(e)) => same_file(o, &e),
        _ => false,
    };
    match out.filter(|_| !same_as_stderr) {
        Some(fd) => match pipe::Sender::from_owned_fd(fd) {
            Ok(p) => Either::Left(p),
            Err(_) => Either::Right(tokio::io::stdout()),
        },
        None => Either::Right(tokio::io::stdout()),
    }
}

/// Sets a pipe back to blocking for whoever shares it after us.
pub fn restore_stdin(s: Stdin) {
    if let Either::Left(p) = s {
        let _ = p.into_blocking_fd();
    }
}

pub fn restore_stdout(s: Stdout) {
    if let Either::Left(p) = s {
        let _ = p.into_blocking_fd();
    }
}

fn dup(fd: std::os::fd::BorrowedFd<'_>) -> Option<OwnedFd> {
    fd.try_clone_to_owned().ok()
}

fn same_file(a: &OwnedFd, b: &OwnedFd) -> bool {
    let meta = |fd: &OwnedFd| {
        fd.try_clone()
            .ok()
            .and_then(|fd| std::fs::File::from(fd).metadata().ok())
            .map(|m| (m.dev(), m.ino()))
    };
    matches!((meta(a), meta(b)), (Some(x), Some(y)) if x == y)
}
