//! Group commit: the segments that lanes have ready go to PostgreSQL
//! together.
//!
//! A lane (see `coalescer`) batches what piles up behind its own in-flight
//! write, which helps a hot partition but not many thin ones: batch-1
//! producers spread over ten partitions gave segments of one or two messages,
//! each its own call and commit, and PostgreSQL spent about as much CPU per
//! call as on four single-row commits. So lanes do not call PostgreSQL
//! themselves; they hand their compressed segment to this committer, which
//! keeps at most `writers` group writes in flight (the queue is `db::share`'s,
//! bounded by MAX_SEGMENTS and MAX_BYTES a write). While those run, segments
//! of other lanes pile up, and the next group write takes them all: one call
//! of `queen.push_segments_of_queues_v1`, whatever queues they are of (one
//! call per queue cost a queue-per-push workload twice PostgreSQL's time per
//! message, docs/PERFORMANCE.md). Like the lanes,
//! this batches exactly what load produces and never waits on a timer: an
//! idle broker's segment goes out at once.
//!
//! A group whose partitions the broker's dedup memory all covers (it wrote
//! their previous segments: it knows each partition's id, last offset and
//! window) is one statement, `queen.push_known_segments_v1`, which skips
//! the lookups and checks of the general function: at batch 1 PostgreSQL
//! spent most of a group write starting those statements' executors. A
//! segment whose partition is no longer what the memory says is passed over
//! and written again through the checking function in a second commit.
//!
//! A failed group is retried segment by segment, so one bad segment cannot
//! fail its neighbours; only when PostgreSQL cannot be reached at all does
//! every segment of the group get that error (each would meet it alone).

use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::{GenericClient, Pool};
use tokio::sync::oneshot;

use super::dedup::{Answer, Known};
use super::segment::{
    append_known, append_segment, append_with_memory, keeps_no_window, Appended, MemorySegment, PushError, PUSH_SQL, PUSH_WITH_MEMORY_SQL,
};
use crate::db::share::{Share, Shared};
use crate::db::DbError;

/// Most segments one group write carries.
const MAX_SEGMENTS: usize = 256;
/// Most compressed bytes one group write carries.
const MAX_BYTES: usize = 8 << 20;
/// Fewest segments worth one `push_segments_of_queues_v1` call when all of
/// them are of queues without a dedup window: its set-based statements cost
/// PostgreSQL more than `push_segment_without_window_v1` for one segment and
/// break even near two (pgbench, docs/PERFORMANCE.md), so smaller sets go as
/// single calls inside the group's transaction. A group holding a segment
/// of a queue with a window (or not yet known) is one set-based call
/// however few its segments.
const MULTI_MIN: usize = 3;

type Reply = oneshot::Sender<Result<Appended, Arc<PushError>>>;

/// One lane's segment, waiting for a group write.
struct Job {
    queue: String,
    partition: String,
    hashes: Vec<i64>,
    blob: Vec<u8>,
    /// The queue's dedup window as the lane last saw it (`None`: unknown).
    window: Option<i32>,
    /// What the broker's dedup memory covers of the partition.
    known: Option<Known>,
    reply: Reply,
    queued: Instant,
}

impl Shared for Job {
    fn weight(&self) -> usize {
        self.blob.len()
    }
}

struct Inner {
    share: Arc<Share<Job>>,
    pool: Pool,
}

/// The group committer. Cheap to clone.
#[derive(Clone)]
pub struct GroupCommitter {
    inner: Arc<Inner>,
}

impl GroupCommitter {
    pub fn new(pool: Pool, max_writers: usize) -> GroupCommitter {
        GroupCommitter { inner: Arc::new(Inner { share: Arc::new(Share::bounded(max_writers, MAX_SEGMENTS, MAX_BYTES)), pool }) }
    }

