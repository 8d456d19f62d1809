//! `acp-shim`: the stdio agent command an editor launches (placeholder until the shim lands).

fn main() {}
