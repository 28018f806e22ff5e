//! One message by its address (partitionId, transactionId), the message
//! listing, and the dead-letter repairs (API.md §2.8).
//!
//! A live message is immutable: it is found through the transaction index (or,
//! on a queue without a dedup window, which keeps no index, among the
//! partition's newest segments) and decoded from its segment. Its status is
//! derived, never stored: dead_letter when a dead-letter row exists, else from
//! the partition's cursors and leases (completed when every group committed
//! past it, processing while a live lease covers it, pending otherwise).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Pool};
use serde_json::{json, Value};
use uuid::Uuid;

use super::raw_json;
use crate::json::iso_ms;
use crate::crypto::KeyRing;
use crate::db::DbError;
use crate::log::{decompress_frames, FrameReader, SEGMENT_LIMIT};
use crate::log::legacy_index_hash;
use crate::push::{Coalescer, PushItem};
use crate::tenancy::Tenant;

/// Most messages one listing call decodes, whatever the filters.
const SCAN_CAP: usize = 10_000;
/// How many of a partition's newest segments a lookup searches when the
/// index has no entry (a queue without a dedup window keeps none).
const RECENT_SEGMENTS: i64 = 64;

/// One cursor of the message's partition.
struct Cursor {
    group: String,
    committed: i64,
    lease_live: bool,
    batch_end: Option<i64>,
    lease_expires_at: Option<DateTime<Utc>>,
}

async fn cursors(client: &impl GenericClient, pid: i64) -> Result<Vec<Cursor>, DbError> {
    let rows = client
        .query(
            "SELECT consumer_group, committed, lease_expires_at > now() AND worker_id IS NOT NULL, batch_end, lease_expires_at
             FROM queen.consumers WHERE partition_id = $1 ORDER BY consumer_group",
            &[&pid],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Cursor {
            group: r.get(0),
            committed: r.get(1),
            lease_live: r.get::<_, Option<bool>>(2).unwrap_or(false),
            batch_end: r.get(3),
            lease_expires_at: r.get(4),
        })
        .collect())
}

fn group_status(c: &Cursor, offset: i64) -> &'static str {
    if c.committed >= offset {
        "completed"
    } else if c.lease_live && c.batch_end.is_some_and(|e| offset <= e) {
        "processing"
    } else {
        "pending"
    }
}

/// The status of the message at `offset` across every group.
fn status(cursors: &[Cursor], offset: i64) -> &'static str {
    let each: Vec<&str> = cursors.iter().map(|c| group_status(c, offset)).collect();
    if each.is_empty() || each.contains(&"pending") {
        "pending"
    } else if each.contains(&"processing") {
        "processing"
    } else {
        "completed"
    }
}

/// A decoded message and where it lives.
struct Found {
    offset: i64,
    message_id: Uuid,
    trace_id: Option<Uuid>,
    producer_sub: Option<String>,
    payload: super::ShownPayload,
    encrypted: bool,
    created_at: DateTime<Utc>,
}

