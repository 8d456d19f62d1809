//! Remote agent logins: an agent's login run on acpd's host, in a pseudo-terminal, for a
//! principal at the editor's machine (acp-shim `--login NAME`) or in the web console.
//!
//! `GET /acp/login?agent=NAME&cols=C&rows=R` upgrades to the login link
//! (`acpd_wire::login`); `link` runs it: the command `agent::login::command_for` picks, under
//! the profile's environment, cwd and HOME (`pty`), the terminal's bytes both ways, the URLs it
//! prints (`urls`), and the loopback ports it listens on (`ports`) forwarded from the client's
//! machine (`tunnel`). Only principals the profile names in `login_principals` may run it;
//! one login per profile at a time (`Logins`); it is ended at `login_timeout_secs`.

mod link;
mod ports;
mod pty;
pub use pty::{EXEC_SUBCOMMAND, exec_main};
mod tunnel;
mod urls;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::ws::WebSocketUpgrade;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::AgentProfile;

/// The profiles whose login runs now: one at a time each.
#[derive(Clone, Default)]
pub struct Logins {
    running: Arc<Mutex<HashSet<String>>>,
}

/// A profile's claim on its login; dropping it frees the profile.
pub struct Claim {
    profile: String,
    running: Arc<Mutex<HashSet<String>>>,
}

impl Logins {
    /// Whether `profile`'s login runs now.
    pub fn running(&self, profile: &str) -> bool {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.contains(profile)
    }

    /// Claims `profile`'s login; `None` while another runs.
    pub fn claim(&self, profile: &str) -> Option<Claim> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.insert(profile.to_owned()).then(|| Claim {
            profile: profile.to_owned(),
            running: self.running.clone(),
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.remove(&self.profile);
    }
}

/// The query of `/acp/login`.
#[derive(Deserialize)]
pub struct LoginQuery {
    pub agent: Option<String>,
    pub cols: Option<u16>,
    pub rows: Option<u16>,
}

/// Who asks for which login, and what the login task hangs on.
pub struct LoginRequest {
    pub principal_name: String,
    pub profile: Option<AgentProfile>,
    pub logins: Logins,
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
    pub cols: u16,
    pub rows: u16,
}

/// Why `principal_name` may not start `profile`'s login now (`None`: it may): the status
/// and the line `/acp/login` refuses with. Pure, so the console can tell a person beforehand
/// exactly what the upgrade would answer (a browser never sees a refused upgrade's body).
pub fn refusal(
    profile: Option<&AgentProfile>,
    principal_name: &str,
    logins: &Logins,
) -> Option<(StatusCode, String)> {
    let Some(profile) = profile else {
        return Some((
            StatusCode::NOT_FOUND,
            "no hosted agent of that name (the built-in agent has no login)".into(),
        ));
    };
    if !profile.may_log_in(principal_name) {
        return Some((
            StatusCode::FORBIDDEN,
            format!(
                "principal {principal_name:?} may not log in agent {:?} (its login_principals)",
                profile.name
            ),
        ));
    }
    logins.running(&profile.name).then(|| {
        (
            StatusCode::CONFLICT,
            format!(
                "a login of agent {:?} is already running; finish or end it first",
                profile.name
            ),
        )
    })
}

/// The upgrade of `/acp/login`: refused with a status and a line saying why when the
/// principal may not log this profile in, or its login already runs.
pub fn upgrade(ws: WebSocketUpgrade, req: LoginRequest) -> Response {
    let refuse = |status: StatusCode, why: String| (status, format!("{why}\n")).into_response();
    if let Some((status, why)) = refusal(req.profile.as_ref(), &req.principal_name, &req.logins) {
        if status == StatusCode::FORBIDDEN {
            tracing::warn!(target: "acpd::audit", principal = %req.principal_name, agent = %req.profile.as_ref().map_or("", |p| p.name.as_str()), "remote login refused: not in the profile's login_principals");
        }
        return refuse(status, why);
    }
    let Some(profile) = req.profile else {
        return refuse(StatusCode::NOT_FOUND, "no hosted agent of that name".into());
    };
    // Between the check and the claim another upgrade may have claimed it.
    let Some(claim) = req.logins.claim(&profile.name) else {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "a login of agent {:?} is already running; finish or end it first",
                profile.name
            ),
        );
    };
    if !ws
        .requested_protocols()
        .any(|p| p.as_bytes() == acpd_wire::login::SUBPROTOCOL.as_bytes())
    {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("ask for the {} subprotocol", acpd_wire::login::SUBPROTOCOL),
        );
    }
    let tasks = req.tasks.clone();
    let run = link::Run {
        principal_name: req.principal_name,
        profile,
        cols: req.cols,
        rows: req.rows,
        shutdown: req.shutdown,
    };
    ws.protocols([acpd_wire::login::SUBPROTOCOL])
        .on_upgrade(move |socket| {
            tasks.track_future(async move {
                link::run(socket, run).await;
                drop(claim);
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_is_refused_for_no_profile_another_principal_or_one_running() {
        let profile = AgentProfile {
            name: "lg".into(),
            program: "x".into(),
            args: vec![],
            env: vec![],
            pass_env: vec![],
            cwd: None,
            home: None,
            login: vec![],
            login_principals: vec!["alice".into()],
            login_timeout: std::time::Duration::from_secs(1),
        };
        let logins = Logins::default();
        let status =
            |p: Option<&AgentProfile>, who: &str, l: &Logins| refusal(p, who, l).map(|r| r.0);
        assert_eq!(status(None, "alice", &logins), Some(StatusCode::NOT_FOUND));
        assert_eq!(
            status(Some(&profile), "bob", &logins),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(status(Some(&profile), "alice", &logins), None);
        let _claim = logins.claim("lg").expect("claimed");
        assert_eq!(
            status(Some(&profile), "alice", &logins),
            Some(StatusCode::CONFLICT)
        );
    }

    #[test]
    fn one_login_per_profile_at_a_time() {
        let logins = Logins::default();
        let a = logins.claim("a").expect("first");
        assert!(logins.claim("a").is_none());
        assert!(logins.running("a") && !logins.running("b"));
        let _b = logins.claim("b").expect("another profile");
        drop(a);
        assert!(logins.claim("a").is_some());
    }
}
