//! The editor's terminal during a remote login: raw mode while it runs (restored however the
//! login ends), its size, and its keystrokes read on a thread of their own.

use std::io::{IsTerminal, Read, Write};

use tokio::sync::mpsc;

/// Raw mode on stdin's terminal while held; nothing when stdin is not a terminal.
pub struct RawMode {
    on: bool,
}

impl RawMode {
    pub fn enter() -> RawMode {
        let on = std::io::stdin().is_terminal() && crossterm::terminal::enable_raw_mode().is_ok();
        RawMode { on }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if self.on {
            let _ = crossterm::terminal::disable_raw_mode();
        }
    }
}

/// The terminal's size (columns, rows); 80×24 when there is no terminal.
pub fn size() -> (u16, u16) {
    crossterm::terminal::size().unwrap_or((80, 24))
}

/// Keystrokes (raw bytes: Ctrl-C is byte 3) until stdin ends. A plain thread: a read of a
/// terminal cannot be interrupted, and the runtime must not wait for it at exit.
pub fn keystrokes() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(32);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// Writes the login's output to the terminal.
pub fn show(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

/// A line of the shim's own on stderr (in raw mode a newline needs its carriage return).
pub fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "acp-shim: {line}\r\n");
    let _ = err.flush();
}
