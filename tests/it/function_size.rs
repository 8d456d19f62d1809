//! The function-size rule: a product function longer than `LIMIT` lines says why in a
//! `// long: <reason>` comment directly above it (above or among its attributes and doc lines).
//!
//! Long functions are usually a select! loop or a request handler that grew a branch at a time;
//! the fix is a loop over a closed event enum with one handler per event (the shim's
//! `Relay::on_editor`/`on_socket`/`on_connect`). Some are long for a good reason (a flat
//! match table, a declarative list): the comment states it, and `git grep '// long:'` lists
//! them all. The check parses the code (syn) rather than counting braces, so strings, raw
//! strings and macros cannot fool it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::source::{root, rust_files};
use syn::visit::{self, Visit};

/// The most lines (signature to closing brace) a function may have without a stated reason.
const LIMIT: usize = 80;

/// Every product source file: the daemon's `src/` and each member crate's `src/`.
fn product_files() -> Vec<PathBuf> {
    let mut dirs = vec![root().join("src")];
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        dirs.push(entry.path().join("src"));
    }
    let mut files = vec![];
    for d in dirs {
        rust_files(&d, &mut files);
    }
    files.sort();
    files
}

/// `#[cfg(test)]` (or any cfg naming `test`), `#[test]`, `#[tokio::test]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    fn names_test(tokens: proc_macro2::TokenStream) -> bool {
        use proc_macro2::TokenTree;
        let mut tokens = tokens.into_iter();
        while let Some(t) = tokens.next() {
            match t {
                // `not(test)` is product code.
                TokenTree::Ident(i) if i == "not" => {
                    tokens.next();
                }
                TokenTree::Ident(i) if i == "test" => return true,
                TokenTree::Group(g) if names_test(g.stream()) => return true,
                _ => {}
            }
        }
        false
    }
    attrs.iter().any(|a| {
        let path = a.path();
        if path.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        match &a.meta {
            syn::Meta::List(list) if path.is_ident("cfg") => names_test(list.tokens.clone()),
            _ => false,
        }
    })
}

/// The directory a file's `mod x;` declarations resolve in.
fn module_dir(file: &Path) -> PathBuf {
    let dir = file.parent().unwrap();
    let stem = file.file_stem().unwrap().to_string_lossy();
    let is_root = matches!(stem.as_ref(), "mod" | "lib" | "main")
        || dir.file_name().is_some_and(|d| d == "bin");
    if is_root {
        dir.to_path_buf()
    } else {
        dir.join(stem.as_ref())
    }
}

struct Long {
    file: PathBuf,
    line: usize,
    name: String,
    lines: usize,
}

struct Finder<'a> {
    file: &'a Path,
    source: Vec<&'a str>,
    /// Inline modules entered so far (their out-of-line children resolve beneath them).
    mods: Vec<String>,
    /// The type of the impl block being walked, for `Type::method` names.
    self_ty: Option<String>,
    /// Out-of-line `#[cfg(test)] mod x;` declarations: the module paths they name.
    test_modules: Vec<PathBuf>,
    long: Vec<Long>,
}

