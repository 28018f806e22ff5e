//! One ephemeral queue's state: its partitions' rings, its groups' cursors
//! and leases, its bounds and counters. Pure and synchronous (the caller
//! holds the queue's lock and passes the clock), so every rule is unit
//! tested here without a broker.
//!
//! Shaped like the durable log on purpose, so that one mental model covers
//! both: a partition is a FIFO ring addressed by a sequence number; every
//! group has one cursor per partition (the first sequence it has not
//! settled) and at most one lease per partition at a time, which is what
//! keeps a partition's messages in order; an ack settles a message, a nack
//! (`failed`/`retry`) gives it back to be delivered again with
//! `attempts + 1` until `retryLimit`, after which it is dropped and counted
//! (there is no DLQ: nothing here outlives the process). A message leaves
//! the ring once every group has settled it, or when a bound (length,
//! bytes, age) pushes it out.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use super::options::{Options, Policy};

/// Bytes a queued message costs beyond its payload (its allocation's
/// header and size-class slack, its ring slot, the instant, the order),
/// counted against the budgets so that they bound the memory and not only
/// the payloads. Measured: the broker's RSS grows by 193-204 MB per million
/// queued 100-byte payloads (docs/PERFORMANCE.md), i.e. the payload plus
/// about 96 bytes.
pub const MESSAGE_OVERHEAD: u64 = 96;

/// The group a pop without `group` uses (queue mode).
pub const QUEUE_MODE: &str = "__QUEUE_MODE__";

struct Message {
    payload: Arc<RawValue>,
    at: Instant,
    /// Push order across the queue's partitions (drop-oldest's key).
    order: u64,
}

impl Message {
    fn cost(&self) -> u64 {
        self.payload.get().len() as u64 + MESSAGE_OVERHEAD
    }
}

struct Partition {
    name: Arc<str>,
    /// Sequence of `ring[0]`.
    base: u64,
    ring: VecDeque<Message>,
    bytes: u64,
}

impl Partition {
    fn end(&self) -> u64 {
        self.base + self.ring.len() as u64
    }
}

struct Lease {
    no: u64,
    /// The delivered sequences, ascending, and which are answered (acked
    /// or nacked).
    seqs: Vec<u64>,
    answered: Vec<bool>,
    /// Messages of the lease not answered yet.
    open: usize,
    expires: Instant,
}

#[derive(Default)]
struct Cursor {
    /// First sequence this group has not settled.
    next: u64,
    /// Settled sequences above `next` (acked out of order, dropped).
    settled: BTreeSet<u64>,
    /// Deliveries so far of unsettled messages that were delivered.
    attempts: HashMap<u64, u32>,
    lease: Option<Lease>,
    lease_no: u64,
}

impl Cursor {
    fn settle(&mut self, seq: u64) {
        self.attempts.remove(&seq);
        if seq >= self.next {
            self.settled.insert(seq);
        }
        while self.settled.remove(&self.next) {
            self.next += 1;
        }
    }

    /// Moves past what the ring no longer holds.
    fn clamp(&mut self, base: u64) {
        if self.next < base {
            self.next = base;
            self.settled = self.settled.split_off(&base);
            self.attempts.retain(|&s, _| s >= base);
            while self.settled.remove(&self.next) {
                self.next += 1;
            }
        }
    }
}

struct Group {
    cursors: Vec<Cursor>,
    last_used: Instant,
}

/// A delivered message, as the pop answers it.
pub struct Delivered {
    pub id: String,
    pub partition: Arc<str>,
    pub payload: Arc<RawValue>,
    pub attempts: u32,
}

/// What an ack did to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Acked,
    /// Nacked: it will be delivered again.
    Redelivered,
    /// Nacked past `retryLimit`: settled and dropped.
    Dropped,
    /// The id names an earlier incarnation of the ring (a restart, a reset,
    /// a deleted queue).
    Stale,
    /// The id is not one this ring handed out, or its delivery's lease ended.
    Unknown,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Acked | Outcome::Dropped => "acked",
            Outcome::Redelivered => "redelivered",
            Outcome::Stale => "stale",
            Outcome::Unknown => "unknown",
        }
    }
}

/// Why a push was refused (nothing of it was queued).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Over the queue's bounds under `policy: reject`.
    Full { detail: String },
    /// Larger than the queue's bounds themselves.
    TooLarge { detail: String },
    /// Over the broker-wide budget.
    MemoryFull,
}

