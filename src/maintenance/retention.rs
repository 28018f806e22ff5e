//! Retention: removes segments past `retentionSeconds`, and past
//! `completedRetentionSeconds` once every group has committed beyond them
//! (`queen.retention_v1`, which also keeps `log_start` true).

use deadpool_postgres::Pool;

use crate::db::DbError;

/// One batch; `Ok(true)` when the batch was full (more may be due).
pub async fn tick(pool: &Pool, batch: i32) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let n: i32 = client.query_one("SELECT queen.retention_v1($1)", &[&batch]).await?.get(0);
    if n > 0 {
        tracing::debug!(segments = n, "retention removed segments");
    }
    Ok(n >= batch)
}
