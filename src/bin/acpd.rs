//! The `acpd` binary: everything lives in the library; see `acpd::cli`.

fn main() -> std::process::ExitCode {
    acpd::cli::main()
}
