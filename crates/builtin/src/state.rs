//! What survives a restart: one JSON file per session under `<data_dir>/builtin/`, written
//! atomically (temp file + rename) after every turn and every settings change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::config::ToolPolicy;
use super::transcript::Message;

const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("no saved state for session {0}")]
    NotFound(String),
    #[error("invalid session id {0:?}")]
    BadId(String),
    #[error("session state {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("session state {path}: {message}")]
    Corrupt { path: PathBuf, message: String },
}

/// The user's choices for a session (modes and config options).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub mode: String,
    pub model: Option<String>,
    pub thought_level: String,
    /// Values of the extra config options, by id.
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
}

/// A session's durable state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedSession {
    pub version: u32,
    pub cwd: PathBuf,
    #[serde(default)]
    pub additional_dirs: Vec<PathBuf>,
    pub settings: Settings,
    /// Fixed at the first prompt when the config freezes it.
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub messages: Vec<Message>,
    /// "Always" answers to permission requests, by tool name.
    #[serde(default)]
    pub remembered: BTreeMap<String, ToolPolicy>,
    #[serde(default)]
    pub title: Option<String>,
    /// Client-declared tools (`_meta.acpd.clientTools`), as validated.
    #[serde(default)]
    pub client_tools: Vec<super::tools::ClientTool>,
    /// The ACP `mcpServers` of the last new/load/resume.
    #[serde(default)]
    pub mcp_servers: Vec<serde_json::Value>,
}

impl SavedSession {
    pub fn new(cwd: PathBuf, additional_dirs: Vec<PathBuf>, settings: Settings) -> SavedSession {
        SavedSession {
            version: VERSION,
            cwd,
            additional_dirs,
            settings,
            system_prompt: None,
            messages: vec![],
            remembered: BTreeMap::new(),
            title: None,
            client_tools: vec![],
            mcp_servers: vec![],
        }
    }
}

/// Session ids are made by this agent (uuids); anything else could name a path.
fn path_of(dir: &Path, id: &str) -> Result<PathBuf, StateError> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(StateError::BadId(id.to_owned()));
    }
    Ok(dir.join(format!("{id}.json")))
}

pub async fn save(dir: &Path, id: &str, state: &SavedSession) -> Result<(), StateError> {
    let path = path_of(dir, id)?;
    let io = |source| StateError::Io {
        path: path.clone(),
        source,
    };
    let bytes = serde_json::to_vec(state).map_err(|e| StateError::Corrupt {
        path: path.clone(),
        message: e.to_string(),
    })?;
    // Transcripts are conversations: owner-only, like the rest of the data directory.
    tokio::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .await
        .map_err(io)?;
    let tmp = dir.join(format!(".{id}.json.tmp"));
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .await
        .map_err(io)?;
    file.write_all(&bytes).await.map_err(io)?;
    file.flush().await.map_err(io)?;
    drop(file);
    tokio::fs::rename(&tmp, &path).await.map_err(io)
}

pub async fn load(dir: &Path, id: &str) -> Result<SavedSession, StateError> {
    let path = path_of(dir, id)?;
    let bytes = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StateError::NotFound(id.to_owned()));
        }
        Err(source) => return Err(StateError::Io { path, source }),
    };
    let state: SavedSession = serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
        path: path.clone(),
        message: e.to_string(),
    })?;
    if state.version != VERSION {
        return Err(StateError::Corrupt {
            path,
            message: format!("unknown version {}", state.version),
        });
    }
    Ok(state)
}

pub async fn delete(dir: &Path, id: &str) -> Result<(), StateError> {
    let path = path_of(dir, id)?;
    match tokio::fs::remove_file(&path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StateError::Io { path, source }),
    }
}
