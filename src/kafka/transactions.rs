//! Kafka transactions (docs/KAFKA.md, migrations/0037_kafka_transactions.sql):
//! InitProducerId with a transactional id, AddPartitionsToTxn,
//! AddOffsetsToTxn, TxnOffsetCommit and EndTxn.
//!
//! Why staged in PostgreSQL and not written to the log with markers, as
//! Kafka's own brokers do: Queen's readers are not only Kafka consumers
//! that know to skip aborted records, but HTTP pops, fetches and the
//! dashboard. A transaction's batches are checked against the producer's
//! windows like any idempotent batch (`idempotence::produce`), then kept as
//! the segments they will become; its offsets are kept beside the cursors.
//! EndTxn's commit moves both into place in one PostgreSQL transaction of
//! one round trip, an abort deletes them. So nothing of an open or aborted
//! transaction is ever readable, by anyone, and the stage survives a broker
//! restart or the producer moving to another broker: every broker of the
//! database can serve every step, so the coordinator a client is given
//! (`nodes::Nodes::owner`, as for groups) only has to be live.
//!
//! The price: a transaction's records are in memory of no reader until it
//! commits, so `read_uncommitted` consumers see them no earlier than
//! `read_committed` ones, and Produce answers their offsets as -1 (they are
//! given at commit).

use deadpool_postgres::Pool;
use kafka_protocol::messages::add_offsets_to_txn_request::AddOffsetsToTxnRequest;
use kafka_protocol::messages::add_offsets_to_txn_response::AddOffsetsToTxnResponse;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnRequest;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResponse, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequest;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponse, TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};

use super::codes::*;
use super::topics::{partition_name, valid_name};
use super::Kafka;
use crate::db::DbError;
use crate::tenancy::Tenant;

const INIT_SQL: &str = "SELECT o_producer, o_epoch FROM queen.kafka_init_transactional_v2($1, $2, $3)";
const CHECK_SQL: &str = "SELECT queen.kafka_txn_check_v1($1, $2, $3, $4)";
const OFFSETS_SQL: &str = "SELECT queen.kafka_txn_offsets_v1($1, $2, $3, $4, $5)";
const END_SQL: &str = "SELECT * FROM queen.kafka_txn_end_v1($1, $2, $3, $4)";
const EXPIRE_SQL: &str = "SELECT queen.kafka_txn_expire_v1($1)";

/// InitProducerId with `tenant`'s transactional id: its producer with
/// whatever it left open aborted and the epoch bumped (older sessions
/// fenced), or a new one. A transactional id is kept by the tenant's
/// stored name, as a queue's, so two tenants' ids never meet.
pub async fn init(pool: &Pool, tenant: Tenant, transactional_id: &str, timeout_ms: i32) -> Result<(i64, i16), DbError> {
    let client = pool.get().await?;
    let stmt = client.prepare_cached(INIT_SQL).await?;
    let row = client.query_one(&stmt, &[&tenant.stored(transactional_id), &timeout_ms.max(1), &tenant.0]).await?;
    Ok((row.get(0), row.get(1)))
}

/// Checks the caller is the transactional id's current session and, with
/// `begin`, opens its transaction: 0 or Kafka's error code.
async fn check(pool: &Pool, transactional_id: &str, producer: i64, epoch: i16, begin: bool) -> i16 {
    let checked = async {
        let client = pool.get().await?;
        let stmt = client.prepare_cached(CHECK_SQL).await?;
        Ok::<i16, DbError>(client.query_one(&stmt, &[&transactional_id, &producer, &epoch, &begin]).await?.get(0))
    };
    checked.await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "kafka transaction check failed; the producer retries");
        KAFKA_STORAGE_ERROR
    })
}