async fn find(client: &impl GenericClient, ring: Option<&KeyRing>, pid: i64, txn: &str) -> Result<Option<Found>, DbError> {
    let indexed = client
        .query_opt("SELECT msg_offset FROM queen.txn_index WHERE partition_id = $1 AND txn_hash = $2", &[&pid, &legacy_index_hash(txn)])
        .await?
        .map(|row| row.get::<_, i64>(0));
    let segments = match indexed {
        Some(offset) => {
            client
                .query(
                    "SELECT base_offset, created_at, blob FROM queen.segments
                     WHERE partition_id = $1 AND base_offset <= $2 ORDER BY base_offset DESC LIMIT 1",
                    &[&pid, &offset],
                )
                .await?
        }
        None => {
            client
                .query(
                    "SELECT base_offset, created_at, blob FROM queen.segments
                     WHERE partition_id = $1 ORDER BY base_offset DESC LIMIT $2",
                    &[&pid, &RECENT_SEGMENTS],
                )
                .await?
        }
    };
    // Newest first; inside a segment the last frame with the id wins (a
    // queue without window may hold an id twice). Comparing the id itself
    // keeps a 64-bit hash collision from showing another message.
    for seg in &segments {
        let base: i64 = seg.get(0);
        let Ok(frames) = decompress_frames(seg.get::<_, &[u8]>(2), SEGMENT_LIMIT) else { continue };
        let hit = FrameReader::new(&frames)
            .map_while(Result::ok)
            .enumerate()
            .filter(|(k, f)| f.transaction_id == txn && indexed.is_none_or(|o| o == base + *k as i64))
            .last();
        if let Some((k, f)) = hit {
            return Ok(Some(Found {
                offset: base + k as i64,
                message_id: f.message_id,
                trace_id: f.trace_id,
                producer_sub: f.producer_sub.map(str::to_string),
                payload: super::ShownPayload::of_frame(ring, &f),
                encrypted: f.encrypted,
                created_at: seg.get(1),
            }));
        }
    }
    Ok(None)
}

/// `GET /api/v1/messages/{partitionId}/{transactionId}` in `tenant`'s
/// queues; `None` = 404 (another tenant's partition too).
pub async fn detail(pool: &Pool, ring: Option<&KeyRing>, tenant: Tenant, pid: i64, txn: &str) -> Result<Option<Value>, DbError> {
    let client = pool.get().await?;
    let Some(q) = client
        .query_opt(
            "SELECT p.name, q.name, q.namespace, q.task, q.lease_time, q.retry_limit, q.dead_letter_queue,
                    q.delayed_processing, q.window_buffer, q.dedup_window_seconds
             FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE p.id = $1 AND q.tenant_id = $2",
            &[&pid, &tenant.0],
        )
        .await?
    else {
        return Ok(None);
    };
    let dead = client
        .query_opt(
            "SELECT error_message, retry_count, message_id, trace_id, producer_sub, payload::text, created_at, msg_offset, sealed
             FROM queen.dead_letters WHERE partition_id = $1 AND transaction_id = $2 ORDER BY id DESC LIMIT 1",
            &[&pid, &txn],
        )
        .await?;
    let found = find(&client, ring, pid, txn).await?;
    let cs = cursors(&client, pid).await?;
    let (found, status) = match (found, &dead) {
        (Some(f), Some(_)) => (f, "dead_letter"),
        (Some(f), None) => {
            let s = status(&cs, f.offset);
            (f, s)
        }
        // The segment is gone (retention) but the dead-letter snapshot remains.
        (None, Some(d)) => (
            Found {
                offset: d.get(7),
                message_id: d.get(2),
                trace_id: d.get(3),
                producer_sub: d.get(4),
                payload: super::ShownPayload::of_snapshot(ring, d.get(5), d.get(8), &d.get(2)),
                encrypted: d.get::<_, Option<&[u8]>>(8).is_some(),
                created_at: d.get(6),
            },
            "dead_letter",
        ),
        (None, None) => return Ok(None),
    };
    let groups: Vec<Value> = cs
        .iter()
        .map(|c| json!({"name": c.group, "status": group_status(c, found.offset), "committedOffset": c.committed}))
        .collect();
    let lease_expires = cs
        .iter()
        .filter(|c| group_status(c, found.offset) == "processing")
        .filter_map(|c| c.lease_expires_at)
        .min()
        .map(iso_ms);
    let bus_groups = cs.iter().filter(|c| c.group != crate::pop::QUEUE_MODE).count();
    let has_queue_mode = cs.iter().any(|c| c.group == crate::pop::QUEUE_MODE);
    let data = raw_json(found.payload.json.clone());
    let mut answer = json!({
        "id": found.message_id.to_string(),
        "transactionId": txn,
        "data": data,
        "payload": data,
        "traceId": found.trace_id.map(|t| t.to_string()),
        "producerSub": found.producer_sub,
        "createdAt": iso_ms(found.created_at),
        "partitionId": pid.to_string(),
        "partition": q.get::<_, String>(0),
        "isEncrypted": found.encrypted,
        "queue": crate::tenancy::shown(q.get::<_, &str>(1)),
        "queuePath": format!("{}/{}", crate::tenancy::shown(q.get::<_, &str>(1)), q.get::<_, String>(0)),
        "namespace": q.get::<_, String>(2),
        "task": q.get::<_, String>(3),
        "status": status,
        "errorMessage": dead.as_ref().and_then(|d| d.get::<_, Option<String>>(0)),
        "retryCount": dead.as_ref().map(|d| d.get::<_, i32>(1)).unwrap_or(0),
        "leaseExpiresAt": lease_expires,
        "queueConfig": {"leaseTime": q.get::<_, i32>(4), "retryLimit": q.get::<_, i32>(5),
                        "deadLetterQueue": q.get::<_, bool>(6), "delayedProcessing": q.get::<_, i32>(7),
                        "windowBuffer": q.get::<_, i32>(8), "dedupWindowSeconds": q.get::<_, i32>(9)},
        "mode": {"hasQueueMode": has_queue_mode, "busGroupsCount": bus_groups,
                 "type": match (has_queue_mode, bus_groups) { (true, 0) => "queue", (false, n) if n > 0 => "bus", (true, _) => "hybrid", _ => "none" }},
        "consumerGroups": groups,
    });
    found.payload.note(&mut answer);
    Ok(Some(answer))
}

