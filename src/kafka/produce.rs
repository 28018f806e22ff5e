//! `Produce`: the records of every partition of one request become push
//! items of one `push::push_items` call, so they share the coalescer and
//! the group commit with HTTP pushes, and wake long-polls the same way. The
//! answer comes only after the commit (as HTTP's 201 does); `acks=0` gets
//! none at all.
//!
//! An idempotent producer's batches are the exception: they are written
//! in a transaction of their own with the producer's sequence windows
//! ([`idempotence`]), so that a resend is known as one by any broker at
//! any time.
//!
//! A partition whose batch does not decode, or whose topic name is not a
//! queue name, is refused alone; the others are written. The broker mints
//! every record's transactionId (Kafka has no such id), so none is ever a
//! duplicate.

use std::borrow::Cow;
use std::time::Duration;

use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, ProduceResponse, TopicProduceResponse};

use super::topics::{partition_name, valid_name};
use super::idempotence::{self, Sequenced};
use super::{batch, records, Kafka};
use crate::push::{self, Outcome, PushItem};
use crate::tenancy::Tenant;
use super::codes::*;


/// The stored payloads of one partition of the request, or its error.
struct Lane {
    topic: usize,
    index: i32,
    partition: String,
    payloads: Vec<String>,
    error: i16,
    /// Why, when a quota refused it (Produce v8+ answers it).
    message: Option<String>,
    /// An idempotent producer's batch: its sequence window decides.
    sequenced: Option<Sequenced>,
    /// The first offset written (or, for a resend, written before).
    first: Option<i64>,
}

