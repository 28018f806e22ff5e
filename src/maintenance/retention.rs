//! Retention: removes segments past `retentionSeconds`, and past
//! `completedRetentionSeconds` once every group has committed beyond them
//! (`queen.retention_v1`, which also keeps `log_start` true), and with them
//! the transaction-index entries the dedup purge has not reached yet: a
//! removed message's transactionId is forgotten with it, and so are its
//! traces.

use deadpool_postgres::Pool;

use super::index_entries::Doomed;
use crate::db::DbError;

/// One batch; `Ok(true)` when the batch was full (more may be due).
pub async fn tick(pool: &Pool, batch: i32) -> Result<bool, DbError> {
    let mut client = pool.get().await?;
    // One transaction: the segments and their entries go together.
    let tx = client.transaction().await?;
    let removed = tx.query("SELECT * FROM queen.retention_v1($1)", &[&batch]).await?;
    let mut doomed = Doomed::default();
    for s in &removed {
        if let Some(blob) = s.get::<_, Option<&[u8]>>(3) {
            doomed.add_segment(&tx, s.get(0), s.get(1), s.get(2), blob).await?;
        }
    }
    doomed.delete(&tx).await?;
    if !removed.is_empty() {
        let mut partitions: Vec<i64> = removed.iter().map(|s| s.get(0)).collect();
        partitions.dedup();
        tx.execute("SELECT queen.trace_follow_retention_v1($1)", &[&partitions]).await?;
    }
    tx.commit().await?;
    if !removed.is_empty() {
        metrics::counter!(crate::metrics::RETENTION_SEGMENTS).increment(removed.len() as u64);
        tracing::debug!(segments = removed.len(), "retention removed segments");
    }
    Ok(removed.len() >= batch as usize)
}
