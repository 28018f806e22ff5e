//! `POST /api/v1/transaction` (API.md §2.4), JSON form: push and ack
//! operations applied in one PostgreSQL transaction, all or nothing.
//!
//! Pushes go through the same segment writer as a plain push (frames,
//! in-request dedup, gap-free offsets, envelopes for an encrypting queue) but on the bundle's connection instead
//! of the coalescer, so they commit with the acks. A cross-request duplicate
//! push or a refused ack rolls everything back; the answer is still 200, with
//! `success: false`, because the client reads the body either way.
//!
//! A bundle may carry a `kv` rider (issue 29 §4): KV operations that run
//! after the pushes and acks, in the same transaction (`kv::run`). A lost
//! `required` verdict (a lock's guard, a `putIfAbsent` that must win) rolls
//! the whole bundle back and answers `success: false, reason:
//! "kv_precondition"` with the failed operation's flat index.
//!
//! A `timers` rider schedules or cancels timers in the same transaction,
//! after the KV rider; its results close the flat `results` space.
//!
//! Every ack is fenced by its own lease ([`Fence::Always`], issue 25): a
//! transaction is how a consumer commits "ack my input, push my output"
//! exactly once, so an ack whose lease is not live rolls the bundle back even
//! when its message is already below the cursor (a zombie whose batch another
//! consumer finished must not commit its output a second time). Which lease
//! an ack without its own is fenced by is [`resolve_lease`]'s one rule.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{AckItem, AckService, AckStatus, Fence, Released};
use crate::db::DbError;
use crate::pop::QUEUE_MODE;
use crate::push::segment::SegmentWrite;
use crate::push::validate::{parse_item, parse_items, PushItem};
use crate::push::coalescer::InSegment;
use crate::push::{Outcome, PushPlan};
use crate::tenancy::{Owners, Tenant};

/// Why a bundle is refused before anything runs.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    #[error("{0}")]
    BadRequest(String),
    /// A rider of a switched-off family (403): the message names it.
    #[error("{0}")]
    RidersDisabled(&'static str),
    /// A push to a queue that encrypts, on a broker without the key (503).
    #[error(transparent)]
    NoKey(crate::crypto::NoKeyToSeal),
    /// A rider touching what it may not (403): the locks' namespace.
    #[error("{0}")]
    Forbidden(String),
    /// The tenant's quota refuses the bundle's pushes or kv rider (429 or
    /// 403, `tenancy::quota`); nothing ran.
    #[error("quota")]
    Quota(crate::tenancy::quota::Refused),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<tokio_postgres::Error> for TxnError {
    fn from(e: tokio_postgres::Error) -> Self {
        TxnError::Db(DbError::from(e))
    }
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow)]
    operations: Option<Vec<&'a RawValue>>,
    #[serde(rename = "requiredLeases", alias = "required_leases", default)]
    required_leases: Option<Vec<String>>,
    #[serde(borrow)]
    kv: Option<&'a RawValue>,
    #[serde(borrow)]
    timers: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawOp<'a> {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(borrow)]
    items: Option<&'a RawValue>,
}

enum Op<'a> {
    Push(Vec<PushItem<'a>>),
    Ack(AckItem, bool),
}

/// What a bundle's riders may use: the KV limits when KV is on, and
/// whether timers may be scheduled.
#[derive(Clone, Copy)]
pub struct Riders<'a> {
    pub kv: Option<&'a crate::kv::KvLimits>,
    pub timers: bool,
}

/// What a committed bundle wrote, for waking consumers afterwards.
pub struct Committed {
    pub answer: Value,
    pub pushed: Vec<(String, i64, String, u64)>,
    pub released: Vec<Released>,
}

