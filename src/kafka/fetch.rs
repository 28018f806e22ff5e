//! `Fetch`: the reads by offset of `POST /api/v1/fetch`
//! (`reads::fetch::fetch_into`), answered as record batches. The same
//! budgets, the same long-poll woken by pushes, the same high watermark and
//! log start on every partition.
//!
//! There are no fetch sessions: a v7+ request is answered in full with
//! session id 0, which tells the client to send full requests, as Kafka
//! does when it keeps no session.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use kafka_protocol::messages::fetch_request::FetchRequest;
use kafka_protocol::messages::fetch_response::{FetchResponse, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::BrokerId;

use super::records::{from_payload, KafkaRecord};
use super::topics::{partition_name, valid_name};
use super::{batch, Kafka};
use crate::reads::fetch::{self as reads, Entry, Sink};
use crate::tenancy::Tenant;
use super::codes::*;


/// One partition's part of the answer as the reader fills it.
#[derive(Default)]
struct Part {
    records: Vec<(i64, KafkaRecord, i64)>,
    high_watermark: i64,
    log_start: i64,
    error: i16,
    /// Where the read began.
    offset: i64,
}

/// Collects records per entry, in entry order.
#[derive(Default)]
struct Parts {
    parts: Vec<Part>,
}

impl Sink for Parts {
    fn begin(&mut self, e: &Entry) {
        self.parts.push(Part { offset: e.offset, ..Part::default() });
    }

    fn record(&mut self, offset: i64, created_at: DateTime<Utc>, _: &str, payload: &[u8]) {
        let part = self.parts.last_mut().expect("begin comes first");
        part.records.push((offset, from_payload(payload), created_at.timestamp_millis()));
    }

    fn end(&mut self, high_watermark: i64, log_start: i64, error: Option<&'static str>) {
        let part = self.parts.last_mut().expect("begin comes first");
        (part.high_watermark, part.log_start) = (high_watermark, log_start);
        part.error = match error {
            None => 0,
            // A partition nobody wrote yet: empty, both ends at 0.
            Some(reads::UNKNOWN_TOPIC_OR_PARTITION) if part.offset == 0 => 0,
            Some(reads::UNKNOWN_TOPIC_OR_PARTITION) => OFFSET_OUT_OF_RANGE,
            Some(reads::OFFSET_OUT_OF_RANGE) => OFFSET_OUT_OF_RANGE,
            Some(_) => KAFKA_STORAGE_ERROR,
        };
    }
}

/// `Fetch`.
pub async fn fetch(kafka: &Kafka, tenant: Tenant, req: &FetchRequest, version: i16) -> FetchResponse {
    // Where each requested partition's answer comes from: an entry of the
    // read, or an error decided here.
    let mut plan: Vec<(usize, i32, Result<usize, i16>)> = Vec::new();
    let mut entries = Vec::new();
    for (t, topic) in req.topics.iter().enumerate() {
        for p in &topic.partitions {
            let name = partition_name(p.partition).filter(|_| valid_name(&topic.topic.0));
            let source = match name {
                None => Err(UNKNOWN_TOPIC_OR_PARTITION),
                Some(_) if p.fetch_offset < 0 => Err(OFFSET_OUT_OF_RANGE),
                Some(partition) => {
                    entries.push(Entry {
                        queue: tenant.stored(&topic.topic.0),
                        partition,
                        offset: p.fetch_offset,
                        max_bytes: (p.partition_max_bytes.max(1) as usize).min(reads::MAX_ENTRY_BYTES),
                    });
                    Ok(entries.len() - 1)
                }
            };
            plan.push((t, p.partition, source));
        }
    }
    let mut parts = Parts::default();
    if !entries.is_empty() {
        let request = reads::Request {
            entries,
            max_bytes: (req.max_bytes.max(1) as usize).min(reads::MAX_CALL_BYTES),
            max_wait: Duration::from_millis(req.max_wait_ms.max(0) as u64).min(reads::MAX_WAIT),
            min_bytes: req.min_bytes.max(0) as usize,
        };
        let state = &kafka.state;
        let ring = state.coalescer.encryption().ring();
        match reads::fetch_into(&state.pool, ring.as_deref(), &state.pop.wake, state.pop.config(), &request, Parts::default).await {
            Ok((p, _)) => parts = p,
            Err(e) => {
                tracing::warn!(error = %e, "kafka fetch failed; the consumer retries");
                plan.iter_mut().filter(|(_, _, s)| s.is_ok()).for_each(|(_, _, s)| *s = Err(KAFKA_STORAGE_ERROR));
            }
        }
    }
    let mut r = FetchResponse::default();
    r.responses = req
        .topics
        .iter()
        .map(|t| {
            let mut out = FetchableTopicResponse::default();
            out.topic = t.topic.clone();
            out.topic_id = t.topic_id;
            out
        })
        .collect();
    for (t, index, source) in plan {
        let mut d = PartitionData::default();
        d.partition_index = index;
        d.preferred_read_replica = BrokerId(-1);
        d.aborted_transactions = Some(Vec::new());
        match source.map(|i| std::mem::take(&mut parts.parts[i])) {
            Err(code) => {
                d.error_code = code;
                d.high_watermark = -1;
                d.last_stable_offset = -1;
            }
            Ok(part) => {
                d.error_code = part.error;
                d.high_watermark = part.high_watermark;
                d.last_stable_offset = part.high_watermark;
                if version >= 5 {
                    d.log_start_offset = part.log_start;
                }
                if !part.records.is_empty() {
                    let mut out = Vec::new();
                    batch::encode(&mut out, &part.records);
                    d.records = Some(Bytes::from(out));
                }
            }
        }
        r.responses[t].partitions.push(d);
    }
    r
}