    /// Appends one compressed segment to (queue, partition), committed with
    /// whatever else is ready. At most one segment per partition may be in
    /// flight (the lane guarantees it). `window`: the queue's dedup window as
    /// last reported, which picks the function to call; `known`: what the
    /// dedup memory covers of the partition.
    pub async fn write(
        &self,
        queue: &str,
        partition: &str,
        hashes: Vec<i64>,
        blob: Vec<u8>,
        window: Option<i32>,
        known: Option<Known>,
    ) -> Result<Appended, Arc<PushError>> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            queue: queue.to_string(),
            partition: partition.to_string(),
            hashes,
            blob,
            window,
            known,
            reply,
            queued: Instant::now(),
        };
        let inner = self.inner.clone();
        // The queue is db::share's: at most `max_writers` group writes in
        // flight, each taking what is pending up to MAX_SEGMENTS and
        // MAX_BYTES (a larger segment goes alone).
        self.inner.share.submit(job, move |jobs| {
            let inner = inner.clone();
            async move { inner.write_group(jobs).await }
        });
        rx.await.unwrap_or_else(|_| Err(Arc::new(PushError::Lost)))
    }

    /// The original message ids of dedup candidates (offset, hash) of partition `pid` (see
    /// `segment::originals`).
    pub async fn originals(
        &self,
        pid: i64,
        candidates: &[(i64, i64)],
        hasher: &crate::log::TxnHasher,
    ) -> Result<Vec<Option<uuid::Uuid>>, DbError> {
        super::segment::originals(&self.inner.pool.get().await?, pid, candidates, hasher).await
    }
}

impl Inner {
    async fn write_group(&self, jobs: Vec<Job>) {
        metrics::histogram!(crate::metrics::GROUP_SEGMENTS).record(jobs.len() as f64);
        for job in &jobs {
            stage("group", job.queued);
        }
        let asked = Instant::now();
        let client = match self.pool.get().await {
            Ok(c) => c,
            Err(e) => return fail_all(jobs, Arc::new(PushError::Db(DbError::from(e)))),
        };
        stage("pool", asked);
        let writing = Instant::now();
        // Segments the known write passed over go once more, through the
        // function that checks what the memory cannot (a second commit, for
        // the few whose partition moved under the memory).
        let missed = self.write_once(&client, jobs, true).await;
        if !missed.is_empty() {
            metrics::counter!(crate::metrics::PUSH_KNOWN_MISSED).increment(missed.len() as u64);
            self.write_once(&client, missed, false).await;
        }
        stage("write", writing);
    }

    /// Writes `jobs` in one transaction and answers each; returns the ones
    /// `push_known_segments_v1` passed over, unanswered (none when `known`
    /// is false: every segment then goes through the checking function).
    async fn write_once(&self, client: &deadpool_postgres::Client, jobs: Vec<Job>, known: bool) -> Vec<Job> {
        // Partitions in (queue, partition) byte order, the functions' lock
        // order: one known write when the dedup memory covers every
        // segment; else one checking call or, for fewer than MULTI_MIN
        // segments of queues known to keep no window, a single call each.
        // A group of both kinds goes whole through the checking function:
        // two calls would lock its partitions in two sorted runs, and two
        // brokers writing the same partitions could then deadlock.
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.sort_by(|&a, &b| (&jobs[a].queue, &jobs[a].partition).cmp(&(&jobs[b].queue, &jobs[b].partition)));
        let calls = if known && order.iter().all(|&j| jobs[j].known.is_some()) {
            vec![Call::Known(order)]
        } else if order.len() < MULTI_MIN && order.iter().all(|&j| keeps_no_window(jobs[j].window)) {
            order.into_iter().map(|j| Call::Checked(vec![j])).collect()
        } else {
            vec![Call::Checked(order)]
        };
        let result = if let [only] = calls.as_slice() {
            run(client, &jobs, only).await.map(|r| vec![r])
        } else {
            write_in_transaction(client, &jobs, &calls).await
        };
        match result {
            Ok(results) => {
                let mut replies: Vec<Option<Appended>> = jobs.iter().map(|_| None).collect();
                for (call, writes) in calls.iter().zip(results) {
                    for (&j, w) in call.members().iter().zip(writes) {
                        replies[j] = w;
                    }
                }
                let mut missed = Vec::new();
                for (job, w) in jobs.into_iter().zip(replies) {
                    match w {
                        Some(w) => {
                            let _ = job.reply.send(Ok(w));
                        }
                        None if known && job.known.is_some() => missed.push(job),
                        None => {
                            let _ = job.reply.send(Err(Arc::new(PushError::Lost)));
                        }
                    }
                }
                missed
            }
            Err(e) => {
                let e = PushError::Db(e);
                if jobs.len() == 1 || e.database_unreachable() {
                    fail_all(jobs, Arc::new(e));
                    return Vec::new();
                }
                tracing::debug!(error = %e, segments = jobs.len(), "group write failed; writing its segments one by one");
                for job in jobs {
                    let r = run(client, std::slice::from_ref(&job), &Call::Checked(vec![0])).await;
                    let r = r
                        .map_err(|e| Arc::new(PushError::Db(e)))
                        .and_then(|mut w| w.pop().flatten().ok_or_else(|| Arc::new(PushError::Lost)));
                    let _ = job.reply.send(r);
                }
                Vec::new()
            }
        }
    }
}

