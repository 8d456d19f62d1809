//! A profile's own HOME (`home = "…"`): the directory, created private, and the environment
//! that points the agent at it — `HOME` and the XDG base directories beneath it — so two
//! profiles of one agent never share credentials or state by accident. `apply` is the whole
//! environment of a profile's processes (agent, supervisor, login): the `child_env`
//! allowlist, then HOME, `pass_env` and the profile's `env`, nothing else of acpd's.

use std::path::Path;

use crate::config::AgentProfile;

/// The agent's own HOME: created private if missing.
pub fn prepare(home: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home)
}

/// Sets the environment of a process of `profile` (hosted agent under its supervisor,
/// `acpd agent login`): acpd's own variables are cleared down to the allowlist
/// (`acpd_builtin::child_env`), so its secrets never reach the agent.
pub fn apply<'a>(
    cmd: &'a mut std::process::Command,
    profile: &AgentProfile,
) -> &'a mut std::process::Command {
    acpd_builtin::child_env::clean(cmd)
        .envs(env(profile))
        .envs(acpd_builtin::child_env::passed(&profile.pass_env))
        .envs(profile.env.iter().map(|(k, v)| (k, v)))
}

/// The environment a profile's `home` gives the agent: `HOME` and the XDG base directories
/// beneath it (a profile's own `env` wins).
pub fn env(profile: &AgentProfile) -> Vec<(String, String)> {
    let Some(home) = &profile.home else {
        return vec![];
    };
    let h = home.display().to_string();
    [
        ("HOME", h.clone()),
        ("XDG_CONFIG_HOME", format!("{h}/.config")),
        ("XDG_DATA_HOME", format!("{h}/.local/share")),
        ("XDG_STATE_HOME", format!("{h}/.local/state")),
        ("XDG_CACHE_HOME", format!("{h}/.cache")),
    ]
    .into_iter()
    .filter(|(k, _)| !profile.env.iter().any(|(e, _)| e == k))
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_points_home_and_xdg_beneath_it_and_the_profiles_env_wins() {
        let mut p = AgentProfile {
            name: "a".into(),
            program: "x".into(),
            args: vec![],
            env: vec![("XDG_CACHE_HOME".into(), "/cache".into())],
            pass_env: vec![],
            cwd: None,
            home: None,
            login: vec![],
            login_principals: vec![],
            login_timeout: std::time::Duration::from_secs(1),
        };
        assert!(env(&p).is_empty());
        p.home = Some("/data/homes/a".into());
        let e = env(&p);
        assert!(e.contains(&("HOME".into(), "/data/homes/a".into())));
        assert!(e.contains(&("XDG_CONFIG_HOME".into(), "/data/homes/a/.config".into())));
        assert!(!e.iter().any(|(k, _)| k == "XDG_CACHE_HOME"), "{e:?}");
    }
}
