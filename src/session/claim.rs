//! Who answers an agent request that was sent to several clients: the first valid answer
//! wins, the other copies are withdrawn; an invalid answer or a client gone leaves the rest
//! to answer; the last one gone sends the request on. Pure: the session actor does the I/O.

use std::collections::BTreeSet;

use acpd_protocol::method;
use acpd_wire::PeerError;
use serde_json::Value;

use super::ConnId;

/// How the claim sees a client's answer to `method`: a permission needs an `outcome`, an
/// elicitation an `action` ACP defines; an error is invalid (others may still answer).
pub fn judge(method: &str, result: &Result<Value, PeerError>) -> Answer {
    let v = match result {
        Err(PeerError::Disconnected) => return Answer::Gone,
        Err(PeerError::Remote(_)) => return Answer::Invalid,
        Ok(v) => v,
    };
    let valid = match method {
        method::SESSION_REQUEST_PERMISSION => v.get("outcome").is_some_and(Value::is_object),
        method::ELICITATION_CREATE => matches!(
            v.get("action").and_then(Value::as_str),
            Some("accept" | "decline" | "cancel")
        ),
        _ => true,
    };
    if valid {
        Answer::Valid
    } else {
        Answer::Invalid
    }
}

/// One client's answer as the claim sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A result the agent can use (a permission: one with an `outcome`).
    Valid,
    /// An error, or a result without what the method needs.
    Invalid,
    /// The client went away (detached, disconnected) without answering.
    Gone,
}

/// What to do after an answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// This answer goes to the agent; withdraw the copies at these clients.
    Decide { withdraw: Vec<ConnId> },
    /// Others are still asked: wait for them.
    Wait,
    /// Nobody asked is left and this answer is the last word: it goes to the agent.
    Forward,
    /// Nobody asked is left and nobody answered: ask other clients (or wait for one).
    Reroute,
    /// The client was not asked (already withdrawn, a stale answer): ignore it.
    Ignore,
}

#[derive(Debug, Default)]
pub struct Claim {
    asked: BTreeSet<ConnId>,
    /// Clients that were asked once; they are not asked again.
    tried: BTreeSet<ConnId>,
    decided: bool,
}

impl Claim {
    /// Records that `conn` was sent the request; false if it has it already or was tried.
    pub fn ask(&mut self, conn: &ConnId) -> bool {
        if self.decided || self.tried.contains(conn) {
            return false;
        }
        self.tried.insert(conn.clone());
        self.asked.insert(conn.clone())
    }

    pub fn is_asked(&self) -> bool {
        !self.asked.is_empty()
    }

    /// Some client was sent it once.
    pub fn was_tried_by_anyone(&self) -> bool {
        !self.tried.is_empty()
    }

    pub fn was_tried(&self, conn: &ConnId) -> bool {
        self.tried.contains(conn)
    }

    pub fn answer(&mut self, conn: &ConnId, answer: Answer) -> Step {
        if self.decided || !self.asked.remove(conn) {
            return Step::Ignore;
        }
        match answer {
            Answer::Valid => {
                self.decided = true;
                Step::Decide {
                    withdraw: std::mem::take(&mut self.asked).into_iter().collect(),
                }
            }
            _ if self.is_asked() => Step::Wait,
            Answer::Invalid => {
                self.decided = true;
                Step::Forward
            }
            Answer::Gone => Step::Reroute,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn c(s: &str) -> ConnId {
        Arc::from(s)
    }

    #[test]
    fn the_first_valid_answer_wins_and_the_others_are_withdrawn() {
        let mut claim = Claim::default();
        for n in ["a", "b", "d"] {
            assert!(claim.ask(&c(n)));
        }
        assert!(!claim.ask(&c("a")), "asked once");
        assert_eq!(
            claim.answer(&c("b"), Answer::Valid),
            Step::Decide {
                withdraw: vec![c("a"), c("d")]
            }
        );
        assert_eq!(claim.answer(&c("a"), Answer::Valid), Step::Ignore);
        assert!(!claim.ask(&c("e")), "decided: nobody new is asked");
    }

    #[test]
    fn answers_are_judged_by_what_the_method_needs() {
        use serde_json::json;
        let elicit = method::ELICITATION_CREATE;
        let ok = |v: Value| Ok::<Value, PeerError>(v);
        assert_eq!(
            judge(elicit, &ok(json!({ "action": "decline" }))),
            Answer::Valid
        );
        assert_eq!(
            judge(
                elicit,
                &ok(json!({ "action": "accept", "content": { "x": 1 } }))
            ),
            Answer::Valid
        );
        assert_eq!(
            judge(elicit, &ok(json!({ "action": "maybe" }))),
            Answer::Invalid
        );
        assert_eq!(judge(elicit, &ok(json!({}))), Answer::Invalid);
        let permission = method::SESSION_REQUEST_PERMISSION;
        assert_eq!(
            judge(permission, &ok(json!({ "outcome": {} }))),
            Answer::Valid
        );
        assert_eq!(judge(permission, &ok(json!({}))), Answer::Invalid);
        assert_eq!(judge("fs/read_text_file", &ok(json!({}))), Answer::Valid);
        let gone = Err(PeerError::Disconnected);
        assert_eq!(judge(elicit, &gone), Answer::Gone);
        let e = Err(PeerError::Remote(acpd_wire::ResponseError::internal("x")));
        assert_eq!(judge("fs/read_text_file", &e), Answer::Invalid);
    }

    #[test]
    fn an_invalid_answer_waits_for_the_others_and_the_last_is_forwarded() {
        let mut claim = Claim::default();
        claim.ask(&c("a"));
        claim.ask(&c("b"));
        assert_eq!(claim.answer(&c("a"), Answer::Invalid), Step::Wait);
        assert_eq!(claim.answer(&c("b"), Answer::Invalid), Step::Forward);
    }

    #[test]
    fn everyone_gone_reroutes_and_the_gone_are_not_asked_again() {
        let mut claim = Claim::default();
        claim.ask(&c("a"));
        claim.ask(&c("b"));
        assert_eq!(claim.answer(&c("a"), Answer::Gone), Step::Wait);
        assert_eq!(claim.answer(&c("b"), Answer::Gone), Step::Reroute);
        assert!(!claim.ask(&c("a")));
        assert!(claim.ask(&c("d")));
        assert_eq!(
            claim.answer(&c("d"), Answer::Valid),
            Step::Decide { withdraw: vec![] }
        );
    }
}