/// `DELETE /api/v1/messages/{partitionId}/{transactionId}`: removes the
/// dead-letter rows of that address in `tenant`'s queues; false when there
/// are none.
pub async fn delete_dead_letter(pool: &Pool, tenant: Tenant, pid: i64, txn: &str) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let n = client
        .execute(
            "DELETE FROM queen.dead_letters d USING queen.queues q
             WHERE d.partition_id = $1 AND d.transaction_id = $2 AND q.id = d.queue_id AND q.tenant_id = $3",
            &[&pid, &txn, &tenant.0],
        )
        .await?;
    Ok(n > 0)
}

/// The outcome of a dead-letter replay, for the HTTP answer and for waking
/// consumers of the partition.
pub struct Replayed {
    pub answer: Value,
    pub queue: String,
    pub partition: String,
    pub partition_id: i64,
    pub queued: bool,
}

/// Which dead letter to replay: the newest of a message's address
/// (`POST /api/v1/messages/{partitionId}/{transactionId}/retry`), or one row
/// by its id (`POST /api/v1/dlq/{id}/replay`).
pub enum DeadLetter<'a> {
    Address { partition_id: i64, transaction_id: &'a str },
    Id(i64),
}

/// Where a replay goes instead of the dead letter's own queue and partition
/// (`POST /api/v1/dlq/{id}/replay` with `{queue?, partition?}`); either one
/// absent keeps the original's.
#[derive(Debug, Default, Clone)]
pub struct ReplayTarget {
    pub queue: Option<String>,
    pub partition: Option<String>,
}

