//! Idempotent producers, durable: the producer ids InitProducerId hands
//! out, their epochs, and per (producer, topic, partition) the sequence
//! numbers and first offsets of the last five batches written, kept in
//! PostgreSQL beside the log (migrations/0036_kafka_producers.sql).
//!
//! Why in the database and in the records' transaction: a batch whose
//! answer was lost is sent again, to this broker after a restart or to
//! another broker of the database. Only a window written in the same
//! commit as the records tells every broker, at any later time, whether
//! they are there. So an idempotent producer's batches do not go through
//! the coalescer's shared commits: each Produce request's batches of one
//! producer are one transaction that locks the producer's row, reads the
//! windows, writes the batches that are new (through the transactions'
//! push path, `ack::transaction::push_in_at`, so a batch is never split
//! across commits), advances the windows, and commits: three round trips. A resend is answered with its original first offset; a gap
//! with OUT_OF_ORDER_SEQUENCE_NUMBER; a batch of an older epoch than the
//! producer's with INVALID_PRODUCER_EPOCH.
//!
//! A producer id this database does not know (it expired, or a broker of
//! the previous version handed it out) is taken as it comes: its first
//! batch opens a window whatever its sequence, as Kafka's own brokers do
//! once a producer's state is gone.

use deadpool_postgres::Pool;

use super::codes::*;
use crate::ack::transaction::{push_in_at, stage, TxnError};
use crate::db::DbError;
use crate::http::AppState;
use crate::tenancy::Tenant;
use super::produce::{first_offsets, push_items};

/// Batches remembered per window: Kafka's `max.in.flight` for idempotence
/// (the functions of 0036 keep the same five).
#[cfg(test)]
const REMEMBERED: usize = 5;

const INIT_SQL: &str = "SELECT o_producer, o_epoch FROM queen.kafka_init_producer_v2($1, $2, $3)";
const BEGIN_SQL: &str = "SELECT * FROM queen.kafka_produce_begin_v2($1, $2, $3, $4, $5)";
const RECORD_SQL: &str = "SELECT queen.kafka_produce_record_v1($1, $2, $3, $4, $5, $6, $7)";
const EXPIRE_SQL: &str = "SELECT queen.kafka_producers_expire_v2($1, $2, $3)";
const TXN_STATE_SQL: &str = "SELECT transactional_id, txn_state FROM queen.kafka_producers WHERE producer_id = $1";
const STAGE_SQL: &str = "SELECT queen.kafka_txn_stage_v1($1, $2, $3, $4, $5, $6)";

/// The producer fields of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequenced {
    pub producer_id: i64,
    pub epoch: i16,
    pub first: i32,
    pub count: i32,
    /// A transactional producer's batch: staged until its EndTxn.
    pub transactional: bool,
}

impl Sequenced {
    /// The batch's last sequence: Kafka's sequences wrap from i32::MAX to 0.
    fn last(&self) -> i32 {
        ((i64::from(self.first) + i64::from(self.count.max(1)) - 1) % (i64::from(i32::MAX) + 1)) as i32
    }
}

/// The sequence after `seq`.
fn next(seq: i32) -> i32 {
    if seq == i32::MAX { 0 } else { seq + 1 }
}

/// What to do with a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// New: write it.
    Write,
    /// Already written: answer this first offset.
    Duplicate(i64),
    /// Refuse it with this error code.
    Refuse(i16),
}

/// A partition's window as stored: its epoch and (first sequence, last
/// sequence, first offset) of the remembered batches, oldest first.
#[derive(Debug, Default)]
struct Window {
    epoch: i16,
    batches: Vec<(i32, i32, i64)>,
}

/// Whether `batch` is new, given the producer's current epoch and its
/// partition's window (None: none yet).
fn verdict(producer_epoch: i16, window: Option<&Window>, batch: Sequenced) -> Verdict {
    if batch.epoch < producer_epoch {
        return Verdict::Refuse(INVALID_PRODUCER_EPOCH);
    }
    let Some(w) = window else { return Verdict::Write };
    if batch.epoch < w.epoch {
        return Verdict::Refuse(INVALID_PRODUCER_EPOCH);
    }
    if batch.epoch > w.epoch {
        // A bumped epoch (KIP-360) starts its sequences afresh.
        return if batch.first == 0 { Verdict::Write } else { Verdict::Refuse(OUT_OF_ORDER_SEQUENCE_NUMBER) };
    }
    if let Some(&(_, _, offset)) = w.batches.iter().find(|(f, l, _)| *f == batch.first && *l == batch.last()) {
        return Verdict::Duplicate(offset);
    }
    match w.batches.last() {
        Some(&(_, last, _)) if batch.first != next(last) => Verdict::Refuse(OUT_OF_ORDER_SEQUENCE_NUMBER),
        _ => Verdict::Write,
    }
}