/// Counters since the queue was created.
#[derive(Default, Clone, Copy)]
pub struct Counters {
    pub pushed: u64,
    pub delivered: u64,
    pub acked: u64,
    pub dropped_full: u64,
    pub dropped_ttl: u64,
    pub dropped_retries: u64,
    pub refused: u64,
}

/// A message id: the broker incarnation, the ring's generation, the
/// partition, the sequence and the delivery's lease (0: committed at
/// delivery). Opaque to clients.
#[derive(Debug, PartialEq, Eq)]
pub struct MessageId {
    pub epoch: u64,
    pub generation: u64,
    pub partition: usize,
    pub seq: u64,
    pub lease: u64,
}

impl MessageId {
    pub fn render(&self) -> String {
        format!("{:x}.{:x}.{:x}.{:x}.{:x}", self.epoch, self.generation, self.partition, self.seq, self.lease)
    }

    pub fn parse(s: &str) -> Option<MessageId> {
        let mut it = s.split('.').map(|p| u64::from_str_radix(p, 16).ok());
        let id = MessageId {
            epoch: it.next()??,
            generation: it.next()??,
            partition: usize::try_from(it.next()??).ok()?,
            seq: it.next()??,
            lease: it.next()??,
        };
        it.next().is_none().then_some(id)
    }
}

/// One queue.
pub struct QueueState {
    pub options: Options,
    /// Configured through `/configure` (not only created by a push or pop).
    pub declared: bool,
    /// Bumped by a reset: ids of the ring before it answer `stale`.
    pub generation: u64,
    partitions: Vec<Partition>,
    by_name: HashMap<String, usize>,
    groups: HashMap<String, Group>,
    pub length: usize,
    pub bytes: u64,
    order: u64,
    rr: usize,
    pub counters: Counters,
    pub last_used: Instant,
}

impl QueueState {
    pub fn new(options: Options, generation: u64, now: Instant) -> QueueState {
        QueueState {
            options,
            declared: false,
            generation,
            partitions: Vec::new(),
            by_name: HashMap::new(),
            groups: HashMap::new(),
            length: 0,
            bytes: 0,
            order: 0,
            rr: 0,
            counters: Counters::default(),
            last_used: now,
        }
    }

    fn partition_index(&mut self, name: &str) -> usize {
        if let Some(&i) = self.by_name.get(name) {
            return i;
        }
        let i = self.partitions.len();
        self.partitions.push(Partition { name: Arc::from(name), base: 0, ring: VecDeque::new(), bytes: 0 });
        self.by_name.insert(name.to_string(), i);
        for g in self.groups.values_mut() {
            g.cursors.push(Cursor::default());
        }
        i
    }

    /// Plans a push of `payloads` into `partition`: the bytes it needs from
    /// the broker-wide budget beyond what it frees, or the refusal. Changes
    /// nothing; [`QueueState::push`] applies the plan.
    pub fn plan_push(&self, payloads: &[Arc<RawValue>]) -> Result<(u64, usize), Refusal> {
        let cost: u64 = payloads.iter().map(|p| p.get().len() as u64 + MESSAGE_OVERHEAD).sum();
        let (n, o) = (payloads.len(), &self.options);
        if n > o.max_length || cost > o.max_bytes {
            return Err(Refusal::TooLarge {
                detail: format!("{n} messages of {cost} bytes exceed the queue's bounds (maxLength {}, maxBytes {})", o.max_length, o.max_bytes),
            });
        }
        let fits = |len: usize, bytes: u64| len + n <= o.max_length && bytes + cost <= o.max_bytes;
        if fits(self.length, self.bytes) {
            return Ok((cost, 0));
        }
        if o.policy == Policy::Reject {
            return Err(Refusal::Full {
                detail: format!(
                    "the queue holds {} messages of {} bytes; {n} more of {cost} bytes exceed maxLength {} or maxBytes {}",
                    self.length, self.bytes, o.max_length, o.max_bytes
                ),
            });
        }
        // Drop-oldest: count what must go, oldest first across partitions.
        let mut heads: Vec<usize> = vec![0; self.partitions.len()];
        let (mut len, mut bytes, mut dropped) = (self.length, self.bytes, 0usize);
        let mut freed = 0u64;
        while !fits(len, bytes) {
            let Some((p, m)) = self
                .partitions
                .iter()
                .enumerate()
                .filter_map(|(p, part)| part.ring.get(heads[p]).map(|m| (p, m)))
                .min_by_key(|(_, m)| m.order)
            else {
                break;
            };
            heads[p] += 1;
            len -= 1;
            bytes -= m.cost();
            freed += m.cost();
            dropped += 1;
        }
        Ok((cost.saturating_sub(freed), dropped))
    }

