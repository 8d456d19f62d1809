//! The documents link to what exists: every relative link and `#anchor` in the top-level
//! documents and the book's pages (docs/src) names a file that is there and a heading it has,
//! every `{{#include}}` of the book finds its file, and every page is in SUMMARY.md. And the
//! generated docs (`acpd man`, `acpd completions`) carry the flags the book documents.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use acpd::{Setting, config_reference};
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

use crate::support::security_support::acpd;
use crate::support::source::root;

/// The documents outside the book whose links are checked (deploy/README.md when present).
const TOP_LEVEL: &[&str] = &[
    "README.md",
    "DEVELOPING.md",
    "UPGRADING.md",
    "ARCHITECTURE.md",
    "deploy/README.md",
    "bench/README.md",
];

/// A Markdown document's headings as GitHub and mdBook make anchors of them: lower case,
/// letters, digits, `-` and `_` kept, spaces to `-`, the rest dropped; a repeat gets `-1`, `-2`.
fn heading_slugs(text: &str) -> BTreeSet<String> {
    let mut slugs = BTreeSet::new();
    let mut current: Option<String> = None;
    for event in Parser::new_ext(text, Options::all()) {
        match event {
            Event::Start(Tag::Heading { .. }) => current = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = current.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let Some(h) = current.take() else { continue };
                let base: String = h
                    .trim()
                    .chars()
                    .filter_map(|c| match c {
                        c if c.is_alphanumeric() => Some(c.to_lowercase().next().unwrap_or(c)),
                        '-' | '_' => Some(c),
                        c if c.is_whitespace() => Some('-'),
                        _ => None,
                    })
                    .collect();
                let mut slug = base.clone();
                let mut n = 0;
                while slugs.contains(&slug) {
                    n += 1;
                    slug = format!("{base}-{n}");
                }
                slugs.insert(slug);
            }
            _ => {}
        }
    }
    slugs
}

/// Every link and image target in a Markdown document, code blocks and code spans left out.
fn link_targets(text: &str) -> Vec<String> {
    Parser::new_ext(text, Options::all())
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some(dest_url.to_string())
            }
            _ => None,
        })
        .collect()
}

/// The `{{#include PATH[:FROM[:TO]]}}` lines of a book page: (the file, its lines FROM..=TO).
fn includes(text: &str) -> Vec<(String, Option<usize>, Option<usize>)> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("{{#include "))
        .filter_map(|l| l.strip_suffix("}}"))
        .map(|spec| {
            let mut parts = spec.trim().split(':');
            let path = parts.next().unwrap_or_default().to_owned();
            let from = parts.next().and_then(|p| p.parse().ok());
            let to = parts.next().and_then(|p| p.parse().ok());
            (path, from, to)
        })
        .collect()
}

/// `a/b/../c` as `a/c`, without touching the file system (a target may not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// What a document offers as anchors: its own headings, and for a book page those of the
/// files it includes (they are part of the page mdBook renders).
fn anchors_of(path: &Path, in_book: bool) -> Result<BTreeSet<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !in_book {
        return Ok(heading_slugs(&text));
    }
    let mut page = String::new();
    for line in text.lines() {
        match includes(line).pop() {
            Some((inc, from, to)) => {
                let file = normalize(&path.parent().unwrap_or(Path::new("")).join(&inc));
                // A missing include is reported where it is written (`check_file`).
                let body = std::fs::read_to_string(&file).unwrap_or_default();
                let lines: Vec<&str> = body.lines().collect();
                let from = from.unwrap_or(1).saturating_sub(1).min(lines.len());
                let to = to.unwrap_or(lines.len()).min(lines.len()).max(from);
                page.push_str(&lines[from..to].join("\n"));
            }
            None => page.push_str(line),
        }
        page.push('\n');
    }
    Ok(heading_slugs(&page))
}