/// One call of a group write: members are indexes into the group's jobs,
/// in lock order.
enum Call {
    /// Segments the dedup memory covers: `push_known_segments_v1`.
    Known(Vec<usize>),
    /// Any segments: `push_segments_of_queues_v1`, or for a lone segment
    /// of a queue without a window `push_segment_without_window_v1`.
    Checked(Vec<usize>),
}

impl Call {
    fn members(&self) -> &[usize] {
        match self {
            Call::Known(m) | Call::Checked(m) => m,
        }
    }
}

/// Records the time since `since` as push stage `name`.
fn stage(name: &'static str, since: Instant) {
    crate::metrics::stage(crate::metrics::PUSH_STAGE, name, since);
}

fn fail_all(jobs: Vec<Job>, e: Arc<PushError>) {
    for job in jobs {
        let _ = job.reply.send(Err(e.clone()));
    }
}

/// Several calls in one transaction, sent as one pipeline: BEGIN, the calls
/// and COMMIT leave together and cost one round trip. If a call fails the
/// COMMIT finds the transaction aborted and rolls it back, so either every
/// segment of the group is committed or none is.
async fn write_in_transaction(
    client: &deadpool_postgres::Client,
    jobs: &[Job],
    calls: &[Call],
) -> Result<Vec<Vec<Option<Appended>>>, DbError> {
    // Statements are prepared (cached) first, so that each call below sends
    // its query on first poll, in order, between BEGIN and COMMIT.
    for sql in [PUSH_SQL, PUSH_WITH_MEMORY_SQL] {
        client.prepare_cached(sql).await?;
    }
    let begin = client.batch_execute("BEGIN");
    let writes = futures_util::future::join_all(calls.iter().map(|c| run(client, jobs, c)));
    let commit = client.batch_execute("COMMIT");
    let (begun, results, committed) = tokio::join!(begin, writes, commit);
    let results = results.into_iter().collect::<Result<Vec<_>, _>>();
    begun?;
    let results = results?;
    committed?;
    Ok(results)
}

/// One call: each member's outcome, in member order (None: a known
/// segment the function passed over).
async fn run(client: &impl GenericClient, jobs: &[Job], call: &Call) -> Result<Vec<Option<Appended>>, DbError> {
    let segments = |members: &[usize]| -> Vec<MemorySegment> {
        members
            .iter()
            .map(|&j| {
                let job = &jobs[j];
                MemorySegment { queue: &job.queue, partition: &job.partition, hashes: &job.hashes, blob: &job.blob, known: job.known }
            })
            .collect()
    };
    match call {
        Call::Known(members) => append_known(client, &segments(members)).await,
        Call::Checked(members) => {
            if let [j] = members.as_slice() {
                let job = &jobs[*j];
                if keeps_no_window(job.window) {
                    let write = append_segment(client, &job.queue, &job.partition, &job.hashes, &job.blob).await?;
                    return Ok(vec![Some(Appended { write, answer: Answer::default(), at_us: None })]);
                }
            }
            Ok(append_with_memory(client, &segments(members)).await?.into_iter().map(Some).collect())
        }
    }
}
