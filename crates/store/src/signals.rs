//! Revocation signals between the daemons on one Postgres: a revoked token or grant is
//! announced with `NOTIFY` (`announce`), and a replica listening (`listen`, sqlx's
//! `PgListener`) checks the store at once instead of at its next poll. A signal says only
//! "look now": the rows stay the source of truth, and polling still covers a lost signal.
//! SQLite has no such channel (and no second daemon).

use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::mpsc;

use super::backend::Pool;

/// The `LISTEN`/`NOTIFY` channel.
const CHANNEL: &str = "acpd_revocations";

/// Tells the listening daemons that something was revoked. Best effort: a failure is
/// logged, the daemons' polls find the revocation anyway.
pub(super) async fn announce(pool: &Pool, what: &str) {
    if let Pool::Postgres(p) = pool {
        let sent = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(what)
            .execute(p)
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, "cannot announce a revocation; the daemons' polls will find it");
        }
    }
}

/// A stream of "something was revoked" signals (coalesced: at most one waits), for as long
/// as the receiver lives; `None` on SQLite. The listener reconnects by itself.
pub(super) fn listen(pool: &Pool) -> Option<mpsc::Receiver<()>> {
    let Pool::Postgres(p) = pool else {
        return None;
    };
    let (tx, rx) = mpsc::channel(1);
    let pool = p.clone();
    tokio::spawn(async move {
        let mut listener = loop {
            let connected = async {
                let mut l = PgListener::connect_with(&pool).await?;
                l.listen(CHANNEL).await?;
                Ok::<_, sqlx::Error>(l)
            };
            tokio::select! {
                _ = tx.closed() => return,
                l = connected => match l {
                    Ok(l) => break l,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot listen for revocations; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                },
            }
        };
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                n = listener.recv() => match n {
                    Ok(_) => {
                        // Full: a signal is waiting already, which says the same.
                        let _ = tx.try_send(());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "revocation listener failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                },
            }
        }
    });
    Some(rx)
}
