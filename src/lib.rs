//! acpd: the Agent Client Protocol served over the network.
//!
//! See ARCHITECTURE.md for the map. `server::serve` is the daemon; `cli::main` the binary.

pub mod acp;
pub mod agent;
pub mod cli;
pub mod config;
pub mod jsonrpc;
pub mod metrics;
pub mod server;
pub mod session;
pub mod store;
pub mod transport;