impl Finder<'_> {
    fn check(&mut self, attrs: &[syn::Attribute], sig: &syn::Signature, block: &syn::Block) {
        let start = sig.ident.span().start().line;
        let end = block.brace_token.span.close().end().line;
        let lines = end + 1 - start;
        if lines <= LIMIT || self.reason_above(attrs, start) {
            return;
        }
        let name = match &self.self_ty {
            Some(t) => format!("{t}::{}", sig.ident),
            None => sig.ident.to_string(),
        };
        self.long.push(Long {
            file: self.file.to_path_buf(),
            line: start,
            name,
            lines,
        });
    }

    /// Whether a `// long: <reason>` line sits in the run of comment and attribute lines
    /// directly above the signature.
    fn reason_above(&self, attrs: &[syn::Attribute], sig_line: usize) -> bool {
        let attr_lines: BTreeSet<usize> = attrs
            .iter()
            .flat_map(|a| {
                let s = a.pound_token.span.start().line;
                let e = a.bracket_token.span.close().end().line;
                s..=e
            })
            .collect();
        let mut line = sig_line - 1; // 1-based: the line above the signature
        while line >= 1 {
            let text = self.source[line - 1].trim();
            if let Some(reason) = text.strip_prefix("// long:") {
                return !reason.trim().is_empty();
            }
            if !(text.starts_with("//") || attr_lines.contains(&line)) {
                return false;
            }
            line -= 1;
        }
        false
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test(&m.attrs) {
            if m.content.is_none() {
                let mut path = module_dir(self.file);
                path.extend(&self.mods);
                self.test_modules.push(path.join(m.ident.to_string()));
            }
            return;
        }
        self.mods.push(m.ident.to_string());
        visit::visit_item_mod(self, m);
        self.mods.pop();
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let name = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.self_ty, name);
        visit::visit_item_impl(self, i);
        self.self_ty = outer;
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        let outer = self.self_ty.replace(t.ident.to_string());
        visit::visit_item_trait(self, t);
        self.self_ty = outer;
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        // A free function nested in a method is not that type's method.
        let outer = self.self_ty.take();
        self.check(&f.attrs, &f.sig, &f.block);
        visit::visit_item_fn(self, f);
        self.self_ty = outer;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        self.check(&f.attrs, &f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default
            && !is_test(&f.attrs)
        {
            self.check(&f.attrs, &f.sig, block);
        }
        visit::visit_trait_item_fn(self, f);
    }
}

/// Every product function over the limit without a stated reason.
fn long_functions() -> Vec<Long> {
    let files = product_files();
    let sources: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let mut long = vec![];
    let mut test_modules = vec![];
    for (file, source) in files.iter().zip(&sources) {
        let ast = syn::parse_file(source).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut finder = Finder {
            file,
            source: source.lines().collect(),
            mods: vec![],
            self_ty: None,
            test_modules: vec![],
            long: vec![],
        };
        finder.visit_file(&ast);
        long.extend(finder.long);
        test_modules.extend(finder.test_modules);
    }
    // A `#[cfg(test)] mod x;` is x.rs, x/mod.rs and everything beneath x/.
    long.retain(|l| {
        !test_modules
            .iter()
            .any(|m| l.file == m.with_extension("rs") || l.file.starts_with(m))
    });
    long
}

#[test]
fn product_functions_over_the_limit_state_a_reason() {
    let long = long_functions();
    let mut report = String::new();
    for l in &long {
        let rel = l.file.strip_prefix(root()).unwrap_or(&l.file);
        report += &format!(
            "  {}:{} {} ({} lines)\n",
            rel.display(),
            l.line,
            l.name,
            l.lines
        );
    }
    assert!(
        report.is_empty(),
        "product functions over {LIMIT} lines with no `// long: <reason>` comment above them \
         (split them along their seams, or state why they are long):\n{report}"
    );
}

/// The rule must see what it claims to: a long function is found, a reason excuses it, test
/// code is skipped, inline or out of line (and `cfg(not(test))` code is not).
#[test]
fn function_size_rule_sees_long_functions_and_reasons() {
    let body = "    let _ = 1;\n".repeat(LIMIT);
    let source = format!(
        "struct S;\nimpl S {{\n    fn long(&self) {{\n{body}    }}\n\n    // long: a flat table\n    \
         #[inline]\n    fn excused(&self) {{\n{body}    }}\n}}\n\nfn short() {{}}\n\n\
         #[cfg(test)]\nmod tests {{\n    fn in_tests() {{\n{body}    }}\n}}\n\n\
         #[cfg(not(test))]\nfn product_only() {{\n{body}}}\n\n#[cfg(test)]\nmod more;\n"
    );
    let ast = syn::parse_file(&source).unwrap();
    let mut finder = Finder {
        file: Path::new("src/example.rs"),
        source: source.lines().collect(),
        mods: vec![],
        self_ty: None,
        test_modules: vec![],
        long: vec![],
    };
    finder.visit_file(&ast);
    let found: Vec<_> = finder
        .long
        .iter()
        .map(|l| (l.name.as_str(), l.lines))
        .collect();
    assert_eq!(found, [("S::long", LIMIT + 2), ("product_only", LIMIT + 2)]);
    // An out-of-line test module's file (more.rs or more/mod.rs) is left out.
    assert_eq!(finder.test_modules, [PathBuf::from("src/example/more")]);
}
