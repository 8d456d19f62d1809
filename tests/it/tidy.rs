//! Tidy rules that keep the codebase as ARCHITECTURE.md describes it.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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
}

#[test]
fn source_files_stay_under_600_lines() {
    let mut files = vec![];
    for dir in ["src", "tests", "benches", "crates"] {
        rust_files(&root().join(dir), &mut files);
    }
    let long: Vec<_> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 600).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these files: {long:?}");
}
