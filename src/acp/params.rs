//! Shape checks on the params of the session methods acpd routes itself, before anything
//! is sent to a session or an agent.
//!
//! Without them a `sessionId` of the wrong type made a session method look sessionless, so it
//! went to the agent (which answered "method not found" for methods acpd emulates), and
//! wrong types in fields acpd or the agent reads were relayed or silently ignored. Only
//! types are checked here, not the whole schema: params are still relayed verbatim, and
//! whatever a check does not mention (extensions, `_meta`) passes.

use acpd_protocol::method;
use serde_json::Value;

use crate::config::roots::OutsideRoots;
use crate::error::AcpError;
use crate::session::roles::Role;

/// Why params were refused: the message of the -32602 they earn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    #[error("{0}: params must be an object")]
    NotAnObject(String),
    #[error("{field} must be {what}")]
    Field {
        field: &'static str,
        what: &'static str,
    },
    /// A required member is absent (the text names it and what it holds).
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("role must be \"controller\" or \"observer\"")]
    AttachRole,
    #[error("role must be \"controller\" or \"observer\" (or revoke: true)")]
    ShareRole,
    #[error("afterSeq must be a non-negative integer")]
    AfterSeq,
    /// A session directory outside the principal's roots.
    #[error(transparent)]
    Roots(#[from] OutsideRoots),
}

impl From<ParamsError> for AcpError {
    fn from(e: ParamsError) -> AcpError {
        AcpError::InvalidParams(e.to_string())
    }
}

/// What a field must be.
#[derive(Clone, Copy)]
enum Kind {
    String,
    /// A string holding an absolute path (ACP requires absolute `cwd`s).
    AbsolutePath,
    Array,
    /// An array of objects that each have a string `type` (content blocks).
    Blocks,
}

/// `(field, kind, required)` for each method acpd checks.
fn rules(method: &str) -> Option<&'static [(&'static str, Kind, bool)]> {
    use Kind::*;
    const SID: (&str, Kind, bool) = ("sessionId", String, true);
    Some(match method {
        method::SESSION_NEW => &[("cwd", AbsolutePath, true), ("mcpServers", Array, false)],
        method::SESSION_LOAD | method::SESSION_RESUME | method::SESSION_FORK => &[
            SID,
            ("cwd", AbsolutePath, false),
            ("mcpServers", Array, false),
        ],
        method::SESSION_LIST => &[("cwd", AbsolutePath, false), ("cursor", String, false)],
        method::SESSION_PROMPT => &[SID, ("prompt", Blocks, true)],
        method::SESSION_SET_MODE => &[SID, ("modeId", String, true)],
        method::SESSION_SET_CONFIG_OPTION => &[SID, ("configId", String, true)],
        method::SESSION_CLOSE
        | method::SESSION_DELETE
        | method::SESSION_CANCEL
        | method::SESSION_SET_MODEL
        | method::ACPD_SESSION_ATTACH => &[SID],
        _ => return None,
    })
}

/// Checks `params` of `method`; the message of the -32602 it earns, if any. Methods acpd does
/// not know pass unchecked.
pub fn check(method: &str, params: &Value) -> Result<(), ParamsError> {
    let Some(rules) = rules(method) else {
        return Ok(());
    };
    let Some(obj) = params.as_object() else {
        return Err(ParamsError::NotAnObject(method.to_owned()));
    };
    for &(field, kind, required) in rules {
        let ok = match (obj.get(field), kind) {
            (None, _) => !required,
            (Some(Value::String(s)), Kind::String) => !s.is_empty(),
            (Some(Value::String(s)), Kind::AbsolutePath) => s.starts_with('/'),
            (Some(Value::Array(_)), Kind::Array) => true,
            (Some(Value::Array(items)), Kind::Blocks) => items
                .iter()
                .all(|b| b.get("type").is_some_and(Value::is_string)),
            _ => false,
        };
        if !ok {
            let what = match kind {
                Kind::String => "a non-empty string",
                Kind::AbsolutePath => "an absolute path",
                Kind::Array => "an array",
                Kind::Blocks => "an array of content blocks",
            };
            return Err(ParamsError::Field { field, what });
        }
    }
    Ok(())
}

/// The role an attach asks for: `session/load|resume` attach a controller (the editor case);
/// `_acpd/session/attach` says (`role`, default controller).
pub(super) fn attach_role(method: &str, params: &Value) -> Result<Role, ParamsError> {
    match params.get("role") {
        _ if method != method::ACPD_SESSION_ATTACH => Ok(Role::Controller),
        None | Some(Value::Null) => Ok(Role::Controller),
        Some(r) => r
            .as_str()
            .and_then(Role::parse)
            .ok_or(ParamsError::AttachRole),
    }
}