fn parse_ops<'a>(ops: &[&'a RawValue]) -> Result<Vec<Op<'a>>, TxnError> {
    let bad = |i: usize, e: String| TxnError::BadRequest(format!("operations[{i}]: {e}"));
    ops.iter()
        .enumerate()
        .map(|(i, raw)| {
            let op: RawOp<'a> = serde_json::from_str(raw.get()).map_err(|_| bad(i, "must be an object".into()))?;
            match op.kind.as_deref() {
                Some("push") => match op.items {
                    Some(items) => parse_items(items).map(Op::Push).map_err(|e| bad(i, e)),
                    // A flat push operation is itself one item.
                    None => parse_item(0, raw).map(|it| Op::Push(vec![it])).map_err(|e| bad(i, e)),
                },
                Some("ack") => {
                    let v: Value = serde_json::from_str(raw.get()).map_err(|e| bad(i, e.to_string()))?;
                    // camelCase, or the older clients' snake_case (camelCase wins).
                    let get = |k: &str, snake: &str| v.get(k).filter(|x| !x.is_null()).or_else(|| v.get(snake));
                    let field = |k: &str, snake: &str| {
                        get(k, snake).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string)
                            .ok_or_else(|| bad(i, format!("{k}: required, a non-empty string")))
                    };
                    let lease = get("leaseId", "lease_id").and_then(Value::as_str).filter(|l| !l.is_empty()).map(str::to_string);
                    let own_lease = lease.is_some();
                    Ok(Op::Ack(
                        AckItem {
                            transaction_id: field("transactionId", "transaction_id")?,
                            partition_id: field("partitionId", "partition_id")?,
                            status: match v.get("status") {
                                // JSON booleans, as the client's True/False (and the plain ack route) read.
                                Some(Value::Bool(true)) => AckStatus::Completed,
                                Some(Value::Bool(false)) => AckStatus::Failed,
                                other => AckStatus::normalize(other.and_then(Value::as_str)),
                            },
                            error: v.get("error").and_then(Value::as_str).map(str::to_string),
                            lease_id: lease,
                            group: get("consumerGroup", "consumer_group").and_then(Value::as_str).filter(|g| !g.is_empty()).unwrap_or(QUEUE_MODE).to_string(),
                        },
                        own_lease,
                    ))
                }
                _ => Err(bad(i, "transaction supports only push and ack operations".into())),
            }
        })
        .collect()
}

/// One bundle as the route read it. `body` is the JSON bundle (or a `QTB1`
/// head); `binary_pushes` are a `QTB1` body's pushed items, which run after
/// the head's operations, as the answer order of API.md §3.3 has them.
/// `counts_only` answers `pushed`, `duplicate` and `acked` instead of
/// per-operation results; `producer` is the caller's JWT subject.
pub struct Bundle<'a, 'b> {
    pub body: &'a str,
    pub binary_pushes: &'a [PushItem<'b>],
    pub counts_only: bool,
    pub producer: Option<&'a str>,
    pub riders: Riders<'a>,
    /// Whose queues the bundle acts on (`tenancy`): its pushes go to the
    /// tenant's queues, and with tenancy on (`owners` given) an ack of
    /// another tenant's partition answers as one of an unknown partition.
    pub tenant: Tenant,
    pub owners: Option<&'a Owners>,
    /// The tenants' quotas, which the bundle's pushes and kv rider pass.
    pub quotas: Option<&'a crate::tenancy::quota::Quotas>,
}

