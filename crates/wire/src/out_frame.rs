//! What a peer hands its transport: a message's text, owned or shared. A session's update is
//! one `Arc<str>` for the journal and every client; carried as `Shared` it reaches a
//! transport that frames it anew (the resume link) without another copy.

use std::ops::Deref;
use std::sync::Arc;

/// One outgoing message, as the JSON text to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutFrame {
    /// Made by this peer (answers, requests, its own notifications).
    Owned(String),
    /// Shared with other clients and the journal (`PeerHandle::try_send_raw`).
    Shared(Arc<str>),
}

impl OutFrame {
    pub fn as_str(&self) -> &str {
        match self {
            OutFrame::Owned(s) => s,
            OutFrame::Shared(s) => s,
        }
    }

    /// The text as a `String`: free when owned, a copy when shared.
    pub fn into_string(self) -> String {
        match self {
            OutFrame::Owned(s) => s,
            OutFrame::Shared(s) => String::from(&*s),
        }
    }
}

impl Deref for OutFrame {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for OutFrame {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for OutFrame {
    fn from(s: String) -> Self {
        OutFrame::Owned(s)
    }
}

impl From<&str> for OutFrame {
    fn from(s: &str) -> Self {
        OutFrame::Owned(s.to_owned())
    }
}

impl From<Arc<str>> for OutFrame {
    fn from(s: Arc<str>) -> Self {
        OutFrame::Shared(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_and_shared_read_the_same() {
        let shared: Arc<str> = Arc::from("{\"x\":1}");
        let a = OutFrame::from(shared.clone());
        let b = OutFrame::from(String::from("{\"x\":1}"));
        assert_eq!(a.as_str(), b.as_str());
        assert_eq!(a.as_str(), "{\"x\":1}");
        assert_eq!(a.len(), 7);
        assert_eq!(a.into_string(), b.into_string());
        // A shared frame is the same allocation, not a copy.
        let OutFrame::Shared(s) = OutFrame::from(shared.clone()) else {
            panic!()
        };
        assert!(Arc::ptr_eq(&s, &shared));
    }
}