/// One partition's batch of an idempotent producer's request.
pub struct Lane<'a> {
    pub queue: &'a str,
    pub partition: &'a str,
    pub batch: Sequenced,
    /// The stored payloads of its records.
    pub payloads: &'a [String],
}

/// InitProducerId without a transactional id: a new producer id of
/// `tenant` (`bump` None), or KIP-360's next epoch of (id, epoch) (a new id
/// when another tenant holds that one). `Ok(None)`: the epoch given is not
/// the producer's (another session bumped it): fenced.
pub async fn init_producer(pool: &Pool, tenant: Tenant, bump: Option<(i64, i16)>) -> Result<Option<(i64, i16)>, DbError> {
    let (id, epoch) = bump.unwrap_or((-1, -1));
    let client = pool.get().await?;
    let stmt = client.prepare_cached(INIT_SQL).await?;
    let row = client.query_one(&stmt, &[&id, &epoch, &tenant.0]).await?;
    let (id, epoch): (i64, i16) = (row.get(0), row.get(1));
    Ok((epoch >= 0).then_some((id, epoch)))
}

/// Writes the batches of one producer (all `lanes` share its id and
/// epoch) in one transaction with their windows, and answers each lane's
/// first offset (its original one for a resend) or its error code. An
/// `Err` wrote nothing.
pub async fn produce(state: &AppState, tenant: Tenant, subject: Option<&str>, txn: Option<&str>, lanes: &[Lane<'_>]) -> Result<Vec<Result<i64, i16>>, TxnError> {
    let Some(first) = lanes.first() else { return Ok(Vec::new()) };
    let (producer, epoch) = (first.batch.producer_id, first.batch.epoch);
    let transactional = lanes.iter().any(|l| l.batch.transactional);
    let queues: Vec<&str> = lanes.iter().map(|l| l.queue).collect();
    let partitions: Vec<&str> = lanes.iter().map(|l| l.partition).collect();
    let client = state.pool.get().await.map_err(DbError::from)?;
    let (begin, record) = (client.prepare_cached(BEGIN_SQL).await?, client.prepare_cached(RECORD_SQL).await?);
    let (state_of, stage_sql) = (client.prepare_cached(TXN_STATE_SQL).await?, client.prepare_cached(STAGE_SQL).await?);
    // Three round trips: BEGIN with the lock and the windows, the batches'
    // segments in one call, the windows' advance with COMMIT. Statements are
    // prepared first, so each pipelined pair leaves in order.
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [&producer, &epoch, &queues, &partitions, &tenant.0];
    let one: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&producer];
    // The producer's transaction state only matters to a transactional batch.
    let txn_state = async {
        match transactional {
            true => client.query_opt(&state_of, &one).await,
            false => Ok(None),
        }
    };
    let (begun, rows, txn_state) = tokio::join!(client.batch_execute("BEGIN"), client.query(&begin, &params), txn_state);
    let written = async {
        begun?;
        let rows = rows?;
        let txn_state = txn_state?;
        if rows.len() != lanes.len() {
            return Err(DbError::Unexpected("kafka_produce_begin_v2 answered another count of windows".into()).into());
        }
        // A transaction's batch comes from its producer's current session,
        // inside an open transaction (AddPartitionsToTxn opened it).
        let (txn_id, open): (Option<String>, bool) = txn_state.map_or((None, false), |r| (r.get(0), r.get::<_, i16>(1) == 1));
        let refusal = match (transactional, txn) {
            (false, _) => 0,
            (true, Some(t)) if txn_id.as_deref() == Some(t) => if open { 0 } else { INVALID_TXN_STATE },
            (true, _) => INVALID_PRODUCER_ID_MAPPING,
        };
        let verdicts: Vec<Verdict> = lanes
            .iter()
            .zip(&rows)
            .map(|(lane, row)| {
                let window = row.get::<_, Option<i16>>("o_window_epoch").map(|epoch| {
                    let (f, l, o): (Vec<i32>, Vec<i32>, Vec<i64>) = (row.get("o_firsts"), row.get("o_lasts"), row.get("o_offsets"));
                    Window { epoch, batches: f.into_iter().zip(l).zip(o).map(|((f, l), o)| (f, l, o)).collect() }
                });
                match verdict(row.get("o_epoch"), window.as_ref(), lane.batch) {
                    Verdict::Write if refusal != 0 => Verdict::Refuse(refusal),
                    v => v,
                }
            })
            .collect();
        let writes: Vec<usize> = (0..lanes.len()).filter(|&i| verdicts[i] == Verdict::Write).collect();
        let items = push_items(writes.iter().map(|&i| (lanes[i].queue, lanes[i].partition, lanes[i].payloads)));
        let mut firsts: Vec<Option<i64>> = vec![None; lanes.len()];
        let mut pushed = Vec::new();
        if !items.is_empty() && transactional {
            // Staged as the segments they become; their offsets are given
            // at commit, so the answer and the window say -1.
            let staged = stage(&client, &state.coalescer, &items, subject).await?;
            let queues: Vec<&str> = staged.iter().map(|s| s.queue.as_str()).collect();
            let partitions: Vec<&str> = staged.iter().map(|s| s.partition.as_str()).collect();
            let counts: Vec<i32> = staged.iter().map(|s| s.hashes.len() as i32).collect();
            let hashes: Vec<i64> = staged.iter().flat_map(|s| s.hashes.iter().copied()).collect();
            let blobs: Vec<&[u8]> = staged.iter().map(|s| s.blob.as_slice()).collect();
            client.execute(&stage_sql, &[&producer, &queues, &partitions, &counts, &hashes, &blobs]).await?;
            writes.iter().for_each(|&i| firsts[i] = Some(-1));
        } else if !items.is_empty() {
            // The records' ids are minted here: from the tails read under
            // the producer's lock, the segments skip the dedup check.
            let tails: Vec<((&str, &str), (i64, i64))> = writes
                .iter()
                .filter_map(|&i| {
                    let row = &rows[i];
                    let tail = row.get::<_, Option<i64>>("o_partition_id").zip(row.get::<_, Option<i64>>("o_last_offset"));
                    tail.map(|t| ((lanes[i].queue, lanes[i].partition), t))
                })
                .collect();
            let written = push_in_at(&client, &state.coalescer, &items, subject, &tails)
                .await?
                .map_err(|dup| DbError::Unexpected(format!("a minted transactionId was found again: {dup}")))?;
            for (&i, first) in writes.iter().zip(first_offsets(written.outcomes.iter(), writes.iter().map(|&i| lanes[i].payloads.len()))) {
                firsts[i] = first;
            }
            pushed = written.pushed;
        }
        let recorded: Vec<usize> = writes.iter().copied().filter(|&i| firsts[i].is_some()).collect();
        let col = |f: &dyn Fn(usize) -> i32| recorded.iter().map(|&i| f(i)).collect::<Vec<i32>>();
        let (q, p): (Vec<&str>, Vec<&str>) = recorded.iter().map(|&i| (lanes[i].queue, lanes[i].partition)).unzip();
        let offsets: Vec<i64> = recorded.iter().filter_map(|&i| firsts[i]).collect();
        let (seq_firsts, seq_lasts) = (col(&|i| lanes[i].batch.first), col(&|i| lanes[i].batch.last()));
        // A COMMIT after a failed statement rolls back, and the failure is what is answered.
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [&producer, &epoch, &q, &p, &seq_firsts, &seq_lasts, &offsets];
        let (advanced, committed) = tokio::join!(client.execute(&record, &params), client.batch_execute("COMMIT"));
        advanced?;
        committed?;
        Ok::<_, TxnError>((verdicts, firsts, pushed))
    }
    .await;
    let (verdicts, firsts, pushed) = match written {
        Ok(w) => w,
        Err(e) => {
            // Whatever failed, the connection goes back to the pool outside a transaction.
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(e);
        }
    };
    for (queue, pid, partition, n) in pushed {
        state.committed_push(&queue, pid, &partition, n);
    }
    Ok(verdicts
        .into_iter()
        .zip(firsts)
        .map(|(v, first)| match v {
            // A batch of control records only has no offset of its own.
            Verdict::Write => Ok(first.unwrap_or(-1)),
            Verdict::Duplicate(offset) => Ok(offset),
            Verdict::Refuse(code) => Err(code),
        })
        .collect())
}

