//! The agent side of ACP as acpd serves it: one `connection` task per client, method
//! dispatch, capability negotiation, parameter checks and the rate limit (`rate`).

pub mod connection;
mod initialize;
mod params;
mod rate;
mod share;
