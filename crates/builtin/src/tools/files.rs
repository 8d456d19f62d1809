//! File tools: read_file, write_file and edit through the client's `fs/*` when it offers
//! them (the editor sees unsaved buffers and its own edits), else on the host, confined;
//! list_dir, glob and grep on the host. Host files are opened beneath the session's
//! roots (`beneath`); `check` judges a call's path before anyone is asked for permission.

use acpd_protocol::method;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use super::beneath::{self, Kind, Root};
use super::paths::HostPath;
use super::{Outcome, ToolEnv, ToolError};

/// Directories a search never enters.
const SKIP_DIRS: [&str; 4] = [".git", "node_modules", "target", ".hg"];
const MAX_WALK: usize = 50_000;
const MAX_SEARCH_FILE: u64 = 2 * 1024 * 1024;
/// Largest file read whole on the host (edit needs all of it; reads are then cut).
const MAX_READ: u64 = 32 * 1024 * 1024;

fn arg<'a>(input: &'a Value, k: &str) -> Result<&'a str, ToolError> {
    input
        .get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::BadInput(format!("`{k}` (string) is required")))
}

/// Which route a file operation takes.
enum Route {
    Client(PathBuf),
    Host(HostPath),
}

/// What a host file error tells the model.
fn host_error(p: &HostPath, e: std::io::Error) -> ToolError {
    if beneath::is_escape(&e) {
        ToolError::Outside(p.abs.clone())
    } else if beneath::is_unsupported(&e) {
        ToolError::Failed(
            "host file tools need the openat2 system call (Linux 5.6 or later), which this \
             kernel refuses"
                .into(),
        )
    } else {
        ToolError::Io(p.display(), e)
    }
}

/// Runs a blocking file operation beneath `p`'s root.
async fn on_host<T: Send + 'static>(
    p: &HostPath,
    f: impl FnOnce(&Root, &Path) -> std::io::Result<T> + Send + 'static,
) -> Result<T, ToolError> {
    let (root, rel) = (p.root.clone(), p.rel.clone());
    match tokio::task::spawn_blocking(move || f(&root, &rel)).await {
        Ok(r) => r.map_err(|e| host_error(p, e)),
        Err(e) => Err(ToolError::Failed(e.to_string())),
    }
}

/// Refuses a call whose path is outside the session's directories (symlinks followed as
/// the tool would), before the user is asked to allow it. A file that does not exist yet
/// passes: the tool reports it.
pub fn check(env: &ToolEnv<'_>, name: &str, input: &Value) -> Result<(), ToolError> {
    let p = || arg(input, "path");
    let route = match name {
        "read_file" => read_route(env, p()?)?,
        "write_file" => write_route(env, p()?)?,
        "edit" => edit_route(env, p()?)?,
        "list_dir" | "glob" | "grep" => Route::Host(host_dir(env, input)?),
        _ => return Ok(()),
    };
    let Route::Host(hp) = route else {
        return Ok(());
    };
    // Reads follow links as the kernel does; writes follow a final link to its target.
    let mut checks = vec![];
    if name != "write_file" {
        checks.push(hp.root.check(&hp.rel));
    }
    if name == "write_file" || name == "edit" {
        checks.push(hp.root.check_write(&hp.rel));
    }
    for c in checks {
        match c {
            Err(e) if beneath::is_escape(&e) || beneath::is_unsupported(&e) => {
                return Err(host_error(&hp, e));
            }
            _ => {}
        }
    }
    Ok(())
}

fn read_route(env: &ToolEnv<'_>, p: &str) -> Result<Route, ToolError> {
    if env.config.client_fs && env.caps.read_text_file {
        Ok(Route::Client(env.roots.for_client(p)?))
    } else if env.config.host_fs {
        Ok(Route::Host(env.roots.for_host(p)?))
    } else {
        Err(ToolError::Unavailable("file reading"))
    }
}

fn write_route(env: &ToolEnv<'_>, p: &str) -> Result<Route, ToolError> {
    if env.config.client_fs && env.caps.write_text_file {
        Ok(Route::Client(env.roots.for_client(p)?))
    } else if env.config.host_fs {
        Ok(Route::Host(env.roots.for_host(p)?))
    } else {
        Err(ToolError::Unavailable("file writing"))
    }
}