/// `AddPartitionsToTxn` (v0–3): opens the transaction; every partition
/// gets the answer (a partition needs no registration here: the stage
/// takes whatever the transaction's producer sends).
pub async fn add_partitions(kafka: &Kafka, tenant: Tenant, req: &AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse {
    let code = check(
        &kafka.state.pool,
        &tenant.stored(&req.v3_and_below_transactional_id.0),
        req.v3_and_below_producer_id.0,
        req.v3_and_below_producer_epoch,
        true,
    )
    .await;
    let mut r = AddPartitionsToTxnResponse::default();
    r.results_by_topic_v3_and_below = req
        .v3_and_below_topics
        .iter()
        .map(|t| {
            let mut out = AddPartitionsToTxnTopicResult::default();
            out.name = t.name.clone();
            out.results_by_partition = t
                .partitions
                .iter()
                .map(|&p| {
                    let mut a = AddPartitionsToTxnPartitionResult::default();
                    a.partition_index = p;
                    a.partition_error_code = match (code, valid_name(&t.name.0) && partition_name(p).is_some()) {
                        (0, false) => UNKNOWN_TOPIC_OR_PARTITION,
                        (code, _) => code,
                    };
                    a
                })
                .collect();
            out
        })
        .collect();
    r
}

/// `AddOffsetsToTxn`: opens the transaction for the group's offsets.
pub async fn add_offsets(kafka: &Kafka, tenant: Tenant, req: &AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
    let mut r = AddOffsetsToTxnResponse::default();
    r.error_code = check(&kafka.state.pool, &tenant.stored(&req.transactional_id.0), req.producer_id.0, req.producer_epoch, true).await;
    r
}

/// `TxnOffsetCommit`: stages the group's offsets; they become its cursors
/// when the transaction commits.
pub async fn offset_commit(kafka: &Kafka, tenant: Tenant, req: &TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
    let transactional_id = tenant.stored(&req.transactional_id.0);
    let mut wanted: Vec<(String, String, i64)> = Vec::new();
    let mut r = TxnOffsetCommitResponse::default();
    let mut valid: Vec<Vec<bool>> = Vec::new();
    for t in &req.topics {
        let mut out = TxnOffsetCommitResponseTopic::default();
        out.name = t.name.clone();
        let mut ok = Vec::new();
        for p in &t.partitions {
            let mut a = TxnOffsetCommitResponsePartition::default();
            a.partition_index = p.partition_index;
            out.partitions.push(a);
            match partition_name(p.partition_index).filter(|_| valid_name(&t.name.0)) {
                Some(name) => {
                    // Kafka's committed offset k is the cursor k - 1.
                    wanted.push((tenant.stored(&t.name.0), name, p.committed_offset.max(0) - 1));
                    ok.push(true);
                }
                None => ok.push(false),
            }
        }
        r.topics.push(out);
        valid.push(ok);
    }
    let staged = async {
        let mut client = kafka.state.pool.get().await?;
        let tx = client.transaction().await?;
        let check = tx.prepare_cached(CHECK_SQL).await?;
        let code: i16 = tx
            .query_one(&check, &[&transactional_id, &req.producer_id.0, &req.producer_epoch, &false])
            .await?
            .get(0);
        if code == 0 && !wanted.is_empty() {
            let queues: Vec<&str> = wanted.iter().map(|w| w.0.as_str()).collect();
            let partitions: Vec<&str> = wanted.iter().map(|w| w.1.as_str()).collect();
            let cursors: Vec<i64> = wanted.iter().map(|w| w.2).collect();
            let stmt = tx.prepare_cached(OFFSETS_SQL).await?;
            tx.execute(&stmt, &[&req.producer_id.0, &req.group_id.0.as_str(), &queues, &partitions, &cursors]).await?;
        }
        tx.commit().await?;
        Ok::<i16, DbError>(code)
    };
    let code = staged.await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "kafka txn offset commit failed; the producer retries");
        KAFKA_STORAGE_ERROR
    });
    for (out, ok) in r.topics.iter_mut().zip(valid) {
        for (p, ok) in out.partitions.iter_mut().zip(ok) {
            p.error_code = if !ok { UNKNOWN_TOPIC_OR_PARTITION } else { code };
        }
    }
    r
}

/// `EndTxn`: commits (the staged segments join the log, the staged
/// offsets become cursors) or aborts, in one PostgreSQL transaction sent
/// as one round trip; then wakes the readers of what was written.
pub async fn end(kafka: &Kafka, tenant: Tenant, req: &EndTxnRequest) -> EndTxnResponse {
    let transactional_id = tenant.stored(&req.transactional_id.0);
    let mut r = EndTxnResponse::default();
    r.producer_id = req.producer_id;
    r.producer_epoch = req.producer_epoch;
    let state = &kafka.state;
    let ended = async {
        let client = state.pool.get().await?;
        let stmt = client.prepare_cached(END_SQL).await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&transactional_id, &req.producer_id.0, &req.producer_epoch, &req.committed];
        // BEGIN, the move and COMMIT leave together: a COMMIT after a failed
        // statement rolls back, and the failure is what is answered.
        let (begun, rows, committed) =
            tokio::join!(client.batch_execute("BEGIN"), client.query(&stmt, &params), client.batch_execute("COMMIT"));
        begun?;
        let rows = rows?;
        committed?;
        Ok::<_, DbError>(rows)
    };
    match ended.await {
        Ok(rows) => {
            r.error_code = rows.first().map_or(UNKNOWN_SERVER_ERROR, |row| row.get(0));
            if r.error_code == 0 {
                for row in rows.iter().skip(1) {
                    let (queue, partition): (String, String) = (row.get(1), row.get(2));
                    let (pid, n): (i64, i64) = (row.get(3), row.get(4));
                    state.committed_push(&queue, pid, &partition, n as u64);
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "kafka end txn failed; the producer retries");
            // Retriable: the client sends EndTxn again, and a commit that did
            // land is answered as done.
            r.error_code = COORDINATOR_NOT_AVAILABLE;
        }
    }
    r
}

/// The transaction-timeout pass: aborts up to `batch` transactions open
/// past their timeout (and fences their producers); `Ok(true)` when the
/// batch was full.
pub async fn expire(pool: &Pool, batch: i32) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client.prepare_cached(EXPIRE_SQL).await?;
    let aborted: i64 = client.query_one(&stmt, &[&batch]).await?.get(0);
    if aborted > 0 {
        tracing::info!(transactions = aborted, "aborted kafka transactions open past their timeout");
    }
    Ok(aborted >= i64::from(batch))
}
