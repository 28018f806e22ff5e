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
//!
//! What the queue's bookkeeping costs is counted too ([`QueueState::overhead`]:
//! a fixed amount per partition, per group and per cursor, plus their
//! names), so that `QUEEN_EPHEMERAL_MAX_MB` bounds the memory a client can
//! make the broker hold, not only the payloads. A group's cursors are sparse
//! (a partition it never read costs it nothing), a cursor that knows nothing
//! beyond "start at the ring's head" is dropped, and a partition that is
//! empty, unleased and unwritten for the idle time is removed
//! ([`QueueState::forget_idle_partitions`]); its number is never reused, so
//! an id of it answers `unknown`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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

/// Bookkeeping counted against the broker-wide budget beyond the names:
/// a partition's ring and map entries, a group's entry, a cursor's entry
/// (estimates of their allocations, rounded up).
pub const PARTITION_OVERHEAD: u64 = 192;
pub const GROUP_OVERHEAD: u64 = 128;
pub const CURSOR_OVERHEAD: u64 = 160;

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
    /// Last push into it (an empty partition idle this long goes).
    last_push: Instant,
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
    /// Knows nothing a missing cursor would not: no lease, nothing settled
    /// or counted, and not past the ring's head.
    fn is_blank(&self, base: u64) -> bool {
        self.lease.is_none() && self.settled.is_empty() && self.attempts.is_empty() && self.next <= base
    }

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

