//! Background services, one file each: retention, the dedup-window purge of
//! the transaction index, the `maxWaitTimeSeconds` eviction, the log's
//! Prometheus gauges, empty-partition cleanup, the metrics sampler, the
//! trace sweeper, the KV expiry sweeper, and
//! the planner statistics of the partition table, which grows in jumps. Each
//! runs on its own cadence until the shutdown signal, does bounded work per
//! tick, and treats a failed tick as a skipped one (the next tick retries).

pub mod analyze;
pub mod dedup_purge;
pub mod eviction;
pub mod gauges;
pub mod index_entries;
pub mod kv_expiry;
pub mod metrics_sampler;
pub mod partition_cleanup;
pub mod retention;
pub mod traces;

use std::future::Future;
use std::time::Duration;

use tokio::sync::broadcast;

/// Runs `tick` every `every` until shutdown. A tick that reports more work
/// left (`Ok(true)`) is followed by another, up to a bound, so a backlog
/// drains without waiting a full interval per batch; between them the
/// service rests as long as the tick took (at most a second), so a backlog
/// takes at most half of one connection's time and the pushes and pops
/// beside it keep theirs (a retention pass over 1,000,000 segments run back
/// to back raised the push p99 1.57-fold on two cores, issue 51).
pub fn spawn_service<F, Fut>(name: &'static str, every: Duration, shutdown: broadcast::Receiver<()>, tick: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<bool, crate::db::DbError>> + Send,
{
    spawn_paced_service(name, every, None, shutdown, tick);
}

/// [`spawn_service`] for a walk whose tick costs what the log's size makes
/// it cost: a round of ticks that took `t` is followed by the next one no
/// sooner than `t / share` after its start (and never sooner than `every`),
/// so the walk takes at most `share` of one connection's time whatever the
/// log's size. Why: the gauges' walk reads 50,000 partitions a tick; at
/// 1,000,000 partitions that tick cost 1.3-1.6 s of PostgreSQL every 10 s,
/// a sixth of a core for as long as the broker runs; paced to 5 %, an idle
/// broker's PostgreSQL there spends about half the CPU it did (issue 51,
/// docs/PERFORMANCE.md). A small log's ticks are short and keep `every`.
pub fn spawn_walk_service<F, Fut>(name: &'static str, every: Duration, share: f64, shutdown: broadcast::Receiver<()>, tick: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<bool, crate::db::DbError>> + Send,
{
    spawn_paced_service(name, every, Some(share), shutdown, tick);
}

/// Rounds shorter than this are never paced: they cost nothing worth a
/// staler gauge (a test broker's 100 ms interval stays 100 ms).
const PACE_FLOOR: Duration = Duration::from_millis(100);

/// When the round after one that started at `started` and took `spent` may
/// start: `every` later, or later still when `spent` is more than `share`
/// of the gap.
fn next_round(started: tokio::time::Instant, spent: Duration, every: Duration, share: Option<f64>) -> tokio::time::Instant {
    let paced = share
        .filter(|s| *s > 0.0 && *s < 1.0 && spent >= PACE_FLOOR)
        .map_or(Duration::ZERO, |s| spent.div_f64(s));
    started + every.max(paced)
}

fn spawn_paced_service<F, Fut>(
    name: &'static str,
    every: Duration,
    share: Option<f64>,
    mut shutdown: broadcast::Receiver<()>,
    mut tick: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<bool, crate::db::DbError>> + Send,
{
    tokio::spawn(async move {
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = shutdown.recv() => return,
            }
            let round = tokio::time::Instant::now();
            for _ in 0..100 {
                let started = std::time::Instant::now();
                let done = tick().await;
                metrics::histogram!(crate::metrics::MAINTENANCE_TICK, "service" => name).record(started.elapsed().as_secs_f64());
                match done {
                    Ok(true) => tokio::time::sleep(started.elapsed().min(Duration::from_secs(1))).await,
                    Ok(false) => break,
                    Err(e) => {
                        tracing::warn!(service = name, error = %e, "maintenance tick failed; retrying next tick");
                        break;
                    }
                }
            }
            // As the interval did (a late round delays the next, no burst
            // to catch up): from this round's start.
            next = next_round(round, round.elapsed(), every, share).max(tokio::time::Instant::now());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_keeps_its_interval_until_its_ticks_outgrow_their_share() {
        let t0 = tokio::time::Instant::now();
        let every = Duration::from_secs(10);
        let at = |spent: u64, share| next_round(t0, Duration::from_millis(spent), every, share) - t0;
        assert_eq!(at(300, Some(0.05)), every, "a short tick keeps the interval");
        assert_eq!(next_round(t0, Duration::from_millis(60), Duration::from_millis(100), Some(0.05)) - t0,
                   Duration::from_millis(100), "a tick under the floor is never paced");
        assert_eq!(at(1_500, Some(0.05)), Duration::from_secs(30), "1.5 s at 5 %: every 30 s");
        assert_eq!(at(1_500, None), every, "a plain service is not paced");
        assert_eq!(at(60_000, None), every, "nor after a long backlog");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_walk_rests_until_it_has_taken_its_share() {
        let (stop, _) = broadcast::channel(1);
        let starts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = starts.clone();
        let t0 = tokio::time::Instant::now();
        spawn_walk_service("test_walk", Duration::from_secs(10), 0.05, stop.subscribe(), move || {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(t0.elapsed().as_secs());
                tokio::time::sleep(Duration::from_secs(2)).await;
                Ok(false)
            }
        });
        tokio::time::sleep(Duration::from_secs(125)).await;
        assert_eq!(*starts.lock().unwrap(), [0, 40, 80, 120], "a 2 s tick at 5 %: a round every 40 s, not every 10 s");
        let _ = stop.send(());
    }
}