/// Runs one bundle. `Ok` carries the 200 answer (successful or rolled back).
/// `coalescer` lends its settings (the zstd level, which queues seal); the
/// pushes themselves run on the bundle's connection, not through it.
pub async fn run(
    pool: &deadpool_postgres::Pool,
    acks: &AckService,
    coalescer: &crate::push::Coalescer,
    bundle: Bundle<'_, '_>,
) -> Result<Committed, TxnError> {
    let Bundle { body, binary_pushes, counts_only, producer, riders, tenant, owners, quotas } = bundle;
    let parsed: Body<'_> =
        serde_json::from_str(body).map_err(|e| TxnError::BadRequest(format!("bad body: {e}")))?;
    let ops = match parsed.operations {
        Some(ops) => ops,
        None if !binary_pushes.is_empty() => Vec::new(),
        None => return Err(TxnError::BadRequest("transaction requires an operations array".into())),
    };
    let rider = |r: Option<&RawValue>| r.is_some_and(|r| !matches!(r.get().trim(), "null" | "[]"));
    let timer_ops = match (rider(parsed.timers), riders.timers) {
        (false, _) => Vec::new(),
        (true, false) => return Err(TxnError::RidersDisabled("timers riders are switched off (/api/v1/system/kv-timers)")),
        (true, true) => {
            let v: Value = serde_json::from_str(parsed.timers.expect("a rider").get()).map_err(|e| TxnError::BadRequest(format!("timers: {e}")))?;
            let mut ops = crate::timers::parse(&v, "timers").map_err(TxnError::BadRequest)?;
            ops.iter_mut().for_each(|op| op.own(tenant));
            ops
        }
    };
    let kv_ops = match (rider(parsed.kv), riders.kv) {
        (false, _) => Vec::new(),
        (true, None) => return Err(TxnError::RidersDisabled("kv riders are not enabled on this broker (QUEEN_KV_ENABLED)")),
        (true, Some(limits)) => {
            let v: Value = serde_json::from_str(parsed.kv.expect("a rider").get()).map_err(|e| TxnError::BadRequest(format!("kv: {e}")))?;
            let ops = crate::kv::parse(&v, "kv", limits).map_err(|e| TxnError::BadRequest(e.to_string()))?;
            crate::kv::refuse_reserved(&ops, "kv").map_err(|e| TxnError::Forbidden(e.to_string()))?;
            let mut ops = ops;
            if !tenant.is_default() {
                ops.iter_mut().for_each(|op| op.own(tenant));
            }
            ops
        }
    };
    let mut ops = parse_ops(&ops)?;
    if !binary_pushes.is_empty() {
        ops.push(Op::Push(binary_pushes.to_vec()));
    }
    // The tenant's own queues and partitions (`tenancy`).
    let mut foreign = Vec::new();
    for op in ops.iter_mut() {
        if let Op::Push(items) = op {
            tenant.own(items);
        }
    }
    if let Some(quotas) = quotas {
        let pushes: Vec<PushItem<'_>> = ops.iter().filter_map(|o| if let Op::Push(items) = o { Some(items.iter().cloned()) } else { None }).flatten().collect();
        quotas.push_and_schedule(tenant, &pushes, &timer_ops).map_err(TxnError::Quota)?;
        let reads = kv_ops.iter().filter(|op| !op.is_write()).count() as u64;
        quotas.kv(tenant, reads, kv_ops.len() as u64 - reads).map_err(TxnError::Quota)?;
    }
    if let Some(owners) = owners {
        let ids: Vec<i64> = ops.iter().filter_map(|o| if let Op::Ack(a, _) = o { a.partition_id.parse().ok() } else { None }).collect();
        foreign = owners.foreign(pool, tenant, &ids).await?;
    }
    let mut required = parsed.required_leases.unwrap_or_default();
    required.retain(|l| !l.is_empty());
    required.sort_unstable();
    required.dedup();
    let any_lease = !required.is_empty() || ops.iter().any(|o| matches!(o, Op::Ack(_, true)));
    let transaction_id = Uuid::now_v7().to_string();
    let rolled_back = |error: String| Committed {
        answer: json!({"transactionId": transaction_id, "success": false, "error": error, "results": []}),
        pushed: vec![],
        released: vec![],
    };

    let mut client = pool.get().await.map_err(DbError::from)?;
    let tx = client.transaction().await?;
    let mut results = Vec::new();
    let mut pushed = Vec::new();
    let mut released = Vec::new();
    for (op_index, op) in ops.into_iter().enumerate() {
        match op {
            Op::Push(items) => {
                let written = match push_in(&tx, coalescer, &items, producer).await? {
                    Ok(w) => w,
                    Err(duplicate) => {
                        tx.rollback().await?;
                        return Ok(rolled_back(duplicate.to_string()));
                    }
                };
                pushed.extend(written.pushed);
                for r in written.results {
                    let mut r = r;
                    r["index"] = json!(results.len());
                    r["type"] = json!("push");
                    results.push(r);
                }
            }
            Op::Ack(mut item, own) => {
                // Rollback texts name the partition as given; another
                // tenant's is acked as no partition (`tenancy::NO_PARTITION`).
                let given = item.partition_id.clone();
                if item.partition_id.parse().is_ok_and(|id: i64| foreign.contains(&id)) {
                    item.partition_id = crate::tenancy::NO_PARTITION.to_string();
                }
                if !own {
                    match resolve_lease(&tx, &item, any_lease, &required).await? {
                        Resolved::Lease(lease) => item.lease_id = lease,
                        Resolved::Uncovered => {
                            tx.rollback().await?;
                            return Ok(rolled_back(format!(
                                "QTXN transaction rolled back: operations[{op_index}] ack of {:?} on partition {} refused: \
                                 invalid or expired lease (none of the {} requiredLeases holds this partition for group {})",
                                item.transaction_id,
                                given,
                                required.len(),
                                item.group
                            )));
                        }
                    }
                }
                let (outcomes, rel) = acks.ack_on(&tx, std::slice::from_ref(&item), Fence::Always).await?;
                let o = &outcomes[0];
                if !o.success {
                    tx.rollback().await?;
                    let lease = item.lease_id.as_deref().map_or("no lease".to_string(), |l| format!("lease {l}"));
                    return Ok(rolled_back(format!(
                        "QTXN transaction rolled back: operations[{op_index}] ack of {:?} on partition {} ({lease}) refused: {}",
                        item.transaction_id,
                        given,
                        o.error.as_deref().unwrap_or("refused")
                    )));
                }
                released.extend(rel);
                results.push(json!({"index": results.len(), "type": "ack", "success": true,
                                    "transactionId": item.transaction_id, "error": null, "dlq": o.dlq}));
            }
        }
    }
    if let Some(limits) = riders.kv.filter(|_| !kv_ops.is_empty()) {
        let outcome = crate::kv::run(&tx, &kv_ops, limits).await?;
        if let Some(i) = outcome.failed {
            tx.rollback().await?;
            let lost = &outcome.results[i];
            let mut answer = rolled_back(format!("kv precondition failed: kv[{i}] on key {} ({})", lost["key"], lost["reason"].as_str().unwrap_or("lost")))
                .answer;
            answer["reason"] = json!("kv_precondition");
            answer["failedIndex"] = json!(results.len() + i);
            answer["kvReason"] = lost["reason"].clone();
            answer["version"] = lost["version"].clone();
            answer["value"] = lost["value"].clone();
            return Ok(Committed { answer, pushed: vec![], released: vec![] });
        }
        for r in outcome.results {
            let mut r = r;
            r["index"] = json!(results.len());
            r["type"] = json!("kv");
            results.push(r);
        }
    }
    if !timer_ops.is_empty() {
        let fired = crate::timers::run(&tx, &timer_ops, producer, coalescer.encryption()).await.map_err(|e| match e {
            crate::timers::TimerError::Db(db) => TxnError::Db(db),
            crate::timers::TimerError::NoKey(k) => TxnError::NoKey(k),
        })?;
        for mut r in fired {
            r["index"] = json!(results.len());
            r["type"] = json!("timer");
            results.push(r);
        }
    }
    tx.commit().await?;
    let answer = if counts_only {
        let count = |kind: &str, dup: bool| {
            results.iter().filter(|r| r["type"] == kind && (r.get("duplicate").is_some() == dup || kind == "ack")).count()
        };
        json!({"transactionId": transaction_id, "success": true, "pushed": count("push", false),
               "duplicate": count("push", true), "acked": count("ack", false), "results": []})
    } else {
        json!({"transactionId": transaction_id, "success": true, "results": results})
    };
    Ok(Committed {
        answer,
        pushed,
        released,
    })
}