    /// Applies a planned push: drops `drop_oldest` messages, then appends.
    /// Answers the bytes freed and added, for the broker-wide account.
    pub fn push(&mut self, partition: &str, payloads: Vec<Arc<RawValue>>, drop_oldest: usize, now: Instant) -> (u64, u64) {
        let mut freed = 0;
        for _ in 0..drop_oldest {
            let Some(p) = (0..self.partitions.len())
                .filter(|&p| !self.partitions[p].ring.is_empty())
                .min_by_key(|&p| self.partitions[p].ring[0].order)
            else {
                break;
            };
            freed += self.pop_front(p);
            self.counters.dropped_full += 1;
        }
        let p = self.partition_index(partition);
        let mut added = 0;
        let n = payloads.len();
        for payload in payloads {
            self.order += 1;
            let m = Message { payload, at: now, order: self.order };
            added += m.cost();
            let part = &mut self.partitions[p];
            part.bytes += m.cost();
            part.ring.push_back(m);
        }
        self.length += n;
        self.bytes += added;
        self.counters.pushed += n as u64;
        self.last_used = now;
        (freed, added)
    }

    /// Removes a partition's oldest message; its bytes.
    fn pop_front(&mut self, p: usize) -> u64 {
        let part = &mut self.partitions[p];
        let Some(m) = part.ring.pop_front() else { return 0 };
        part.base += 1;
        part.bytes -= m.cost();
        self.length -= 1;
        self.bytes -= m.cost();
        m.cost()
    }

    /// Drops what every group has settled from the front of partition `p`
    /// (nothing while no group exists: the first consumer sees it all).
    fn trim(&mut self, p: usize) -> u64 {
        let Some(low) = self.groups.values().map(|g| g.cursors[p].next).min() else { return 0 };
        let mut freed = 0;
        while self.partitions[p].base < low && !self.partitions[p].ring.is_empty() {
            freed += self.pop_front(p);
        }
        freed
    }

    /// Drops messages older than the queue's TTL; the bytes freed.
    pub fn expire(&mut self, now: Instant) -> u64 {
        let Some(ttl) = self.options.ttl else { return 0 };
        let mut freed = 0;
        for p in 0..self.partitions.len() {
            while self.partitions[p].ring.front().is_some_and(|m| now.saturating_duration_since(m.at) >= ttl) {
                freed += self.pop_front(p);
                self.counters.dropped_ttl += 1;
            }
        }
        freed
    }

    /// Forgets groups unused for `idle` (they no longer hold the ring);
    /// the bytes this frees.
    pub fn forget_idle_groups(&mut self, idle: Duration, now: Instant) -> u64 {
        let before = self.groups.len();
        self.groups.retain(|_, g| now.saturating_duration_since(g.last_used) < idle);
        if self.groups.len() == before {
            return 0;
        }
        (0..self.partitions.len()).map(|p| self.trim(p)).sum()
    }

    /// Drops every message, rewinds every group and voids every lease;
    /// `(dropped, bytes freed)`.
    pub fn reset(&mut self, generation: u64) -> (usize, u64) {
        let (n, bytes) = (self.length, self.bytes);
        for part in &mut self.partitions {
            part.base += part.ring.len() as u64;
            part.ring.clear();
            part.bytes = 0;
        }
        self.groups.clear();
        self.length = 0;
        self.bytes = 0;
        self.generation = generation;
        (n, bytes)
    }

    fn group(&mut self, name: &str, now: Instant) -> &mut Group {
        if !self.groups.contains_key(name) {
            let cursors = self.partitions.iter().map(|p| Cursor { next: p.base, ..Cursor::default() }).collect();
            self.groups.insert(name.to_string(), Group { cursors, last_used: now });
        }
        let g = self.groups.get_mut(name).expect("just made");
        g.last_used = now;
        g
    }

    /// Ends `group`'s expired lease on partition `p`: its unsettled
    /// messages are due again, or dropped past the retry limit.
    fn expire_lease(&mut self, group: &str, p: usize, now: Instant) {
        let limit = self.options.retry_limit;
        let Some(g) = self.groups.get_mut(group) else { return };
        let c = &mut g.cursors[p];
        if c.lease.as_ref().is_none_or(|l| l.expires > now) {
            return;
        }
        let lease = c.lease.take().expect("checked");
        for (seq, answered) in lease.seqs.into_iter().zip(lease.answered) {
            if !answered && seq >= c.next && !c.settled.contains(&seq) && c.attempts.get(&seq).is_some_and(|&a| a > limit) {
                c.settle(seq);
                self.counters.dropped_retries += 1;
            }
        }
    }

