//! Tidy rules that keep the codebase as ARCHITECTURE.md describes it.

use crate::support::source::{root, rust_files};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

#[test]
fn every_source_file_starts_with_a_doc_line() {
    let mut files = vec![];
    for dir in ["src", "tests", "benches", "crates"] {
        rust_files(&root().join(dir), &mut files);
    }
    let missing: Vec<_> = files
        .iter()
        .filter(|f| !std::fs::read_to_string(f).unwrap().starts_with("//!"))
        .collect();
    assert!(
        missing.is_empty(),
        "files without a leading //! line: {missing:?}"
    );
}

#[test]
fn stdout_is_never_used_for_logs() {
    let mut files = vec![];
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("crates"), &mut files);
    // The CLI prints command output (a new token's secret, `token list`); the scripted
    // agent's stdout is its protocol (and its tests may print). Nothing else writes to stdout.
    let allowed = ["cli.rs", "cert.rs", "scripted-agent", "/tests/", "build.rs"];
    let offenders: Vec<_> = files
        .iter()
        .filter(|f| !allowed.iter().any(|a| f.to_string_lossy().contains(a)))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            // `eprintln!`/`eprint!` write to stderr and are fine.
            ["println!(", "print!(", "dbg!("].iter().any(|m| {
                text.match_indices(m)
                    .any(|(i, _)| !text[..i].ends_with('e'))
            })
        })
        .collect();
    assert!(offenders.is_empty(), "stdout/dbg! used in {offenders:?}");
}

#[test]
fn migration_folders_mirror_each_other() {
    let names = |d: &str| {
        let mut v: Vec<String> = std::fs::read_dir(root().join("migrations").join(d))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("sqlite"), names("postgres"));
}

#[test]
fn architecture_names_every_module() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    for entry in std::fs::read_dir(root().join("src")).unwrap().flatten() {
        let name = entry
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if ["lib", "bin", "main"].contains(&name.as_str()) {
            continue;
        }
        assert!(
            arch.contains(&format!("`{name}`")),
            "ARCHITECTURE.md does not mention `{name}`"
        );
    }
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let manifest = std::fs::read_to_string(entry.path().join("Cargo.toml")).unwrap();
        let name = manifest
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .unwrap();
        assert!(
            arch.contains(&format!("**`{name}`**")),
            "ARCHITECTURE.md has no paragraph for the crate `{name}`"
        );
    }
}

#[test]
fn architecture_stays_a_map() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let lines = arch.lines().count();
    assert!(
        lines <= 250,
        "ARCHITECTURE.md has {lines} lines: what is true of one module goes in its //! doc"
    );
}

