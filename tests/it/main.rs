//! The one integration-test binary: real sockets, a real daemon, a real store.

mod pgtest;