/// The broken links, includes and anchors of one document, as lines to report.
fn check_file(file: &Path, book: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => return vec![format!("{}: {e}", file.display())],
    };
    let dir = file.parent().unwrap_or(Path::new(""));
    let in_book = file.starts_with(book);
    if in_book {
        for (inc, ..) in includes(&text) {
            if !normalize(&dir.join(&inc)).is_file() {
                problems.push(format!(
                    "{}: {{{{#include {inc}}}}}: no such file",
                    file.display()
                ));
            }
        }
    }
    for target in link_targets(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let dest = if path.is_empty() {
            file.to_owned()
        } else {
            normalize(&dir.join(path))
        };
        if !dest.exists() {
            problems.push(format!("{}: link {target}: no such file", file.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if dest.extension().is_none_or(|e| e != "md") {
            continue;
        }
        match anchors_of(&dest, dest.starts_with(book)) {
            Ok(slugs) if slugs.contains(anchor) => {}
            Ok(_) => problems.push(format!(
                "{}: link {target}: {} has no heading #{anchor}",
                file.display(),
                dest.display()
            )),
            Err(e) => problems.push(e),
        }
    }
    problems
}

/// Every `.md` file under `dir`.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            out.extend(markdown_under(&path));
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The book's pages that SUMMARY.md does not list (mdBook would not render them).
fn unlisted_pages(book: &Path) -> Vec<String> {
    let summary = book.join("SUMMARY.md");
    let text = std::fs::read_to_string(&summary).unwrap_or_default();
    let listed: BTreeSet<PathBuf> = link_targets(&text)
        .iter()
        .map(|t| normalize(&book.join(t)))
        .collect();
    markdown_under(book)
        .into_iter()
        .filter(|p| *p != summary && !listed.contains(p))
        .map(|p| format!("{}: not in SUMMARY.md", p.display()))
        .collect()
}

fn check_all(root: &Path) -> Vec<String> {
    let book = root.join("docs/src");
    let mut files: Vec<PathBuf> = TOP_LEVEL
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.exists())
        .collect();
    files.extend(markdown_under(&book));
    let mut problems: Vec<String> = files.iter().flat_map(|f| check_file(f, &book)).collect();
    problems.extend(unlisted_pages(&book));
    problems
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = root();
    assert!(
        root.join("docs/src/SUMMARY.md").is_file(),
        "the book is at docs/src"
    );
    let problems = check_all(&root);
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

/// The checker itself finds what it is for, in a little tree of documents made here.
#[test]
fn docs_check_reports_a_missing_file_a_missing_anchor_a_missing_include_and_an_unlisted_page() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs/src")).unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Top\n\n## A `code` heading: here\n\n[ok](#a-code-heading-here) [ok](docs/src/page.md#inside)\n\
         [gone](docs/src/nope.md) [bad anchor](#nowhere) `[not a link](nope.md)`\n\n\
         ```\n[in a block](nope2.md)\n```\n",
    )
    .unwrap();
    std::fs::write(
        root.join("docs/src/SUMMARY.md"),
        "# Summary\n\n- [Page](page.md)\n",
    )
    .unwrap();
    std::fs::write(root.join("INC.md"), "# Inc\n\n## Inside\n").unwrap();
    std::fs::write(
        root.join("docs/src/page.md"),
        "# Page\n\n{{#include ../../INC.md}}\n\n{{#include ../../MISSING.md}}\n\n[up](../../README.md#top)\n",
    )
    .unwrap();
    std::fs::write(root.join("docs/src/orphan.md"), "# Orphan\n").unwrap();
    let problems = check_all(root);
    let has = |needle: &str| problems.iter().any(|p| p.contains(needle));
    assert!(has("link docs/src/nope.md: no such file"), "{problems:#?}");
    assert!(has("link #nowhere:"), "{problems:#?}");
    assert!(
        has("{{#include ../../MISSING.md}}: no such file"),
        "{problems:#?}"
    );
    assert!(has("orphan.md: not in SUMMARY.md"), "{problems:#?}");
    assert_eq!(problems.len(), 4, "{problems:#?}");
}

#[tokio::test]
async fn man_page_has_every_serve_flag_of_the_configuration_reference() {
    let run = acpd(&["man"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("\n.TH acpd 1 "), "{}", run.stdout);
    // roff writes `-` as `\-`.
    let page = run.stdout.replace("\\-", "-");
    let serve = page
        .split(".SH \"ACPD SERVE\"")
        .nth(1)
        .and_then(|s| s.split("\n.SH ").next())
        .expect("acpd(1) has a section for acpd serve");
    let mut flags: Vec<String> = config_reference()
        .into_iter()
        .filter_map(|Setting { flag, .. }| flag)
        .collect();
    assert!(flags.len() > 20, "{flags:?}");
    flags.extend(["--config", "--log-format", "--worker-threads"].map(String::from));
    for flag in &flags {
        assert!(
            serve.contains(&format!("\\fB{flag}\\fR")),
            "`acpd man` does not describe `acpd serve {flag}`"
        );
    }
}

#[tokio::test]
async fn bash_completions_know_the_subcommands_and_serve_flags() {
    let run = acpd(&["completions", "bash"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for word in ["serve", "web-login", "--listen", "--tls-cert"] {
        assert!(run.stdout.contains(word), "no {word} in:\n{}", run.stdout);
    }
    let bad = acpd(&["completions", "tcsh"]).await;
    assert_eq!(bad.code, Some(64), "{}", bad.stderr);
}
