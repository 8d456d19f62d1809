//! The layering ARCHITECTURE.md promises, checked: no import cycles between files or between
//! a crate's top-level modules, the crates' dependency edges, and a truthful `rust-version`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::support::source::root;
use serde_json::Value;

/// Every library or binary crate of the workspace, by the folder its root file is in.
fn crate_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![root().join("src")];
    let mut members: Vec<_> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("src"))
        .collect();
    members.sort();
    dirs.extend(members);
    dirs
}

type ModPath = Vec<String>;

/// The module each file of a crate is, keyed by its path (`lib.rs`/`main.rs` is `[]`);
/// `src/bin/` holds separate crates and is left out.
fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<ModPath, PathBuf>, top: bool) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let p = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if top && name == "bin" {
                    continue;
                }
                let mut sub = prefix.to_vec();
                sub.push(name);
                walk(&p, &sub, out, false);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let mut m = prefix.to_vec();
                if !(matches!(stem, "mod") || (top && matches!(stem, "lib" | "main"))) {
                    m.push(stem.to_owned());
                }
                out.insert(m, p);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &[], &mut out, true);
    out
}

/// Code without comments and string literals, so that neither is read as a path.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                }
                prev = if prev == '\\' && c == '\\' { ' ' } else { c };
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' {
                in_str = true;
            }
            out.push(c);
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// The paths a `crate::…`/`super::…` reference names, with `{…}` groups expanded.
fn expand(s: &str, prefix: Vec<String>, out: &mut Vec<ModPath>) {
    let mut cur = prefix;
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        expand(&group[start..i], cur.clone(), out);
                        start = i + 1;
                        if c == '}' {
                            return;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        cur.push(rest[..end].to_owned());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out.push(cur);
}

/// Import edges between the files of one crate: file module → module it names. A module
/// naming its own ancestors (items its parent declares) is how Rust nests, not an edge.
fn edges(mods: &BTreeMap<ModPath, PathBuf>) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut out: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (me, file) in mods {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let mut paths = vec![];
        for (i, _) in code.match_indices("crate::") {
            if code[..i].ends_with('$')
                || code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            expand(&code[i + "crate::".len()..], vec![], &mut paths);
        }
        for (i, _) in code.match_indices("super::") {
            if code[..i].ends_with("super::")
                || code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            let mut base = me.clone();
            let mut rest = &code[i..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            expand(rest, base, &mut paths);
        }
        for p in paths {
            // The longest prefix that is a module of this crate.
            let target = (0..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|m| mods.contains_key(m));
            let Some(target) = target else { continue };
            if me.starts_with(&target) {
                continue;
            }
            out.entry(me.clone()).or_default().insert(target);
        }
    }
    out
}

/// A cycle in `graph`, if there is one, as the list of nodes around it.
fn find_cycle<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        n: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        state: &mut BTreeMap<N, u8>,
        stack: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m) {
                Some(1) => {
                    let at = stack.iter().position(|x| x == m).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if !state.contains_key(n) {
            let mut stack = vec![];
            if let Some(c) = visit(n, graph, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_import_cycles_between_files_or_top_level_modules() {
    let mut problems = vec![];
    for src in crate_dirs() {
        let mods = modules(&src);
        let files = edges(&mods);
        if let Some(c) = find_cycle(&files) {
            let names: Vec<_> = c
                .iter()
                .map(|m| mods[m].strip_prefix(root()).unwrap().display().to_string())
                .collect();
            problems.push(format!("files import each other: {}", names.join(" -> ")));
        }
        let mut tops: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in &files {
            let Some(a) = from.first() else { continue };
            for to in tos {
                let Some(b) = to.first() else { continue };
                if a != b {
                    tops.entry(a.clone()).or_default().insert(b.clone());
                }
            }
        }
        if let Some(c) = find_cycle(&tops) {
            problems.push(format!(
                "modules of {} import each other: {}",
                src.strip_prefix(root()).unwrap().display(),
                c.join(" -> ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    // The check above must be able to fail: two sibling files naming each other.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.path().join("a.rs"), "use crate::b::{X, y::Z};\n").unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    std::fs::write(
        dir.path().join("b/mod.rs"),
        "use super::a::W; // crate::a\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("b/y.rs"), "use super::super::a;\n").unwrap();
    let mods = modules(dir.path());
    let cycle = find_cycle(&edges(&mods)).expect("a cycle");
    assert!(cycle.contains(&vec!["a".to_owned()]), "{cycle:?}");
    // A child naming its parent is not a cycle.
    std::fs::write(dir.path().join("a.rs"), "pub struct W;\n").unwrap();
    std::fs::write(dir.path().join("b/y.rs"), "use super::X;\n").unwrap();
    std::fs::write(dir.path().join("b/mod.rs"), "mod y;\nuse crate::b::y::Z;\n").unwrap();
    assert_eq!(find_cycle(&edges(&modules(dir.path()))), None);
}

/// `cargo metadata` of the workspace for this platform, from its lock file (once: cargo
/// locks its package cache, so the tests share one run).
fn metadata() -> &'static Value {
    static META: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    META.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked", "--offline"])
            .args([
                "--filter-platform",
                &format!("{}-unknown-linux-gnu", std::env::consts::ARCH),
            ])
            .current_dir(root())
            .output()
            .expect("run cargo metadata");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    })
}

/// Names of every package `name` depends on, transitively, for normal (not dev or build)
/// dependencies on this platform.
fn normal_deps_of(meta: &Value, name: &str) -> BTreeSet<String> {
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let start = names
        .iter()
        .find(|(_, n)| **n == name)
        .map(|(id, _)| *id)
        .unwrap();
    let mut seen = BTreeSet::new();
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            let pkg = dep["pkg"].as_str().unwrap();
            if normal && seen.insert(names[pkg].to_owned()) {
                todo.push(pkg);
            }
        }
    }
    seen
}

#[test]
fn crate_edges_enforce_the_layers() {
    let meta = metadata();
    let rules: [(&str, &[&str]); 6] = [
        (
            "acpd-wire",
            &[
                "axum",
                "hyper",
                "sqlx",
                "agent-client-protocol-schema",
                "acpd-store",
                "reqwest",
            ],
        ),
        (
            "acpd-store",
            &["agent-client-protocol-schema", "acpd-wire", "axum", "hyper"],
        ),
        (
            "acpd-builtin",
            &["sqlx", "axum", "acpd-store", "tokio-tungstenite"],
        ),
        (
            "acp-shim",
            &[
                "sqlx",
                "axum",
                "rmcp",
                "acpd-store",
                "acpd-builtin",
                "reqwest",
            ],
        ),
        ("acpd-scripted-agent", &["acpd-wire", "acpd", "acpd-store"]),
        // The vocabulary does no I/O and knows no layer.
        (
            "acpd-protocol",
            &["acpd-wire", "acpd-store", "tokio", "serde", "serde_json"],
        ),
    ];
    let mut problems = vec![];
    for (krate, banned) in rules {
        let deps = normal_deps_of(meta, krate);
        for b in banned {
            if deps.contains(*b) {
                problems.push(format!("{krate} depends on {b}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn version(v: &str) -> (u64, u64, u64) {
    let mut it = v.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

#[test]
fn rust_version_is_truthful() {
    // The toolchain here is newer than our `rust-version`, so the claim is checked against
    // what we use: no locked dependency may ask for a newer compiler than we say we need.
    let meta = metadata();
    let ours = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "acpd")
        .and_then(|p| p["rust_version"].as_str())
        .expect("acpd has a rust-version")
        .to_owned();
    let mut over = vec![];
    // Our own code uses let-chains (`if let … && …`), stable since 1.88.
    if version(&ours) < (1, 88, 0) {
        over.push("let-chains need 1.88".to_owned());
    }
    for p in meta["packages"].as_array().unwrap() {
        let workspace = p["source"].is_null();
        if let Some(rv) = p["rust_version"].as_str() {
            if workspace && rv != ours {
                over.push(format!("{} says {rv}, the workspace {ours}", p["name"]));
            }
            if version(rv) > version(&ours) {
                over.push(format!("{} {} needs rust {rv}", p["name"], p["version"]));
            }
        }
    }
    assert!(
        over.is_empty(),
        "rust-version {ours} is not enough:\n{}",
        over.join("\n")
    );
}
