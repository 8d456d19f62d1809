//! The agent side of ACP as acpd serves it: one `connection` task per client, method
//! dispatch, capability negotiation and parameter checks.

pub mod connection;
mod params;
