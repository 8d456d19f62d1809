//! acp-shim: stdio ACP agent command that relays to acpd. See `acpd::shim`.

fn main() -> std::process::ExitCode {
    acpd::shim::main()
}
