//! acp-shim: stdio ACP agent command that relays to acpd. See the crate docs (lib.rs).

// mimalloc, not glibc's malloc: every relayed message allocates and frees across worker
// threads, where glibc's arenas cost a quarter of the streaming CPU (bench/README.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    acp_shim::main()
}
