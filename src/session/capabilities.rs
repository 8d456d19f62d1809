//! Per-client capabilities in a shared session: the agent sees one `initialize`, but each
//! attached client declared its own `clientCapabilities`. This is the one place that decides
//! what a client must have declared to be sent an agent request (`fs/*`, `terminal/*`,
//! `elicitation/create` by mode), a notification (`elicitation/complete`) or a journaled
//! `session/update` of a gated kind (newer specs' `plan_update`, `notice`, compaction, …),
//! live or in replay; and which attached controllers an agent request goes to. Pure: the
//! session actor asks and does the sends.

use acpd_protocol::method;
use serde_json::Value;

use super::ConnId;

/// A client capability something needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    ReadTextFile,
    WriteTextFile,
    Terminal,
    /// `elicitation.form`.
    ElicitForm,
    /// `elicitation.url`.
    ElicitUrl,
    /// An elicitation in a mode ACP does not define (or none): no client can have it.
    ElicitUnknown,
    /// `plan` (`plan_update`, `plan_removed`).
    Plan,
    /// `session.notices`.
    Notices,
    /// `session.compaction`.
    Compaction,
    /// `subagents`.
    Subagents,
    /// `session.promptSuggestions`.
    PromptSuggestions,
    /// `session.cursors`.
    Cursors,
    /// `session.quota`.
    Quota,
}

impl Need {
    /// Where it is declared in `clientCapabilities` (`None`: nowhere).
    fn pointer(self) -> Option<&'static str> {
        Some(match self {
            Need::ReadTextFile => "/fs/readTextFile",
            Need::WriteTextFile => "/fs/writeTextFile",
            Need::Terminal => "/terminal",
            Need::ElicitForm => "/elicitation/form",
            Need::ElicitUrl => "/elicitation/url",
            Need::ElicitUnknown => return None,
            Need::Plan => "/plan",
            Need::Notices => "/session/notices",
            Need::Compaction => "/session/compaction",
            Need::Subagents => "/subagents",
            Need::PromptSuggestions => "/session/promptSuggestions",
            Need::Cursors => "/session/cursors",
            Need::Quota => "/session/quota",
        })
    }

    /// How a log line or an error names it.
    pub fn name(self) -> &'static str {
        match self {
            Need::ElicitUnknown => "an elicitation mode ACP defines",
            other => other.pointer().map_or("", |p| &p[1..]),
        }
    }

    /// Whether `caps` (a client's `initialize.clientCapabilities`) declares it: `true` for a
    /// boolean capability, an object for an object one (`{}` is support; absent or `null`
    /// is not, and `elicitation: {}` declares no mode).
    pub fn met_by(self, caps: &Value) -> bool {
        let Some(p) = self.pointer() else {
            return false;
        };
        matches!(
            caps.pointer(p),
            Some(Value::Bool(true)) | Some(Value::Object(_))
        )
    }

    /// What an agent request needs (`None`: nothing declared; permissions, extensions).
    pub fn of_request(method: &str, params: &Value) -> Option<Need> {
        match method {
            method::FS_READ_TEXT_FILE => Some(Need::ReadTextFile),
            method::FS_WRITE_TEXT_FILE => Some(Need::WriteTextFile),
            m if m.starts_with("terminal/") => Some(Need::Terminal),
            method::ELICITATION_CREATE => Some(match params.get("mode").and_then(Value::as_str) {
                Some("form") => Need::ElicitForm,
                Some("url") => Need::ElicitUrl,
                _ => Need::ElicitUnknown,
            }),
            _ => None,
        }
    }

    /// What an agent notification other than `session/update` needs.
    pub fn of_notification(method: &str) -> Option<Need> {
        match method {
            // Completes a URL-mode elicitation: for the clients that could have been asked.
            method::ELICITATION_COMPLETE => Some(Need::ElicitUrl),
            _ => None,
        }
    }

    /// What a `session/update` of `kind` (its `sessionUpdate`) needs; the kinds of ACP 1.20
    /// and its drafts that a client must opt into.
    pub fn of_update(kind: &str) -> Option<Need> {
        match kind {
            "plan_update" | "plan_removed" => Some(Need::Plan),
            "notice" => Some(Need::Notices),
            "compaction_update" | "compaction_summary_chunk" => Some(Need::Compaction),
            "subagent_update" | "session_message" | "session_message_chunk" => {
                Some(Need::Subagents)
            }
            "prompt_suggestions_update" => Some(Need::PromptSuggestions),
            "cursor_update" => Some(Need::Cursors),
            "quota_update" => Some(Need::Quota),
            _ => None,
        }
    }
}

