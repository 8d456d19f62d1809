//! Path mapping (`--map LOCAL=REMOTE`): the editor's paths become the box's on the way to
//! acpd, and the box's become the editor's on the way back, only where ACP carries a path.
//!
//! Pure: no I/O, one owner (the relay loop). A message is first checked for the bytes of any
//! prefix it could be rewritten from (`Needles`); most messages (streamed chunks of prose,
//! answers) have none and are relayed as they came without being parsed. Only a message that
//! may carry a mapped path becomes a `serde_json::Value`, walked by method:
//!
//! - editor → daemon: `session/new|load|resume|fork` `cwd` and `additionalDirectories`,
//!   `session/list` `cwd` (the filter), `session/prompt` blocks (`resource_link.uri`,
//!   `resource.resource.uri`, `file://` only);
//! - daemon → editor: `session/update` tool calls (`locations[].path`, diff `path`, content
//!   blocks) and message chunks (content blocks), `session/request_permission` `toolCall`,
//!   `fs/read_text_file|write_text_file` `path`, `terminal/create` `cwd`, and the answer to a
//!   `session/list` (`sessions[].cwd`, `additionalDirectories`).
//!
//! A path is under a prefix when it is the prefix or continues it with `/` (component-wise:
//! `/a/bc` is not under `/a/b`); the longest prefix wins; a path under none passes unchanged.

use acpd_protocol::method;
use std::collections::HashSet;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use serde_json::Value;

#[cfg(test)]
mod tests;

/// Which way a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Editor → daemon: LOCAL prefixes become REMOTE ones.
    ToRemote,
    /// Daemon → editor: REMOTE prefixes become LOCAL ones.
    ToLocal,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MapError {
    #[error("invalid --map {0:?}: expected LOCAL=REMOTE")]
    Syntax(String),
    #[error("invalid --map {spec:?}: {side} path {path:?} {why}")]
    Path {
        spec: String,
        side: &'static str,
        path: String,
        why: &'static str,
    },
    #[error("--map {0:?} is given twice with different targets")]
    Conflict(String),
}

/// One prefix pair, normalized: absolute, no `.`/`..`/empty components, no trailing `/`
/// (the root is the empty string, so "prefix + rest" needs no special case).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pair {
    local: String,
    remote: String,
}

/// The path-URI characters a `file://` URI must escape (the URL standard's path set).
const PATH_SET: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// The mappings, and the rewriting state of one link (which editor requests were a
/// `session/list`, whose answer carries cwds).
#[derive(Debug, Default)]
pub struct PathMap {
    pairs: Vec<Pair>,
    to_remote: Needles,
    to_local: Needles,
    /// Raw ids of the editor's `session/list` requests not answered yet.
    lists: HashSet<String>,
}

/// What a message must contain to be worth parsing for one direction.
#[derive(Debug, Default)]
struct Needles {
    /// A prefix whose first characters a JSON or URI encoder may spell otherwise (non-ASCII,
    /// `%`, quotes, …) makes every message a candidate.
    always: bool,
    needles: Vec<String>,
}

impl Needles {
    fn new<'a>(prefixes: impl Iterator<Item = &'a str>) -> Needles {
        let mut n = Needles::default();
        for p in prefixes {
            // The longest start that is spelled the same in JSON, in a path and in a URI.
            let plain = p
                .find(|c: char| !(c.is_ascii_alphanumeric() || "/-._".contains(c)))
                .map_or(p, |end| &p[..end]);
            if plain.len() < 2 {
                n.always = true;
            } else {
                n.needles.push(plain.to_owned());
            }
        }
        n
    }

    fn hit(&self, text: &str) -> bool {
        self.always || self.needles.iter().any(|n| text.contains(n.as_str()))
    }
}

impl PathMap {
    /// From `LOCAL=REMOTE` specs (flags and config file alike).
    pub fn new<S: AsRef<str>>(specs: &[S]) -> Result<PathMap, MapError> {
        let mut pairs: Vec<Pair> = Vec::new();
        for spec in specs {
            let spec = spec.as_ref();
            let (l, r) = spec
                .split_once('=')
                .ok_or_else(|| MapError::Syntax(spec.to_owned()))?;
            let local = normalize(spec, "LOCAL", l)?;
            let remote = normalize(spec, "REMOTE", r)?;
            if let Some(p) = pairs.iter().find(|p| p.local == local) {
                if p.remote != remote {
                    return Err(MapError::Conflict(l.to_owned()));
                }
                continue;
            }
            pairs.push(Pair { local, remote });
        }
        Ok(PathMap {
            to_remote: Needles::new(pairs.iter().map(|p| p.local.as_str())),
            to_local: Needles::new(pairs.iter().map(|p| p.remote.as_str())),
            pairs,
            lists: HashSet::new(),
        })
    }

