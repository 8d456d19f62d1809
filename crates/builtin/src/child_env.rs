//! The environment of every process acpd starts (hosted agents and their supervisor, the
//! built-in agent's host shell, stdio MCP servers, `acpd agent login`): a short allowlist of
//! acpd's own variables and nothing else, so acpd's secrets (provider keys, the cluster
//! secret, the store URL, tokens) never reach a child. What a child needs beyond it, its
//! profile or config names (`env`, `pass_env`).

use std::ffi::{OsStr, OsString};

/// The variables a child inherits from acpd: where programs are, who and where the user is,
/// the locale, the terminal and the time zone. Nothing that holds a credential.
pub const INHERITED: [&str; 9] = [
    "PATH", "HOME", "LANG", "TERM", "TMPDIR", "USER", "LOGNAME", "SHELL", "TZ",
];

/// Locale categories (`LC_ALL`, `LC_CTYPE`, …) are inherited too.
const INHERITED_PREFIX: &str = "LC_";

/// Whether a child inherits acpd's variable `name`.
pub fn inherited(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    INHERITED.contains(&name) || name.starts_with(INHERITED_PREFIX)
}

/// acpd's variables a child inherits, from `vars` (acpd's environment in `clean`).
pub fn allowed(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
    vars.into_iter().filter(|(k, _)| inherited(k)).collect()
}

/// The capabilities that open another process's `/proc/<pid>/environ` even when it is not
/// dumpable (a read-mode ptrace check passes with any of them): `CAP_SYS_PTRACE`,
/// `CAP_SYS_ADMIN`, `CAP_PERFMON` (linux/capability.h; libc does not name them).
const PROC_READING_CAPS: [libc::c_ulong; 3] = [19, 21, 38];

/// Clears `cmd`'s environment down to the allowlist; the caller adds what the child's
/// profile or config names after this. Where acpd runs as root, the child also loses
/// `PROC_READING_CAPS` (from its bounding set, so for everything it starts): with them, a
/// root child could read acpd's `/proc/<pid>/environ` despite `seal_own_environ`.
pub fn clean(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec; plain prctl system calls. Not permitted
    // (no CAP_SETPCAP: acpd is not root) is fine: the child has none of them either.
    unsafe {
        cmd.pre_exec(|| {
            drop_proc_reading_caps();
            // acpd runs with transparent huge pages off (`src/bin/acpd.rs`); the flag survives
            // exec, and the child gets the system's default back.
            libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0);
            Ok(())
        });
    }
    cmd.env_clear().envs(allowed(std::env::vars_os()))
}

/// Drops `PROC_READING_CAPS` from the calling process's bounding set (so from everything it
/// execs and starts). Not permitted (no CAP_SETPCAP: not root) is fine: it has none of them
/// to give away. Async-signal-safe (plain prctl calls), so usable between fork and exec.
pub fn drop_proc_reading_caps() {
    for cap in PROC_READING_CAPS {
        // SAFETY: a plain prctl on the calling process.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
}

/// Makes acpd's own `/proc/<pid>/environ` (and `mem`, `maps`, `fd`, …) unreadable to the
/// processes it starts, which run as the same user: a non-dumpable process's `/proc` files
/// need `CAP_SYS_PTRACE`. What acpd was started with stays its own even where Landlock is
/// missing or a child is not confined (hosted agents). Children are dumpable again after
/// their `exec`. Costs acpd its core dumps.
pub fn seal_own_environ() -> std::io::Result<()> {
    // SAFETY: plain prctl on the calling process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `pass_env`: acpd's own variables a profile names, passed through by name (a variable
/// acpd does not have is left out).
pub fn passed(names: &[String]) -> Vec<(String, OsString)> {
    names
        .iter()
        .filter_map(|n| Some((n.clone(), std::env::var_os(n)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_allowlist_and_locale_categories_are_inherited() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("LC_ALL", "C.UTF-8"),
            ("HOME", "/home/u"),
            ("OPENAI_API_KEY", "sk-x"),
            ("ANTHROPIC_API_KEY", "sk-y"),
            ("ACPD_CLUSTER_SECRET", "s"),
            ("ACPD_STORE", "postgres://u:p@h/db"),
            ("DATABASE_URL", "postgres://u:p@h/db"),
            ("LCX", "no"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let kept: Vec<_> = allowed(vars)
            .into_iter()
            .map(|(k, _)| k.into_string().unwrap())
            .collect();
        assert_eq!(kept, ["PATH", "LC_ALL", "HOME"]);
    }
}
