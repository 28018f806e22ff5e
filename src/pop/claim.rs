//! The claim's round trip: one call to a stored function per pop attempt,
//! and the assembly of its rows into claimed partitions and verdicts.
//! PostgreSQL returns whole segments and slicing bounds; decompressing and
//! slicing happen afterwards, in `render`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::hotlist::Verdict;
use super::params::{PopParams, Route};

/// A slice of one stored segment to deliver: frames [start_idx, start_idx + take).
#[derive(Debug, Clone)]
pub struct SegmentSlice {
    pub base_offset: i64,
    pub start_idx: usize,
    pub take: usize,
    /// Frames in the whole stored segment.
    pub msg_count: usize,
    pub created_at: DateTime<Utc>,
    /// The stored blob; empty when PostgreSQL was told the broker holds the
    /// segment decompressed (`decoded`).
    pub blob: Vec<u8>,
    /// The segment's frames from the broker's cache (`pop::frames`).
    pub decoded: Option<std::sync::Arc<super::frames::Decoded>>,
}

/// Everything one call took from one partition.
#[derive(Debug, Clone)]
pub struct ClaimedPartition {
    pub partition_id: i64,
    pub partition: String,
    pub queue: String,
    pub first: i64,
    pub last: i64,
    pub attempt: i32,
    /// The partition's last offset as the claim read it (`None`: a claim
    /// function that does not say): `last` reaching it means the claim
    /// took everything there was.
    pub tail: Option<i64>,
    pub segments: Vec<SegmentSlice>,
}

/// A partition a visibility option hid, and when its head becomes claimable
/// (PostgreSQL's clock), for the revisit wheel.
#[derive(Debug, Clone)]
pub struct Hidden {
    pub partition_id: i64,
    pub partition: String,
    pub queue: String,
    pub visible_at: DateTime<Utc>,
}

/// The outcome of one round trip.
#[derive(Debug, Default)]
pub struct ClaimResult {
    pub claimed: Vec<ClaimedPartition>,
    pub verdicts: HashMap<i64, Verdict>,
    pub hidden: Vec<Hidden>,
}

impl ClaimResult {
    /// Adds another round trip's outcome (the window claims go one partition at a time).
    pub fn absorb(&mut self, other: ClaimResult) {
        self.claimed.extend(other.claimed);
        self.verdicts.extend(other.verdicts);
        self.hidden.extend(other.hidden);
    }
}

/// A claim statement twice: as it is, and for a claim whose commit need not
/// wait for the WAL flush (`PopParams::async_commit`: an autoAck pop, when
/// the operator opted in). The second sets `synchronous_commit` for its own
/// implicit transaction, which its COMMIT reads; the uncorrelated subquery is
/// an init plan, run once, before the rows, in the same round trip
/// (docs/DECISIONS.md, "An autoAck pop waits for the disk unless the
/// operator says otherwise").
macro_rules! claim_sql {
    ($name:ident, $sql:literal) => {
        const $name: [&str; 2] =
            [$sql, concat!($sql, " WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL")];
    };
}

