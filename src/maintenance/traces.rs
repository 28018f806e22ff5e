//! The trace sweeper: removes traces older than `TRACES_RETENTION_DAYS`, a
//! bounded batch per tick (`queen.trace_sweep_v1`). Traces of messages that
//! retention, partition cleanup or a queue's deletion removed go with them
//! (migrations/0008_traces.sql); this is the ceiling for the rest.

use deadpool_postgres::Pool;

use crate::db::DbError;

/// One batch; `Ok(true)` when it was full (more may be due).
pub async fn tick(pool: &Pool, days: i32, batch: i32) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let removed: i64 = client.query_one("SELECT queen.trace_sweep_v1($1, $2)", &[&days, &batch]).await?.get(0);
    if removed > 0 {
        tracing::debug!(traces = removed, "trace sweeper removed traces");
    }
    Ok(removed >= batch as i64)
}