/// A group: one cursor per partition it has read (a missing one starts at
/// the ring's head).
struct Group {
    cursors: HashMap<usize, Cursor>,
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
    /// By partition number, in creation order (numbers are never reused).
    partitions: BTreeMap<usize, Partition>,
    by_name: HashMap<String, usize>,
    next_partition: usize,
    /// Bytes of bookkeeping (partitions, groups, cursors), see the module.
    pub overhead: u64,
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
            partitions: BTreeMap::new(),
            by_name: HashMap::new(),
            next_partition: 0,
            overhead: 0,
            groups: HashMap::new(),
            length: 0,
            bytes: 0,
            order: 0,
            rr: 0,
            counters: Counters::default(),
            last_used: now,
        }
    }

    /// What the queue holds for the broker-wide budget: messages and
    /// bookkeeping.
    pub fn footprint(&self) -> u64 {
        self.bytes + self.overhead
    }

    fn partition_cost(name: &str) -> u64 {
        PARTITION_OVERHEAD + 2 * name.len() as u64
    }

    fn partition_index(&mut self, name: &str, now: Instant) -> usize {
        if let Some(&i) = self.by_name.get(name) {
            return i;
        }
        let i = self.next_partition;
        self.next_partition += 1;
        self.partitions.insert(i, Partition { name: Arc::from(name), last_push: now, base: 0, ring: VecDeque::new(), bytes: 0 });
        self.by_name.insert(name.to_string(), i);
        self.overhead += Self::partition_cost(name);
        i
    }

    /// The cursor of `group` on partition `p`, made at the ring's head if
    /// it has none.
    fn cursor(&mut self, group: &str, p: usize) -> &mut Cursor {
        let base = self.partitions[&p].base;
        let g = self.groups.get_mut(group).expect("group exists");
        if !g.cursors.contains_key(&p) {
            self.overhead += CURSOR_OVERHEAD;
        }
        g.cursors.entry(p).or_insert_with(|| Cursor { next: base, ..Cursor::default() })
    }

    /// Drops `group`'s cursor of `p` if it knows nothing beyond the ring's
    /// head (so a group that keeps up holds no cursors between reads).
    fn drop_blank_cursor(&mut self, group: &str, p: usize) {
        let Some(base) = self.partitions.get(&p).map(|part| part.base) else { return };
        let Some(g) = self.groups.get_mut(group) else { return };
        if g.cursors.get(&p).is_some_and(|c| c.is_blank(base)) {
            g.cursors.remove(&p);
            self.overhead -= CURSOR_OVERHEAD;
        }
    }

    /// Where `group` stands on `p`: its cursor's next, or the ring's head.
    fn next_of(g: &Group, p: usize, base: u64) -> u64 {
        g.cursors.get(&p).map_or(base, |c| c.next)
    }

    /// Plans a push of `payloads` into `partition`: the bytes it needs from
    /// the broker-wide budget beyond what it frees, or the refusal. Changes
    /// nothing; [`QueueState::push`] applies the plan.
    pub fn plan_push(&self, partition: &str, payloads: &[Arc<RawValue>]) -> Result<(u64, usize), Refusal> {
        let cost: u64 = payloads.iter().map(|p| p.get().len() as u64 + MESSAGE_OVERHEAD).sum();
        // A new partition's bookkeeping is the broker's, not the queue's
        // bounds': it is reserved from the budget with the messages.
        let bookkeeping = if self.by_name.contains_key(partition) { 0 } else { Self::partition_cost(partition) };
        let (n, o) = (payloads.len(), &self.options);
        if n > o.max_length || cost > o.max_bytes {
            return Err(Refusal::TooLarge {
                detail: format!("{n} messages of {cost} bytes exceed the queue's bounds (maxLength {}, maxBytes {})", o.max_length, o.max_bytes),
            });
        }
        let fits = |len: usize, bytes: u64| len + n <= o.max_length && bytes + cost <= o.max_bytes;
        if fits(self.length, self.bytes) {
            return Ok((cost + bookkeeping, 0));
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
        let mut heads: HashMap<usize, usize> = HashMap::new();
        let (mut len, mut bytes, mut dropped) = (self.length, self.bytes, 0usize);
        let mut freed = 0u64;
        while !fits(len, bytes) {
            let Some((p, m)) = self
                .partitions
                .iter()
                .filter_map(|(&p, part)| part.ring.get(heads.get(&p).copied().unwrap_or(0)).map(|m| (p, m)))
                .min_by_key(|(_, m)| m.order)
            else {
                break;
            };
            *heads.entry(p).or_insert(0) += 1;
            len -= 1;
            bytes -= m.cost();
            freed += m.cost();
            dropped += 1;
        }
        Ok(((cost + bookkeeping).saturating_sub(freed), dropped))
    }

    /// Applies a planned push: drops `drop_oldest` messages, then appends.
    /// Answers the bytes freed and added, for the broker-wide account.
    pub fn push(&mut self, partition: &str, payloads: Vec<Arc<RawValue>>, drop_oldest: usize, now: Instant) -> (u64, u64) {
        let mut freed = 0;
        for _ in 0..drop_oldest {
            let Some(p) = self.partitions.iter().filter(|(_, part)| !part.ring.is_empty()).min_by_key(|(_, part)| part.ring[0].order).map(|(&p, _)| p)
            else {
                break;
            };
            freed += self.pop_front(p);
            self.counters.dropped_full += 1;
        }
        let before = self.overhead;
        let p = self.partition_index(partition, now);
        let mut added = self.overhead - before;
        let n = payloads.len();
        for payload in payloads {
            self.order += 1;
            let m = Message { payload, at: now, order: self.order };
            added += m.cost();
            let part = self.partitions.get_mut(&p).expect("just made");
            part.bytes += m.cost();
            part.ring.push_back(m);
        }
        self.partitions.get_mut(&p).expect("just made").last_push = now;
        self.length += n;
        self.bytes += added - (self.overhead - before);
        self.counters.pushed += n as u64;
        self.last_used = now;
        (freed, added)
    }

    /// Removes a partition's oldest message; its bytes.
    fn pop_front(&mut self, p: usize) -> u64 {
        let part = self.partitions.get_mut(&p).expect("a live partition");
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
        let base = self.partitions[&p].base;
        let Some(low) = self.groups.values().map(|g| Self::next_of(g, p, base)).min() else { return 0 };
        let mut freed = 0;
        while self.partitions[&p].base < low && !self.partitions[&p].ring.is_empty() {
            freed += self.pop_front(p);
        }
        freed
    }

    /// Drops messages older than the queue's TTL; the bytes freed.
    pub fn expire(&mut self, now: Instant) -> u64 {
        let Some(ttl) = self.options.ttl else { return 0 };
        let mut freed = 0;
        let keys: Vec<usize> = self.partitions.keys().copied().collect();
        for p in keys {
            while self.partitions[&p].ring.front().is_some_and(|m| now.saturating_duration_since(m.at) >= ttl) {
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
        let mut released = 0;
        self.groups.retain(|name, g| {
            let keep = now.saturating_duration_since(g.last_used) < idle;
            if !keep {
                released += Self::group_cost(name) + CURSOR_OVERHEAD * g.cursors.len() as u64;
            }
            keep
        });
        self.overhead -= released;
        if self.groups.len() == before {
            return 0;
        }
        let keys: Vec<usize> = self.partitions.keys().copied().collect();
        keys.into_iter().map(|p| self.trim(p)).sum()
    }

    /// Drops the cursors that know nothing, then removes the partitions that
    /// are empty, leased by no group and unwritten for `idle`.
    pub fn forget_idle_partitions(&mut self, idle: Duration, now: Instant) {
        let mut dropped = 0u64;
        for g in self.groups.values_mut() {
            let before = g.cursors.len();
            let partitions = &self.partitions;
            g.cursors.retain(|p, c| !partitions.get(p).is_none_or(|part| c.is_blank(part.base)));
            dropped += (before - g.cursors.len()) as u64;
        }
        self.overhead -= dropped * CURSOR_OVERHEAD;
        let held: std::collections::HashSet<usize> = self.groups.values().flat_map(|g| g.cursors.keys().copied()).collect();
        let gone: Vec<usize> = self
            .partitions
            .iter()
            .filter(|(p, part)| part.ring.is_empty() && !held.contains(p) && now.saturating_duration_since(part.last_push) >= idle)
            .map(|(&p, _)| p)
            .collect();
        for p in gone {
            let part = self.partitions.remove(&p).expect("listed");
            self.by_name.remove(&*part.name);
            self.overhead -= Self::partition_cost(&part.name);
        }
    }

    fn group_cost(name: &str) -> u64 {
        GROUP_OVERHEAD + name.len() as u64
    }

    /// How many partitions the queue holds (empty ones too, until they go).
    pub fn partition_count(&self) -> usize {
        self.partitions.len()
    }

    /// Drops every message, rewinds every group and voids every lease;
    /// `(dropped, bytes freed)`.
    pub fn reset(&mut self, generation: u64) -> (usize, u64) {
        let (n, bytes) = (self.length, self.bytes);
        for part in self.partitions.values_mut() {
            part.base += part.ring.len() as u64;
            part.ring.clear();
            part.bytes = 0;
        }
        let cursors: u64 = self.groups.values().map(|g| g.cursors.len() as u64).sum();
        let groups: u64 = self.groups.keys().map(|n| Self::group_cost(n)).sum();
        self.overhead -= cursors * CURSOR_OVERHEAD + groups;
        self.groups.clear();
        self.length = 0;
        self.bytes = 0;
        self.generation = generation;
        (n, bytes)
    }

    fn group(&mut self, name: &str, now: Instant) -> &mut Group {
        if !self.groups.contains_key(name) {
            self.overhead += Self::group_cost(name);
            self.groups.insert(name.to_string(), Group { cursors: HashMap::new(), last_used: now });
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
        let Some(c) = g.cursors.get_mut(&p) else { return };
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
        let (base, end) = (self.partitions[&p].base, self.partitions[&p].end());
        if base == end && self.groups[group].cursors.get(&p).is_none_or(|c| c.lease.is_none()) {
            return Vec::new(); // nothing to take: no cursor made for it
        }
        let c = self.cursor(group, p);
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
            None => self.partitions.keys().copied().collect(),
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
        let order: Vec<usize> = match partition {
            Some(name) => self.by_name.get(name).copied().into_iter().collect(),
            // In turn: from the partition after the one the last pop began
            // at, wrapping.
            None => self.partitions.range(self.rr..).chain(self.partitions.range(..self.rr)).map(|(&p, _)| p).collect(),
        };
        if partition.is_none() {
            if let Some(&first) = order.first() {
                self.rr = first + 1;
            }
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
            let (generation, part) = (self.generation, &self.partitions[&p]);
            let c = self.groups.get_mut(group).expect("group exists").cursors.get_mut(&p).expect("available made it");
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
                self.drop_blank_cursor(group, p);
            } else {
                let open = seqs.len();
                c.lease = Some(Lease { no: lease, answered: vec![false; open], seqs, open, expires: now + lease_time });
            }
        }
        self.counters.delivered += out.len() as u64;
        let next_expiry = self.groups[group].cursors.values().filter_map(|c| c.lease.as_ref().map(|l| l.expires)).min();
        (out, next_expiry)
    }

    /// Acks (`settle`) or nacks one delivered message of `group`.
    pub fn ack(&mut self, epoch: u64, group: &str, id: &str, settle: bool, now: Instant) -> Outcome {
        let Some(id) = MessageId::parse(id) else { return Outcome::Unknown };
        if id.epoch != epoch || id.generation != self.generation {
            return Outcome::Stale;
        }
        let Some(base) = self.partitions.get(&id.partition).map(|part| part.base) else { return Outcome::Unknown };
        let limit = self.options.retry_limit;
        let p = id.partition;
        let Some(g) = self.groups.get_mut(group) else { return Outcome::Unknown };
        g.last_used = now;
        let Some(c) = g.cursors.get_mut(&p) else {
            // No cursor: the group stands at the ring's head.
            return if id.seq < base && settle { Outcome::Acked } else { Outcome::Unknown };
        };
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
        self.drop_blank_cursor(group, p);
        outcome
    }

    /// `(partition, depth, bytes)` of every partition.
    pub fn partitions(&self) -> impl Iterator<Item = (&str, usize, u64)> {
        self.partitions.values().map(|p| (&*p.name, p.ring.len(), p.bytes))
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
                for (p, part) in &self.partitions {
                    let Some(c) = g.cursors.get(p) else {
                        pending += part.ring.len() as u64;
                        continue;
                    };
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
        let (need, drop) = q.plan_push("p", &payloads(0..n)).unwrap();
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
        assert!(matches!(q.plan_push("b", &payloads(0..1)), Err(Refusal::Full { .. })));
        assert!(matches!(q.plan_push("b", &payloads(0..4)), Err(Refusal::TooLarge { .. })));
        q.options.policy = Policy::DropOldest;
        let (_, drop) = q.plan_push("b", &payloads(20..22)).unwrap();
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

    /// The bookkeeping, counted from scratch: what `overhead` must equal.
    fn recount(q: &QueueState) -> u64 {
        let parts: u64 = q.partitions.values().map(|p| QueueState::partition_cost(&p.name)).sum();
        let groups: u64 = q.groups.iter().map(|(n, g)| QueueState::group_cost(n) + CURSOR_OVERHEAD * g.cursors.len() as u64).sum();
        parts + groups
    }

    #[test]
    fn partitions_and_cursors_are_counted_and_go_when_empty_and_idle() {
        let now = Instant::now();
        let mut q = QueueState::new(opts(), 1, now);
        for i in 0..50 {
            let name = format!("p{i}");
            let (need, _) = q.plan_push(&name, &payloads(0..1)).unwrap();
            assert_eq!(need, 1 + MESSAGE_OVERHEAD + QueueState::partition_cost(&name), "a new partition reserves its bookkeeping");
            q.push(&name, payloads(0..1), 0, now);
        }
        let (again, _) = q.plan_push("p0", &payloads(0..1)).unwrap();
        assert_eq!(again, 1 + MESSAGE_OVERHEAD, "an existing one does not");
        assert_eq!(q.overhead, recount(&q));
        // A group that never read a partition holds no cursor of it.
        q.ready("idle-group", Some("p0"), 1, now);
        assert_eq!(q.overhead, recount(&q));
        let (first, _) = q.pop(7, "g", Some("p0"), 1, false, now);
        let (m, _) = q.pop(7, "g", None, 100, true, now);
        assert_eq!(m.len(), 49);
        assert_eq!(q.overhead, recount(&q));
        q.forget_idle_groups(Duration::from_secs(1), now + Duration::from_secs(2));
        assert_eq!(q.groups.len(), 0);
        // "idle-group" never read them, so every ring kept its message
        // (forgetting a group does not trim without another group): no
        // partition is empty yet.
        q.forget_idle_partitions(Duration::from_secs(1), now + Duration::from_secs(2));
        assert_eq!(q.partition_count(), 50);
        let (all, _) = q.pop(7, "h", None, 100, true, now + Duration::from_secs(2));
        assert_eq!(all.len(), 50);
        q.forget_idle_partitions(Duration::from_secs(1), now + Duration::from_secs(2));
        assert_eq!(q.partition_count(), 0, "empty, unleased and idle: gone");
        assert_eq!(q.overhead, recount(&q));
        assert_eq!(q.overhead, QueueState::group_cost("h"), "only the group is left");
        // Its number is not reused: an id of the old partition is unknown.
        q.push("p0", payloads(5..6), 0, now);
        assert_eq!(q.ack(7, "g", &first[0].id, true, now), Outcome::Unknown);
        let (fresh, _) = q.pop(7, "h", Some("p0"), 1, true, now);
        assert_eq!(values(&fresh), [5]);
    }

    #[test]
    fn a_recently_written_or_leased_partition_stays() {
        let (mut q, now) = queue(1);
        let (m, _) = q.pop(7, "g", None, 1, false, now);
        q.forget_idle_partitions(Duration::from_secs(1), now + Duration::from_secs(5));
        assert_eq!(q.partition_count(), 1, "leased");
        assert_eq!(q.ack(7, "g", &m[0].id, true, now), Outcome::Acked);
        q.forget_idle_partitions(Duration::from_secs(1), now + Duration::from_millis(500));
        assert_eq!(q.partition_count(), 1, "written half a second ago");
        q.forget_idle_partitions(Duration::from_secs(1), now + Duration::from_secs(5));
        assert_eq!(q.partition_count(), 0);
        assert_eq!(q.overhead, recount(&q));
    }
}
