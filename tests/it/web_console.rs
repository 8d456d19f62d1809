//! The web console (`src/web`): the cookie rules over real HTTP (`cookies`), and the console
//! driven in a real headless Chromium over WebDriver (`browser`, needs `ACPD_TEST_CHROMEDRIVER`).

mod browser;
mod cookies;
mod hardening;
mod pages;
mod support;
