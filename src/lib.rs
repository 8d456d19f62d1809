//! acpd: the Agent Client Protocol served over the network.
pub mod store;
// Only the compaction part of the session layer lives on this branch; the merge reconciles it
// with the real `session` module.
pub mod session {
    pub mod compaction;
}
