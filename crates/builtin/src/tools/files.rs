//! File tools: read_file, write_file and edit through the client's `fs/*` when it offers
//! them (the editor sees unsaved buffers and its own edits), else on the host, confined;
//! list_dir, glob and grep on the host.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

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
    Host(PathBuf),
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

async fn read_text(env: &ToolEnv<'_>, route: &Route) -> Result<String, ToolError> {
    match route {
        Route::Client(p) => {
            let r = env
                .client
                .request("fs/read_text_file", json!({ "path": p }), env.cancel)
                .await?;
            Ok(r.get("content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned())
        }
        Route::Host(p) => {
            let len = tokio::fs::metadata(p)
                .await
                .map_err(|e| ToolError::Io(env.roots.display(p), e))?
                .len();
            if len > MAX_READ {
                return Err(ToolError::Failed(format!(
                    "{} is {len} bytes, over the {MAX_READ}-byte limit for text files",
                    env.roots.display(p)
                )));
            }
            tokio::fs::read_to_string(p)
                .await
                .map_err(|e| ToolError::Io(env.roots.display(p), e))
        }
    }
}

async fn write_text(env: &ToolEnv<'_>, route: &Route, content: &str) -> Result<(), ToolError> {
    match route {
        Route::Client(p) => {
            env.client
                .request(
                    "fs/write_text_file",
                    json!({ "path": p, "content": content }),
                    env.cancel,
                )
                .await?;
            Ok(())
        }
        Route::Host(p) => {
            if let Some(parent) = p.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(|e| ToolError::Io(env.roots.display(p), e))?;
            }
            tokio::fs::write(p, content)
                .await
                .map_err(|e| ToolError::Io(env.roots.display(p), e))
        }
    }
}

fn path_of(route: &Route) -> &Path {
    match route {
        Route::Client(p) | Route::Host(p) => p,
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
        Route::Host(p) => tokio::fs::read_to_string(p).await.ok(),
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
    // Read and write take the same route, so the edit applies to what the editor shows.
    let route = if env.config.client_fs && env.caps.read_text_file && env.caps.write_text_file {
        Route::Client(env.roots.for_client(p)?)
    } else if env.config.host_fs {
        Route::Host(env.roots.for_host(p)?)
    } else {
        return Err(ToolError::Unavailable("file editing"));
    };
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

fn host_dir(env: &ToolEnv<'_>, input: &Value) -> Result<PathBuf, ToolError> {
    if !env.config.host_fs {
        return Err(ToolError::Unavailable("file search"));
    }
    let p = input.get("path").and_then(Value::as_str).unwrap_or(".");
    env.roots.for_host(p)
}

pub async fn list_dir(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let dir = host_dir(env, input)?;
    let mut rd = tokio::fs::read_dir(&dir)
        .await
        .map_err(|e| ToolError::Io(env.roots.display(&dir), e))?;
    let mut names = vec![];
    while let Ok(Some(e)) = rd.next_entry().await {
        let mut name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().await.is_ok_and(|t| t.is_dir()) {
            name.push('/');
        }
        names.push(name);
        if names.len() >= 2000 {
            break;
        }
    }
    names.sort();
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

/// Files under `root` (depth first, sorted, skipping VCS and build directories).
fn walk(root: &Path, stop: &AtomicBool, mut visit: impl FnMut(&Path) -> bool) {
    let mut stack = vec![root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = rd.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.file_name()));
        for e in entries {
            seen += 1;
            if seen > MAX_WALK || stop.load(Ordering::Relaxed) {
                return;
            }
            let Ok(t) = e.file_type() else { continue };
            let path = e.path();
            if t.is_dir() {
                if !SKIP_DIRS.contains(&e.file_name().to_string_lossy().as_ref()) {
                    stack.push(path);
                }
            } else if t.is_file() && !visit(&path) {
                return;
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
    let root = host_dir(env, input)?;
    let r2 = root.clone();
    let found = blocking_walk(env, move |stop| {
        let mut out = vec![];
        walk(&r2, stop, |p| {
            if let Ok(rel) = p.strip_prefix(&r2)
                && matcher.is_match(rel)
            {
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
    let root = host_dir(env, input)?;
    let limit = env.config.output_limit;
    let r2 = root.clone();
    let lines = blocking_walk(env, move |stop| {
        let mut out: Vec<String> = vec![];
        let mut size = 0usize;
        walk(&r2, stop, |p| {
            let rel = p.strip_prefix(&r2).unwrap_or(p);
            if filter.as_ref().is_some_and(|f| !f.is_match(rel)) {
                return true;
            }
            if std::fs::metadata(p)
                .map(|m| m.len() > MAX_SEARCH_FILE)
                .unwrap_or(true)
            {
                return true;
            }
            let Ok(bytes) = std::fs::read(p) else {
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