/// `_acpd/session/share {sessionId, with, role}` or `{sessionId, with, revoke: true}`:
/// session id, grantee name, role (`None`: revoke).
pub(super) fn share_request(params: &Value) -> Result<(String, String, Option<Role>), ParamsError> {
    let sid = params
        .get("sessionId")
        .and_then(Value::as_str)
        .ok_or(ParamsError::Missing("sessionId"))?;
    let with = params
        .get("with")
        .and_then(Value::as_str)
        .ok_or(ParamsError::Missing("with (a principal name)"))?;
    if params.get("revoke") == Some(&Value::Bool(true)) {
        return Ok((sid.to_owned(), with.to_owned(), None));
    }
    let role = params
        .get("role")
        .and_then(Value::as_str)
        .and_then(Role::parse)
        .ok_or(ParamsError::ShareRole)?;
    Ok((sid.to_owned(), with.to_owned(), Some(role)))
}

/// The acpd extension `_meta.acpd.allProfiles: true`: sessions of every profile, not only of
/// the connection's.
pub(super) fn all_profiles(params: &Value) -> bool {
    params.pointer("/_meta/acpd/allProfiles") == Some(&Value::Bool(true))
}

pub(super) fn session_id(params: &Value) -> Option<String> {
    params
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// `cwd` and `additionalDirectories` of a `session/new|load|resume` against the principal's
/// roots (and never acpd's data directory): the reason when refused.
pub(super) fn check_roots(
    roots: &crate::config::roots::FsRoots,
    principal_name: &str,
    params: &Value,
) -> Result<(), ParamsError> {
    let Some(cwd) = params.get("cwd").and_then(Value::as_str) else {
        return Ok(()); // `check` already refused a missing one where it matters.
    };
    let additional: Vec<std::path::PathBuf> = params
        .get("additionalDirectories")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(Into::into)
        .collect();
    roots
        .check_session(principal_name, cwd.as_ref(), &additional)
        .map_err(|e| {
            tracing::warn!(target: "acpd::audit", principal = %principal_name, reason = %e, "session directory refused");
            e.into()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn good_params_pass_and_unknown_methods_are_not_checked() {
        let ok = [
            (
                "session/new",
                json!({ "cwd": "/w", "mcpServers": [], "_meta": {} }),
            ),
            ("session/list", json!({})),
            ("session/list", json!({ "cwd": "/w", "cursor": "c" })),
            (
                "session/prompt",
                json!({ "sessionId": "s", "prompt": [{ "type": "text", "text": "x" }] }),
            ),
            (
                "session/load",
                json!({ "sessionId": "s", "cwd": "/w", "mcpServers": [] }),
            ),
            (
                "_acpd/session/attach",
                json!({ "sessionId": "s", "afterSeq": 3 }),
            ),
            ("session/whatever", json!([1])),
            ("_vendor/x", json!("anything")),
        ];
        for (m, p) in ok {
            assert_eq!(check(m, &p), Ok(()), "{m} {p}");
        }
    }

    #[test]
    fn wrong_types_are_named() {
        let bad = [
            ("session/new", json!({ "cwd": 5 }), "cwd"),
            ("session/new", json!({ "cwd": "relative" }), "cwd"),
            (
                "session/new",
                json!({ "cwd": "/w", "mcpServers": "none" }),
                "mcpServers",
            ),
            ("session/list", json!({ "cursor": 5 }), "cursor"),
            ("session/list", json!([1]), "object"),
            (
                "session/prompt",
                json!({ "sessionId": "s", "prompt": "x" }),
                "prompt",
            ),
            (
                "session/prompt",
                json!({ "sessionId": "s", "prompt": [{ "type": 5 }] }),
                "prompt",
            ),
            ("session/close", json!({ "sessionId": 5 }), "sessionId"),
            ("session/delete", json!({}), "sessionId"),
            ("session/cancel", json!({ "sessionId": null }), "sessionId"),
            (
                "session/set_mode",
                json!({ "sessionId": "s", "modeId": 5 }),
                "modeId",
            ),
        ];
        for (m, p, field) in bad {
            let e = check(m, &p).expect_err(m).to_string();
            assert!(e.contains(field), "{m} {p}: {e}");
        }
    }
}
