//! Shared sessions, the decisions: what a client's role lets it do, what a grant (not
//! ownership) lets another principal do and what happens to a prompt while a turn runs
//! (which attached clients an agent request goes to is `capabilities.rs`). Pure: no I/O, no
//! channels; the session actor and the connection ask and do what they are told.

pub use crate::config::BusyPrompts;
use acpd_protocol::method;

/// What an attached client may do (RFD #533's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read-only: every update, no prompt, cancel, mode/config change or answer.
    Observer,
    /// Prompts, cancels, sets modes and config options, answers the agent's requests.
    Controller,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Observer => "observer",
            Role::Controller => "controller",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "observer" => Some(Role::Observer),
            "controller" => Some(Role::Controller),
            _ => None,
        }
    }

    /// The role granted to a client that asks for `self` and may have at most `cap`.
    pub fn capped(self, cap: Role) -> Role {
        self.min(cap)
    }

    /// Whether this role may send a command that changes the session (prompt, cancel,
    /// set_mode, set_config_option, close, delete, fork, extension requests).
    pub fn may_steer(self) -> bool {
        self == Role::Controller
    }
}

/// What a session-scoped request becomes when its sender's principal does not own the session
/// but holds a grant on it (any role; the role is checked by the session as for anyone).
#[derive(Debug, PartialEq, Eq)]
pub enum GranteeStep {
    /// Sent to the session like the owner's.
    Send,
    /// Only the owner may (-32010): deleting the session, forking it (the fork would be the
    /// owner's), changing its grants.
    OwnerOnly,
    /// `session/close`: ends this client's attachment only; the session, its running turn
    /// and its other clients go on.
    DetachOnly,
}

pub fn grantee_step(method: &str) -> GranteeStep {
    match method {
        method::SESSION_DELETE | method::SESSION_FORK | method::ACPD_SESSION_SHARE => {
            GranteeStep::OwnerOnly
        }
        method::SESSION_CLOSE => GranteeStep::DetachOnly,
        _ => GranteeStep::Send,
    }
}

/// What to do with a prompt now.
#[derive(Debug, PartialEq, Eq)]
pub enum PromptStep {
    Start,
    Queue,
    Refuse,
}

/// `busy`: a turn runs (or prompts wait already, which keep their order).
pub fn prompt_step(busy: bool, policy: BusyPrompts) -> PromptStep {
    match (busy, policy) {
        (false, _) => PromptStep::Start,
        (true, BusyPrompts::Queue) => PromptStep::Queue,
        (true, BusyPrompts::Refuse) => PromptStep::Refuse,
    }
}

pub const PERMISSION: &str = method::SESSION_REQUEST_PERMISSION;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observer_steers_nothing_and_caps_bind() {
        assert!(!Role::Observer.may_steer());
        assert!(Role::Controller.may_steer());
        assert_eq!(Role::Controller.capped(Role::Observer), Role::Observer);
        assert_eq!(Role::Observer.capped(Role::Controller), Role::Observer);
        assert_eq!(Role::parse("observer"), Some(Role::Observer));
        assert_eq!(Role::parse("owner"), None);
    }

    #[test]
    fn a_grant_is_not_ownership() {
        for m in ["session/delete", "session/fork", "_acpd/session/share"] {
            assert_eq!(grantee_step(m), GranteeStep::OwnerOnly, "{m}");
        }
        assert_eq!(grantee_step("session/close"), GranteeStep::DetachOnly);
        for m in [
            "session/prompt",
            "session/cancel",
            "session/set_mode",
            "session/set_config_option",
            "session/load",
            "_x/ext",
        ] {
            assert_eq!(grantee_step(m), GranteeStep::Send, "{m}");
        }
    }

    #[test]
    fn busy_prompts_queue_or_refuse() {
        assert_eq!(prompt_step(false, BusyPrompts::Refuse), PromptStep::Start);
        assert_eq!(prompt_step(true, BusyPrompts::Queue), PromptStep::Queue);
        assert_eq!(prompt_step(true, BusyPrompts::Refuse), PromptStep::Refuse);
    }
}
