//! Planner statistics for the partition table, which grows in jumps.
//!
//! The broker prepares its statements once per connection, and PostgreSQL
//! keeps a statement's plan until the statistics of a table it reads change.
//! `queen.partitions` can grow many times over in seconds (a producer spreading
//! over 100,000 new partitions). Plans made while it was small go on assuming
//! it is (the group push found three partitions by name by reading every
//! partition of the queue) until autovacuum analyzes the table, which is up to
//! its naptime away: a minute by default, and set by the database, not by us.
//! Measured in docs/PERFORMANCE.md (stop 8): on a fresh broker, a prefill of
//! 1,000,000 messages over 100,000 new partitions took 57-62 s with stale
//! plans and 30-37 s with this service.
//!
//! Each tick therefore asks whether the table holds at least `MIN_ROWS` rows
//! and more than twice what its statistics say, and analyzes it if so
//! (`SKIP_LOCKED`: an ANALYZE already running elsewhere does the same job).
//! Doubling bounds the work: 17 passes take it from 1,000 rows to 100 million.
//! Shrinking and steady churn are left to autovacuum, and so is a table this
//! broker's role cannot analyze. The cursor table (`queen.consumers`), which a
//! group's first pop grows by a row per partition, is left out on purpose:
//! analyzed at once, it made the claim statement of the drain that follows
//! 15 % slower per call.

use deadpool_postgres::Pool;

use crate::db::DbError;

/// Below this a plan's shape does not depend on the table's size.
pub const MIN_ROWS: i64 = 1_000;

const GROWN_SQL: &str = "
    SELECT count(*) FROM pg_class c
    WHERE c.oid = 'queen.partitions'::regclass
      AND pg_stat_get_live_tuples(c.oid) >= $1 AND pg_stat_get_live_tuples(c.oid) > 2 * c.reltuples
      AND pg_has_role(c.relowner, 'MEMBER')";

/// One pass; never asks for another at once.
pub async fn tick(pool: &Pool) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let grown = client.prepare_cached(GROWN_SQL).await?;
    let due: i64 = client.query_one(&grown, &[&MIN_ROWS]).await?.get(0);
    if due > 0 {
        client.batch_execute("ANALYZE (SKIP_LOCKED) queen.partitions").await?;
        tracing::debug!("refreshed the planner statistics of queen.partitions, which had doubled");
    }
    Ok(false)
}