    /// Messages `group` could take from partition `p` now, at most `max`.
    fn available(&mut self, group: &str, p: usize, max: usize, now: Instant) -> Vec<u64> {
        self.expire_lease(group, p, now);
        let (base, end) = (self.partitions[p].base, self.partitions[p].end());
        let c = &mut self.groups.get_mut(group).expect("group exists").cursors[p];
        if c.lease.is_some() {
            return Vec::new();
        }
        c.clamp(base);
        let mut out = Vec::new();
        let mut seq = c.next;
        while seq < end && out.len() < max {
            if !c.settled.contains(&seq) {
                out.push(seq);
            }
            seq += 1;
        }
        out
    }

    /// How many messages a pop by `group` would find now (for a window
    /// buffer), at most `max`.
    pub fn ready(&mut self, group: &str, partition: Option<&str>, max: usize, now: Instant) -> usize {
        self.group(group, now);
        let parts: Vec<usize> = match partition {
            Some(name) => self.by_name.get(name).copied().into_iter().collect(),
            None => (0..self.partitions.len()).collect(),
        };
        let mut n = 0;
        for p in parts {
            n += self.available(group, p, max - n, now).len();
            if n >= max {
                break;
            }
        }
        n
    }

    /// Takes up to `batch` messages for `group` (from `partition`, or from
    /// the partitions in turn), leased for the queue's lease time or, with
    /// `commit`, settled at delivery. Also answers the earliest instant a
    /// lease of this group ends (a waiting pop wakes then).
    pub fn pop(&mut self, epoch: u64, group: &str, partition: Option<&str>, batch: usize, commit: bool, now: Instant) -> (Vec<Delivered>, Option<Instant>) {
        self.expire(now);
        self.group(group, now);
        self.last_used = now;
        let n_parts = self.partitions.len();
        let order: Vec<usize> = match partition {
            Some(name) => self.by_name.get(name).copied().into_iter().collect(),
            None => (0..n_parts).map(|k| (self.rr + k) % n_parts.max(1)).collect(),
        };
        if partition.is_none() && n_parts > 0 {
            self.rr = (self.rr + 1) % n_parts;
        }
        let mut out = Vec::new();
        for p in order {
            if out.len() >= batch {
                break;
            }
            let seqs = self.available(group, p, batch - out.len(), now);
            if seqs.is_empty() {
                // What an ended lease dropped may now leave the ring.
                self.trim(p);
                continue;
            }
            let lease_time = self.options.lease;
            let (generation, part) = (self.generation, &self.partitions[p]);
            let c = &mut self.groups.get_mut(group).expect("group exists").cursors[p];
            let lease = if commit {
                0
            } else {
                c.lease_no += 1;
                c.lease_no
            };
            for &seq in &seqs {
                let attempts = c.attempts.entry(seq).or_insert(0);
                *attempts += 1;
                let m = &part.ring[(seq - part.base) as usize];
                out.push(Delivered {
                    id: MessageId { epoch, generation, partition: p, seq, lease }.render(),
                    partition: part.name.clone(),
                    payload: m.payload.clone(),
                    attempts: *attempts,
                });
            }
            if commit {
                for &seq in &seqs {
                    c.settle(seq);
                }
                self.counters.acked += seqs.len() as u64;
                self.trim(p);
            } else {
                let open = seqs.len();
                c.lease = Some(Lease { no: lease, answered: vec![false; open], seqs, open, expires: now + lease_time });
            }
        }
        self.counters.delivered += out.len() as u64;
        let next_expiry = self.groups[group].cursors.iter().filter_map(|c| c.lease.as_ref().map(|l| l.expires)).min();
        (out, next_expiry)
    }

