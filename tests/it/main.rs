//! The one integration-test binary: real sockets, a real daemon, a real store.

#[allow(dead_code)]
mod pgtest;

mod builtin;
mod builtin_support;
