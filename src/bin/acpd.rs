//! The `acpd` binary: everything lives in the library; see `acpd::cli`.

// mimalloc, not glibc's malloc: every relayed message allocates and frees across worker
// threads, where glibc's arenas cost a quarter of the streaming CPU (bench/README.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // No transparent huge pages: mimalloc asks for them on its arenas, so every 2 MiB its
    // allocations reach became resident at once, and a daemon holding thousands of small,
    // mostly idle sessions and sockets paid for the untouched rest (67 KiB per session at
    // 100 live; bench/results/2026-12-07-memory.md). Children get the default back
    // (`acpd_builtin::child_env::clean`).
    // SAFETY: a plain prctl on the calling process.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    acpd::main()
}