/// Pushes a dead letter back, into its own partition or into `target`,
/// under the deterministic transactionId `dlq:<row id>` (so a repeated
/// replay is a duplicate, not a second copy), then removes the row. An
/// encrypted snapshot is opened here and sealed again by the push (under
/// the current key, bound to the replay's new message id). `None` = no such
/// row in `tenant`'s queues. `target.queue` is a stored name.
pub async fn replay_dead_letter(
    pool: &Pool,
    coalescer: &Coalescer,
    tenant: Tenant,
    which: DeadLetter<'_>,
    target: &ReplayTarget,
) -> Result<Option<Replayed>, DbError> {
    let ring = coalescer.encryption().ring();
    const COLUMNS: &str = "SELECT d.id, q.name, p.name, d.consumer_group, d.payload::text, d.trace_id, d.producer_sub, d.sealed,
                                  d.message_id, d.transaction_id
                           FROM queen.dead_letters d JOIN queen.queues q ON q.id = d.queue_id
                           JOIN queen.partitions p ON p.id = d.partition_id";
    // One transaction: the dead letter is locked, pushed back through the
    // transaction push path and removed together, so a crash or a
    // concurrent replay can neither lose it nor replay it twice.
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let row = match which {
        DeadLetter::Address { partition_id, transaction_id } => {
            tx.query_opt(
                &format!("{COLUMNS} WHERE d.partition_id = $1 AND d.transaction_id = $2 AND q.tenant_id = $3 ORDER BY d.id DESC LIMIT 1 FOR UPDATE OF d"),
                &[&partition_id, &transaction_id, &tenant.0],
            )
            .await?
        }
        DeadLetter::Id(id) => tx.query_opt(&format!("{COLUMNS} WHERE d.id = $1 AND q.tenant_id = $2 FOR UPDATE OF d"), &[&id, &tenant.0]).await?,
    };
    let Some(row) = row else { return Ok(None) };
    let dlq_id: i64 = row.get(0);
    let (own_queue, own_partition, group): (String, String, String) = (row.get(1), row.get(2), row.get(3));
    let queue = target.queue.clone().unwrap_or(own_queue);
    let partition = target.partition.clone().unwrap_or(own_partition);
    let original_txn: String = row.get(9);
    let shown = super::ShownPayload::of_snapshot(ring, row.get(4), row.get(7), &row.get(8));
    if let Some(e) = shown.decrypt_error {
        return Err(DbError::Unexpected(format!("replay of dead letter {dlq_id}: {e}")));
    }
    let payload: String = shown.json.unwrap_or_else(|| "null".into());
    let replay_txn = format!("dlq:{dlq_id}");
    let item = PushItem {
        queue: queue.as_str().into(),
        partition: partition.as_str().into(),
        transaction_id: Some(replay_txn.as_str().into()),
        trace_id: row.get(5),
        payload: &payload,
        message_id: None,
    };
    // The replay keeps the original producer, not the operator who asked for it.
    let producer: Option<String> = row.get(6);
    let written = crate::ack::transaction::push_in(&tx, coalescer, std::slice::from_ref(&item), producer.as_deref()).await.map_err(|e| match e {
        crate::ack::transaction::TxnError::Db(db) => db,
        other => DbError::Unexpected(format!("replay push failed: {other}")),
    })?;
    // Already there: an earlier replay's push (before replays were one
    // transaction) whose dead letter stayed. Removed now, answered duplicate.
    let (status, message_id, partition_id, offset) = match &written {
        Ok(w) => {
            let (_, pid, _, _) = w.pushed[0];
            let id = w.results[0]["messageId"].as_str().and_then(|s| uuid::Uuid::parse_str(s).ok()).unwrap_or_default();
            let offset: i64 = tx
                .query_one("SELECT last_offset FROM queen.partitions WHERE id = $1", &[&pid])
                .await?
                .get(0);
            ("queued", id, pid, Some(offset))
        }
        Err(there) => ("duplicate", there.original, there.partition_id, None),
    };
    let removed = tx.execute("DELETE FROM queen.dead_letters WHERE id = $1", &[&dlq_id]).await? > 0;
    tx.commit().await?;
    let answer = json!({
        "success": true,
        "result": if status == "queued" { "moved" } else { "duplicate" },
        "queue": crate::tenancy::shown(&queue), "partition": partition, "consumerGroup": group,
        "dlqId": dlq_id.to_string(), "originalTransactionId": original_txn,
        "replayedAs": {"index": 0, "message_id": message_id.to_string(), "transaction_id": replay_txn,
                       "queueName": crate::tenancy::shown(&queue), "status": status, "offset": offset},
        "dlqRowRemoved": removed,
    });
    Ok(Some(Replayed { answer, queue, partition, partition_id, queued: status == "queued" }))
}

