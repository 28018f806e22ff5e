//! The metrics sampler: on each tick (`METRICS_FLUSH_MS`, a minute by
//! default), each broker writes the per-queue traffic it saw since the last
//! sample into `queen.metrics_samples` and its own system figures (memory,
//! CPU, request rate, database pool, parked long-polls) into
//! `queen.broker_samples`; the analytics routes sum across brokers. It trims
//! samples older than `METRICS_RETENTION_DAYS`.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

use deadpool_postgres::Pool;

use crate::db::DbError;
use crate::metrics::Telemetry;

/// What the previous tick saw, so a sample reports rates over its own
/// interval rather than since boot.
pub struct Sampler {
    broker: String,
    retention_days: i32,
    previous: Mutex<(Instant, f64, u64)>,
}

impl Sampler {
    pub fn new(broker: String, retention_days: i32) -> Sampler {
        let (_, user, system) = crate::metrics::process_usage();
        let requests = Telemetry::global().requests.load(Ordering::Relaxed);
        Sampler { broker, retention_days, previous: Mutex::new((Instant::now(), user + system, requests)) }
    }

    /// This broker's figures now; rates since the previous call.
    fn system(&self, pool: &Pool, telemetry: &Telemetry) -> SystemSample {
        let (rss, user, system) = crate::metrics::process_usage();
        let requests = telemetry.requests.load(Ordering::Relaxed);
        let now = Instant::now();
        let (cpu_percent, rps) = {
            let mut prev = self.previous.lock().expect("sampler lock poisoned");
            let secs = now.duration_since(prev.0).as_secs_f64().max(0.001);
            let r = (((user + system) - prev.1).max(0.0) / secs * 100.0, requests.saturating_sub(prev.2) as f64 / secs);
            *prev = (now, user + system, requests);
            r
        };
        let status = pool.status();
        SystemSample {
            rss: rss as i64,
            cpu_percent,
            rps,
            pool_size: status.size as i32,
            pool_in_use: (status.size - status.available.min(status.size)) as i32,
            pool_waiting: status.waiting as i32,
            parked: telemetry.parked.load(Ordering::Relaxed),
            uptime: telemetry.uptime_seconds() as i64,
        }
    }

    /// Writes one sample; traffic deltas that cannot be written are kept for
    /// the next.
    pub async fn tick(&self, pool: &Pool, telemetry: &Telemetry) -> Result<bool, DbError> {
        let deltas = telemetry.take_deltas();
        let sys = self.system(pool, telemetry);
        let write = async {
            let client = pool.get().await?;
            if !deltas.is_empty() {
                let names: Vec<&str> = deltas.keys().map(String::as_str).collect();
                let col = |i: usize| -> Vec<i64> { names.iter().map(|n| deltas[*n][i] as i64).collect() };
                client
                    .execute(
                        "INSERT INTO queen.metrics_samples (sampled_at, queue_name, broker, pushed, popped, acked)
                         SELECT date_trunc('minute', now()), q, $2, pu, po, ac
                         FROM unnest($1::text[], $3::bigint[], $4::bigint[], $5::bigint[]) AS t (q, pu, po, ac)",
                        &[&names, &self.broker, &col(0), &col(1), &col(2)],
                    )
                    .await?;
            }
            client
                .execute(
                    "INSERT INTO queen.broker_samples (broker, rss_bytes, cpu_percent, requests_per_second, pool_size, pool_in_use,
                                                       pool_waiting, parked_long_polls, uptime_seconds)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    &[&self.broker, &sys.rss, &sys.cpu_percent, &sys.rps, &sys.pool_size, &sys.pool_in_use, &sys.pool_waiting, &sys.parked, &sys.uptime],
                )
                .await?;
            client
                .batch_execute(&format!(
                    "DELETE FROM queen.metrics_samples WHERE sampled_at < now() - make_interval(days => {d});
                     DELETE FROM queen.broker_samples WHERE sampled_at < now() - make_interval(days => {d});",
                    d = self.retention_days
                ))
                .await?;
            Ok::<_, DbError>(())
        };
        match write.await {
            Ok(()) => Ok(false),
            Err(e) => {
                telemetry.restore_deltas(deltas);
                Err(e)
            }
        }
    }
}

struct SystemSample {
    rss: i64,
    cpu_percent: f64,
    rps: f64,
    pool_size: i32,
    pool_in_use: i32,
    pool_waiting: i32,
    parked: i64,
    uptime: i64,
}