/// What [`push_in`] wrote: one result per item (`{success, transactionId,
/// messageId, queueName, duplicate?}`), and the partitions to wake.
pub struct Written {
    pub results: Vec<Value>,
    pub pushed: Vec<(String, i64, String, u64)>,
    /// Each item's outcome, in item order.
    pub outcomes: Vec<Outcome>,
}

/// A push of [`push_in`] whose transactionId its partition already holds:
/// nothing of the call was written. Displays as the refusal the
/// transaction and the stream cycle answer.
#[derive(Debug, Clone)]
pub struct AlreadyThere {
    pub transaction_id: String,
    pub queue: String,
    pub partition: String,
    pub partition_id: i64,
    /// The message that holds the transactionId.
    pub original: Uuid,
}

impl std::fmt::Display for AlreadyThere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QDUP duplicate push: transactionId {:?} is already in {}/{}", self.transaction_id, self.queue, self.partition)
    }
}

/// Pushes `items` on `tx` through the segment writer, as part of the
/// caller's transaction: the transaction bundles' and the streams cycle's
/// one push path. In-request duplicates are first-wins; a transactionId
/// already in its partition is `Err` with the message (the caller rolls
/// back).
pub async fn push_in(
    tx: &impl deadpool_postgres::GenericClient,
    coalescer: &crate::push::Coalescer,
    items: &[PushItem<'_>],
    producer: Option<&str>,
) -> Result<Result<Written, AlreadyThere>, TxnError> {
    push_in_at(tx, coalescer, items, producer, &[]).await
}

/// [`push_in`], told where partitions end: `tails` holds ((queue,
/// partition), (partition id, last offset)) as the caller's transaction
/// read them. A partition's segments whose ids the broker mints all skip
/// the dedup check from there (`InSegment::tail`); later segments of the
/// call to the same partition from the end of the one before.
pub async fn push_in_at(
    tx: &impl deadpool_postgres::GenericClient,
    coalescer: &crate::push::Coalescer,
    items: &[PushItem<'_>],
    producer: Option<&str>,
    tails: &[((&str, &str), (i64, i64))],
) -> Result<Result<Written, AlreadyThere>, TxnError> {
    let hasher = coalescer.hasher_in(tx).await?;
    let plan = PushPlan::new(items, producer, coalescer.encryption(), hasher).map_err(TxnError::NoKey)?;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; items.len()];
    let rounds = chunks(&plan, items, coalescer.config())?;
    let mut written: Vec<(i64, u64)> = vec![(0, 0); plan.groups.len()];
    // Each group's tail where its ids are all minted here and `tails` is
    // asked to skip the check (a new partition's from its first segment).
    let minted: Vec<bool> = plan
        .groups
        .iter()
        .map(|g| !tails.is_empty() && g.leaders.iter().all(|&i| items[i].transaction_id.is_none() && items[i].message_id.is_none()))
        .collect();
    let mut tail: Vec<Option<(i64, i64)>> = plan
        .groups
        .iter()
        .zip(&minted)
        .map(|(g, &minted)| tails.iter().find(|((q, p), _)| *q == g.queue && *p == g.partition).map(|t| t.1).filter(|_| minted))
        .collect();
    for round in &rounds {
        let segments: Vec<InSegment> = round
            .iter()
            .map(|c| {
                let g = &plan.groups[c.group];
                InSegment { queue: &g.queue, partition: &g.partition, hashes: &c.hashes, frames: &c.frames, tail: tail[c.group] }
            })
            .collect();
        for (c, write) in round.iter().zip(coalescer.write_many_in(tx, &segments).await?) {
            let g = &plan.groups[c.group];
            let chunk = &g.leaders[c.leaders.clone()];
            match write {
                SegmentWrite::Written { partition_id, base_offset, .. } => {
                    for (n, &idx) in chunk.iter().enumerate() {
                        let message_id = plan.message_ids[idx];
                        outcomes[idx] = Some(Outcome::Queued { message_id, partition_id, offset: base_offset + n as i64 });
                    }
                    written[c.group] = (partition_id, written[c.group].1 + chunk.len() as u64);
                    if minted[c.group] {
                        tail[c.group] = Some((partition_id, base_offset + chunk.len() as i64 - 1));
                    }
                }
                SegmentWrite::Duplicates { dups, partition_id, .. } => {
                    return Ok(Err(AlreadyThere {
                        transaction_id: plan.txns[chunk[dups[0].0]].to_string(),
                        queue: g.queue.clone(),
                        partition: g.partition.clone(),
                        partition_id,
                        original: dups[0].1,
                    }));
                }
            }
        }
    }
    let pushed = plan.groups.iter().zip(written).map(|(g, (pid, n))| (g.queue.clone(), pid, g.partition.clone(), n)).collect();
    plan.settle_followers(&mut outcomes);
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(|o| o.expect("every item has an outcome")).collect();
    let results = outcomes
        .iter()
        .enumerate()
        .map(|(idx, o)| {
            let mut r = json!({"success": true, "transactionId": plan.txns[idx], "messageId": o.message_id().to_string(),
                               "queueName": crate::tenancy::shown(&items[idx].queue)});
            if matches!(o, Outcome::Duplicate { .. }) {
                r["duplicate"] = json!(true);
            }
            r
        })
        .collect();
    Ok(Ok(Written { results, pushed, outcomes }))
}

/// A partition's items cut into segments of at most the coalescer's bounds,
/// as every other writer keeps them (a reader slices one segment at a
/// time). Round k holds the k-th segment of every partition: one call
/// writes a round (a call takes one segment per partition).
fn chunks(plan: &PushPlan<'_>, items: &[PushItem<'_>], cfg: &crate::config::CoalesceConfig) -> Result<Vec<Vec<Chunk>>, TxnError> {
    let mut rounds: Vec<Vec<Chunk>> = Vec::new();
    for (g, group) in plan.groups.iter().enumerate() {
        let (mut at, mut k) = (0, 0);
        while at < group.leaders.len() {
            let mut frames = Vec::new();
            let mut end = at;
            while end < group.leaders.len() && (end == at || (end - at < cfg.max_frames && frames.len() < cfg.max_bytes)) {
                plan.frame(items, group.leaders[end]).encode_into(&mut frames).map_err(|e| TxnError::BadRequest(e.to_string()))?;
                end += 1;
            }
            let hashes = group.leaders[at..end].iter().map(|&i| plan.hashes[i]).collect();
            if rounds.len() == k {
                rounds.push(Vec::new());
            }
            rounds[k].push(Chunk { group: g, leaders: at..end, frames, hashes });
            (at, k) = (end, k + 1);
        }
    }
    Ok(rounds)
}

