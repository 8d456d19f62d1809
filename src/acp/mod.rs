//! The agent side of ACP as acpd serves it: one `connection` task per client, method
//! dispatch, capability negotiation and the error mapping.

pub mod connection;
mod error;
mod params;

pub use error::AcpError;