/// The `**Architecture Invariant:**` paragraphs of ARCHITECTURE.md (each up to a blank line).
fn invariants(arch: &str) -> Vec<String> {
    arch.split("\n\n")
        .map(str::trim)
        .filter(|p| p.starts_with("**Architecture Invariant:**"))
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The tests an invariant names: its paragraph ends with `(test: a::b, c::d)`.
fn named_tests(invariant: &str) -> Option<Vec<String>> {
    let rest = invariant.strip_suffix(").")?;
    let list = &rest[rest.rfind("(test: ")? + "(test: ".len()..];
    let names: Vec<String> = list
        .split(',')
        .map(|n| n.trim().trim_matches('`').to_owned())
        .collect();
    names
        .iter()
        .all(|n| n.contains("::") && !n.contains(' '))
        .then_some(names)
}

/// The names of the test functions in one file: a `fn` whose attributes, directly above it,
/// include `#[test]` or `#[tokio::test…]`. (Tests a macro makes, like `store::both!`'s, have
/// no name here: an invariant names a test written out.)
fn test_fns(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut out = vec![];
    for (i, line) in lines.iter().enumerate() {
        let decl = ["pub(crate) ", "pub(super) ", "pub ", "async "]
            .iter()
            .fold(*line, |l, p| l.strip_prefix(p).unwrap_or(l));
        let decl = decl.strip_prefix("async ").unwrap_or(decl);
        let Some(rest) = decl.strip_prefix("fn ") else {
            continue;
        };
        // The attribute lines above: up to code, a comment or a blank line.
        let mut attrs = lines[..i]
            .iter()
            .rev()
            .take_while(|l| !(l.is_empty() || l.starts_with("//") || l.ends_with(['}', ';', '{'])));
        if !attrs.any(|a| a.starts_with("#[test]") || a.starts_with("#[tokio::test")) {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

/// Every test as it may be named in an invariant: `module::test` for the integration binary
/// (`cargo test -p acpd --test it module::test` runs it), `crate::module::test` for a unit
/// test (with or without the `tests` module it sits in).
fn existing_tests() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let module = |base: &Path, file: &Path| -> Vec<String> {
        let rel = file.strip_prefix(base).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        parts
    };
    let mut crates = vec![("acpd".to_owned(), root().join("src"))];
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let manifest = std::fs::read_to_string(entry.path().join("Cargo.toml")).unwrap();
        let name = manifest
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .unwrap()
            .replace('-', "_");
        crates.push((name, entry.path().join("src")));
    }
    let it = root().join("tests/it");
    let mut sources: Vec<(Vec<String>, PathBuf)> = vec![];
    let mut files = vec![];
    rust_files(&it, &mut files);
    sources.extend(files.drain(..).map(|f| (module(&it, &f), f)));
    for (name, src) in &crates {
        rust_files(src, &mut files);
        for f in files.drain(..) {
            let mut path = vec![name.clone()];
            path.extend(module(src, &f));
            sources.push((path, f));
        }
    }
    for (path, file) in sources {
        let prefix = path.join("::");
        for test in test_fns(&std::fs::read_to_string(&file).unwrap()) {
            names.insert(format!("{prefix}::{test}"));
            names.insert(format!("{prefix}::tests::{test}"));
        }
    }
    names
}

#[test]
fn every_architecture_invariant_names_a_test_that_exists() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let invariants = invariants(&arch);
    assert!(
        invariants.len() >= 8,
        "ARCHITECTURE.md has {} invariants; the map keeps about a dozen",
        invariants.len()
    );
    let tests = existing_tests();
    let mut problems = vec![];
    for inv in &invariants {
        match named_tests(inv) {
            None => problems.push(format!("names no test `(test: module::name).`: {inv}")),
            Some(names) => problems.extend(
                names
                    .into_iter()
                    .filter(|n| !tests.contains(n))
                    .map(|n| format!("no such test `{n}`: {inv}")),
            ),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_invariant_check_sees_a_missing_test() {
    let tests = existing_tests();
    // Names this file's own tests the way an invariant does, and one that is not there.
    assert!(tests.contains("tidy::every_architecture_invariant_names_a_test_that_exists"));
    assert!(
        tests.contains("acpd_store::pack::tests::a_run_of_one_session_kind_and_time_is_one_row")
    );
    assert!(
        tests.contains("cancel::a_closed_turns_late_answer_never_ends_a_reopened_sessions_prompt")
    );
    assert!(!tests.contains("tidy::no_such_test"));
    let text = "intro\n\n**Architecture Invariant:** a rule\nover lines (test: a::b, `c::d`).\n\n\
                **Architecture Invariant:** untested.";
    let found = invariants(text);
    assert_eq!(found.len(), 2);
    assert_eq!(
        named_tests(&found[0]),
        Some(vec!["a::b".into(), "c::d".into()])
    );
    assert_eq!(named_tests(&found[1]), None);
}

/// Files allowed to hold the whole `acpd_store::Store`: the session layer (sessions and
/// journals), the daemon's wiring that opens it and hands out the narrow handles, token auth,
/// and the admin commands. Everyone else holds a narrow handle (`WebStore`, `RegistryStore`,
/// `ClusterStore`) or nothing.
const WHOLE_STORE: &[&str] = &[
    "src/session/",
    "src/server/mod.rs",
    "src/server/auth.rs",
    "src/cli.rs",
    "src/cli/",
];

/// Whether code (comments left out) names `acpd_store::Store`, alone or in a `use` list.
fn names_whole_store(text: &str) -> bool {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    code.match_indices("acpd_store::").any(|(i, m)| {
        let rest = code[i + m.len()..].trim_start();
        let items = match rest.strip_prefix('{') {
            Some(list) => &list[..list.find('}').unwrap_or(list.len())],
            None => rest,
        };
        let mut words = items.split(|c: char| !(c.is_alphanumeric() || c == '_'));
        match rest.starts_with('{') {
            true => words.any(|w| w == "Store"),
            false => words.next() == Some("Store"),
        }
    })
}

#[test]
fn only_the_session_layer_holds_the_whole_store() {
    let mut files = vec![];
    rust_files(&root().join("src"), &mut files);
    let offenders: Vec<_> = files
        .iter()
        .filter(|f| {
            let rel = f
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            !WHOLE_STORE.iter().any(|a| rel.starts_with(a))
        })
        .filter(|f| names_whole_store(&std::fs::read_to_string(f).unwrap()))
        .collect();
    assert!(
        offenders.is_empty(),
        "these hold the whole store; give them a narrow handle (acpd_store::handles): {offenders:?}"
    );
    // The rule sees what it is about.
    assert!(names_whole_store(
        "use acpd_store::{JournalEntry,\n    Store};"
    ));
    assert!(names_whole_store("let s = acpd_store::Store::open(u, o);"));
    assert!(!names_whole_store(
        "use acpd_store::{StoreError, WebStore};"
    ));
    assert!(!names_whole_store("// acpd_store::Store::open"));
}
