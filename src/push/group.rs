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
//! A failed group is retried segment by segment, so one bad segment cannot
//! fail its neighbours; only when PostgreSQL cannot be reached at all does
//! every segment of the group get that error (each would meet it alone).

use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::{GenericClient, Pool};
use tokio::sync::oneshot;

use super::dedup::{Answer, Known};
use super::segment::{append_segment, append_with_memory, keeps_no_window, Appended, PushError, MemorySegment, PUSH_SQL, PUSH_WITH_MEMORY_SQL};
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
        // Partitions in (queue, partition) byte order, the function's lock
        // order: one call for the whole group, or, for a group of fewer
        // than MULTI_MIN segments of queues known to keep no window, a
        // single call each.
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.sort_by(|&a, &b| (&jobs[a].queue, &jobs[a].partition).cmp(&(&jobs[b].queue, &jobs[b].partition)));
        let calls: Vec<Vec<usize>> = if order.len() < MULTI_MIN && order.iter().all(|&j| keeps_no_window(jobs[j].window)) {
            order.into_iter().map(|j| vec![j]).collect()
        } else {
            vec![order]
        };
        let result = if calls.len() == 1 {
            call(&client, &jobs, &calls[0]).await.map(|r| vec![r])
        } else {
            write_in_transaction(&client, &jobs, &calls).await
        };
        stage("write", writing);
        match result {
            Ok(results) => {
                let mut replies: Vec<Option<Appended>> = jobs.iter().map(|_| None).collect();
                for (members, writes) in calls.iter().zip(results) {
                    for (&j, w) in members.iter().zip(writes) {
                        replies[j] = Some(w);
                    }
                }
                for (job, w) in jobs.into_iter().zip(replies) {
                    let _ = job.reply.send(w.ok_or_else(|| Arc::new(PushError::Lost)));
                }
            }
            Err(e) => {
                let e = PushError::Db(e);
                if jobs.len() == 1 || e.database_unreachable() {
                    return fail_all(jobs, Arc::new(e));
                }
                tracing::debug!(error = %e, segments = jobs.len(), "group write failed; writing its segments one by one");
                for job in jobs {
                    let r = call(&client, std::slice::from_ref(&job), &[0]).await;
                    let r = r
                        .map_err(|e| Arc::new(PushError::Db(e)))
                        .and_then(|mut w| w.pop().ok_or_else(|| Arc::new(PushError::Lost)));
                    let _ = job.reply.send(r);
                }
            }
        }
    }
}

/// Records the time since `since` as push stage `name`.
fn stage(name: &'static str, since: Instant) {
    metrics::histogram!(crate::metrics::PUSH_STAGE, "stage" => name).record(since.elapsed().as_secs_f64());
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
    calls: &[Vec<usize>],
) -> Result<Vec<Vec<Appended>>, DbError> {
    // Statements are prepared (cached) first, so that each call below sends
    // its query on first poll, in order, between BEGIN and COMMIT.
    for sql in [PUSH_SQL, PUSH_WITH_MEMORY_SQL] {
        client.prepare_cached(sql).await?;
    }
    let begin = client.batch_execute("BEGIN");
    let writes = futures_util::future::join_all(calls.iter().map(|members| call(client, jobs, members)));
    let commit = client.batch_execute("COMMIT");
    let (begun, results, committed) = tokio::join!(begin, writes, commit);
    let results = results.into_iter().collect::<Result<Vec<_>, _>>();
    begun?;
    let results = results?;
    committed?;
    Ok(results)
}

/// One call for `members` (indexes into `jobs`, in lock order, see
/// `write_group`): each member's outcome, in `members` order.
async fn call(client: &impl GenericClient, jobs: &[Job], members: &[usize]) -> Result<Vec<Appended>, DbError> {
    if let [j] = members {
        let job = &jobs[*j];
        if keeps_no_window(job.window) {
            let write = append_segment(client, &job.queue, &job.partition, &job.hashes, &job.blob).await?;
            return Ok(vec![Appended { write, answer: Answer::default(), at_us: None }]);
        }
    }
    let segments: Vec<MemorySegment> = members
        .iter()
        .map(|&j| {
            let job = &jobs[j];
            MemorySegment { queue: &job.queue, partition: &job.partition, hashes: &job.hashes, blob: &job.blob, known: job.known }
        })
        .collect();
    append_with_memory(client, &segments).await
}
