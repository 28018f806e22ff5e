//! What the broker counts, and the two ways it shows it: JSON at `/metrics`
//! (the shape the Python client's `Admin.metrics()` reads) and Prometheus text
//! at `/metrics/prometheus`, rendered by `metrics-exporter-prometheus`.
//!
//! Counters that the analytics sampler persists once a minute (pushed,
//! popped, acked per queue) are also kept here as deltas since the last
//! sample, so the sampler's cost follows the queues that saw traffic.
//!
//! The recorder keeps each histogram sample in a bucket until a summary folds
//! it in, and only a scrape or an upkeep does that: [`Telemetry::upkeep`] runs
//! every [`UPKEEP_EVERY`] (a maintenance service), or a broker nobody scrapes
//! would grow by every sample it records (measured: 40 MB per 2,000,000
//! delivered messages before the upkeep ran).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub const PUSHED: &str = "queen_push_messages_total";
pub const POPPED: &str = "queen_pop_messages_total";
pub const ACKED: &str = "queen_ack_messages_total";
pub const DELIVERY_LAG: &str = "queen_delivery_lag_seconds";
pub const REQUEST_DURATION: &str = "queen_http_request_duration_seconds";
pub const SEGMENT_MESSAGES: &str = "queen_segment_messages";
/// Segments written by one group commit (push path).
pub const GROUP_SEGMENTS: &str = "queen_push_group_segments";
/// Segments the one-statement write passed over because the partition was
/// no longer what the broker's dedup memory said (another broker wrote it,
/// the queue's window widened, the partition is gone); each went through
/// the checking function in a second commit (`push::group`).
pub const PUSH_KNOWN_MISSED: &str = "queen_push_known_missed_segments_total";
/// Where a push's time goes, by `stage`: `lane` (queued behind its
/// partition's in-flight write and the hold), `group` (its segment waiting
/// for a group writer), `pool` (the writer waiting for a connection) and
/// `write` (the statements and the COMMIT). A slow push shows which one.
pub const PUSH_STAGE: &str = "queen_push_stage_seconds";
/// Where an ack's time goes, by `stage`: `share` (waiting for a shared ack
/// writer, `ack::share`; one sample per request), `pool` (the writer
/// waiting for a connection) and `write` (its statements and their COMMIT;
/// one sample per write, shared or not).
pub const ACK_STAGE: &str = "queen_ack_stage_seconds";
/// Where a pop's claim time goes, by `stage`: `share` (a batch-1 pop
/// waiting for a shared claim, `pop::share`; one sample per pop), `permit`
/// (the claim limiter), `pool` (a connection) and `claim` (the claim of the
/// ring's candidates and its COMMIT; one sample per claim, shared or not).
/// A long-poll's parked time is no stage: nothing was there to claim.
pub const POP_STAGE: &str = "queen_pop_stage_seconds";

/// Records the time since `since` as `stage` of the histogram `family`
/// ([`PUSH_STAGE`], [`ACK_STAGE`], [`POP_STAGE`]).
pub fn stage(family: &'static str, stage: &'static str, since: Instant) {
    metrics::histogram!(family, "stage" => stage).record(since.elapsed().as_secs_f64());
}