/// Whether a client with `caps` may be sent something that needs `need`.
pub fn allows(need: Option<Need>, caps: &Value) -> bool {
    need.is_none_or(|n| n.met_by(caps))
}

/// Whether the request goes to every controller at once, the first valid answer winning (a
/// question for the user), rather than to one client (an operation on its machine).
pub fn fans_out(method: &str) -> bool {
    matches!(
        method,
        method::SESSION_REQUEST_PERMISSION | method::ELICITATION_CREATE
    )
}

/// Whether the request waits for a client to attach when nobody can take it now (up to
/// `pending_request_timeout`). An elicitation does not: it is answered at once.
fn waits_for_a_client(method: &str) -> bool {
    method != method::ELICITATION_CREATE
}

/// An attached controller as routing sees it.
pub struct Candidate<'a> {
    pub conn: &'a ConnId,
    /// Its `initialize.clientCapabilities`.
    pub caps: &'a Value,
    /// It was sent this request once already (it is not sent it again).
    pub tried: bool,
}

/// Where an agent request goes now.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Send it to these.
    Ask(Vec<ConnId>),
    /// Nothing to do now: clients have it, or it waits for one to attach.
    Wait,
    /// No attached controller can take it and it does not wait: answer the agent now.
    Refuse,
}

/// Routes an agent request among the attached controllers (oldest first). `asked`: some
/// client has it now. A question (`fans_out`) goes to every controller that declared what it
/// needs; anything else to one: the prompter if it declared it, else the newest that did.
/// A gated request no attached controller declared is refused; with no controller attached,
/// it waits for one, except an elicitation, refused at once.
pub fn route(
    method: &str,
    need: Option<Need>,
    asked: bool,
    prompter: Option<&ConnId>,
    controllers: &[Candidate],
) -> Route {
    let able: Vec<&Candidate> = controllers
        .iter()
        .filter(|c| allows(need, c.caps))
        .collect();
    let fresh: Vec<&Candidate> = able.iter().copied().filter(|c| !c.tried).collect();
    let fan = fans_out(method);
    if asked && !fan {
        return Route::Wait;
    }
    if !fresh.is_empty() {
        if fan {
            return Route::Ask(fresh.iter().map(|c| c.conn.clone()).collect());
        }
        let pick = fresh
            .iter()
            .find(|c| Some(c.conn) == prompter)
            .or(fresh.last());
        return Route::Ask(pick.map(|c| c.conn.clone()).into_iter().collect());
    }
    if asked || need.is_none() {
        return Route::Wait;
    }
    if controllers.is_empty() && waits_for_a_client(method) {
        return Route::Wait;
    }
    if able.is_empty() || !waits_for_a_client(method) {
        Route::Refuse
    } else {
        Route::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn c(s: &str) -> ConnId {
        Arc::from(s)
    }

    fn names(r: Route) -> Vec<String> {
        match r {
            Route::Ask(v) => v.iter().map(|c| c.to_string()).collect(),
            other => panic!("not asked: {other:?}"),
        }
    }

    const PERMISSION: &str = method::SESSION_REQUEST_PERMISSION;
    const ELICIT: &str = method::ELICITATION_CREATE;

    #[test]
    fn capabilities_are_read_as_acp_declares_them() {
        let caps = json!({
            "fs": { "readTextFile": true, "writeTextFile": false },
            "terminal": true,
            "elicitation": { "form": {}, "url": null },
            "session": { "notices": {}, "quota": {} },
        });
        assert!(Need::ReadTextFile.met_by(&caps));
        assert!(!Need::WriteTextFile.met_by(&caps));
        assert!(Need::Terminal.met_by(&caps));
        assert!(Need::ElicitForm.met_by(&caps));
        assert!(!Need::ElicitUrl.met_by(&caps), "null is not support");
        assert!(!Need::ElicitForm.met_by(&json!({ "elicitation": {} })));
        assert!(!Need::ElicitUnknown.met_by(&caps));
        assert!(Need::Notices.met_by(&caps));
        assert!(Need::Quota.met_by(&caps));
        assert!(!Need::Quota.met_by(&json!({ "session": { "quota": null } })));
        assert!(!Need::Compaction.met_by(&caps));
        assert!(!Need::Terminal.met_by(&Value::Null));
        assert_eq!(Need::ElicitUrl.name(), "elicitation/url");
    }

    #[test]
    fn what_each_message_needs() {
        let form = json!({ "mode": "form" });
        let url = json!({ "mode": "url" });
        assert_eq!(Need::of_request(ELICIT, &form), Some(Need::ElicitForm));
        assert_eq!(Need::of_request(ELICIT, &url), Some(Need::ElicitUrl));
        assert_eq!(
            Need::of_request(ELICIT, &json!({})),
            Some(Need::ElicitUnknown)
        );
        assert_eq!(
            Need::of_request("terminal/output", &json!({})),
            Some(Need::Terminal)
        );
        assert_eq!(Need::of_request(PERMISSION, &json!({})), None);
        assert_eq!(Need::of_request("_x/ext", &json!({})), None);
        assert_eq!(
            Need::of_notification(method::ELICITATION_COMPLETE),
            Some(Need::ElicitUrl)
        );
        assert_eq!(Need::of_notification("_x/note"), None);
        assert_eq!(Need::of_update("notice"), Some(Need::Notices));
        assert_eq!(Need::of_update("quota_update"), Some(Need::Quota));
        assert_eq!(
            Need::of_update("compaction_summary_chunk"),
            Some(Need::Compaction)
        );
        assert_eq!(Need::of_update("agent_message_chunk"), None);
        assert_eq!(Need::of_update("acpd_test_unknown_kind"), None);
    }

    #[test]
    fn a_question_goes_to_every_controller_that_declared_its_mode() {
        let (a, b, d) = (c("a"), c("b"), c("d"));
        let both = json!({ "elicitation": { "form": {}, "url": {} } });
        let form = json!({ "elicitation": { "form": {} } });
        let none = json!({});
        let cs = |tried: bool| {
            [
                Candidate {
                    conn: &a,
                    caps: &both,
                    tried,
                },
                Candidate {
                    conn: &b,
                    caps: &form,
                    tried: false,
                },
                Candidate {
                    conn: &d,
                    caps: &none,
                    tried: false,
                },
            ]
        };
        let f = Some(Need::ElicitForm);
        let u = Some(Need::ElicitUrl);
        assert_eq!(names(route(ELICIT, f, false, None, &cs(false))), ["a", "b"]);
        assert_eq!(names(route(ELICIT, u, false, None, &cs(false))), ["a"]);
        // A permission needs nothing declared: every controller.
        assert_eq!(
            names(route(PERMISSION, None, false, None, &cs(false))),
            ["a", "b", "d"]
        );
        // One has it; a newcomer is asked too; nobody new: wait for the answers.
        assert_eq!(names(route(ELICIT, f, true, None, &cs(true))), ["b"]);
        assert_eq!(route(ELICIT, u, true, None, &cs(true)), Route::Wait);
        // The one that could answer went away (tried, not asked): answered at once.
        assert_eq!(route(ELICIT, u, false, None, &cs(true)), Route::Refuse);
        // Nobody declared the mode, or nobody is attached: answered at once.
        assert_eq!(
            route(ELICIT, u, false, None, &cs(false)[1..]),
            Route::Refuse
        );
        assert_eq!(route(ELICIT, f, false, None, &[]), Route::Refuse);
        let odd = Some(Need::ElicitUnknown);
        assert_eq!(route(ELICIT, odd, false, None, &cs(false)), Route::Refuse);
        // A permission with nobody attached waits for a controller.
        assert_eq!(route(PERMISSION, None, false, None, &[]), Route::Wait);
    }

    #[test]
    fn fs_goes_to_one_controller_that_declared_it_never_to_one_that_did_not() {
        let (a, b, d) = (c("a"), c("b"), c("d"));
        let fs = json!({ "fs": { "readTextFile": true }, "terminal": true });
        let none = json!({});
        let cs = [
            Candidate {
                conn: &a,
                caps: &fs,
                tried: false,
            },
            Candidate {
                conn: &b,
                caps: &none,
                tried: false,
            },
            Candidate {
                conn: &d,
                caps: &none,
                tried: false,
            },
        ];
        let read = Some(Need::ReadTextFile);
        let write = Some(Need::WriteTextFile);
        let fs_read = method::FS_READ_TEXT_FILE;
        assert_eq!(names(route(fs_read, read, false, Some(&b), &cs)), ["a"]);
        let term = Some(Need::Terminal);
        assert_eq!(
            names(route("terminal/create", term, false, Some(&a), &cs)),
            ["a"]
        );
        // One at a time.
        assert_eq!(route(fs_read, read, true, Some(&a), &cs), Route::Wait);
        // Nobody declared it: refused, not sent to the prompter.
        let fs_write = method::FS_WRITE_TEXT_FILE;
        assert_eq!(route(fs_write, write, false, Some(&b), &cs), Route::Refuse);
        // Nobody attached: it waits for a client.
        assert_eq!(route(fs_read, read, false, None, &[]), Route::Wait);
        // Extensions need nothing: the prompter, else the newest.
        assert_eq!(names(route("_x/ext", None, false, Some(&b), &cs)), ["b"]);
        assert_eq!(names(route("_x/ext", None, false, None, &cs)), ["d"]);
    }
}
