//! The session row's `meta` as a live session keeps it: the text, parsed when read. Its tree
//! (the agent's modes and config options, the `mcpServers`) is a few dozen small allocations
//! (~1.2 KiB for a 300-byte text), held by every live session, and it is read or changed only
//! on an attach, a restore, a fork or a mode or config change.

use serde_json::{Value, json};

pub(super) struct Meta(Box<str>);

impl Meta {
    pub fn new(text: String) -> Meta {
        Meta(text.into_boxed_str())
    }

    /// The tree; `{}` when the text is not a JSON object's (an empty one of an older row).
    pub fn value(&self) -> Value {
        match serde_json::from_str::<Value>(&self.0) {
            Ok(v) if v.is_object() => v,
            _ => json!({}),
        }
    }

    /// Changes the tree with `f` and returns the new text (for the row's patch).
    pub fn update(&mut self, f: impl FnOnce(&mut Value)) -> String {
        let mut v = self.value();
        f(&mut v);
        let text = v.to_string();
        self.0 = text.as_str().into();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_read_back_and_returned_as_the_new_text() {
        let mut m = Meta::new(r#"{"modes":{"currentModeId":"a"},"mcpServers":[]}"#.into());
        let text = m.update(|v| v["modes"]["currentModeId"] = json!("b"));
        assert_eq!(text, r#"{"modes":{"currentModeId":"b"},"mcpServers":[]}"#);
        assert_eq!(m.value()["modes"]["currentModeId"], "b");
    }

    #[test]
    fn unreadable_text_reads_as_an_empty_object() {
        assert_eq!(Meta::new(String::new()).value(), json!({}));
        assert_eq!(Meta::new("[1]".into()).value(), json!({}));
    }
}
