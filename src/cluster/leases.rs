//! The leases one replica holds, without any I/O: what the keeper renews, and which tokens a
//! renewal round that found leases gone must fire.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(super) struct Leases {
    held: HashMap<Arc<str>, (i64, CancellationToken)>,
}

impl Leases {
    /// A lease acquired under `epoch`; it replaces an older one of the same session (the
    /// session was opened again here), whose token fires: that actor must not go on.
    pub fn hold(&mut self, id: Arc<str>, epoch: i64, lost: CancellationToken) {
        if let Some((old, token)) = self.held.insert(id, (epoch, lost))
            && old != epoch
        {
            token.cancel();
        }
    }

    /// The session ended: its lease (under that epoch only) is no longer renewed.
    pub fn release(&mut self, id: &str, epoch: i64) {
        if self.held.get(id).is_some_and(|(e, _)| *e == epoch) {
            self.held.remove(id);
        }
    }

    /// What a renewal round renews: `(session, epoch)`.
    pub fn snapshot(&self) -> Vec<(String, i64)> {
        self.held
            .iter()
            .map(|(id, (epoch, _))| (id.to_string(), *epoch))
            .collect()
    }

    /// A round found `gone` (`(session, epoch)` as renewed) no longer ours: they are dropped,
    /// and their tokens are returned to be fired. A lease acquired again since the round
    /// started has another epoch, so it is kept.
    pub fn lost(&mut self, gone: &[(String, i64)]) -> Vec<(Arc<str>, CancellationToken)> {
        let mut fired = Vec::new();
        for (id, epoch) in gone {
            if self.held.get(id.as_str()).is_some_and(|(e, _)| e == epoch)
                && let Some((key, (_, token))) = self.held.remove_entry(id.as_str())
            {
                fired.push((key, token));
            }
        }
        fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_lease_fires_its_token_once_and_is_not_renewed_again() {
        let mut l = Leases::default();
        let t = CancellationToken::new();
        l.hold("s1".into(), 3, t.clone());
        l.hold("s2".into(), 1, CancellationToken::new());
        let fired = l.lost(&[("s1".to_owned(), 3)]);
        assert_eq!(fired.len(), 1);
        assert_eq!(&*fired[0].0, "s1");
        let mut left = l.snapshot();
        left.sort();
        assert_eq!(left, vec![("s2".to_owned(), 1)]);
        assert!(l.lost(&[("s1".to_owned(), 3)]).is_empty());
    }

    #[test]
    fn a_round_about_an_older_epoch_keeps_the_newer_lease() {
        let mut l = Leases::default();
        let newer = CancellationToken::new();
        l.hold("s".into(), 5, newer.clone());
        assert!(l.lost(&[("s".to_owned(), 4)]).is_empty());
        assert!(!newer.is_cancelled());
        assert_eq!(l.snapshot(), vec![("s".to_owned(), 5)]);
    }

    #[test]
    fn release_forgets_only_the_epoch_it_names() {
        let mut l = Leases::default();
        l.hold("s".into(), 2, CancellationToken::new());
        l.release("s", 1);
        assert_eq!(l.snapshot(), vec![("s".to_owned(), 2)]);
        l.release("s", 2);
        assert!(l.snapshot().is_empty());
    }

    #[test]
    fn holding_a_newer_epoch_fires_the_older_token() {
        let mut l = Leases::default();
        let old = CancellationToken::new();
        l.hold("s".into(), 1, old.clone());
        l.hold("s".into(), 2, CancellationToken::new());
        assert!(old.is_cancelled());
        assert_eq!(l.snapshot(), vec![("s".to_owned(), 2)]);
    }
}
