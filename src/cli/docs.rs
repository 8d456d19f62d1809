//! `acpd man` and `acpd completions SHELL`: the man pages and shell completions, generated from
//! the same clap definitions as `--help`, so the three never disagree.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory;

use super::{Cli, EXIT_USAGE};

#[derive(clap::Args)]
pub(crate) struct ManArgs {
    /// Write one page per command (acpd.1, acpd-serve.1, …) into this directory (created if
    /// missing) instead of the whole of acpd(1) to stdout.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// What could not be written; at the CLI boundary it becomes one line and exit status 1.
#[derive(Debug, thiserror::Error)]
enum DocsError {
    #[error("cannot write the man pages to {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
}

/// The command tree as the pages show it: built (subcommands know their `acpd serve` names),
/// without clap's `help` subcommand, which is not a command of acpd's.
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

pub(crate) fn man(args: ManArgs) -> ExitCode {
    let result = match args.out {
        Some(dir) => std::fs::create_dir_all(&dir)
            .and_then(|()| clap_mangen::generate_to(command(), &dir))
            .map_err(|source| DocsError::Dir {
                dir: dir.clone(),
                source,
            }),
        None => one_page(&command())
            .and_then(|page| std::io::stdout().lock().write_all(&page))
            .map_err(DocsError::Stdout),
    };
    finish(result)
}

pub(crate) fn completions(args: CompletionsArgs) -> ExitCode {
    let mut cmd = command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "acpd", &mut out);
    finish(
        std::io::stdout()
            .lock()
            .write_all(&out)
            .map_err(DocsError::Stdout),
    )
}

fn finish(result: Result<(), DocsError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `acpd completions bash | head`: the reader had what it wanted.
        Err(DocsError::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "acpd: {e}");
            // A directory that cannot be written is the caller's to fix, like a bad flag.
            match e {
                DocsError::Dir { .. } => ExitCode::from(EXIT_USAGE),
                DocsError::Stdout(_) => ExitCode::FAILURE,
            }
        }
    }
}

/// acpd(1) as one page: clap_mangen's page of `acpd`, then a section per command (recursively)
/// with its synopsis, description and options, so `man acpd` shows every flag of `serve`.
fn one_page(cmd: &clap::Command) -> std::io::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_section(sub, &mut page)?;
    }
    Ok(page)
}

fn command_section(cmd: &clap::Command, page: &mut Vec<u8>) -> std::io::Result<()> {
    let name = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    writeln!(page, ".SH \"{}\"", name.to_uppercase())?;
    let man = clap_mangen::Man::new(cmd.clone());
    let mut body = Vec::new();
    man.render_synopsis_section(&mut body)?;
    man.render_description_section(&mut body)?;
    man.render_options_section(&mut body)?;
    // The command's own sections become subsections of its section in acpd(1).
    for line in String::from_utf8_lossy(&body).lines() {
        match line.strip_prefix(".SH ") {
            Some(title) => writeln!(page, ".SS {}", title_case(title))?,
            None => writeln!(page, "{line}")?,
        }
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_section(sub, page)?;
    }
    Ok(())
}

/// `OPTIONS` as `Options`: subsection titles are not shouted.
fn title_case(title: &str) -> String {
    let mut chars = title.chars();
    match chars.next() {
        Some(first) => first.to_string() + &chars.as_str().to_lowercase(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_has_a_section_per_command_but_none_for_help() {
        let page = String::from_utf8(one_page(&command()).unwrap()).unwrap();
        assert!(page.contains("\n.TH acpd 1 "), "{}", &page[..120]);
        for section in [
            ".SH \"ACPD SERVE\"",
            ".SH \"ACPD TOKEN CREATE\"",
            ".SH \"ACPD MAN\"",
        ] {
            assert!(page.contains(section), "no {section}");
        }
        assert!(!page.contains(".SH \"ACPD HELP\""));
    }

    #[test]
    fn man_out_writes_one_page_per_command() {
        let dir = tempfile::tempdir().unwrap();
        clap_mangen::generate_to(command(), dir.path()).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        for page in [
            "acpd.1",
            "acpd-serve.1",
            "acpd-token-create.1",
            "acpd-completions.1",
        ] {
            assert!(names.iter().any(|n| n == page), "{names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
    }
}
