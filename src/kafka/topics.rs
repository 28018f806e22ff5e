//! Topics as Kafka sees them: the names, their advertised widths
//! (Metadata), and where their partitions' logs begin and end
//! (ListOffsets). A topic is the queue of the same name; partition `n` is
//! the Queen partition named `"n"`.

use deadpool_postgres::Pool;
use kafka_protocol::messages::list_offsets_request::ListOffsetsRequest;
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::metadata_response::{MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic};
use kafka_protocol::messages::{BrokerId, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::Kafka;
use crate::db::DbError;
use crate::http::AppState;
use crate::tenancy::Tenant;
use super::codes::*;


/// Whether `name` can be a topic here: a valid queue name that does not
/// claim Kafka's internal prefix.
pub fn valid_name(name: &str) -> bool {
    !name.starts_with("__") && crate::push::validate::check_name(name).is_ok()
}

/// The Queen partition name of Kafka partition `index`, if it has one.
pub fn partition_name(index: i32) -> Option<String> {
    (index >= 0).then(|| index.to_string())
}

/// The named topics of `tenant` that exist (all of them for `None`), by
/// the names the tenant knows, each with its width: its declared width
/// (`floor` when it declared none), or one past its highest numeric
/// partition when that is more (migrations/0026).
pub async fn widths(pool: &Pool, tenant: Tenant, names: Option<&[String]>, floor: i32) -> Result<Vec<(String, i32)>, DbError> {
    let stored: Option<Vec<String>> = names.map(|ns| ns.iter().map(|n| tenant.stored(n)).collect());
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT q.name, GREATEST(COALESCE((SELECT k.partitions FROM queen.kafka_topics k WHERE k.queue_id = q.id), $2),
                    COALESCE(max(CASE WHEN p.name ~ '^(0|[1-9][0-9]{0,8})$' THEN p.name::int END), -1) + 1)
             FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id
             WHERE ($1::text[] IS NULL OR q.name = ANY($1)) AND q.tenant_id = $3
             GROUP BY q.id, q.name ORDER BY q.name",
            &[&stored, &floor, &tenant.0],
        )
        .await?;
    Ok(rows.iter().map(|r| (crate::tenancy::shown(r.get::<_, &str>(0)).to_string(), r.get::<_, i32>(1))).collect())
}

/// Creates `tenant`'s queues of `names` that do not exist yet, within its
/// queue quota (refused: nothing is created).
pub async fn create(state: &AppState, tenant: Tenant, names: &[String]) -> Result<(), CreateError> {
    if names.is_empty() {
        return Ok(());
    }
    let stored: Vec<String> = names.iter().map(|n| tenant.stored(n)).collect();
    state.quotas.push(tenant, &stored.iter().map(String::as_str).collect::<Vec<_>>(), 0, 0)?;
    let client = state.pool.get().await.map_err(DbError::from)?;
    client.execute("SELECT queen.ensure_queue_v1(n) FROM unnest($1::text[]) AS n", &[&stored]).await.map_err(DbError::from)?;
    Ok(())
}

/// Why topics were not created.
#[derive(Debug)]
pub enum CreateError {
    /// The tenant's quota refuses a new queue.
    Quota(crate::tenancy::quota::Refused),
    Db(DbError),
}

impl From<crate::tenancy::quota::Refused> for CreateError {
    fn from(r: crate::tenancy::quota::Refused) -> Self {
        CreateError::Quota(r)
    }
}

impl From<DbError> for CreateError {
    fn from(e: DbError) -> Self {
        CreateError::Db(e)
    }
}

impl CreateError {
    /// Kafka's code and message for it.
    pub fn kafka(&self) -> (i16, String) {
        match self {
            CreateError::Quota(r) => (POLICY_VIOLATION, r.message()),
            CreateError::Db(_) => (KAFKA_STORAGE_ERROR, "the topic could not be created".into()),
        }
    }
}

