//! acpd: the Agent Client Protocol served over the network.
pub mod store;
