//! Build script: turns on the integration tests that need something outside the repository
//! when it is named: a Postgres server, the official ACP SDKs installed by npm and by pip, a
//! chromedriver for the web console's browser tests.
//!
//! Rust cannot mark a test ignored at run time, so the choice is made at build time: with
//! `ACPD_TEST_DATABASE_URL` set, `cfg(acpd_pg)` is on and the Postgres tests run; with
//! `ACPD_TEST_SDK_DIR` set, `cfg(acpd_sdk)` and the npm SDK interop tests; with
//! `ACPD_TEST_PYSDK_PYTHON` set, `cfg(acpd_pysdk)` and the Python SDK one; with
//! `ACPD_TEST_CHROMEDRIVER` set (its path), `cfg(acpd_browser)` and the headless Chromium tests
//! of the web console. Without them they are
//! compiled with `#[ignore]` and show up as ignored in every test run.

fn main() {
    for (var, cfg) in [
        ("ACPD_TEST_DATABASE_URL", "acpd_pg"),
        ("ACPD_TEST_SDK_DIR", "acpd_sdk"),
        ("ACPD_TEST_PYSDK_PYTHON", "acpd_pysdk"),
        ("ACPD_TEST_CHROMEDRIVER", "acpd_browser"),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={var}");
        if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