/// The listing filters of `GET /api/v1/messages`.
#[derive(Debug, Clone, Default)]
pub struct MessageFilter {
    /// Whose queues are listed (`tenancy`); `queue` is a stored name.
    pub tenant: Tenant,
    pub queue: Option<String>,
    pub partition: Option<String>,
    pub namespace: Option<String>,
    pub task: Option<String>,
    pub status: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub limit: usize,
    pub offset: usize,
}

const LIST_WHERE: &str = "FROM queen.segments s
    JOIN queen.partitions p ON p.id = s.partition_id
    JOIN queen.queues q ON q.id = p.queue_id
    WHERE ($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR p.name = $2)
      AND ($3::text IS NULL OR q.namespace = $3) AND ($4::text IS NULL OR q.task = $4)
      AND ($5::timestamptz IS NULL OR s.created_at >= $5) AND ($6::timestamptz IS NULL OR s.created_at <= $6)
      AND q.tenant_id = $7";

/// `GET /api/v1/messages`: newest first. `total` counts the stored messages
/// matching every filter but `status`, which is derived per message; at most
/// 10,000 messages are decoded per call.
pub async fn list(pool: &Pool, ring: Option<&KeyRing>, f: &MessageFilter) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let args: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [&f.queue, &f.partition, &f.namespace, &f.task, &f.from, &f.to, &f.tenant.0];
    let total: i64 = client
        .query_one(&format!("SELECT COALESCE(sum(s.msg_count), 0)::bigint {LIST_WHERE}"), &args)
        .await?
        .get(0);
    let mut out = Vec::new();
    let mut skipped = 0;
    let mut examined = 0;
    let mut cursor_cache: HashMap<i64, Vec<Cursor>> = HashMap::new();
    let mut page = 0i64;
    'pages: loop {
        let rows = client
            .query(
                &format!(
                    "SELECT s.partition_id, p.name, q.name, s.base_offset, s.created_at, s.blob {LIST_WHERE}
                     ORDER BY s.created_at DESC, s.partition_id, s.base_offset DESC LIMIT 50 OFFSET {}",
                    page * 50
                ),
                &args,
            )
            .await?;
        if rows.is_empty() {
            break;
        }
        page += 1;
        for r in &rows {
            let pid: i64 = r.get(0);
            let base: i64 = r.get(3);
            let created: DateTime<Utc> = r.get(4);
            let blob: &[u8] = r.get(5);
            let Ok(frames) = decompress_frames(blob, SEGMENT_LIMIT) else { continue };
            let decoded: Vec<_> = FrameReader::new(&frames).filter_map(Result::ok).collect();
            if let std::collections::hash_map::Entry::Vacant(e) = cursor_cache.entry(pid) {
                e.insert(cursors(&client, pid).await?);
            }
            for (i, fr) in decoded.iter().enumerate().rev() {
                examined += 1;
                if examined > SCAN_CAP {
                    break 'pages;
                }
                let offset = base + i as i64;
                let st = status(&cursor_cache[&pid], offset);
                if f.status.as_deref().is_some_and(|want| want != st) {
                    continue;
                }
                if skipped < f.offset {
                    skipped += 1;
                    continue;
                }
                let shown = super::ShownPayload::of_frame(ring, fr);
                let mut m = json!({
                    "id": fr.message_id.to_string(),
                    "transactionId": fr.transaction_id,
                    "partitionId": pid.to_string(),
                    "partition": r.get::<_, String>(1),
                    "queue": crate::tenancy::shown(r.get::<_, &str>(2)),
                    "data": raw_json(shown.json.clone()),
                    "traceId": fr.trace_id.map(|t| t.to_string()),
                    "producerSub": fr.producer_sub,
                    "createdAt": iso_ms(created),
                    "status": st,
                    "isEncrypted": fr.encrypted,
                });
                shown.note(&mut m);
                out.push(m);
                if out.len() >= f.limit {
                    break 'pages;
                }
            }
        }
    }
    Ok(json!({"messages": out, "total": total, "limit": f.limit, "offset": f.offset}))
}
