//! Journal compaction (placeholder until the store branch lands).