    /// Acks (`settle`) or nacks one delivered message of `group`.
    pub fn ack(&mut self, epoch: u64, group: &str, id: &str, settle: bool, now: Instant) -> Outcome {
        let Some(id) = MessageId::parse(id) else { return Outcome::Unknown };
        if id.epoch != epoch || id.generation != self.generation {
            return Outcome::Stale;
        }
        if id.partition >= self.partitions.len() {
            return Outcome::Unknown;
        }
        let limit = self.options.retry_limit;
        let p = id.partition;
        let Some(g) = self.groups.get_mut(group) else { return Outcome::Unknown };
        g.last_used = now;
        let c = &mut g.cursors[p];
        let slot = c.lease.as_ref().filter(|l| l.no == id.lease).and_then(|l| l.seqs.binary_search(&id.seq).ok());
        let Some(slot) = slot.filter(|&k| !c.lease.as_ref().expect("found").answered[k]) else {
            // Settled already (a repeated ack): the same answer again.
            let done = id.seq < c.next || c.settled.contains(&id.seq);
            return if done && settle { Outcome::Acked } else { Outcome::Unknown };
        };
        if c.settled.contains(&id.seq) || id.seq < c.next {
            return Outcome::Acked;
        }
        let outcome = if settle {
            c.settle(id.seq);
            Outcome::Acked
        } else if c.attempts.get(&id.seq).is_some_and(|&a| a > limit) {
            c.settle(id.seq);
            Outcome::Dropped
        } else {
            Outcome::Redelivered
        };
        let lease = c.lease.as_mut().expect("live");
        lease.answered[slot] = true;
        lease.open -= 1;
        if lease.open == 0 {
            c.lease = None;
        }
        match outcome {
            Outcome::Acked => self.counters.acked += 1,
            Outcome::Dropped => self.counters.dropped_retries += 1,
            _ => {}
        }
        self.trim(p);
        outcome
    }

    /// `(partition, depth, bytes)` of every partition.
    pub fn partitions(&self) -> impl Iterator<Item = (&str, usize, u64)> {
        self.partitions.iter().map(|p| (&*p.name, p.ring.len(), p.bytes))
    }