    /// An editor message on its way to acpd; `Some` when it was rewritten.
    pub fn editor_to_daemon(&mut self, line: &str) -> Option<String> {
        if self.pairs.is_empty() {
            return None;
        }
        // The answer to a `session/list` carries cwds even when its request carries none.
        if line.contains(method::SESSION_LIST) {
            let v: Value = serde_json::from_str(line).ok()?;
            if v["method"] == method::SESSION_LIST
                && let Some(id) = v.get("id")
            {
                self.lists.insert(id.to_string());
            }
        }
        if !self.to_remote.hit(line) {
            return None;
        }
        self.rewrite(Dir::ToRemote, line)
    }

    /// A daemon message on its way to the editor; `Some` when it was rewritten.
    pub fn daemon_to_editor(&mut self, text: &str) -> Option<String> {
        if self.pairs.is_empty() {
            return None;
        }
        if !self.to_local.hit(text) {
            if !self.lists.is_empty() {
                // An answer to a list with no mapped cwd in it: forget its id.
                self.forget_list(text);
            }
            return None;
        }
        self.rewrite(Dir::ToLocal, text)
    }

    fn forget_list(&mut self, text: &str) {
        #[derive(serde::Deserialize)]
        struct Id<'a> {
            #[serde(borrow)]
            id: Option<&'a serde_json::value::RawValue>,
            method: Option<serde::de::IgnoredAny>,
        }
        if let Ok(Id {
            id: Some(id),
            method: None,
        }) = serde_json::from_str::<Id<'_>>(text)
            && let Ok(id) = serde_json::from_str::<Value>(id.get())
        {
            self.lists.remove(&id.to_string());
        }
    }

    fn rewrite(&mut self, dir: Dir, text: &str) -> Option<String> {
        let mut v: Value = serde_json::from_str(text).ok()?;
        let changed = self.message(dir, &mut v);
        changed.then(|| v.to_string())
    }

    /// Rewrites the paths of one message in place; true when anything changed.
    fn message(&mut self, dir: Dir, v: &mut Value) -> bool {
        let answer_to_list = dir == Dir::ToLocal
            && v.get("method").is_none()
            && v.get("id")
                .is_some_and(|id| self.lists.remove(&id.to_string()));
        let mut w = Walk {
            map: self,
            dir,
            changed: false,
        };
        let method = v.get("method").and_then(Value::as_str).map(str::to_owned);
        match (method.as_deref(), v.get_mut("params")) {
            (Some(m), Some(params)) => w.params(m, params),
            (None, _) if answer_to_list => {
                let sessions = v
                    .pointer_mut("/result/sessions")
                    .and_then(Value::as_array_mut);
                for s in sessions.into_iter().flatten() {
                    w.dirs(s);
                }
            }
            _ => {}
        }
        w.changed
    }

    /// The path `p` on the other side, if a prefix of this direction covers it.
    pub fn path(&self, dir: Dir, p: &str) -> Option<String> {
        let (from, to) = self.best(dir, p)?;
        let out = format!("{to}{}", &p[from.len()..]);
        Some(if out.is_empty() { "/".into() } else { out })
    }

    fn best(&self, dir: Dir, p: &str) -> Option<(&str, &str)> {
        if !p.starts_with('/') {
            return None;
        }
        self.pairs
            .iter()
            .map(|pair| match dir {
                Dir::ToRemote => (pair.local.as_str(), pair.remote.as_str()),
                Dir::ToLocal => (pair.remote.as_str(), pair.local.as_str()),
            })
            .filter(|(from, _)| under(p, from))
            .max_by_key(|(from, _)| from.len())
    }

    /// A `file://` URI (empty or `localhost` authority) on the other side. The prefix is
    /// matched on the decoded path; the rest of the URI keeps its own spelling.
    pub fn uri(&self, dir: Dir, uri: &str) -> Option<String> {
        let rest = uri.strip_prefix("file://")?;
        let auth = if rest.starts_with("localhost/") {
            "localhost"
        } else if rest.starts_with('/') {
            ""
        } else {
            return None;
        };
        let rest = &rest[auth.len()..];
        let end = rest.find(['?', '#']).unwrap_or(rest.len());
        let (raw, suffix) = rest.split_at(end);
        let decoded = percent_decode_str(raw).decode_utf8().ok()?;
        let (from, to) = self.best(dir, &decoded)?;
        // Where, in the raw path, the decoded prefix ends.
        let bytes = raw.as_bytes();
        let (mut i, mut n) = (0, 0);
        while n < from.len() {
            let escaped = bytes[i] == b'%'
                && bytes
                    .get(i + 1..i + 3)
                    .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
            i += if escaped { 3 } else { 1 };
            n += 1;
        }
        let to = utf8_percent_encode(to, PATH_SET).to_string();
        let tail = &raw[i..];
        let path = if to.is_empty() && tail.is_empty() {
            "/"
        } else {
            ""
        };
        Some(format!("file://{auth}{to}{path}{tail}{suffix}"))
    }
}