/// A segment ready to be written later: a Kafka transaction stages its
/// records as these until it commits (`kafka::transactions`).
pub struct Staged {
    pub queue: String,
    pub partition: String,
    pub hashes: Vec<i64>,
    /// The compressed frames.
    pub blob: Vec<u8>,
}

/// `items` as the segments [`push_in`] would write, in the order a
/// partition's must be written; nothing is written.
pub async fn stage(
    client: &impl deadpool_postgres::GenericClient,
    coalescer: &crate::push::Coalescer,
    items: &[PushItem<'_>],
    producer: Option<&str>,
) -> Result<Vec<Staged>, TxnError> {
    let hasher = coalescer.hasher_in(client).await?;
    let plan = PushPlan::new(items, producer, coalescer.encryption(), hasher).map_err(TxnError::NoKey)?;
    let level = coalescer.config().zstd_level;
    Ok(chunks(&plan, items, coalescer.config())?
        .into_iter()
        .flatten()
        .map(|c| {
            let g = &plan.groups[c.group];
            Staged { queue: g.queue.clone(), partition: g.partition.clone(), blob: crate::log::compress_frames(&c.frames, level), hashes: c.hashes }
        })
        .collect())
}

/// One segment's worth of a partition's items in [`push_in`].
struct Chunk {
    /// Index into the plan's groups.
    group: usize,
    /// Its items: a range of the group's leaders.
    leaders: std::ops::Range<usize>,
    frames: Vec<u8>,
    hashes: Vec<i64>,
}

/// Which lease fences an ack sent without its own.
enum Resolved {
    /// This lease (`None`: the bundle names no lease, the ack is lease-less).
    Lease(Option<String>),
    /// `requiredLeases` names several leases and none of them holds the
    /// ack's partition: the ack is refused, as a lease that is not live.
    Uncovered,
}

/// An ack without its own lease (API.md §2.4, issue 44 §1): the partition's
/// current holder when the bundle names any lease (and, with
/// `requiredLeases`, when it is one of them); else the single required
/// lease, which the ack then proves or fails; else lease-less. A lease holds
/// exactly one (partition, group), so with several required leases the ack's
/// partition names its own among them, and one that none of them holds is
/// [`Resolved::Uncovered`]. Two leases holding one partition cannot happen:
/// the cursor row has one `worker_id`. The lookup takes no lock: the ack
/// itself checks the lease under the cursor row's lock.
async fn resolve_lease(
    tx: &deadpool_postgres::Transaction<'_>,
    item: &AckItem,
    any_lease: bool,
    required: &[String],
) -> Result<Resolved, TxnError> {
    if any_lease {
        if let Ok(pid) = item.partition_id.parse::<i64>() {
            let holder = tx
                .query_opt(
                    "SELECT worker_id FROM queen.consumers WHERE partition_id = $1 AND consumer_group = $2",
                    &[&pid, &item.group],
                )
                .await?
                .and_then(|r| r.get::<_, Option<String>>(0));
            if let Some(h) = holder.filter(|h| required.is_empty() || required.contains(h)) {
                return Ok(Resolved::Lease(Some(h)));
            }
        }
    }
    Ok(match required {
        [] => Resolved::Lease(None),
        [only] => Resolved::Lease(Some(only.clone())),
        _ => Resolved::Uncovered,
    })
}
