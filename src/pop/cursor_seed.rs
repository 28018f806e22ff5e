//! The rest of a new group's first contact, walked behind it.
//!
//! A group's first contact used to write its cursor on every partition of
//! the queue and read every partition holding a message into its ring before
//! it answered: 9.4 s at 1,000,000 partitions, with every consumer of the
//! group waiting (issue 51). Now the first contact covers one chunk
//! (`QUEEN_CURSOR_SEED_CHUNK` partitions in name order) and this task walks
//! the rest, a chunk per statement (`queen.seed_cursors_v1`, migration
//! 0046): it writes the chunk's cursors and offers the ring the chunk's
//! partitions holding messages, while the group's pops are served. The
//! claims take partitions in the order the ring was offered them, so the
//! walk, tens of milliseconds a chunk, stays ahead of them.
//!
//! Why a task and not the claims: a claim that meets a partition without
//! the group's cursor writes it itself (`queen.pop_claim_v1`, under a
//! try-lock), and the ring's periodic reseed walks the whole queue, which is
//! what makes this task optional -- a broker killed mid-way loses nothing --
//! but that way costs each such partition a trip through the per-partition
//! claim, and a partition waits for the reseed to be found. Written in bulk
//! ahead of the claims, they cost about twice the first contact's old single
//! insert (100,000 cursors: 0.7 s of PostgreSQL against 0.32 s), off the
//! requests' path.
//!
//! Each statement moves the walk forward by at least one partition name, so
//! the task ends; it also ends on shutdown, when the group is no longer
//! subscribed, or after a few failed statements in a row.

use std::time::{Duration, Instant};

use super::claim;
use super::PopService;

/// Failed statements in a row after which the task leaves the rest to the
/// claims and the reseeds.
const MAX_FAILURES: u32 = 3;
/// Pause after a failed statement.
const RETRY_AFTER: Duration = Duration::from_millis(500);

impl PopService {
    /// Walks (queue, group)'s partitions past `after` a chunk at a time until
    /// the queue's end: their missing cursors written, those holding
    /// messages offered to the group's ring. Stops early on shutdown.
    pub(super) fn spawn_cursor_seed(&self, queue: String, group: String, after: String) {
        let (pool, hotlist, wake) = (self.pool.clone(), self.hotlist.clone(), self.wake.clone());
        let mut closing = self.closing.subscribe();
        let chunk = self.cfg.cursor_seed_chunk;
        tokio::spawn(async move {
            let started = Instant::now();
            let (mut after, mut statements, mut failures) = (after, 0u64, 0u32);
            loop {
                if *closing.borrow() {
                    return;
                }
                let step = async {
                    let client = pool.get().await.map_err(|e| e.to_string())?;
                    claim::seed_cursors(&client, &queue, &group, &after, chunk).await.map_err(|e| e.to_string())
                };
                let outcome = tokio::select! {
                    r = step => r,
                    // Shutdown: the claims and the reseeds cover the rest.
                    _ = closing.changed() => return,
                };
                match outcome {
                    Ok((pending, rest)) => {
                        (failures, statements) = (0, statements + 1);
                        if !pending.is_empty() {
                            hotlist.extend_seed(&queue, &group, pending);
                            wake.pushed(&queue);
                        }
                        match rest {
                            Some(next) => after = next,
                            None => {
                                let seconds = started.elapsed().as_secs_f64();
                                tracing::debug!(%queue, %group, statements, seconds, "first contact's walk done");
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        failures += 1;
                        if failures >= MAX_FAILURES {
                            tracing::warn!(%queue, %group, %after, error = %e, "first contact's walk gave up; claims and reseeds cover the rest");
                            return;
                        }
                        tokio::time::sleep(RETRY_AFTER).await;
                    }
                }
            }
        });
    }
}
