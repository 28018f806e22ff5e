//! Empty-partition cleanup: partitions that retention emptied and nobody has
//! written to for `PARTITION_CLEANUP_DAYS` go, with their cursors and index
//! entries (`queen.cleanup_partitions_v1`). Candidates are recorded by
//! retention as it empties them, so this never walks the partition table.

use std::time::Duration;

use deadpool_postgres::Pool;

use crate::db::DbError;

pub async fn tick(pool: &Pool, idle: Duration, batch: i32) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let idle_seconds = idle.as_secs_f64();
    let n: i32 = client
        .query_one("SELECT queen.cleanup_partitions_v1(make_interval(secs => $1), $2)", &[&idle_seconds, &batch])
        .await?
        .get(0);
    if n > 0 {
        tracing::info!(partitions = n, "removed empty partitions");
    }
    Ok(n >= batch)
}
