//! `GET /api/v1/dlq` (API.md §2.8): dead letters of a queue, newest first,
//! with `total` counting every matching row (§6 A-16); `DELETE /api/v1/dlq`
//! purges what the same filters match.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde_json::{json, Value};

use super::raw_json;
use crate::json::iso_ms;
use crate::db::DbError;

/// The listing filters.
#[derive(Debug, Clone, Default)]
pub struct DlqFilter {
    /// The stored name (`tenancy`): the tenant's dead letters only.
    pub queue: String,
    pub group: Option<String>,
    pub partition: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub limit: i64,
    pub offset: i64,
}

const WHERE: &str = "FROM queen.dead_letters d
    JOIN queen.queues q ON q.id = d.queue_id
    LEFT JOIN queen.partitions p ON p.id = d.partition_id
    WHERE q.name = $1
      AND ($2::text IS NULL OR d.consumer_group = $2)
      AND ($3::text IS NULL OR p.name = $3)
      AND ($4::timestamptz IS NULL OR d.failed_at >= $4)
      AND ($5::timestamptz IS NULL OR d.failed_at <= $5)";

pub async fn list(pool: &Pool, ring: Option<&crate::crypto::KeyRing>, f: &DlqFilter) -> Result<Value, DbError> {
    let client = pool.get().await?;
    let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [&f.queue, &f.group, &f.partition, &f.from, &f.to];
    let total: i64 = client.query_one(&format!("SELECT count(*) {WHERE}"), &args).await?.get(0);
    let sql = format!(
        "SELECT d.id, d.transaction_id, d.partition_id, q.name, p.name, d.consumer_group, d.error_message,
                d.retry_count, d.payload::text, d.producer_sub, d.created_at, d.failed_at, d.message_id, d.trace_id, d.sealed
         {WHERE} ORDER BY d.failed_at DESC, d.id DESC LIMIT {} OFFSET {}",
        f.limit, f.offset
    );
    let rows = client.query(&sql, &args).await?;
    let messages: Vec<Value> = rows
        .iter()
        .map(|r| {
            let shown = super::ShownPayload::of_snapshot(ring, r.get(8), r.get(14), &r.get(12));
            let mut m = json!({
                "id": r.get::<_, i64>(0).to_string(),
                "transactionId": r.get::<_, String>(1),
                "partitionId": r.get::<_, i64>(2).to_string(),
                "queue": crate::tenancy::shown(r.get::<_, &str>(3)),
                "partition": r.get::<_, Option<String>>(4),
                "consumerGroup": r.get::<_, String>(5),
                "errorMessage": r.get::<_, Option<String>>(6),
                "retryCount": r.get::<_, i32>(7),
                "data": raw_json(shown.json.clone()),
                "producerSub": r.get::<_, Option<String>>(9),
                "createdAt": iso_ms(r.get(10)),
                "failedAt": iso_ms(r.get(11)),
                "messageId": r.get::<_, uuid::Uuid>(12).to_string(),
                "traceId": r.get::<_, Option<uuid::Uuid>>(13).map(|t| t.to_string()),
            });
            if r.get::<_, Option<&[u8]>>(14).is_some() {
                m["isEncrypted"] = json!(true);
            }
            shown.note(&mut m);
            m
        })
        .collect();
    Ok(json!({"messages": messages, "pagination": {"limit": f.limit, "offset": f.offset}, "total": total}))
}

/// `DELETE /api/v1/dlq`: removes every dead letter the filters match
/// (`limit`/`offset` do not apply); how many.
pub async fn purge(pool: &Pool, f: &DlqFilter) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [&f.queue, &f.group, &f.partition, &f.from, &f.to];
    Ok(client.execute(&format!("DELETE FROM queen.dead_letters WHERE id IN (SELECT d.id {WHERE})"), &args).await?)
}
