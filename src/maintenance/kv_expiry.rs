//! The KV sweeper: reclaims the rows of expired keys, a bounded batch per
//! tick (`queen.kv_sweep_v1`). It is not what makes a key expire: a key past
//! its `expiresAt` is invisible to every read and absent to every write the
//! moment it expires, whether or not this has run (migrations/0010_kv.sql).

use deadpool_postgres::Pool;

use crate::db::DbError;

/// One batch; `Ok(true)` when it was full (more may be due).
pub async fn tick(pool: &Pool, batch: i32) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let removed: i64 = client.query_one("SELECT queen.kv_sweep_v1($1)", &[&batch]).await?.get(0);
    if removed > 0 {
        tracing::debug!(keys = removed, "kv sweeper reclaimed expired keys");
    }
    Ok(removed >= batch as i64)
}
