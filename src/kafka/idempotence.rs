//! Idempotent producers, as far as one broker process can keep them: the
//! producer ids InitProducerId hands out, and per (producer, topic,
//! partition) the sequence numbers of the last five batches written, so a
//! resent batch is answered with its first offset instead of being written
//! twice, and a gap is refused (OUT_OF_ORDER_SEQUENCE_NUMBER).
//!
//! Why in memory: every current client turns idempotence on by default
//! (librdkafka when asked, the Java client since 3.0, kafka-python 3), and
//! a broker that refused InitProducerId would refuse them all. Producer ids
//! come from a PostgreSQL sequence (migrations/0026), so they are unique
//! across brokers and restarts; the windows are not durable. After a
//! restart, or on another broker, a producer's first batch starts a new
//! window whatever its sequence: at most the batches in flight across the
//! restart can be written twice (at-least-once), which is what Kafka's own
//! brokers promise when they lose a producer's state. Keeping the windows
//! in PostgreSQL, in the transaction of the records, is issue 48.
//!
//! Bounded: at most [`MAX_WINDOWS`] windows; past that the least recently
//! used half is forgotten.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;
use super::codes::*;

/// Batches remembered per window: Kafka's `max.in.flight` for idempotence.
const REMEMBERED: usize = 5;
/// Windows kept at most.
pub const MAX_WINDOWS: usize = 100_000;


/// The producer fields of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequenced {
    pub producer_id: i64,
    pub epoch: i16,
    pub first: i32,
    pub count: i32,
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
    /// Write it, then [`Producers::written`].
    Write,
    /// Already written: answer this first offset.
    Duplicate(i64),
    /// Refuse it with this error code.
    Refuse(i16),
}

struct Window {
    epoch: i16,
    /// (first sequence, last sequence, first offset), oldest first.
    batches: VecDeque<(i32, i32, i64)>,
    used: Instant,
}

type Key = (i64, String, i32);

/// The windows of this broker.
#[derive(Default)]
pub struct Producers {
    windows: Mutex<HashMap<Key, Window>>,
}

impl Producers {
    /// Whether `batch` of `topic`/`partition` is to be written.
    pub fn check(&self, topic: &str, partition: i32, batch: Sequenced) -> Verdict {
        let mut windows = self.windows.lock().expect("producers lock");
        let Some(w) = windows.get_mut(&(batch.producer_id, topic.to_string(), partition)) else { return Verdict::Write };
        w.used = Instant::now();
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
        match w.batches.back() {
            Some(&(_, last, _)) if batch.first != next(last) => Verdict::Refuse(OUT_OF_ORDER_SEQUENCE_NUMBER),
            _ => Verdict::Write,
        }
    }

    /// Records a written batch and its first offset.
    pub fn written(&self, topic: &str, partition: i32, batch: Sequenced, offset: i64) {
        let mut windows = self.windows.lock().expect("producers lock");
        if windows.len() >= MAX_WINDOWS {
            let mut ages: Vec<(Instant, Key)> = windows.iter().map(|(k, w)| (w.used, k.clone())).collect();
            ages.sort_unstable_by_key(|(t, _)| *t);
            for (_, k) in ages.into_iter().take(MAX_WINDOWS / 2) {
                windows.remove(&k);
            }
        }
        let w = windows
            .entry((batch.producer_id, topic.to_string(), partition))
            .or_insert_with(|| Window { epoch: batch.epoch, batches: VecDeque::new(), used: Instant::now() });
        if batch.epoch != w.epoch {
            w.epoch = batch.epoch;
            w.batches.clear();
        }
        w.used = Instant::now();
        w.batches.push_back((batch.first, batch.last(), offset));
        while w.batches.len() > REMEMBERED {
            w.batches.pop_front();
        }
    }

    /// Forgets a producer's windows (its epoch was bumped).
    pub fn forget(&self, producer_id: i64) {
        self.windows.lock().expect("producers lock").retain(|(p, ..), _| *p != producer_id);
    }

    pub fn len(&self) -> usize {
        self.windows.lock().expect("producers lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(first: i32, count: i32) -> Sequenced {
        Sequenced { producer_id: 7, epoch: 0, first, count }
    }

    #[test]
    fn a_resent_batch_is_a_duplicate_a_gap_is_refused_and_an_old_epoch_is_fenced() {
        let p = Producers::default();
        assert_eq!(p.check("t", 0, b(0, 10)), Verdict::Write);
        p.written("t", 0, b(0, 10), 100);
        assert_eq!(p.check("t", 0, b(0, 10)), Verdict::Duplicate(100));
        assert_eq!(p.check("t", 0, b(11, 5)), Verdict::Refuse(OUT_OF_ORDER_SEQUENCE_NUMBER));
        assert_eq!(p.check("t", 0, b(10, 5)), Verdict::Write);
        p.written("t", 0, b(10, 5), 110);
        assert_eq!(p.check("t", 1, b(3, 1)), Verdict::Write, "another partition: its own window");
        for i in 0..5 {
            p.written("t", 0, b(15 + i, 1), 115 + i as i64);
        }
        assert_eq!(p.check("t", 0, b(0, 10)), Verdict::Refuse(OUT_OF_ORDER_SEQUENCE_NUMBER), "only the last five are remembered");
        assert_eq!(p.check("t", 0, b(19, 1)), Verdict::Duplicate(119));
        let bumped = Sequenced { epoch: 1, ..b(0, 1) };
        assert_eq!(p.check("t", 0, bumped), Verdict::Write);
        p.written("t", 0, bumped, 200);
        assert_eq!(p.check("t", 0, b(20, 1)), Verdict::Refuse(INVALID_PRODUCER_EPOCH));
        p.forget(7);
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        let p = Producers::default();
        p.written("t", 0, b(i32::MAX - 1, 2), 5);
        assert_eq!(p.check("t", 0, b(0, 1)), Verdict::Write);
    }
}