/// Read and write take the same route, so the edit applies to what the editor shows.
fn edit_route(env: &ToolEnv<'_>, p: &str) -> Result<Route, ToolError> {
    if env.config.client_fs && env.caps.read_text_file && env.caps.write_text_file {
        Ok(Route::Client(env.roots.for_client(p)?))
    } else if env.config.host_fs {
        Ok(Route::Host(env.roots.for_host(p)?))
    } else {
        Err(ToolError::Unavailable("file editing"))
    }
}

async fn read_text(env: &ToolEnv<'_>, route: &Route) -> Result<String, ToolError> {
    match route {
        Route::Client(p) => {
            let r = env
                .client
                .request(method::FS_READ_TEXT_FILE, json!({ "path": p }), env.cancel)
                .await?;
            Ok(r.get("content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned())
        }
        Route::Host(p) => {
            let bytes = on_host(p, |root, rel| root.read(rel, MAX_READ)).await?;
            String::from_utf8(bytes)
                .map_err(|_| ToolError::Failed(format!("{} is not UTF-8 text", p.display())))
        }
    }
}

async fn write_text(env: &ToolEnv<'_>, route: &Route, content: &str) -> Result<(), ToolError> {
    match route {
        Route::Client(p) => {
            env.client
                .request(
                    method::FS_WRITE_TEXT_FILE,
                    json!({ "path": p, "content": content }),
                    env.cancel,
                )
                .await?;
            Ok(())
        }
        Route::Host(p) => {
            let content = content.as_bytes().to_vec();
            on_host(p, move |root, rel| root.write(rel, &content)).await
        }
    }
}

fn path_of(route: &Route) -> &Path {
    match route {
        Route::Client(p) => p,
        Route::Host(p) => &p.abs,
    }
}

pub async fn read_file(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let route = read_route(env, arg(input, "path")?)?;
    let offset = input
        .get("offset")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .max(1) as usize;
    let limit = input
        .get("limit")
        .and_then(Value::as_u64)
        .map(|l| l as usize);
    let text = read_text(env, &route).await?;
    let selected: String = if offset > 1 || limit.is_some() {
        text.lines()
            .skip(offset - 1)
            .take(limit.unwrap_or(usize::MAX))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        text
    };
    let out = env.truncate(selected);
    Ok(Outcome::text(out.clone()).with_content(vec![
        json!({ "type": "content", "content": { "type": "text", "text": fence(&out) } }),
    ]))
}

pub async fn write_file(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let route = write_route(env, arg(input, "path")?)?;
    let content = arg(input, "content")?;
    let old = match &route {
        Route::Host(p) => on_host(p, |root, rel| root.read(rel, MAX_READ))
            .await
            .ok()
            .and_then(|b| String::from_utf8(b).ok()),
        Route::Client(_) => None,
    };
    write_text(env, &route, content).await?;
    let path = path_of(&route);
    Ok(Outcome::text(format!(
        "Wrote {} bytes to {}",
        content.len(),
        path.display()
    ))
    .with_content(vec![diff(path, old.as_deref(), content)]))
}

pub async fn edit(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let p = arg(input, "path")?;
    let old_string = arg(input, "old_string")?;
    let new_string = arg(input, "new_string")?;
    if old_string.is_empty() {
        return Err(ToolError::BadInput("`old_string` must not be empty".into()));
    }
    let route = edit_route(env, p)?;
    let text = read_text(env, &route).await?;
    let count = text.matches(old_string).count();
    if count == 0 {
        return Err(ToolError::Failed(
            "`old_string` was not found in the file; read it again and copy the text exactly"
                .into(),
        ));
    }
    if count > 1 {
        return Err(ToolError::Failed(format!(
            "`old_string` occurs {count} times; include more surrounding text so it is unique"
        )));
    }
    let updated = text.replacen(old_string, new_string, 1);
    write_text(env, &route, &updated).await?;
    let path = path_of(&route);
    Ok(
        Outcome::text(format!("Edited {}", path.display())).with_content(vec![diff(
            path,
            Some(&text),
            &updated,
        )]),
    )
}

fn diff(path: &Path, old: Option<&str>, new: &str) -> Value {
    json!({ "type": "diff", "path": path, "oldText": old, "newText": new })
}

fn fence(s: &str) -> String {
    format!("```\n{s}\n```")
}

fn host_dir(env: &ToolEnv<'_>, input: &Value) -> Result<HostPath, ToolError> {
    if !env.config.host_fs {
        return Err(ToolError::Unavailable("file search"));
    }
    let p = input.get("path").and_then(Value::as_str).unwrap_or(".");
    env.roots.for_host(p)
}

pub async fn list_dir(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let dir = host_dir(env, input)?;
    let entries = on_host(&dir, |root, rel| root.list(rel)).await?;
    let names: Vec<String> = entries
        .into_iter()
        .take(2000)
        .map(|(name, kind)| {
            let mut name = name.display().to_string();
            if kind == Kind::Dir {
                name.push('/');
            }
            name
        })
        .collect();
    Ok(Outcome::text(env.truncate(names.join("\n"))))
}

/// Runs a blocking directory walk; a cancel stops it at the next entry, and it is awaited.
async fn blocking_walk<T: Send + 'static>(
    env: &ToolEnv<'_>,
    f: impl FnOnce(&AtomicBool) -> T + Send + 'static,
) -> Result<T, ToolError> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut job = tokio::task::spawn_blocking(move || f(&flag));
    tokio::select! {
        r = &mut job => r.map_err(|e| ToolError::Failed(e.to_string())),
        _ = env.cancel.cancelled() => {
            stop.store(true, Ordering::Relaxed);
            let _ = job.await;
            Err(ToolError::Cancelled)
        }
    }
}

