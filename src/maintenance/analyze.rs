//! Planner statistics for the two tables that grow in jumps.
//!
//! The broker prepares its statements once per connection, and PostgreSQL
//! keeps a statement's plan until the statistics of a table it reads change.
//! Two tables can grow many times over in seconds: `queen.partitions` (a
//! producer spreading over 100,000 new partitions) and `queen.consumers` (a
//! group's first pop seeds a cursor for every partition of the queue). Plans
//! made while such a table was small go on assuming it is (a scan of every
//! partition of a queue to find three by name, for one) until autovacuum
//! analyzes the table, which is up to its naptime away: a minute by default,
//! and set by the database, not by us. Measured in docs/PERFORMANCE.md (stop
//! 8): a 100,000-partition prefill took 56 s with stale plans and 28 s with
//! this service.
//!
//! Each tick therefore asks whether either table holds at least `MIN_ROWS`
//! rows and more than twice what its statistics say, and analyzes those
//! (`SKIP_LOCKED`: an ANALYZE already running elsewhere does the same job).
//! Doubling bounds the work: 17 passes take a table from 1,000 rows to 100
//! million. Shrinking and steady churn are left to autovacuum; a table this
//! broker's role cannot analyze is not asked about.

use deadpool_postgres::Pool;

use crate::db::DbError;

/// Below this a plan's shape does not depend on the table's size.
pub const MIN_ROWS: i64 = 1_000;

const GROWN_SQL: &str = "
    SELECT c.relname::text
    FROM pg_class c
    JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE s.schemaname = 'queen' AND c.relname IN ('partitions', 'consumers')
      AND s.n_live_tup >= $1 AND s.n_live_tup > 2 * c.reltuples
      AND pg_has_role(c.relowner, 'MEMBER')";

/// One pass; never asks for another at once.
pub async fn tick(pool: &Pool) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let grown = client.prepare_cached(GROWN_SQL).await?;
    for row in client.query(&grown, &[&MIN_ROWS]).await? {
        let statement = match row.get::<_, &str>(0) {
            "partitions" => "ANALYZE (SKIP_LOCKED) queen.partitions",
            "consumers" => "ANALYZE (SKIP_LOCKED) queen.consumers",
            _ => continue,
        };
        client.batch_execute(statement).await?;
        tracing::debug!(statement, "refreshed planner statistics of a table that grew");
    }
    Ok(false)
}
