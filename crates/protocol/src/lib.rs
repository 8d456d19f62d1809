//! acpd's protocol vocabulary: the name of every ACP and `_acpd/` method acpd, acp-shim and
//! the agents of this workspace interpret ([`method`]), and the one form acpd writes a
//! journaled `session/update` in ([`update_form`]). `acpd-wire` below it knows JSON-RPC only;
//! this crate is where ACP's words live, so that no other file spells a method name.

pub mod method;
pub mod update_form;

pub use method::Method;
