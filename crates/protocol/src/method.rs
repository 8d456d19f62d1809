//! Every method name acpd interprets, as a closed enum ([`Method`]) for dispatch and as a
//! `&str` constant per name for the places that match or send a name as text (a constant can
//! be a `match` pattern; `Method::X.as_str()` cannot). A name not listed here is one acpd only
//! relays (an agent's own extension): `Method::parse` answers `None` for it.

macro_rules! methods {
    ($( $(#[$doc:meta])* $variant:ident = $konst:ident = $name:literal, )*) => {
        /// A method acpd (or acp-shim, or an agent of this workspace) interprets.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Method {
            $( $(#[$doc])* $variant, )*
        }

        $( #[doc = concat!("`", $name, "`")] pub const $konst: &str = $name; )*

        impl Method {
            /// Every method, in the order of this file.
            pub const ALL: &'static [Method] = &[$( Method::$variant, )*];

            /// The name on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Method::$variant => $konst, )*
                }
            }

            /// The name as a JSON string (`"session/close"`, quotes included), to spot a
            /// method in a line without parsing it.
            pub const fn quoted(self) -> &'static str {
                match self {
                    $( Method::$variant => concat!("\"", $name, "\""), )*
                }
            }

            /// The method called `name`; `None` for a name acpd does not interpret.
            pub fn parse(name: &str) -> Option<Method> {
                match name {
                    $( $konst => Some(Method::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

methods! {
    // ACP, client to agent.
    /// The handshake; first on every connection.
    Initialize = INITIALIZE = "initialize",
    Authenticate = AUTHENTICATE = "authenticate",
    Logout = LOGOUT = "logout",
    SessionNew = SESSION_NEW = "session/new",
    SessionLoad = SESSION_LOAD = "session/load",
    SessionResume = SESSION_RESUME = "session/resume",
    SessionFork = SESSION_FORK = "session/fork",
    SessionList = SESSION_LIST = "session/list",
    SessionPrompt = SESSION_PROMPT = "session/prompt",
    /// A notification: the running turn should stop.
    SessionCancel = SESSION_CANCEL = "session/cancel",
    SessionClose = SESSION_CLOSE = "session/close",
    SessionDelete = SESSION_DELETE = "session/delete",
    SessionSetMode = SESSION_SET_MODE = "session/set_mode",
    SessionSetConfigOption = SESSION_SET_CONFIG_OPTION = "session/set_config_option",
    SessionSetModel = SESSION_SET_MODEL = "session/set_model",
    // ACP, agent to client.
    /// A notification: what a turn produced (journaled by acpd, with a seq).
    SessionUpdate = SESSION_UPDATE = "session/update",
    SessionRequestPermission = SESSION_REQUEST_PERMISSION = "session/request_permission",
    FsReadTextFile = FS_READ_TEXT_FILE = "fs/read_text_file",
    FsWriteTextFile = FS_WRITE_TEXT_FILE = "fs/write_text_file",
    TerminalCreate = TERMINAL_CREATE = "terminal/create",
    TerminalOutput = TERMINAL_OUTPUT = "terminal/output",
    TerminalRelease = TERMINAL_RELEASE = "terminal/release",
    TerminalWaitForExit = TERMINAL_WAIT_FOR_EXIT = "terminal/wait_for_exit",
    TerminalKill = TERMINAL_KILL = "terminal/kill",
    /// Asks the user for structured input: `mode` `form` (a `requestedSchema`) or `url`.
    ElicitationCreate = ELICITATION_CREATE = "elicitation/create",
    /// A notification: the out-of-band part of a URL-mode elicitation finished.
    ElicitationComplete = ELICITATION_COMPLETE = "elicitation/complete",
    // acpd's extensions.
    /// A client's token, on the plain TCP listener.
    AcpdAuth = ACPD_AUTH = "_acpd/auth",
    /// Attach to a session, replaying what came after a seq (observer or controller).
    AcpdSessionAttach = ACPD_SESSION_ATTACH = "_acpd/session/attach",
    /// An owner grants (or revokes) another principal's role on a session.
    AcpdSessionShare = ACPD_SESSION_SHARE = "_acpd/session/share",
    /// A notification: who is attached to a session.
    AcpdSessionPresence = ACPD_SESSION_PRESENCE = "_acpd/session/presence",
    /// A notification: a permission request was answered (by another client).
    AcpdSessionRequestResolved = ACPD_SESSION_REQUEST_RESOLVED = "_acpd/session/request_resolved",
    /// An MCP request for an editor's MCP server, through acp-shim's tunnel.
    AcpdMcpMessage = ACPD_MCP_MESSAGE = "_acpd/mcp/message",
    /// An MCP notification or response, through acp-shim's tunnel.
    AcpdMcpNotify = ACPD_MCP_NOTIFY = "_acpd/mcp/notify",
    /// The built-in agent announces a tool call running on the host.
    AcpdToolCall = ACPD_TOOL_CALL = "_acpd/tool_call",
    /// The built-in agent cancels a tool call it announced.
    AcpdToolCallCancel = ACPD_TOOL_CALL_CANCEL = "_acpd/tool_call_cancel",
    /// A notification from an agent to acpd: the tokens of one model call (the built-in
    /// agent's), counted against budgets as they are spent; not relayed.
    AcpdSessionUsage = ACPD_SESSION_USAGE = "_acpd/session/usage",
    /// A notification to clients: a budget reached a threshold, or stopped the turn.
    AcpdSessionBudget = ACPD_SESSION_BUDGET = "_acpd/session/budget",
    // The quotas RFD (proposal).
    /// A session's quotas: acpd answers with its budgets' meters, as a snapshot.
    QuotaRead = QUOTA_READ = "quota/read",
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_to_its_method_and_names_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for m in Method::ALL {
            assert_eq!(Method::parse(m.as_str()), Some(*m));
            assert_eq!(m.quoted(), format!("{:?}", m.as_str()));
            assert!(seen.insert(m.as_str()), "{m} twice");
        }
        assert_eq!(Method::parse("_vendor/thing"), None);
        assert_eq!(Method::parse("session/Prompt"), None);
    }
}