claim_sql!(LIST_SQL, "SELECT * FROM queen.pop_list_set_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)");
// The per-partition list, for a claim that can take only one partition (a
// batch of one, a partition cap of one, one candidate) or likely will (the
// ring's last claim filled its batch from one partition): pop_list_prefix_v1 would
// hand all of it to pop_list_v1 anyway, after a candidate read and a copy of
// every row (about 125 of its 290 µs at batch 1, docs/PERFORMANCE.md, stop 13),
// and pop_list_set_v1 would lock every candidate's cursor row to claim one.
// Both answer the same rows (tests/pop.rs compares them); only the cost differs.
// (pop_list_v2, 0049: pop_list_v1 told which segment of each candidate the
// broker holds decompressed, so that one is not shipped: `$10`. pop_list_v3,
// 0051: a plain first candidate claimed in one statement, the rest through
// pop_list_v2.)
claim_sql!(ONE_SQL, "SELECT * FROM queen.pop_list_v3($1, $10, $2, $3, $4, $5, $6, $7, $8, $9)");
claim_sql!(WILDCARD_SQL, "SELECT * FROM queen.pop_wildcard_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)");
claim_sql!(DISCOVER_SQL, "SELECT * FROM queen.pop_discover_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)");
claim_sql!(SPECIFIC_SQL, "SELECT * FROM queen.pop_specific_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)");
// One partition of a windowBuffer queue whose hold the broker timed itself:
// the claim with the SQL debounce skipped (`pop_claim_v1`, 0003_pop.sql), named as the
// list functions name their rows.
claim_sql!(WINDOW_SQL, "SELECT $1::bigint AS o_partition_id, $10::text AS o_partition, $11::text AS o_queue, c.*
    FROM queen.pop_claim_v1($1, $2, $3, $4, $5, $6, $7, $8, $9) c");
// Several pops' claims of one partition each in one statement and one
// transaction (`pop::share`, 0048_pops_share_a_claim.sql; v2: 0049; v3: 0050): every
// slot's first candidate in one set-based statement, then pop_list_v2 for
// the slots with budget left; every row tagged with its slot, each slot's
// rows those pop_list_v2 would answer it alone. Asynchronous only when every
// slot's pop may be (`ClaimSlot`).
claim_sql!(SHARED_SQL, "SELECT * FROM queen.pop_list_shared_v3($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)");
const RESEED_WINDOW_SQL: &str =
    "SELECT o_ring, o_edge, o_seen, o_pending, o_partition_id, o_partition FROM queen.hotlist_seed_window_v1($1, $2, $3, $4)";
const FIRST_CONTACT_SQL: &str = "SELECT o_partition_id, o_partition FROM queen.first_contact_v2($1, $2, $3, $4, $5)";
const SEED_CURSORS_SQL: &str = "SELECT o_partition_id, o_partition FROM queen.seed_cursors_v1($1, $2, $3, $4)";
const PENDING_SQL: &str =
    "SELECT queen.has_pending_v1(q.id, $2) FROM queen.queues q WHERE q.name = $1";

/// The SQL-path claim of a route (candidate selection inside PostgreSQL).
pub async fn claim_route(
    client: &deadpool_postgres::Client,
    route: &Route,
    p: &PopParams,
    worker: &str,
) -> Result<ClaimResult, tokio_postgres::Error> {
    let lease = p.lease_seconds;
    let mode = p.intent_mode;
    let from = p.intent_from;
    let rows = match route {
        Route::Wildcard { queue } => {
            let cap = p.scan_candidates();
            let args: [&(dyn ToSql + Sync); 10] =
                [queue, &p.group, &worker, &lease, &p.auto_ack, &p.batch, &p.partitions, &mode, &from, &cap];
            query(client, WILDCARD_SQL[p.async_commit as usize], &args).await?
        }
        Route::Specific { queue, partition } => {
            let args: [&(dyn ToSql + Sync); 9] =
                [queue, partition, &p.group, &worker, &lease, &p.auto_ack, &p.batch, &mode, &from];
            query(client, SPECIFIC_SQL[p.async_commit as usize], &args).await?
        }
        Route::Discovery { tenant, namespace, task } => {
            let cap = p.scan_candidates();
            let args: [&(dyn ToSql + Sync); 12] =
                [tenant, namespace, task, &p.group, &worker, &lease, &p.auto_ack, &p.batch, &p.partitions, &mode, &from, &cap];
            query(client, DISCOVER_SQL[p.async_commit as usize], &args).await?
        }
    };
    Ok(assemble(rows))
}

/// The hot-list claim: the broker chose the candidates. `deep`: the first
/// candidate is expected to fill the batch (`hotlist::Checkout::deep`).
/// `held`: segments of candidates the broker holds decompressed; a claim of
/// one partition does not ship them (`Held`).
pub async fn claim_candidates(
    client: &deadpool_postgres::Client,
    pids: &[i64],
    p: &PopParams,
    worker: &str,
    deep: bool,
    held: &Held,
) -> Result<ClaimResult, tokio_postgres::Error> {
    let cached = held.bases(pids);
    let args: [&(dyn ToSql + Sync); 10] = [
        &pids,
        &p.group,
        &worker,
        &p.lease_seconds,
        &p.auto_ack,
        &p.batch,
        &p.partitions,
        &p.intent_mode,
        &p.intent_from,
        &cached,
    ];
    let one = of_one_partition(deep, p, pids.len());
    let (sql, args) = if one { (ONE_SQL, &args[..]) } else { (LIST_SQL, &args[..9]) };
    let rows = crate::metrics::timed(crate::metrics::POP_STAGE, "claim", query(client, sql[p.async_commit as usize], args)).await?;
    let mut result = assemble(rows);
    held.fill(&mut result);
    Ok(result)
}

/// Whether a hot-list claim of `candidates` goes to the per-partition list
/// (`ONE_SQL`): it can take one partition only, or likely will (`deep`).
/// Only that list and the shared claim leave held segments out (`Held`).
pub fn of_one_partition(deep: bool, p: &PopParams, candidates: usize) -> bool {
    deep || p.batch == 1 || p.partitions == 1 || candidates == 1
}

/// Segments of a claim's candidates that the broker holds decompressed
/// (`pop::frames`), taken before the claim so that they are there when it
/// answers: the claim leaves their blobs out (`pop_list_v2`), and `fill`
/// hands the claim the broker's copy instead.
#[derive(Default)]
pub struct Held(Vec<(i64, i64, std::sync::Arc<super::frames::Decoded>)>);

impl Held {
    /// The newest held segment of each of `pids`, from `cache`.
    pub fn of(cache: &super::frames::FrameCache, pids: &[i64]) -> Held {
        Held(pids.iter().filter_map(|&pid| cache.newest(pid).map(|(base, d)| (pid, base, d))).collect())
    }

    /// For each of `pids`, the base offset of its held segment, if any.
    fn bases(&self, pids: &[i64]) -> Vec<Option<i64>> {
        pids.iter().map(|pid| self.0.iter().find(|(p, _, _)| p == pid).map(|(_, base, _)| *base)).collect()
    }

    /// Gives each segment the claim left out its held frames.
    fn fill(&self, result: &mut ClaimResult) {
        for c in &mut result.claimed {
            for seg in c.segments.iter_mut().filter(|s| s.blob.is_empty() && s.decoded.is_none()) {
                seg.decoded = self.0.iter().find(|(p, b, _)| *p == c.partition_id && *b == seg.base_offset).map(|(_, _, d)| d.clone());
            }
        }
    }
}

/// One pop's part of a shared claim (`pop::share`): the candidates the ring
/// checked out for it, its parameters and its lease id.
pub struct ClaimSlot<'a> {
    pub pids: &'a [i64],
    pub p: &'a PopParams,
    pub worker: &'a str,
    pub held: &'a Held,
}

