//! Landlock confinement of the host shell: the command (and everything it starts) may read
//! and write beneath the session's roots, read and execute the system directories, and
//! nothing else, so a permitted `cat ~/.ssh/id_ed25519` or a read of acpd's data directory
//! fails in the kernel. Of `/proc` it may read only a few system-wide files: the
//! directories of processes (acpd's `/proc/<pid>/environ` among them) stay closed. Where
//! Landlock is missing it runs unconfined, with one warning.

use std::path::PathBuf;
use std::sync::OnceLock;

use landlock::{
    ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr,
    path_beneath_rules,
};

/// What a shell command may reach besides the session's roots: the programs and libraries
/// it runs, read-only; `/dev` for `/dev/null` and terminals.
const SYSTEM_READ: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt",
];
/// System-wide `/proc` files tools read (CPU count, memory, load, kernel settings). Not
/// `/proc` itself nor `/proc/self`: a rule is made in acpd, where `/proc/self` is acpd.
const PROC_READ: [&str; 7] = [
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/loadavg",
    "/proc/uptime",
    "/proc/version",
    "/proc/stat",
    "/proc/sys",
];
const SYSTEM_WRITE: [&str; 1] = ["/dev"];

/// The newest ABI this code knows; rights the kernel lacks are dropped (best effort).
const ABI_USED: ABI = ABI::V5;

/// The Landlock ABI version of the running kernel, 0 without Landlock; probed once.
fn kernel_version() -> i64 {
    static VERSION: OnceLock<i64> = OnceLock::new();
    *VERSION.get_or_init(|| {
        // SAFETY: the documented probe: no attribute, size 0, LANDLOCK_CREATE_RULESET_VERSION.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                1u32,
            )
        };
        if v < 1 {
            tracing::warn!(
                "Landlock is not available in this kernel: the built-in agent's host shell runs unconfined"
            );
        }
        v.max(0)
    })
}

/// The paths a session's shell may use.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// Read and write: the session's roots plus the configured extras.
    pub write: Vec<PathBuf>,
    /// Read and execute: the configured extras (system directories are always in).
    pub read: Vec<PathBuf>,
}

/// A ruleset ready to be applied in the child (`restrict_self` in `pre_exec`), or `None`
/// where Landlock is missing.
pub fn ruleset(c: &Confinement) -> Result<Option<RulesetCreated>, landlock::RulesetError> {
    if kernel_version() < 1 {
        return Ok(None);
    }
    let read = SYSTEM_READ
        .iter()
        .chain(&PROC_READ)
        .map(PathBuf::from)
        .chain(c.read.iter().cloned());
    let write = SYSTEM_WRITE
        .iter()
        .map(PathBuf::from)
        .chain(c.write.iter().cloned());
    let created = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI_USED))?
        .create()?
        .add_rules(path_beneath_rules(read, AccessFs::from_read(ABI_USED)))?
        .add_rules(path_beneath_rules(write, AccessFs::from_all(ABI_USED)))?;
    Ok(Some(created))
}

/// Confines `cmd`'s child to `ruleset` just before it executes.
pub fn apply(cmd: &mut tokio::process::Command, ruleset: RulesetCreated) {
    let mut ruleset = Some(ruleset);
    // SAFETY: runs in the forked child before exec; it only makes the prctl and
    // landlock_restrict_self system calls on an already created ruleset descriptor.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(r) = ruleset.take() {
                r.restrict_self().map_err(std::io::Error::other)?;
            }
            Ok(())
        });
    }
}
