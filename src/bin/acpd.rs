//! The `acpd` binary: everything lives in the library; see `acpd::cli`.

// mimalloc, not glibc's malloc: every relayed message allocates and frees across worker
// threads, where glibc's arenas cost a quarter of the streaming CPU (bench/README.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    acpd::main()
}