/// `p` is `prefix` or continues it with `/`; the root (`""`) covers every absolute path.
fn under(p: &str, prefix: &str) -> bool {
    p.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn normalize(spec: &str, side: &'static str, p: &str) -> Result<String, MapError> {
    let bad = |why| MapError::Path {
        spec: spec.to_owned(),
        side,
        path: p.to_owned(),
        why,
    };
    if !p.starts_with('/') {
        return Err(bad("must be absolute"));
    }
    let mut out = String::with_capacity(p.len());
    for c in p.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." {
            return Err(bad("must not contain . or .."));
        }
        out.push('/');
        out.push_str(c);
    }
    Ok(out)
}

/// One message's walk: which members are paths, by method and by update kind.
struct Walk<'a> {
    map: &'a PathMap,
    dir: Dir,
    changed: bool,
}

impl Walk<'_> {
    fn params(&mut self, method: &str, p: &mut Value) {
        match method {
            method::SESSION_NEW
            | method::SESSION_LOAD
            | method::SESSION_RESUME
            | method::SESSION_FORK => self.dirs(p),
            method::SESSION_LIST => self.path(p.get_mut("cwd")),
            method::SESSION_PROMPT => {
                for b in p
                    .get_mut("prompt")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    self.block(b);
                }
            }
            method::SESSION_UPDATE => {
                let Some(u) = p.get_mut("update") else { return };
                match u.get("sessionUpdate").and_then(Value::as_str) {
                    Some("tool_call" | "tool_call_update") => self.tool_call(u),
                    Some("agent_message_chunk" | "user_message_chunk" | "agent_thought_chunk") => {
                        if let Some(b) = u.get_mut("content") {
                            self.block(b);
                        }
                    }
                    _ => {}
                }
            }
            method::SESSION_REQUEST_PERMISSION => {
                if let Some(t) = p.get_mut("toolCall") {
                    self.tool_call(t);
                }
            }
            method::FS_READ_TEXT_FILE | method::FS_WRITE_TEXT_FILE => self.path(p.get_mut("path")),
            method::TERMINAL_CREATE => self.path(p.get_mut("cwd")),
            _ => {}
        }
    }

    /// `cwd` and `additionalDirectories` (session setup params, `session/list` entries).
    fn dirs(&mut self, v: &mut Value) {
        self.path(v.get_mut("cwd"));
        for d in v
            .get_mut("additionalDirectories")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            self.path(Some(d));
        }
    }

    fn tool_call(&mut self, t: &mut Value) {
        for l in t
            .get_mut("locations")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            self.path(l.get_mut("path"));
        }
        for c in t
            .get_mut("content")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            match c.get("type").and_then(Value::as_str) {
                Some("diff") => self.path(c.get_mut("path")),
                Some("content") => {
                    if let Some(b) = c.get_mut("content") {
                        self.block(b);
                    }
                }
                _ => {}
            }
        }
    }

    /// A content block: `resource_link.uri`, `resource.resource.uri`.
    fn block(&mut self, b: &mut Value) {
        let uri = match b.get("type").and_then(Value::as_str) {
            Some("resource_link") => b.get_mut("uri"),
            Some("resource") => b.get_mut("resource").and_then(|r| r.get_mut("uri")),
            _ => None,
        };
        if let Some(u) = uri
            && let Some(new) = u.as_str().and_then(|s| self.map.uri(self.dir, s))
        {
            *u = Value::String(new);
            self.changed = true;
        }
    }

    fn path(&mut self, v: Option<&mut Value>) {
        if let Some(v) = v
            && let Some(new) = v.as_str().and_then(|s| self.map.path(self.dir, s))
        {
            *v = Value::String(new);
            self.changed = true;
        }
    }
}