/// `Metadata`.
pub async fn metadata(kafka: &Kafka, tenant: Tenant, req: &MetadataRequest, version: i16, may_create: bool) -> MetadataResponse {
    let floor = kafka.config.default_partitions;
    let mut r = MetadataResponse::default();
    let live = kafka.nodes.live();
    r.brokers = live
        .iter()
        .map(|n| {
            let mut b = MetadataResponseBroker::default();
            b.node_id = BrokerId(n.id);
            b.host = StrBytes::from_string(n.host.clone());
            b.port = n.port;
            b
        })
        .collect();
    // Fields newer than the request's version must stay at their defaults.
    if version >= 2 {
        r.cluster_id = Some(StrBytes::from_static_str("queen"));
    }
    if version >= 1 {
        r.controller_id = BrokerId(live.first().map_or(0, |n| n.id));
    }
    let wanted: Option<Vec<String>> =
        req.topics.as_ref().map(|ts| ts.iter().filter_map(|t| t.name.as_ref().map(|n| n.0.to_string())).collect());
    // v0 answers every topic for an empty list; later versions for a null one.
    let wanted = match wanted {
        Some(w) if w.is_empty() && version == 0 => None,
        w => w,
    };
    let (valid, invalid): (Vec<String>, Vec<String>) = wanted.iter().flatten().cloned().partition(|n| valid_name(n));
    let auto_create = may_create && kafka.config.auto_create && (version < 4 || req.allow_auto_topic_creation);
    let mut found = widths(&kafka.state.pool, tenant, wanted.as_ref().map(|_| valid.as_slice()), floor).await;
    // Topics the tenant's queue quota kept from being created.
    let mut refused: Vec<String> = Vec::new();
    if auto_create {
        if let Ok(have) = &found {
            let missing: Vec<String> = valid.iter().filter(|n| !have.iter().any(|(h, _)| h == *n)).cloned().collect();
            if !missing.is_empty() {
                found = match create(&kafka.state, tenant, &missing).await {
                    Ok(()) => widths(&kafka.state.pool, tenant, Some(&valid), floor).await,
                    Err(CreateError::Quota(_)) => {
                        refused = missing;
                        found
                    }
                    Err(CreateError::Db(e)) => Err(e),
                };
            }
        }
    }
    let topic = |name: &str, error: i16, width: i32| {
        let mut t = MetadataResponseTopic::default();
        t.name = Some(TopicName(StrBytes::from_string(name.to_string())));
        t.error_code = error;
        t.partitions = (0..width)
            .map(|i| {
                let leader = BrokerId(kafka.nodes.owner(&format!("{name}\0{i}")).id);
                let mut p = MetadataResponsePartition::default();
                p.partition_index = i;
                p.leader_id = leader;
                p.replica_nodes = vec![leader];
                p.isr_nodes = vec![leader];
                p
            })
            .collect();
        t
    };
    match found {
        Ok(have) => {
            r.topics = have.iter().map(|(n, w)| topic(n, 0, *w)).collect();
            for n in valid.iter().filter(|n| !have.iter().any(|(h, _)| h == *n)) {
                // A topic the queue quota kept from being created is answered
                // as it would be: the producer's records then meet the
                // quota's refusal (POLICY_VIOLATION, with its reason) at once,
                // where an unknown topic would keep them waiting until their
                // timeout (clients wait for a topic being created).
                r.topics.push(if refused.contains(n) { topic(n, 0, floor) } else { topic(n, UNKNOWN_TOPIC_OR_PARTITION, 0) });
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "kafka metadata: the topics could not be read");
            r.topics = valid.iter().map(|n| topic(n, KAFKA_STORAGE_ERROR, 0)).collect();
        }
    }
    r.topics.extend(invalid.iter().map(|n| topic(n, INVALID_TOPIC_EXCEPTION, 0)));
    r
}

/// `ListOffsets`: -2 the log start, -1 the high watermark, else the first
/// offset of the first segment written at or after the timestamp (-1 when
/// none is). A partition never written has both ends at 0.
pub async fn list_offsets(kafka: &Kafka, tenant: Tenant, req: &ListOffsetsRequest) -> ListOffsetsResponse {
    let mut r = ListOffsetsResponse::default();
    let client = match kafka.state.pool.get().await {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, "kafka list offsets: no connection");
            None
        }
    };
    for t in &req.topics {
        let mut out = ListOffsetsTopicResponse::default();
        out.name = t.name.clone();
        for p in &t.partitions {
            let mut a = ListOffsetsPartitionResponse::default();
            a.partition_index = p.partition_index;
            a.timestamp = -1;
            let name = partition_name(p.partition_index).filter(|_| valid_name(&t.name.0));
            match (&client, name) {
                (_, None) => a.error_code = UNKNOWN_TOPIC_OR_PARTITION,
                (None, _) => a.error_code = KAFKA_STORAGE_ERROR,
                (Some(c), Some(name)) => match offset_at(c, &tenant.stored(&t.name.0), &name, p.timestamp).await {
                    Ok((offset, ts)) => {
                        a.offset = offset;
                        a.timestamp = ts;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "kafka list offsets failed");
                        a.error_code = KAFKA_STORAGE_ERROR;
                    }
                },
            }
            out.partitions.push(a);
        }
        r.topics.push(out);
    }
    r
}

/// (offset, timestamp) of one ListOffsets question.
async fn offset_at(client: &deadpool_postgres::Client, queue: &str, partition: &str, ts: i64) -> Result<(i64, i64), tokio_postgres::Error> {
    let stmt = client
        .prepare_cached(
            "SELECT p.log_start, p.last_offset + 1,
                    (SELECT s.base_offset FROM queen.segments s
                     WHERE s.partition_id = p.id AND s.base_offset >= p.log_start
                       AND s.created_at >= to_timestamp($3::int8 / 1000.0)
                     ORDER BY s.base_offset LIMIT 1),
                    (SELECT (extract(epoch FROM s.created_at) * 1000)::int8 FROM queen.segments s
                     WHERE s.partition_id = p.id AND s.base_offset >= p.log_start
                       AND s.created_at >= to_timestamp($3::int8 / 1000.0)
                     ORDER BY s.base_offset LIMIT 1)
             FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
             WHERE q.name = $1 AND p.name = $2",
        )
        .await?;
    let rows = client.query(&stmt, &[&queue, &partition, &ts.max(0)]).await?;
    let Some(row) = rows.first() else { return Ok(if ts >= 0 { (-1, -1) } else { (0, -1) }) };
    let (start, end): (i64, i64) = (row.get(0), row.get(1));
    Ok(match ts {
        -2 => (start, -1),
        t if t < 0 => (end, -1),
        _ => match (row.get::<_, Option<i64>>(2), row.get::<_, Option<i64>>(3)) {
            (Some(o), Some(at)) => (o.max(start), at),
            _ => (-1, -1),
        },
    })
}