    /// `(group, pending, in flight)` of every group: messages it has not
    /// settled, and of those the ones under a lease.
    pub fn groups(&self) -> Vec<(String, u64, u64)> {
        let mut out: Vec<(String, u64, u64)> = self
            .groups
            .iter()
            .map(|(name, g)| {
                let mut pending = 0;
                let mut leased = 0;
                for (c, part) in g.cursors.iter().zip(&self.partitions) {
                    let from = c.next.max(part.base);
                    pending += part.end().saturating_sub(from).saturating_sub(c.settled.range(from..).count() as u64);
                    leased += c.lease.as_ref().map_or(0, |l| l.open as u64);
                }
                (name.clone(), pending, leased)
            })
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Options {
        Options {
            max_bytes: 1 << 20,
            max_length: 100,
            policy: Policy::Reject,
            ttl: None,
            lease: Duration::from_secs(10),
            retry_limit: 2,
            window_buffer: None,
        }
    }

    fn payloads(range: std::ops::Range<u32>) -> Vec<Arc<RawValue>> {
        range.map(|i| Arc::from(RawValue::from_string(i.to_string()).unwrap())).collect()
    }

    fn values(d: &[Delivered]) -> Vec<u32> {
        d.iter().map(|m| m.payload.get().parse().unwrap()).collect()
    }

    fn queue(n: u32) -> (QueueState, Instant) {
        let now = Instant::now();
        let mut q = QueueState::new(opts(), 1, now);
        let (need, drop) = q.plan_push(&payloads(0..n)).unwrap();
        assert_eq!(drop, 0);
        assert!(need > 0);
        q.push("p", payloads(0..n), 0, now);
        (q, now)
    }

    #[test]
    fn a_partition_is_leased_to_one_consumer_of_a_group_at_a_time_and_in_order() {
        let (mut q, now) = queue(5);
        let (a, _) = q.pop(7, "g", None, 2, false, now);
        assert_eq!(values(&a), [0, 1]);
        let (b, _) = q.pop(7, "g", None, 2, false, now);
        assert!(b.is_empty(), "the partition is leased");
        // Another group has its own cursor over the same ring.
        let (other, _) = q.pop(7, "h", None, 10, false, now);
        assert_eq!(values(&other), [0, 1, 2, 3, 4]);
        assert_eq!(q.ack(7, "g", &a[0].id, true, now), Outcome::Acked);
        assert_eq!(q.ack(7, "g", &a[1].id, true, now), Outcome::Acked);
        let (c, _) = q.pop(7, "g", None, 10, false, now);
        assert_eq!(values(&c), [2, 3, 4]);
    }

    #[test]
    fn a_nack_redelivers_first_with_attempts_up_to_the_limit_then_drops() {
        let (mut q, now) = queue(2);
        for attempt in 1..=3 {
            let (m, _) = q.pop(7, "g", None, 1, false, now);
            assert_eq!(values(&m), [0]);
            assert_eq!(m[0].attempts, attempt);
            let want = if attempt <= 2 { Outcome::Redelivered } else { Outcome::Dropped };
            assert_eq!(q.ack(7, "g", &m[0].id, false, now), want);
        }
        let (m, _) = q.pop(7, "g", None, 5, false, now);
        assert_eq!(values(&m), [1]);
        assert_eq!(q.counters.dropped_retries, 1);
    }

    #[test]
    fn an_expired_lease_gives_its_unacked_messages_back_and_fences_its_ids() {
        let (mut q, now) = queue(3);
        let (m, expiry) = q.pop(7, "g", None, 3, false, now);
        assert_eq!(expiry, Some(now + Duration::from_secs(10)));
        assert_eq!(q.ack(7, "g", &m[1].id, true, now), Outcome::Acked);
        let later = now + Duration::from_secs(11);
        let (again, _) = q.pop(7, "g", None, 3, false, later);
        assert_eq!(values(&again), [0, 2], "the acked one is not delivered again");
        assert_eq!(again[0].attempts, 2);
        // The first delivery's ids no longer settle anything.
        assert_eq!(q.ack(7, "g", &m[0].id, true, later), Outcome::Unknown);
        assert_eq!(q.ack(7, "g", &again[0].id, true, later), Outcome::Acked);
        // A repeated ack of a settled message answers the same.
        assert_eq!(q.ack(7, "g", &again[0].id, true, later), Outcome::Acked);
    }

    #[test]
    fn ids_of_another_incarnation_or_generation_are_stale() {
        let (mut q, now) = queue(2);
        let (m, _) = q.pop(7, "g", None, 1, false, now);
        assert_eq!(q.ack(8, "g", &m[0].id, true, now), Outcome::Stale);
        assert_eq!(q.ack(7, "g", "nonsense", true, now), Outcome::Unknown);
        assert_eq!(q.reset(2), (2, 2 * (1 + MESSAGE_OVERHEAD)));
        assert_eq!(q.ack(7, "g", &m[0].id, true, now), Outcome::Stale);
        assert_eq!(q.length, 0);
    }

    #[test]
    fn settled_messages_leave_the_ring_only_when_every_group_settled_them() {
        let (mut q, now) = queue(4);
        assert_eq!(q.ready("b", None, 10, now), 4, "b is a group from now on");
        let (a, _) = q.pop(7, "a", None, 4, true, now);
        assert_eq!(a.len(), 4);
        assert_eq!(q.length, 4, "group b has not read them");
        let (b, _) = q.pop(7, "b", None, 2, true, now);
        assert_eq!(b.len(), 2);
        assert_eq!(q.length, 2);
        // An idle group stops holding the ring.
        let (none, _) = q.pop(7, "a", None, 4, true, now + Duration::from_secs(2));
        assert!(none.is_empty());
        let freed = q.forget_idle_groups(Duration::from_secs(1), now + Duration::from_millis(2500));
        assert_eq!(freed, 2 * (1 + MESSAGE_OVERHEAD));
        assert_eq!(q.length, 0);
    }

    #[test]
    fn bounds_refuse_or_drop_the_oldest_whole() {
        let now = Instant::now();
        let mut q = QueueState::new(Options { max_length: 3, ..opts() }, 1, now);
        q.push("a", payloads(0..2), 0, now);
        q.push("b", payloads(10..11), 0, now);
        assert!(matches!(q.plan_push(&payloads(0..1)), Err(Refusal::Full { .. })));
        assert!(matches!(q.plan_push(&payloads(0..4)), Err(Refusal::TooLarge { .. })));
        q.options.policy = Policy::DropOldest;
        let (_, drop) = q.plan_push(&payloads(20..22)).unwrap();
        assert_eq!(drop, 2);
        q.push("b", payloads(20..22), drop, now);
        let (m, _) = q.pop(7, "g", None, 10, true, now);
        let mut got = values(&m);
        got.sort();
        assert_eq!(got, [10, 20, 21], "the two oldest (a's) were dropped");
        assert_eq!(q.counters.dropped_full, 2);
    }

    #[test]
    fn ttl_drops_what_is_too_old() {
        let (mut q, now) = queue(3);
        q.options.ttl = Some(Duration::from_secs(5));
        assert_eq!(q.expire(now + Duration::from_secs(4)), 0);
        assert!(q.expire(now + Duration::from_secs(5)) > 0);
        assert_eq!(q.length, 0);
        assert_eq!(q.counters.dropped_ttl, 3);
    }
}
