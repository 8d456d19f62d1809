//! acpd: the Agent Client Protocol served over the network.
//!
//! See ARCHITECTURE.md for the map. `server::serve` is the daemon; `cli::main` the binary.
//! Modules are private: what nothing reaches from here is dead code, and the compiler says so.

mod acp;
mod agent;
mod budget;
mod cli;
mod cluster;
mod config;
mod error;
mod login;
mod mcp_tunnel;
mod metrics;
mod server;
mod session;
mod transport;
mod web;

pub use cli::main;
pub use config::Config;
/// Every setting with its flag, variable and default: what the docs are checked against.
pub use config::{Setting, reference as config_reference};
pub use server::serve;
/// Chunk compaction, for the store suite (it runs it against both backends).
pub use session::compaction::compact;
/// The daemon's store options (its journal form), for tools and tests that open its store.
pub use session::journal_form::store_options;
