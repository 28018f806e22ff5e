//! Committed offsets are the consumer group's cursors (docs/KAFKA.md):
//! Kafka's committed offset `k`, the next record to read, is Queen's cursor
//! `k - 1`, the last one consumed. So a Kafka group's lag is what
//! `/api/v1/consumer-groups`, the dashboard and Prometheus show, and it
//! survives restarts with the rest of the log.
//!
//! One OffsetCommit is one statement, so its partitions move together. A
//! commit past the high watermark is clamped to it: a cursor beyond the log
//! would make the group skip records written later. A commit never touches
//! a lease an HTTP consumer of the same group may hold.

use deadpool_postgres::Pool;
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequest;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponse, OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequest;
use kafka_protocol::messages::offset_fetch_response::{OffsetFetchResponse, OffsetFetchResponsePartition, OffsetFetchResponseTopic};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;

use super::topics::{partition_name, valid_name};
use super::Kafka;
use crate::db::DbError;
use crate::tenancy::Tenant;
use super::codes::{self, *};

/// `OffsetCommit`.
pub async fn commit(kafka: &Kafka, tenant: Tenant, req: &OffsetCommitRequest) -> OffsetCommitResponse {
    // The cursors are the group's on the tenant's partitions; its
    // membership is the coordinator's under the tenant's stored name.
    let group = req.group_id.0.as_str();
    let member_of = tenant.stored(group);
    // A commit inside a generation is judged by the group's coordinator; a
    // plain commit (generation -1, no member) can be written by any broker.
    let inside = req.generation_id_or_member_epoch >= 0 || !req.member_id.is_empty();
    let allowed = if inside && !kafka.nodes.mine(&super::coordination_key(&member_of)) {
        codes::NOT_COORDINATOR
    } else {
        kafka.groups.commit_allowed(&member_of, req.generation_id_or_member_epoch, req.member_id.as_str())
    };
    let mut r = OffsetCommitResponse::default();
    // (topic index, partition index, queue, partition name, cursor)
    let mut wanted: Vec<(usize, i32, String, String, i64)> = Vec::new();
    let mut codes: Vec<Vec<i16>> = Vec::new();
    for (t, topic) in req.topics.iter().enumerate() {
        let mut out = OffsetCommitResponseTopic::default();
        out.name = topic.name.clone();
        let mut topic_codes = Vec::new();
        for p in &topic.partitions {
            let mut a = OffsetCommitResponsePartition::default();
            a.partition_index = p.partition_index;
            out.partitions.push(a);
            let name = partition_name(p.partition_index).filter(|_| valid_name(&topic.name.0));
            topic_codes.push(match name {
                _ if allowed != 0 => allowed,
                None => UNKNOWN_TOPIC_OR_PARTITION,
                Some(n) => {
                    wanted.push((t, p.partition_index, tenant.stored(&topic.name.0), n, p.committed_offset.max(0) - 1));
                    0
                }
            });
        }
        r.topics.push(out);
        codes.push(topic_codes);
    }
    if !wanted.is_empty() {
        match write(&kafka.state.pool, group, &wanted).await {
            Ok(missing) => {
                for (t, index) in missing {
                    mark(&req.topics[t].partitions, &mut codes[t], index, UNKNOWN_TOPIC_OR_PARTITION);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "kafka offset commit failed");
                for (t, index, ..) in &wanted {
                    mark(&req.topics[*t].partitions, &mut codes[*t], *index, KAFKA_STORAGE_ERROR);
                }
            }
        }
    }
    for (out, topic_codes) in r.topics.iter_mut().zip(codes) {
        for (p, code) in out.partitions.iter_mut().zip(topic_codes) {
            p.error_code = code;
        }
    }
    r
}

fn mark(partitions: &[kafka_protocol::messages::offset_commit_request::OffsetCommitRequestPartition], codes: &mut [i16], index: i32, code: i16) {
    for (p, c) in partitions.iter().zip(codes.iter_mut()) {
        if p.partition_index == index {
            *c = code;
        }
    }
}

/// Writes the cursors in one statement; answers the (topic, partition)
/// pairs that name no partition and were not a commit of offset 0 (a
/// partition nobody wrote has nothing to commit past).
async fn write(pool: &Pool, group: &str, wanted: &[(usize, i32, String, String, i64)]) -> Result<Vec<(usize, i32)>, DbError> {
    let client = pool.get().await?;
    let queues: Vec<&str> = wanted.iter().map(|w| w.2.as_str()).collect();
    let partitions: Vec<&str> = wanted.iter().map(|w| w.3.as_str()).collect();
    let cursors: Vec<i64> = wanted.iter().map(|w| w.4).collect();
    let rows = client
        .query(
            // The one home of the rule (0037_kafka_transactions.sql): a transaction's commit applies its offsets with it too.
            "SELECT * FROM queen.kafka_commit_offsets_v1($1, $2, $3, $4)",
            &[&group, &queues, &partitions, &cursors],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let w = &wanted[(r.get::<_, i64>(0) - 1) as usize];
            (w.0, w.1)
        })
        .collect())
}

/// `OffsetFetch` (v1-7: one group): -1 for a partition never committed.
pub async fn fetch(kafka: &Kafka, tenant: Tenant, req: &OffsetFetchRequest) -> OffsetFetchResponse {
    let group = req.group_id.0.as_str();
    let mut r = OffsetFetchResponse::default();
    let known = match read(&kafka.state.pool, tenant, group).await {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "kafka offset fetch failed");
            r.error_code = KAFKA_STORAGE_ERROR;
            return r;
        }
    };
    let entry = |index: i32, offset: i64| {
        let mut p = OffsetFetchResponsePartition::default();
        p.partition_index = index;
        p.committed_offset = offset;
        p.committed_leader_epoch = -1;
        p.metadata = Some(StrBytes::from_static_str(""));
        p
    };
    match &req.topics {
        Some(topics) => {
            for t in topics {
                let mut out = OffsetFetchResponseTopic::default();
                out.name = t.name.clone();
                for &index in &t.partition_indexes {
                    let committed = known.iter().find(|(q, p, _)| *q == t.name.0.as_str() && *p == index).map_or(-1, |k| k.2);
                    out.partitions.push(entry(index, committed));
                }
                r.topics.push(out);
            }
        }
        None => {
            let mut names: Vec<&str> = known.iter().map(|k| k.0.as_str()).collect();
            names.dedup();
            for name in names {
                let mut out = OffsetFetchResponseTopic::default();
                out.name = TopicName(StrBytes::from_string(name.to_string()));
                out.partitions = known.iter().filter(|k| k.0 == name).map(|k| entry(k.1, k.2)).collect();
                r.topics.push(out);
            }
        }
    }
    r
}

/// Every Kafka-addressable cursor of `group` on `tenant`'s topics: (topic
/// as the tenant knows it, partition, next offset).
async fn read(pool: &Pool, tenant: Tenant, group: &str) -> Result<Vec<(String, i32, i64)>, DbError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT q.name, p.name::int, c.committed + 1
             FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id
             JOIN queen.queues q ON q.id = p.queue_id
             WHERE c.consumer_group = $1 AND p.name ~ '^(0|[1-9][0-9]{0,8})$' AND q.tenant_id = $2
             ORDER BY q.name, p.name::int",
            &[&group, &tenant.0],
        )
        .await?;
    Ok(rows.iter().map(|r| (crate::tenancy::shown(r.get::<_, &str>(0)).to_string(), r.get(1), r.get(2))).collect())
}