/// Awaits `work` and records how long it took as `stage` of `family`
/// (whatever it returned: a wait that failed waited too).
pub async fn timed<T>(family: &'static str, name: &'static str, work: impl std::future::Future<Output = T>) -> T {
    let since = Instant::now();
    let out = work.await;
    stage(family, name, since);
    out
}
/// Ack groups (one partition, group and lease of a request) by how they were
/// applied: `bulk` (the plain groups of a multi-partition batch, one
/// statement) or `each` (one `ack_v2` call).
pub const ACK_GROUPS: &str = "queen_ack_groups_total";
/// Ack requests that were applied in a commit shared with others
/// (`ack::share`); a lone request is not counted.
pub const ACK_SHARED_REQUESTS: &str = "queen_ack_shared_requests_total";
/// Pops of one message whose claim was made in a transaction shared with
/// others (`pop::share`); a lone pop is not counted.
pub const POP_SHARED_CLAIMS: &str = "queen_pop_shared_claims_total";
/// Partitions an ack leased on to a parked pop of its group in its own
/// update, instead of releasing them for a claim (`pop::handover`).
pub const POP_HANDOVERS: &str = "queen_pop_handovers_total";
/// Single-write KV calls that were applied in a commit shared with others
/// (`kv::share`).
pub const KV_SHARED_CALLS: &str = "queen_kv_shared_calls_total";
/// Pooled connections closed at checkout because they were opened before a
/// session met a read-only answer (`db`): after a failover, those that
/// reached the old primary or a standby.
pub const DB_READ_ONLY_DISCARDS: &str = "queen_db_read_only_discards_total";
pub const POOL_CONNECTIONS: &str = "queen_db_pool_connections";
pub const POOL_WAITING: &str = "queen_db_pool_waiting";
pub const PARKED: &str = "queen_parked_long_polls";
pub const POP_PERMITS: &str = "queen_pop_permit_limit";
pub const HOTLIST_READY: &str = "queen_hotlist_ready_partitions";
/// Looks of long-polls that found no claim slot or pooled connection within
/// `DB_CONNECTION_TIMEOUT` and went back to waiting instead of failing.
pub const POP_BUSY_LOOKS: &str = "queen_pop_busy_looks_total";
/// TransactionIds the broker holds in memory for the dedup windows of the
/// partitions it writes (`push::dedup`).
pub const DEDUP_MEMORY: &str = "queen_dedup_memory_entries";
/// One tick of a background service, by `service` (`retention`,
/// `dedup_purge`, `eviction`, …): what a pass costs, and whether a pass at
/// this log's size stays bounded (`maintenance::spawn_service`).
pub const MAINTENANCE_TICK: &str = "queen_maintenance_tick_seconds";
/// Segments retention removed (`maintenance::retention`).
pub const RETENTION_SEGMENTS: &str = "queen_retention_removed_segments_total";
/// Queue wake-gate openings, by `how`: `push` (the first push to a queue in a
/// 5 ms tick opens its gate at once) or `tick` (the later ones, coalesced).
pub const WAKE_OPENS: &str = "queen_wake_gate_opens_total";

/// A gauge not set for this long leaves the exposition: the log gauges of a
/// deleted queue or group (`maintenance::gauges`, set every
/// `STATS_INTERVAL_MS`, at most a minute). The broker's own gauges are set
/// at every scrape, just before the render.
pub const GAUGE_IDLE: Duration = Duration::from_secs(300);

/// How often the recorder folds histogram samples into their summaries.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Per-queue traffic since the last analytics sample: pushed, popped, acked.
pub type QueueDeltas = HashMap<String, [u64; 3]>;

/// The broker's counters. One per process (the recorder is global).
pub struct Telemetry {
    prometheus: PrometheusHandle,
    started: Instant,
    pub requests: AtomicU64,
    pub pushed: AtomicU64,
    pub popped: AtomicU64,
    pub acked: AtomicU64,
    pub parked: AtomicI64,
    deltas: Mutex<QueueDeltas>,
    /// Looked up once: a pop records one sample per message, and a registry
    /// lookup per sample was a fifth of the broker's own CPU in a framed drain.
    delivery_lag: metrics::Histogram,
}

static GLOBAL: OnceLock<Arc<Telemetry>> = OnceLock::new();

