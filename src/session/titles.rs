//! Titles and `updatedAt` for `session/list` from the agent's own `session/list`. Some agents
//! (claude-agent-acp, opencode) name their sessions only there, never in a
//! `session_info_update`; so when the agent advertises `sessionCapabilities.list`, acpd asks it
//! (a few pages, bounded in time) and merges by the agent's session id: the agent's title
//! where acpd's journal has none, the later of the two `updatedAt`s. Some lists are of one
//! project (qwen-code: the request's `cwd`, else the agent process's own directory), so for a
//! list with no `cwd` the sessions the agent's answer left out are asked for again by their
//! `cwd` (`cwds_to_ask`), within the same time budget. `SessionHub::list` is here too: the
//! page from the store with those merged in.

use acpd_protocol::method;
use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use serde_json::{Value, json};

use super::SessionHub;
use crate::agent::AgentHandle;
use crate::error::AcpError;
use acpd_store::ListQuery;

impl SessionHub {
    /// `session/list` for one principal (of one profile, or of all with `None`), from the
    /// store; titles and times merged from `agent`'s own list (the connection's agent, for
    /// the sessions of its profile) when it has one (`titles.rs`).
    pub async fn list(
        &self,
        principal: &str,
        profile: Option<&str>,
        cwd: Option<String>,
        cursor: Option<String>,
        agent: Option<(AgentHandle, String)>,
    ) -> Result<Value, AcpError> {
        let q = ListQuery {
            principal_id: principal.to_owned(),
            cwd,
            agent: profile.map(str::to_owned),
            cursor,
            limit: self.shared.settings.list_page_size,
        };
        let page = self.shared.store.list_sessions(&q).await?;
        let mut theirs = HashMap::new();
        if let Some((a, name)) = &agent
            && agent_lists(a)
        {
            let deadline = Instant::now() + BUDGET;
            from_agent(a, q.cwd.as_deref(), deadline, &mut theirs).await;
            if q.cwd.is_none() {
                let mine = page.sessions.iter().filter(|s| s.agent == *name);
                let rows = mine.filter_map(|s| Some((s.agent_session_id.as_deref()?, &*s.cwd)));
                for cwd in cwds_to_ask(rows, &theirs) {
                    from_agent(a, Some(&cwd), deadline, &mut theirs).await;
                }
            }
        }
        let sessions: Vec<Value> = page
            .sessions
            .iter()
            .map(|s| {
                let mut v = json!({
                    "sessionId": s.id,
                    "cwd": s.cwd,
                    "updatedAt": rfc3339(s.updated_at_ms),
                    "_meta": { "acpd": { "agent": s.agent } },
                });
                if let Some(t) = &s.title {
                    v["title"] = json!(t);
                }
                if let Ok(Value::Array(dirs)) = serde_json::from_str::<Value>(&s.additional_dirs)
                    && !dirs.is_empty()
                {
                    v["additionalDirectories"] = Value::Array(dirs);
                }
                if let (Some((_, name)), Some(asid)) = (&agent, &s.agent_session_id)
                    && *name == s.agent
                    && let Some(info) = theirs.get(asid)
                {
                    merge(&mut v, info);
                }
                v
            })
            .collect();
        let mut out = json!({ "sessions": sessions });
        if let Some(c) = page.next_cursor {
            out["nextCursor"] = json!(c);
        }
        Ok(out)
    }
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// At most this many pages of the agent's list are read per list asked of it.
const MAX_PAGES: usize = 10;
/// At most this many directories are asked again per `session/list` (one page of acpd's).
const MAX_CWDS: usize = 8;
/// And for at most this long in all (a slow agent leaves the list as acpd has it).
const BUDGET: Duration = Duration::from_secs(2);

/// What the agent's list says of one of its sessions.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct AgentInfo {
    pub title: Option<String>,
    pub updated_at: Option<String>,
}

/// Whether the agent's `initialize` answer offers `session/list`.
pub(super) fn agent_lists(agent: &AgentHandle) -> bool {
    agent
        .init
        .pointer("/agentCapabilities/sessionCapabilities/list")
        .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
}

/// The directories to ask the agent's list for again: those of the sessions (agent session
/// id, cwd) its answer without a `cwd` left out, each once, in page order, at most
/// `MAX_CWDS`.
fn cwds_to_ask<'a>(
    rows: impl Iterator<Item = (&'a str, &'a str)>,
    theirs: &HashMap<String, AgentInfo>,
) -> Vec<String> {
    let mut cwds: Vec<String> = Vec::new();
    for (asid, cwd) in rows {
        if !theirs.contains_key(asid) && !cwds.iter().any(|c| c == cwd) {
            cwds.push(cwd.to_owned());
        }
    }
    cwds.truncate(MAX_CWDS);
    cwds
}

