//! The web console (`src/web`): the cookie rules over real HTTP (`cookies`), and the console
//! driven in a real headless Chromium over WebDriver (`browser`, and `flow` for how a person
//! uses it: following the stream, turn markers, new sessions, the approval badge; both need
//! `ACPD_TEST_CHROMEDRIVER`).

mod agent_login;
mod browser;
mod cookies;
mod flow;
mod hardening;
mod pages;
mod spend;
mod support;