/// The producer-expiry pass: deletes up to `batch` producers with their
/// windows, idempotent ones idle for `idle`, transactional ids idle for
/// `txn_idle` (never one inside a transaction); `Ok(true)` when the batch
/// was full.
pub async fn expire(pool: &Pool, idle: std::time::Duration, txn_idle: std::time::Duration, batch: i32) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client.prepare_cached(EXPIRE_SQL).await?;
    let (idle, txn_idle) = (idle.as_secs() as i64, txn_idle.as_secs() as i64);
    let gone: i64 = client.query_one(&stmt, &[&idle, &txn_idle, &batch]).await?.get(0);
    if gone > 0 {
        tracing::debug!(producers = gone, "expired idle kafka producers");
    }
    Ok(gone >= i64::from(batch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(first: i32, count: i32) -> Sequenced {
        Sequenced { producer_id: 7, epoch: 0, first, count, transactional: false }
    }

    /// The window `batches` leave, as 0036's record function keeps it.
    fn window(epoch: i16, batches: &[(i32, i32, i64)]) -> Window {
        let keep = batches.len().saturating_sub(REMEMBERED);
        Window { epoch, batches: batches[keep..].to_vec() }
    }

    #[test]
    fn a_resent_batch_is_a_duplicate_a_gap_is_refused_and_an_old_epoch_is_fenced() {
        assert_eq!(verdict(0, None, b(0, 10)), Verdict::Write);
        assert_eq!(verdict(0, None, b(17, 1)), Verdict::Write, "no window: taken as it comes");
        let w = window(0, &[(0, 9, 100)]);
        assert_eq!(verdict(0, Some(&w), b(0, 10)), Verdict::Duplicate(100));
        assert_eq!(verdict(0, Some(&w), b(11, 5)), Verdict::Refuse(OUT_OF_ORDER_SEQUENCE_NUMBER));
        assert_eq!(verdict(0, Some(&w), b(10, 5)), Verdict::Write);
        let seven = [(0, 9, 100), (10, 14, 110), (15, 15, 115), (16, 16, 116), (17, 17, 117), (18, 18, 118), (19, 19, 119)];
        let w = window(0, &seven);
        assert_eq!(verdict(0, Some(&w), b(0, 10)), Verdict::Refuse(OUT_OF_ORDER_SEQUENCE_NUMBER), "only the last five are remembered");
        assert_eq!(verdict(0, Some(&w), b(19, 1)), Verdict::Duplicate(119));
        assert_eq!(verdict(0, Some(&w), b(15, 1)), Verdict::Duplicate(115));
        let bumped = Sequenced { epoch: 1, ..b(0, 1) };
        assert_eq!(verdict(1, Some(&w), bumped), Verdict::Write, "a bumped epoch starts at 0");
        assert_eq!(verdict(1, Some(&w), Sequenced { epoch: 1, ..b(5, 1) }), Verdict::Refuse(OUT_OF_ORDER_SEQUENCE_NUMBER));
        assert_eq!(verdict(1, Some(&w), b(20, 1)), Verdict::Refuse(INVALID_PRODUCER_EPOCH), "the producer's epoch fences");
        assert_eq!(verdict(0, Some(&window(1, &[(0, 0, 5)])), b(20, 1)), Verdict::Refuse(INVALID_PRODUCER_EPOCH), "so does the window's");
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        let w = window(0, &[(i32::MAX - 1, i32::MAX, 5)]);
        assert_eq!(b(i32::MAX - 1, 2).last(), i32::MAX);
        assert_eq!(b(i32::MAX, 2).last(), 0);
        assert_eq!(verdict(0, Some(&w), b(0, 1)), Verdict::Write);
    }
}