/// Adds the agent's own list (for `cwd`, when given) to `out`, by its session id; stops at
/// `deadline` (nothing added when it fails or is slow).
async fn from_agent(
    agent: &AgentHandle,
    cwd: Option<&str>,
    deadline: Instant,
    out: &mut HashMap<String, AgentInfo>,
) {
    let pages = async {
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = json!({});
            if let Some(cwd) = cwd {
                params["cwd"] = json!(cwd);
            }
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            let Ok(page) = agent.request(method::SESSION_LIST, params).await else {
                return;
            };
            collect(&page, out);
            cursor = page
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if cursor.is_none() {
                return;
            }
        }
    };
    if tokio::time::timeout_at(deadline, pages).await.is_err() {
        tracing::debug!(
            ?cwd,
            "the agent's session/list took too long; titles from the journal only"
        );
    }
}

/// Adds one page of the agent's `session/list` answer to `out`.
fn collect(page: &Value, out: &mut HashMap<String, AgentInfo>) {
    for s in page
        .get("sessions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(id) = s.get("sessionId").and_then(Value::as_str) else {
            continue;
        };
        let text = |k: &str| s.get(k).and_then(Value::as_str).map(str::to_owned);
        out.insert(
            id.to_owned(),
            AgentInfo {
                title: text("title").filter(|t| !t.is_empty()),
                updated_at: text("updatedAt"),
            },
        );
    }
}

/// Merges what the agent says into one `session/list` entry of acpd's.
pub(super) fn merge(entry: &mut Value, info: &AgentInfo) {
    if entry.get("title").is_none_or(Value::is_null)
        && let Some(t) = &info.title
    {
        entry["title"] = json!(t);
    }
    if let Some(theirs) = info.updated_at.as_deref().and_then(parse) {
        let ours = entry
            .get("updatedAt")
            .and_then(Value::as_str)
            .and_then(parse);
        if ours.is_none_or(|o| theirs > o) {
            entry["updatedAt"] = json!(theirs.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        }
    }
}

fn parse(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collect_reads_ids_titles_and_times() {
        let page = json!({ "sessions": [
            { "sessionId": "a", "cwd": "/w", "title": "Fix it", "updatedAt": "2026-01-02T03:04:05Z" },
            { "sessionId": "b", "cwd": "/w", "title": "" },
            { "cwd": "/w", "title": "no id" },
        ]});
        let mut out = HashMap::new();
        collect(&page, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out["a"].title.as_deref(), Some("Fix it"));
        assert_eq!(out["b"], AgentInfo::default());
    }

    #[test]
    fn the_cwds_of_sessions_the_agent_left_out_are_asked_once_each() {
        let mut theirs = HashMap::new();
        theirs.insert("known".to_owned(), AgentInfo::default());
        let rows = [
            ("a", "/w/one"),
            ("known", "/w/two"),
            ("b", "/w/three"),
            ("c", "/w/one"),
        ];
        assert_eq!(
            cwds_to_ask(rows.into_iter(), &theirs),
            ["/w/one", "/w/three"]
        );
        // The agent listed them all: nothing more to ask.
        assert!(cwds_to_ask([("known", "/w/two")].into_iter(), &theirs).is_empty());
        let many: Vec<(String, String)> = (0..20)
            .map(|i| (format!("s{i}"), format!("/w/{i}")))
            .collect();
        let many = many.iter().map(|(a, c)| (a.as_str(), c.as_str()));
        assert_eq!(cwds_to_ask(many, &theirs).len(), MAX_CWDS);
    }

    #[test]
    fn the_journals_title_wins_and_the_later_time_wins() {
        let info = AgentInfo {
            title: Some("theirs".into()),
            updated_at: Some("2026-01-02T03:04:05+01:00".into()),
        };
        let mut untitled = json!({ "sessionId": "s", "updatedAt": "2026-01-01T00:00:00.000Z" });
        merge(&mut untitled, &info);
        assert_eq!(untitled["title"], "theirs");
        assert_eq!(untitled["updatedAt"], "2026-01-02T02:04:05.000Z");

        let mut titled =
            json!({ "sessionId": "s", "title": "ours", "updatedAt": "2027-01-01T00:00:00.000Z" });
        merge(&mut titled, &info);
        assert_eq!(titled["title"], "ours");
        assert_eq!(titled["updatedAt"], "2027-01-01T00:00:00.000Z");

        let mut bad = json!({ "sessionId": "s" });
        merge(
            &mut bad,
            &AgentInfo {
                title: None,
                updated_at: Some("yesterday".into()),
            },
        );
        assert_eq!(bad, json!({ "sessionId": "s" }));
    }
}