/// `Produce`; `None` when the request asked for no answer (`acks=0`).
/// `producer`: the authenticated subject, stamped on every message as an
/// HTTP push stamps its JWT's.
pub async fn produce(kafka: &Kafka, tenant: Tenant, req: &ProduceRequest, producer: Option<&str>, version: i16) -> Option<ProduceResponse> {
    // The tenant's queues the topics are (by topic index).
    let stored: Vec<String> = req.topic_data.iter().map(|t| tenant.stored(&t.name.0)).collect();
    let mut lanes: Vec<Lane> = Vec::new();
    for (t, topic) in req.topic_data.iter().enumerate() {
        let name = topic.name.0.as_str();
        for p in &topic.partition_data {
            let mut lane = Lane { topic: t, index: p.index, partition: String::new(), payloads: Vec::new(), error: 0, message: None, sequenced: None, first: None };
            match (valid_name(name), partition_name(p.index)) {
                (false, _) => lane.error = INVALID_TOPIC_EXCEPTION,
                (_, None) => lane.error = UNKNOWN_TOPIC_OR_PARTITION,
                (true, Some(partition)) => {
                    lane.partition = partition;
                    (lane.error, lane.sequenced) = stored_payloads(p.records.as_deref().unwrap_or_default(), &mut lane.payloads);
                }
            }
            lanes.push(lane);
        }
    }
    if !kafka.config.auto_create {
        refuse_unknown_topics(kafka, tenant, req, &mut lanes).await;
    }
    if kafka.state.push_maintenance() {
        // Push maintenance: HTTP pushes go to the spool, which has no
        // offsets to give; Kafka producers retry until it ends.
        lanes.iter_mut().filter(|l| l.error == 0).for_each(|l| l.error = KAFKA_STORAGE_ERROR);
    }
    let throttled = match admit(kafka, tenant, &lanes, &stored) {
        Ok(waited) => waited,
        Err((code, message)) => {
            for l in lanes.iter_mut().filter(|l| l.error == 0) {
                (l.error, l.message) = (code, Some(message.clone()));
            }
            Duration::ZERO
        }
    };
    // Plain batches share the coalescer's commits; an idempotent
    // producer's go in a transaction of their own with its windows.
    let mut producers: Vec<(i64, i16)> = lanes.iter().filter(|l| l.error == 0).filter_map(|l| l.sequenced).map(|s| (s.producer_id, s.epoch)).collect();
    producers.sort_unstable();
    producers.dedup();
    let plain = write_plain(kafka, &stored, &lanes, producer);
    let sequenced = futures_util::future::join_all(producers.iter().map(|&(id, epoch)| {
        let mine: Vec<usize> = (0..lanes.len())
            .filter(|&i| lanes[i].error == 0 && lanes[i].sequenced.is_some_and(|s| (s.producer_id, s.epoch) == (id, epoch)))
            .collect();
        let (lanes, stored) = (&lanes, &stored);
        async move {
            let batches: Vec<idempotence::Lane> = mine
                .iter()
                .map(|&i| {
                    let l = &lanes[i];
                    let batch = l.sequenced.expect("a sequenced lane");
                    idempotence::Lane { queue: stored[l.topic].as_str(), partition: &l.partition, batch, payloads: &l.payloads }
                })
                .collect();
            let txn = req.transactional_id.as_ref().map(|t| tenant.stored(&t.0));
            let written = idempotence::produce(&kafka.state, tenant, producer, txn.as_deref(), &batches).await;
            (mine, written)
        }
    }));
    let (plain, sequenced) = tokio::join!(plain, sequenced);
    for (i, first) in plain {
        match first {
            Ok(offset) => lanes[i].first = Some(offset),
            Err(code) => lanes[i].error = code,
        }
    }
    for (mine, written) in sequenced {
        match written {
            Ok(answers) => {
                for (i, a) in mine.into_iter().zip(answers) {
                    match a {
                        Ok(offset) => lanes[i].first = Some(offset),
                        Err(code) => lanes[i].error = code,
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "kafka idempotent produce failed; the producer retries");
                mine.into_iter().for_each(|i| lanes[i].error = KAFKA_STORAGE_ERROR);
            }
        }
    }
    if req.acks == 0 {
        return None;
    }
    let mut r = ProduceResponse::default();
    // Before KIP-219 (v6) the time the broker will hold the connection;
    // from v6 the time the client is to wait, which runs alongside.
    r.throttle_time_ms = throttled.as_millis().min(i32::MAX as u128) as i32;
    r.responses = req
        .topic_data
        .iter()
        .map(|t| {
            let mut out = TopicProduceResponse::default();
            out.name = t.name.clone();
            out
        })
        .collect();
    for l in &lanes {
        let mut p = PartitionProduceResponse::default();
        p.index = l.index;
        p.error_code = l.error;
        p.base_offset = if l.error == 0 { l.first.unwrap_or(-1) } else { -1 };
        p.log_append_time_ms = -1;
        p.log_start_offset = -1;
        if version >= 8 {
            p.error_message = l.message.as_deref().map(|m| kafka_protocol::protocol::StrBytes::from_string(m.to_string()));
        }
        r.responses[l.topic].partition_responses.push(p);
    }
    Some(r)
}

/// Admits the lanes still to be written under the tenant's push quota
/// (`tenancy::quota`, as an HTTP push), answering the throttle to report.
/// A spent rate does not refuse them, as Kafka clients have no retry for
/// that: they are admitted into the tenant's debt, and the tenant's
/// connections read nothing more until it is paid (`conn::serve`), as
/// Kafka's own brokers mute a throttled client. A total reached (stored
/// bytes, queue count, a disabled kind) is the code and message every such
/// lane gets. Nothing is written before this answers.
fn admit(kafka: &Kafka, tenant: Tenant, lanes: &[Lane], stored: &[String]) -> Result<Duration, (i16, String)> {
    let open = || lanes.iter().filter(|l| l.error == 0);
    if open().next().is_none() {
        return Ok(Duration::ZERO);
    }
    let mut queues: Vec<&str> = open().map(|l| stored[l.topic].as_str()).collect();
    queues.sort_unstable();
    queues.dedup();
    let messages = open().map(|l| l.payloads.len() as u64).sum();
    let bytes = open().flat_map(|l| &l.payloads).map(|p| p.len() as u64).sum();
    let quotas = &kafka.state.quotas;
    quotas.push_throttled(tenant, &queues, messages, bytes).map_err(|refused| (POLICY_VIOLATION, refused.message()))
}

/// The plain (non-idempotent) lanes through `push::push_items`: each
/// one's first offset or error code, by lane index.
async fn write_plain(kafka: &Kafka, stored: &[String], lanes: &[Lane], producer: Option<&str>) -> Vec<(usize, Result<i64, i16>)> {
    let plain: Vec<usize> = (0..lanes.len()).filter(|&i| lanes[i].error == 0 && lanes[i].sequenced.is_none()).collect();
    let items = push_items(plain.iter().map(|&i| {
        let l = &lanes[i];
        (stored[l.topic].as_str(), l.partition.as_str(), l.payloads.as_slice())
    }));
    if items.is_empty() {
        // Batches of control records only: nothing to write.
        return plain.into_iter().map(|i| (i, Ok(-1))).collect();
    }
    match push::push_items(&kafka.state.coalescer, &items, producer).await {
        Ok(results) => {
            kafka.state.committed_results(&results);
            let firsts = first_offsets(results.iter().map(|r| &r.outcome), plain.iter().map(|&i| lanes[i].payloads.len()));
            plain.into_iter().zip(firsts).map(|(i, first)| (i, Ok(first.unwrap_or(-1)))).collect()
        }
        Err(e) => {
            tracing::warn!(error = %e, "kafka produce failed; the producer retries");
            plain.into_iter().map(|i| (i, Err(KAFKA_STORAGE_ERROR))).collect()
        }
    }
}

/// The push items of lanes given as (queue, partition, stored payloads),
/// lane after lane; the broker mints every id.
pub(super) fn push_items<'a>(lanes: impl Iterator<Item = (&'a str, &'a str, &'a [String])>) -> Vec<PushItem<'a>> {
    lanes
        .flat_map(|(queue, partition, payloads)| {
            payloads.iter().map(move |payload| PushItem {
                queue: Cow::Borrowed(queue),
                partition: Cow::Borrowed(partition),
                transaction_id: None,
                trace_id: None,
                payload,
                message_id: None,
            })
        })
        .collect()
}

