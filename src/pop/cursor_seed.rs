//! The rest of a new group's cursors, written behind its first contact.
//!
//! A group's first contact used to write its cursor on every partition of
//! the queue before it answered: 7.8 s at 1,000,000 partitions, with every
//! consumer of the group waiting (issue 51). Now the first contact writes
//! one chunk (`QUEEN_CURSOR_SEED_CHUNK`, in partition-name order, the order
//! the ring hands partitions to claims) and this task writes the rest, a
//! chunk per statement (`queen.seed_cursors_v1`, migration 0046), while the
//! group's pops are served.
//!
//! Why a task and not the claims: a claim that meets a partition without
//! the group's cursor writes it itself (`queen.pop_claim_v1`, under a
//! try-lock), which is what makes this task optional -- a broker killed
//! mid-way loses nothing -- but that way costs each such partition a trip
//! through the per-partition claim. Written in bulk ahead of the claims,
//! the cursors cost what the first contact's single insert cost, off the
//! requests' path.
//!
//! Each statement moves the walk forward by at least one partition name, so
//! the task ends; it also ends on shutdown, when the group is no longer
//! subscribed, or after a few failed statements in a row (the claims cover
//! what it leaves).

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

/// Failed statements in a row after which the task leaves the rest to the claims.
const MAX_FAILURES: u32 = 3;
/// Pause after a failed statement.
const RETRY_AFTER: Duration = Duration::from_millis(500);

const SEED_SQL: &str = "SELECT queen.seed_cursors_v1($1, $2, $3, $4)";

/// Writes (queue, group)'s missing cursors on the partitions past `after`,
/// `chunk` per statement, until the queue's end; stops early when `closing`
/// turns true.
pub fn spawn(pool: Pool, queue: String, group: String, after: String, chunk: i32, mut closing: tokio::sync::watch::Receiver<bool>) {
    tokio::spawn(async move {
        let started = Instant::now();
        let (mut after, mut statements, mut failures) = (after, 0u64, 0u32);
        loop {
            if *closing.borrow() {
                tracing::info!(%queue, %group, %after, "cursor seeding stopped by shutdown; claims write the rest");
                return;
            }
            let step = async {
                let client = pool.get().await.map_err(|e| e.to_string())?;
                let stmt = client.prepare_cached(SEED_SQL).await.map_err(|e| e.to_string())?;
                let row = client.query_one(&stmt, &[&queue, &group, &after, &chunk]).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(row.get::<_, Option<String>>(0))
            };
            let outcome = tokio::select! {
                r = step => r,
                // Shutdown (or the service gone): the claims write the rest.
                _ = closing.changed() => return,
            };
            match outcome {
                Ok(Some(next)) => {
                    (after, failures) = (next, 0);
                    statements += 1;
                }
                Ok(None) => {
                    tracing::debug!(%queue, %group, statements = statements + 1, seconds = started.elapsed().as_secs_f64(), "cursor seeding done");
                    return;
                }
                Err(e) => {
                    failures += 1;
                    if failures >= MAX_FAILURES {
                        tracing::warn!(%queue, %group, %after, error = %e, "cursor seeding gave up; claims write the rest");
                        return;
                    }
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
        }
    });
}
