//! Build script: turns on the Postgres integration tests when a test server is named.
//!
//! Rust cannot mark a test ignored at run time, so the choice is made at build time: with
//! `ACPD_TEST_DATABASE_URL` set, `cfg(acpd_pg)` is on and the Postgres tests run; without it
//! they are compiled with `#[ignore]` and show up as ignored in every test run.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(acpd_pg)");
    println!("cargo::rerun-if-env-changed=ACPD_TEST_DATABASE_URL");
    if std::env::var_os("ACPD_TEST_DATABASE_URL").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=acpd_pg");
    }
}