/// The first offset written of each lane, from the outcomes of
/// [`push_items`]' items in order and each lane's record count (`None`:
/// none of its records was written).
pub(super) fn first_offsets<'o>(outcomes: impl Iterator<Item = &'o Outcome>, counts: impl Iterator<Item = usize>) -> Vec<Option<i64>> {
    let mut outcomes = outcomes;
    counts
        .map(|n| outcomes.by_ref().take(n).filter_map(|o| if let Outcome::Queued { offset, .. } = o { Some(*offset) } else { None }).min())
        .collect()
}

/// Decodes a partition's batches into stored payloads; answers the error
/// code (0: every record is in `out`) and, for an idempotent producer's
/// batch, its sequence fields.
fn stored_payloads(records: &[u8], out: &mut Vec<String>) -> (i16, Option<Sequenced>) {
    let batches = match batch::decode_all(records) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(error = %e, "kafka produce: a batch refused");
            return (CORRUPT_MESSAGE, None);
        }
    };
    // An idempotent producer sends one batch per partition and request; a
    // transactional one's batch is staged until its EndTxn (`transactions`).
    let sequenced = match batches.as_slice() {
        [b] if b.producer_id >= 0 && b.base_sequence >= 0 => Some(Sequenced {
            producer_id: b.producer_id,
            epoch: b.producer_epoch,
            first: b.base_sequence,
            count: b.records.len() as i32,
            transactional: b.transactional,
        }),
        // A transactional batch without its producer's sequence is a client out of step.
        _ if batches.iter().any(|b| b.transactional) => return (INVALID_RECORD, None),
        _ => None,
    };
    for b in batches.iter().filter(|b| !b.control) {
        for r in &b.records {
            match records::envelope(r) {
                Ok(p) => out.push(p),
                Err(_) => {
                    out.clear();
                    return (INVALID_RECORD, None);
                }
            }
        }
    }
    (0, sequenced)
}

/// With auto-creation off, a topic that is not a queue yet is refused.
async fn refuse_unknown_topics(kafka: &Kafka, tenant: Tenant, req: &ProduceRequest, lanes: &mut [Lane]) {
    let names: Vec<String> = req.topic_data.iter().map(|t| t.name.0.to_string()).collect();
    match super::topics::widths(&kafka.state.pool, tenant, Some(&names), 1).await {
        Ok(have) => {
            for l in lanes.iter_mut().filter(|l| l.error == 0) {
                if !have.iter().any(|(n, _)| *n == names[l.topic]) {
                    l.error = UNKNOWN_TOPIC_OR_PARTITION;
                }
            }
        }
        Err(_) => lanes.iter_mut().filter(|l| l.error == 0).for_each(|l| l.error = KAFKA_STORAGE_ERROR),
    }
}
