//! `--login`: a scripted OAuth-style terminal login, what the agent's `term` auth method
//! runs. It prints a sign-in URL whose redirect is a loopback port it listens on, asks for a
//! code on its terminal, and succeeds only when an HTTP request carrying that code reaches its
//! port: then it writes `$HOME/.scripted-login`, which `--need-login` asks for. A typed
//! `fail` ends it with exit 3.

use std::io::{BufRead, Read, Write};

/// The file a successful login writes in `$HOME`.
pub const CREDENTIAL: &str = ".scripted-login";

pub fn run() -> ! {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| die(e));
    let port = listener.local_addr().unwrap_or_else(|e| die(e)).port();
    println!(
        "Sign in at https://auth.example.test/authorize?redirect_uri=http%3A%2F%2Flocalhost%3A{port}%2Fcallback"
    );
    print!("Paste the code: ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).unwrap_or(0) == 0 {
        println!("no code");
        std::process::exit(2);
    }
    let code = line.trim().to_owned();
    if code == "fail" {
        println!("login refused");
        std::process::exit(3);
    }
    println!("waiting for the callback on port {port}");
    loop {
        let (mut stream, _) = listener.accept().unwrap_or_else(|e| die(e));
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        let ok = head
            .lines()
            .next()
            .is_some_and(|l| l.contains(&format!("code={code}")));
        let body = if ok { "logged in" } else { "wrong code" };
        let _ = write!(
            stream,
            "HTTP/1.1 {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            if ok { "200 OK" } else { "400 Bad Request" },
            body.len()
        );
        let _ = stream.flush();
        if ok {
            break;
        }
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| ".".into());
    let path = std::path::Path::new(&home).join(CREDENTIAL);
    std::fs::write(&path, &code).unwrap_or_else(|e| die(e));
    println!("logged in");
    std::process::exit(0);
}

/// Whether a login has run in this `$HOME`.
pub fn logged_in() -> bool {
    std::env::var_os("HOME").is_some_and(|h| std::path::Path::new(&h).join(CREDENTIAL).exists())
}

fn die(e: std::io::Error) -> ! {
    eprintln!("scripted login: {e}");
    std::process::exit(1);
}