/// The claims of several pops in one round trip and one transaction: each
/// slot claims from its own candidates as `claim_candidates` would for a
/// claim of one partition (`pop_list_v2`), and gets its own result, in
/// order. The commit skips the WAL flush only when every slot's pop allows
/// it (`PopParams::async_commit`): one pop that must wait makes all wait.
pub async fn claim_shared(client: &deadpool_postgres::Client, slots: &[ClaimSlot<'_>]) -> Result<Vec<ClaimResult>, tokio_postgres::Error> {
    let mut pids = Vec::new();
    let mut cached = Vec::new();
    let mut ends = Vec::with_capacity(slots.len());
    for s in slots {
        pids.extend_from_slice(s.pids);
        cached.extend(s.held.bases(s.pids));
        ends.push(i32::try_from(pids.len()).unwrap_or(i32::MAX));
    }
    let groups: Vec<&str> = slots.iter().map(|s| s.p.group.as_str()).collect();
    let workers: Vec<&str> = slots.iter().map(|s| s.worker).collect();
    let leases: Vec<Option<i32>> = slots.iter().map(|s| s.p.lease_seconds).collect();
    let auto_acks: Vec<bool> = slots.iter().map(|s| s.p.auto_ack).collect();
    let budgets: Vec<i32> = slots.iter().map(|s| s.p.batch).collect();
    let caps: Vec<i32> = slots.iter().map(|s| s.p.partitions).collect();
    let modes: Vec<Option<&str>> = slots.iter().map(|s| s.p.intent_mode).collect();
    let froms: Vec<Option<DateTime<Utc>>> = slots.iter().map(|s| s.p.intent_from).collect();
    let args: [&(dyn ToSql + Sync); 11] = [&ends, &pids, &cached, &groups, &workers, &leases, &auto_acks, &budgets, &caps, &modes, &froms];
    let mut per: Vec<Vec<Row>> = slots.iter().map(|_| Vec::new()).collect();
    let async_commit = slots.iter().all(|s| s.p.async_commit);
    for row in crate::metrics::timed(crate::metrics::POP_STAGE, "claim", query(client, SHARED_SQL[async_commit as usize], &args)).await? {
        let slot = usize::try_from(row.get::<_, i32>("o_slot")).unwrap_or(0);
        if let Some(rows) = slot.checked_sub(1).and_then(|i| per.get_mut(i)) {
            rows.push(row);
        }
    }
    Ok(per
        .into_iter()
        .zip(slots)
        .map(|(rows, s)| {
            let mut result = assemble(rows);
            s.held.fill(&mut result);
            result
        })
        .collect())
}

/// The hot-list claim of one partition of a windowBuffer queue, once the
/// broker's hold of it ended (`pop::wheel`): the SQL debounce is skipped.
pub async fn claim_window(
    client: &deadpool_postgres::Client,
    pid: i64,
    queue: &str,
    partition: &str,
    p: &PopParams,
    worker: &str,
    budget: i32,
) -> Result<ClaimResult, tokio_postgres::Error> {
    let skip_window_debounce = true;
    let args: [&(dyn ToSql + Sync); 11] = [
        &pid, &p.group, &worker, &p.lease_seconds, &p.auto_ack, &budget, &p.intent_mode, &p.intent_from, &skip_window_debounce,
        &partition, &queue,
    ];
    Ok(assemble(query(client, WINDOW_SQL[p.async_commit as usize], &args).await?))
}

/// A first contact of the pop's group with `queue` (creating the queue if
/// needed, as the SQL path does): registers the group and answers the
/// partitions with pending data (the ring's first seed). A new group reading
/// everything is covered on the first `seed_now` partitions only, cursors
/// and seed alike; the second value is then the partition name after which
/// the walk goes on (`pop::cursor_seed`), `None` when nothing remains.
pub async fn first_contact(
    client: &deadpool_postgres::Client,
    queue: &str,
    p: &PopParams,
    seed_now: i32,
) -> Result<(Vec<(i64, String)>, Option<String>), tokio_postgres::Error> {
    Ok(seed_rows(query(client, FIRST_CONTACT_SQL, &[&queue, &p.group, &p.intent_mode, &p.intent_from, &seed_now]).await?))
}

/// One chunk of a first contact's walk (`queen.seed_cursors_v1`): writes
/// `group`'s missing cursors on up to `chunk` partitions of `queue` past
/// `after`, and answers those holding messages and where the walk goes on
/// (`None`: the queue's end, or the group is gone).
pub async fn seed_cursors(
    client: &deadpool_postgres::Client,
    queue: &str,
    group: &str,
    after: &str,
    chunk: i32,
) -> Result<(Vec<(i64, String)>, Option<String>), tokio_postgres::Error> {
    Ok(seed_rows(query(client, SEED_CURSORS_SQL, &[&queue, &group, &after, &chunk]).await?))
}

/// The rows of a seed: partitions holding messages, and one row without an
/// id naming where the walk goes on.
fn seed_rows(rows: Vec<Row>) -> (Vec<(i64, String)>, Option<String>) {
    let (mut pending, mut rest) = (Vec::with_capacity(rows.len()), None);
    for r in &rows {
        match r.get::<_, Option<i64>>(0) {
            Some(pid) => pending.push((pid, r.get(1))),
            None => rest = Some(r.get(1)),
        }
    }
    (pending, rest)
}

/// What one ring's reseed found: the partitions of its window with pending
/// data, and where its next reseed starts (`""`: the queue's first
/// partition, the walk having reached the end).
#[derive(Debug, Default, PartialEq)]
pub struct ReseedWindow {
    pub pending: Vec<(i64, String)>,
    pub next_after: String,
}

/// Partitions with pending data for each (queue, group) of `rings`, reading
/// at most `window` partitions of its queue in name order past its `after`
/// (`queen.hotlist_seed_window_v1`): one round trip, one answer per ring, in
/// order.
pub async fn pending_partitions_window(
    client: &deadpool_postgres::Client,
    rings: &[(String, String)],
    after: &[String],
    window: i64,
) -> Result<Vec<ReseedWindow>, tokio_postgres::Error> {
    let queues: Vec<&str> = rings.iter().map(|(q, _)| q.as_str()).collect();
    let groups: Vec<&str> = rings.iter().map(|(_, g)| g.as_str()).collect();
    let limit = i32::try_from(window).unwrap_or(i32::MAX);
    let rows = query(client, RESEED_WINDOW_SQL, &[&queues, &groups, &after, &limit]).await?;
    let mut out: Vec<ReseedWindow> = rings.iter().map(|_| ReseedWindow::default()).collect();
    for r in &rows {
        let Some(ring) = (r.get::<_, i32>(0) as usize).checked_sub(1).and_then(|i| out.get_mut(i)) else { continue };
        let (edge, seen): (String, i32) = (r.get(1), r.get(2));
        if i64::from(seen) >= window {
            ring.next_after = edge;
        }
        if r.get::<_, bool>(3) {
            ring.pending.push((r.get(4), r.get(5)));
        }
    }
    Ok(out)
}

/// Messages `group` could claim from `queue` now (unleased partitions past
/// their cursor; a partition without a cursor counts its whole log), counted
/// over at most `cap` such partitions: enough to tell "fewer than a batch of
/// `cap`" without walking every partition of a large queue.
const PENDING_COUNT_SQL: &str = "SELECT COALESCE(sum(x.n), 0)::bigint FROM (
        SELECT p.last_offset - COALESCE(c.committed, -1) AS n
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.id
        LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = $2
        WHERE q.name = $1 AND p.last_offset > COALESCE(c.committed, -1)
          AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < clock_timestamp())
        LIMIT $3) x";