impl Telemetry {
    /// The process-wide instance (installs the Prometheus recorder once).
    pub fn global() -> Arc<Telemetry> {
        GLOBAL
            .get_or_init(|| {
                let prometheus = PrometheusBuilder::new()
                    .idle_timeout(metrics_util::MetricKindMask::GAUGE, Some(GAUGE_IDLE))
                    .set_buckets(&[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
                    .expect("bucket list is non-empty")
                    .set_buckets_for_metric(
                        metrics_exporter_prometheus::Matcher::Full(SEGMENT_MESSAGES.into()),
                        &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0],
                    )
                    .expect("bucket list is non-empty")
                    .set_buckets_for_metric(
                        metrics_exporter_prometheus::Matcher::Full(GROUP_SEGMENTS.into()),
                        &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
                    )
                    .expect("bucket list is non-empty")
                    .install_recorder()
                    .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder().handle());
                Arc::new(Telemetry {
                    prometheus,
                    started: Instant::now(),
                    requests: AtomicU64::new(0),
                    pushed: AtomicU64::new(0),
                    popped: AtomicU64::new(0),
                    acked: AtomicU64::new(0),
                    parked: AtomicI64::new(0),
                    deltas: Mutex::new(HashMap::new()),
                    delivery_lag: metrics::histogram!(DELIVERY_LAG),
                })
            })
            .clone()
    }

    fn count(&self, queue: &str, slot: usize, n: u64) {
        let mut d = self.deltas.lock().expect("deltas lock poisoned");
        match d.get_mut(queue) {
            Some(v) => v[slot] += n,
            None => {
                let mut v = [0; 3];
                v[slot] = n;
                d.insert(queue.to_string(), v);
            }
        }
    }

    pub fn pushed(&self, queue: &str, n: u64) {
        self.pushed.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(PUSHED, crate::tenancy::queue_labels(queue)).increment(n);
        self.count(queue, 0, n);
    }

    pub fn popped(&self, queue: &str, n: u64) {
        self.popped.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(POPPED, crate::tenancy::queue_labels(queue)).increment(n);
        self.count(queue, 1, n);
    }

    pub fn acked(&self, queue: &str, n: u64) {
        self.acked.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(ACKED, crate::tenancy::queue_labels(queue)).increment(n);
        self.count(queue, 2, n);
    }

    /// `n` messages delivered `lag_seconds` after they were written.
    pub fn delivered(&self, lag_seconds: f64, n: usize) {
        self.delivery_lag.record_many(lag_seconds, n);
    }

    /// Folds the histogram samples recorded since the last upkeep or scrape
    /// into their summaries, freeing the buckets that held them.
    pub fn upkeep(&self) {
        self.prometheus.run_upkeep();
    }

    /// Takes the per-queue traffic since the last call.
    pub fn take_deltas(&self) -> QueueDeltas {
        std::mem::take(&mut *self.deltas.lock().expect("deltas lock poisoned"))
    }

    /// Puts back deltas a failed sample could not persist.
    pub fn restore_deltas(&self, deltas: QueueDeltas) {
        for (q, v) in deltas {
            for (slot, n) in v.into_iter().enumerate() {
                if n > 0 {
                    self.count(&q, slot, n);
                }
            }
        }
    }

    pub fn uptime_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The Prometheus text exposition, with the gauges read now.
    pub fn prometheus_text(
        &self,
        pool: &deadpool_postgres::Pool,
        hotlist_ready: usize,
        pop_permits: usize,
        dedup_entries: usize,
    ) -> String {
        let s = pool.status();
        metrics::gauge!(POOL_CONNECTIONS, "state" => "in_use").set((s.size - s.available) as f64);
        metrics::gauge!(POOL_CONNECTIONS, "state" => "idle").set(s.available as f64);
        metrics::gauge!(POOL_WAITING).set(s.waiting as f64);
        metrics::gauge!(PARKED).set(self.parked.load(Ordering::Relaxed) as f64);
        metrics::gauge!(HOTLIST_READY).set(hotlist_ready as f64);
        metrics::gauge!(POP_PERMITS).set(pop_permits as f64);
        metrics::gauge!(DEDUP_MEMORY).set(dedup_entries as f64);
        self.prometheus.render()
    }
}

/// Resident set size and CPU seconds of this process, from /proc.
pub fn process_usage() -> (u64, f64, f64) {
    let rss_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let (user, system) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the parenthesized command name; utime and stime are 14 and 15.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? / ticks, f.get(12)?.parse::<f64>().ok()? / ticks))
        })
        .unwrap_or((0.0, 0.0));
    (rss_kb * 1024, user, system)
}