/// Files under `base` (relative to `root`), depth first, sorted, skipping VCS and build
/// directories and symlinks; `visit` gets each path relative to `base`. Every directory is
/// opened beneath the root, so one swapped for a link mid-walk is not entered.
fn walk(root: &Root, base: &Path, stop: &AtomicBool, mut visit: impl FnMut(&Path) -> bool) {
    let mut stack = vec![PathBuf::new()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = root.list(&base.join(&dir)) else {
            continue;
        };
        for (name, kind) in entries.into_iter().rev() {
            seen += 1;
            if seen > MAX_WALK || stop.load(Ordering::Relaxed) {
                return;
            }
            let path = dir.join(&name);
            match kind {
                Kind::Dir if !SKIP_DIRS.contains(&name.to_string_lossy().as_ref()) => {
                    stack.push(path)
                }
                Kind::File if !visit(&path) => return,
                _ => {}
            }
        }
    }
}

pub async fn glob(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let pattern = arg(input, "pattern")?;
    let matcher = globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| ToolError::BadInput(format!("bad glob: {e}")))?
        .compile_matcher();
    let dir = host_dir(env, input)?;
    let found = blocking_walk(env, move |stop| {
        let mut out = vec![];
        walk(&dir.root, &dir.rel, stop, |rel| {
            if matcher.is_match(rel) {
                out.push(rel.display().to_string());
            }
            out.len() < 1000
        });
        out
    })
    .await?;
    let text = if found.is_empty() {
        format!("No files match {pattern:?}")
    } else {
        found.join("\n")
    };
    Ok(Outcome::text(env.truncate(text)))
}

pub async fn grep(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let pattern = arg(input, "pattern")?;
    let ci = input
        .get("case_insensitive")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let re = regex::RegexBuilder::new(pattern)
        .case_insensitive(ci)
        .build()
        .map_err(|e| ToolError::BadInput(format!("bad regex: {e}")))?;
    let filter = match input.get("glob").and_then(Value::as_str) {
        Some(g) => Some(
            globset::Glob::new(g)
                .map_err(|e| ToolError::BadInput(format!("bad glob: {e}")))?
                .compile_matcher(),
        ),
        None => None,
    };
    let dir = host_dir(env, input)?;
    let limit = env.config.output_limit;
    let lines = blocking_walk(env, move |stop| {
        let mut out: Vec<String> = vec![];
        let mut size = 0usize;
        walk(&dir.root, &dir.rel, stop, |rel| {
            if filter.as_ref().is_some_and(|f| !f.is_match(rel)) {
                return true;
            }
            // Too large, unreadable, or swapped for something else: skipped.
            let Ok(bytes) = dir.root.read(&dir.rel.join(rel), MAX_SEARCH_FILE) else {
                return true;
            };
            if bytes.iter().take(8192).any(|b| *b == 0) {
                return true;
            }
            let text = String::from_utf8_lossy(&bytes);
            for (n, line) in text.lines().enumerate() {
                if re.is_match(line) {
                    let l = format!("{}:{}: {}", rel.display(), n + 1, line.trim_end());
                    size += l.len() + 1;
                    out.push(l);
                    if size > limit {
                        return false;
                    }
                }
            }
            true
        });
        out
    })
    .await?;
    let text = if lines.is_empty() {
        format!("No matches for {pattern:?}")
    } else {
        lines.join("\n")
    };
    Ok(Outcome::text(env.truncate(text)))
}