pub async fn pending_count(
    client: &deadpool_postgres::Client,
    queue: &str,
    group: &str,
    cap: i32,
) -> Result<u64, tokio_postgres::Error> {
    let rows = query(client, PENDING_COUNT_SQL, &[&queue, &group, &i64::from(cap.max(1))]).await?;
    Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
}

/// The cheap probe of the SQL path: `Some(false)` = definitively nothing to
/// deliver; `None` = the queue does not exist yet (the pop must provision it).
pub async fn has_pending(
    client: &deadpool_postgres::Client,
    queue: &str,
    group: &str,
) -> Result<Option<bool>, tokio_postgres::Error> {
    let rows = query(client, PENDING_SQL, &[&queue, &group]).await?;
    Ok(rows.first().map(|r| r.get(0)))
}

async fn query(
    client: &deadpool_postgres::Client,
    sql: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let stmt = client.prepare_cached(sql).await?;
    client.query(&stmt, args).await
}

fn assemble(rows: Vec<Row>) -> ClaimResult {
    let mut result = ClaimResult::default();
    let mut open: HashMap<i64, usize> = HashMap::new();
    for row in rows {
        let pid: i64 = row.get("o_partition_id");
        let kind: &str = row.get("o_kind");
        let verdict = match kind {
            "segment" => {
                let i = *open.entry(pid).or_insert_with(|| {
                    result.claimed.push(ClaimedPartition {
                        partition_id: pid,
                        partition: row.get("o_partition"),
                        queue: row.get("o_queue"),
                        first: 0,
                        last: -1,
                        attempt: 1,
                        tail: None,
                        segments: Vec::new(),
                    });
                    result.claimed.len() - 1
                });
                result.claimed[i].segments.push(SegmentSlice {
                    base_offset: row.get("o_base_offset"),
                    start_idx: row.get::<_, i32>("o_start_idx") as usize,
                    take: row.get::<_, i32>("o_take") as usize,
                    msg_count: row.get::<_, i32>("o_msg_count") as usize,
                    created_at: row.get("o_created_at"),
                    // NULL: a segment the broker holds (`Held`).
                    blob: row.get::<_, Option<Vec<u8>>>("o_blob").unwrap_or_default(),
                    decoded: None,
                });
                continue;
            }
            "claimed" => {
                if let Some(&i) = open.get(&pid) {
                    let c = &mut result.claimed[i];
                    c.first = row.get("o_first");
                    c.last = row.get("o_last");
                    c.attempt = row.get("o_attempt");
                    c.tail = row.get("o_base_offset");
                }
                Verdict::Claimed
            }
            "busy" => Verdict::Busy,
            "deferred" => {
                if let Some(visible_at) = row.get::<_, Option<DateTime<Utc>>>("o_created_at") {
                    result.hidden.push(Hidden {
                        partition_id: pid,
                        partition: row.get::<_, Option<String>>("o_partition").unwrap_or_default(),
                        queue: row.get::<_, Option<String>>("o_queue").unwrap_or_default(),
                        visible_at,
                    });
                }
                Verdict::Deferred
            }
            _ => Verdict::Empty,
        };
        result.verdicts.insert(pid, verdict);
    }
    result
}
