//! Narrow handles: the store as one layer of the daemon may use it.
//!
//! The session layer holds the whole `Store`. The layers that read or write the store for
//! their own ends hold one of these instead, each exposing only the calls that layer makes:
//! the web console (`WebStore`: its sign-in credentials and read-only session pages), the
//! connection registry (`RegistryStore`: revocation polls) and the replicas' lease keeper
//! (`ClusterStore`: leases and heartbeats). A handle cannot append to a journal, change a
//! session row or mint a token, so what each of those layers may do is a type, not a
//! convention (ARCHITECTURE.md, "only the session layer writes sessions and journals").
//! Each is a `Store` clone behind a private field: cheap to clone, same pool.

use crate::{
    Acquired, GrantRow, JournalEntry, ListQuery, PrincipalRow, SessionPage, SessionRow, Store,
    StoreError, TokenRow, WebSessionRow,
};

/// The web console's view of the store: sign-in codes and cookie credentials, and read-only
/// session rows, grants and journal pages.
#[derive(Clone)]
pub struct WebStore(Store);

impl From<Store> for WebStore {
    fn from(store: Store) -> Self {
        WebStore(store)
    }
}

impl WebStore {
    pub async fn usage_rollup(
        &self,
        q: &super::UsageQuery,
    ) -> Result<Vec<super::UsageRollup>, StoreError> {
        self.0.usage_rollup(q).await
    }

    pub async fn decisions_of(
        &self,
        session_id: &str,
    ) -> Result<Vec<super::DecisionRow>, StoreError> {
        self.0.decisions_of(session_id).await
    }

    pub async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        self.0.session(id).await
    }

    pub async fn live_grant(
        &self,
        session_id: &str,
        principal_id: &str,
    ) -> Result<Option<GrantRow>, StoreError> {
        self.0.live_grant(session_id, principal_id).await
    }

    pub async fn list_sessions(&self, q: &ListQuery) -> Result<SessionPage, StoreError> {
        self.0.list_sessions(q).await
    }

    pub async fn journal_after(
        &self,
        session_id: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        self.0.journal_after(session_id, after_seq, limit).await
    }

    pub async fn journal_before(
        &self,
        session_id: &str,
        before_seq: i64,
        limit: i64,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        self.0.journal_before(session_id, before_seq, limit).await
    }

    pub async fn principal(&self, id: &str) -> Result<Option<PrincipalRow>, StoreError> {
        self.0.principal(id).await
    }

    pub async fn token_by_hash(
        &self,
        hash: &str,
    ) -> Result<Option<(TokenRow, PrincipalRow)>, StoreError> {
        self.0.token_by_hash(hash).await
    }

    pub async fn take_web_login(&self, hash: &str) -> Result<Option<String>, StoreError> {
        self.0.take_web_login(hash).await
    }

    pub async fn insert_web_session(&self, row: &WebSessionRow) -> Result<(), StoreError> {
        self.0.insert_web_session(row).await
    }

    pub async fn web_session(
        &self,
        hash: &str,
    ) -> Result<Option<(WebSessionRow, PrincipalRow)>, StoreError> {
        self.0.web_session(hash).await
    }

    pub async fn delete_web_session(&self, hash: &str) -> Result<bool, StoreError> {
        self.0.delete_web_session(hash).await
    }
}

/// The connection registry's view: which tokens and grants were revoked.
#[derive(Clone)]
pub struct RegistryStore(Store);

impl From<Store> for RegistryStore {
    fn from(store: Store) -> Self {
        RegistryStore(store)
    }
}

impl RegistryStore {
    pub async fn list_tokens(&self) -> Result<Vec<TokenRow>, StoreError> {
        self.0.list_tokens().await
    }

    pub async fn grants_revoked_after(&self, after_ms: i64) -> Result<Vec<GrantRow>, StoreError> {
        self.0.grants_revoked_after(after_ms).await
    }
}

/// The lease keeper's view: session leases and the replica's heartbeat. Reading or writing
/// the session rows themselves is the session layer's.
#[derive(Clone)]
pub struct ClusterStore(Store);

impl From<Store> for ClusterStore {
    fn from(store: Store) -> Self {
        ClusterStore(store)
    }
}

impl ClusterStore {
    pub async fn acquire_lease(
        &self,
        session_id: &str,
        replica: &str,
        ttl_ms: i64,
    ) -> Result<Acquired, StoreError> {
        self.0.acquire_lease(session_id, replica, ttl_ms).await
    }

    pub async fn renew_leases(
        &self,
        replica: &str,
        held: &[(String, i64)],
        ttl_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        self.0.renew_leases(replica, held, ttl_ms).await
    }

    pub async fn release_lease(
        &self,
        session_id: &str,
        replica: &str,
        epoch: i64,
    ) -> Result<bool, StoreError> {
        self.0.release_lease(session_id, replica, epoch).await
    }

    pub async fn replica_heartbeat(
        &self,
        replica: &str,
        advertise_url: Option<&str>,
    ) -> Result<(), StoreError> {
        self.0.replica_heartbeat(replica, advertise_url).await
    }
}
