//! The push path: validated items are grouped by (queue, partition),
//! deduplicated inside the request, encoded into stored frames, and handed to
//! the coalescer; the answer is assembled in item order once every chunk has
//! committed.

pub mod coalescer;
pub mod dedup;
pub mod group;
pub mod segment;
pub mod spool;
pub mod validate;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use uuid::Uuid;

use crate::log::TxnHasher;

pub use coalescer::{Coalescer, EntryItem, Outcome};
pub use segment::PushError;
pub use validate::{parse_push_body, PushItem};

use crate::log::Frame;

/// The result of one pushed item, in request order. It borrows the item's
/// names and, unless the broker minted it, its transactionId.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemResult<'a> {
    pub index: usize,
    pub queue: &'a str,
    pub partition: &'a str,
    pub transaction_id: Cow<'a, str>,
    pub outcome: Outcome,
}

/// Items with their ids minted and grouped by (queue, partition): the one
/// home of the minting rule (a missing transactionId becomes the message id's
/// text) and of in-request deduplication (the first occurrence of a
/// transactionId in a partition wins; later ones follow it). Repeats are
/// found by the transactionId's keyed hash ([`TxnHasher`]), the same identity
/// the segments' hash arrays, the dedup memory and the coalescer use.
pub struct PushPlan<'a> {
    pub message_ids: Vec<Uuid>,
    /// Borrowed from the item, or minted: the message id's text.
    pub txns: Vec<Cow<'a, str>>,
    /// The keyed hash ([`TxnHasher`]) of each of `txns`.
    pub hashes: Vec<i64>,
    pub groups: Vec<PlanGroup>,
    /// (follower item index, leader item index)
    pub followers: Vec<(usize, usize)>,
    /// The authenticated producer (the JWT `sub`), stamped on every frame.
    pub producer: Option<String>,
    /// Each leader's payload envelope where its queue encrypts (empty when
    /// no item's queue does).
    pub sealed: Vec<Option<Vec<u8>>>,
}

/// The items of one partition that will be written.
pub struct PlanGroup {
    pub queue: String,
    pub partition: String,
    /// Indexes of the first occurrence of each transactionId, in item order.
    pub leaders: Vec<usize>,
}

impl<'a> PushPlan<'a> {
    /// The plan of a push, or the refusal of one whose queue encrypts on a
    /// broker without a key (nothing written).
    pub fn new(
        items: &'a [PushItem<'a>],
        producer: Option<&str>,
        encryption: &crate::crypto::Encryption,
        hasher: &TxnHasher,
    ) -> Result<PushPlan<'a>, crate::crypto::NoKeyToSeal> {
        let message_ids: Vec<Uuid> = items.iter().map(|i| i.message_id.unwrap_or_else(Uuid::now_v7)).collect();
        let txns: Vec<Cow<'a, str>> = items
            .iter()
            .zip(&message_ids)
            .map(|(it, id)| match &it.transaction_id {
                Some(t) => Cow::Borrowed(&**t),
                None => Cow::Owned(id.hyphenated().encode_lower(&mut Uuid::encode_buffer()).to_owned()),
            })
            .collect();
        let hashes: Vec<i64> = txns.iter().map(|t| hasher.hash(t)).collect();
        let mut groups: Vec<PlanGroup> = Vec::new();
        let mut group_of = Slots::default();
        let mut first_seen: HashMap<(usize, i64), usize> = HashMap::new();
        let mut followers = Vec::new();
        for (idx, item) in items.iter().enumerate() {
            let g = group_of.slot((&*item.queue, &*item.partition), || {
                groups.push(PlanGroup { queue: item.queue.to_string(), partition: item.partition.to_string(), leaders: vec![] });
                groups.len() - 1
            });
            if item.transaction_id.is_none() && item.message_id.is_none() {
                // The broker minted both from a fresh UUIDv7 just now: no
                // other item can carry it.
                groups[g].leaders.push(idx);
                continue;
            }
            if first_seen.is_empty() {
                first_seen.reserve(items.len() - idx);
            }
            match first_seen.entry((g, hashes[idx])) {
                std::collections::hash_map::Entry::Occupied(leader) => followers.push((idx, *leader.get())),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(idx);
                    groups[g].leaders.push(idx);
                }
            }
        }
        let mut sealed = Vec::new();
        for g in &groups {
            let Some(ring) = encryption.sealing(&g.queue)? else { continue };
            sealed.resize(items.len(), None);
            for &idx in &g.leaders {
                // Bound to the message id: an envelope moved onto another
                // message does not open.
                sealed[idx] = Some(ring.seal(items[idx].payload.as_bytes(), message_ids[idx].as_bytes()));
            }
        }
        Ok(PushPlan { message_ids, txns, hashes, groups, followers, producer: producer.map(str::to_string), sealed })
    }

    /// Whether `group`'s payloads are sealed (a group is one queue's, so
    /// all of them or none).
    pub fn seals(&self, group: &PlanGroup) -> bool {
        group.leaders.first().is_some_and(|&i| self.sealed.get(i).is_some_and(Option::is_some))
    }

    /// The stored frame of item `idx`.
    pub fn frame<'b>(&'b self, items: &'b [PushItem<'_>], idx: usize) -> Frame<'b> {
        let envelope = self.sealed.get(idx).and_then(Option::as_deref);
        Frame {
            message_id: self.message_ids[idx],
            trace_id: items[idx].trace_id,
            transaction_id: &self.txns[idx],
            producer_sub: self.producer.as_deref(),
            encrypted: envelope.is_some(),
            payload: envelope.unwrap_or(items[idx].payload.as_bytes()),
        }
    }

    /// Gives every follower its leader's outcome, as a duplicate.
    pub fn settle_followers(&self, outcomes: &mut [Option<Outcome>]) {
        for &(idx, leader) in &self.followers {
            let l = outcomes[leader].clone().expect("leader has an outcome");
            outcomes[idx] = Some(Outcome::Duplicate { message_id: l.message_id(), partition_id: l.partition_id() });
        }
    }
}

/// Slot numbers by key for a request's items, which nearly always come
/// partition by partition: the previous item's key is compared before the
/// map is hashed, and a request of one key never builds the map.
pub(crate) struct Slots<K> {
    last: Option<(K, usize)>,
    map: HashMap<K, usize>,
}

impl<K> Default for Slots<K> {
    fn default() -> Self {
        Slots { last: None, map: HashMap::new() }
    }
}

impl<K: std::hash::Hash + Eq + Copy> Slots<K> {
    /// The slot of `key`; `new` makes one the first time `key` is seen.
    pub(crate) fn slot(&mut self, key: K, new: impl FnOnce() -> usize) -> usize {
        let s = match self.last {
            Some((k, s)) if k == key => return s,
            None => new(),
            Some((k, s)) => {
                // Until a second key comes, the first lives only in `last`.
                if self.map.is_empty() {
                    self.map.insert(k, s);
                }
                *self.map.entry(key).or_insert_with(new)
            }
        };
        self.last = Some((key, s));
        s
    }
}

/// Whether a group's frames make one coalescer chunk (the chunking rule of
/// [`push_items_prepacked`]: a chunk's first frame always fits).
fn fits_one_chunk(plan: &PushPlan<'_>, items: &[PushItem<'_>], leaders: &[usize], cfg: &crate::config::CoalesceConfig) -> bool {
    leaders.len() <= cfg.max_frames
        && (leaders.len() == 1 || leaders.iter().map(|&idx| plan.frame(items, idx).encoded_len()).sum::<usize>() <= cfg.max_bytes)
}

/// Pushes validated items, stamped with `producer` when the caller is
/// authenticated. Every item is committed (or found to be a
/// duplicate) when this returns `Ok`; on `Err` the caller answers 5xx and the
/// client's retry is made safe by deduplication.
pub async fn push_items<'a>(
    coalescer: &Coalescer,
    items: &'a [PushItem<'a>],
    producer: Option<&str>,
) -> Result<Vec<ItemResult<'a>>, Arc<PushError>> {
    push_items_prepacked(coalescer, items, producer, &[]).await
}

/// [`push_items`] for a `QPB1` flag-8 body: a partition's items that arrived
/// as exactly one of `prepacked` (same items, one chunk, nothing stamped)
/// are stored as the client compressed them, skipping recompression.
pub async fn push_items_prepacked<'a>(
    coalescer: &Coalescer,
    items: &'a [PushItem<'a>],
    producer: Option<&str>,
    prepacked: &[crate::log::binary::FramedGroup],
) -> Result<Vec<ItemResult<'a>>, Arc<PushError>> {
    let n = items.len();
    let hasher = coalescer.hasher().await.map_err(|e| Arc::new(PushError::Db(e)))?;
    let plan = PushPlan::new(items, producer, coalescer.encryption(), hasher).map_err(|e| Arc::new(PushError::NoKey(e)))?;
    let PushPlan { groups, hashes, message_ids, .. } = &plan;

    // Encode and submit every chunk before awaiting any.
    let cfg = coalescer.config().clone();
    let mut pending = Vec::new();
    for group in groups {
        let whole = |g: &&crate::log::binary::FramedGroup| group.leaders.iter().copied().eq(g.items.clone());
        // The client's blob is stored as it came only when nothing is added
        // to its frames: no producer stamp, no envelope.
        let mut blob = if producer.is_none() && !plan.seals(group) { prepacked.iter().find(whole).map(|g| g.blob.clone()) } else { None };
        if blob.is_some() && fits_one_chunk(&plan, items, &group.leaders, &cfg) {
            // Stored as the client compressed it: no frames to encode (the
            // lane recovers them from the blob if a duplicate drops one).
            let chunk: Vec<EntryItem> = group
                .leaders
                .iter()
                .map(|&idx| EntryItem { txn_hash: hashes[idx], message_id: message_ids[idx], frame: 0..0 })
                .collect();
            let rx = coalescer.submit(&group.queue, &group.partition, chunk, Vec::new(), blob);
            pending.push((group.leaders.clone(), rx));
            continue;
        }
        let mut chunk_items: Vec<EntryItem> = Vec::new();
        let mut chunk_idx: Vec<usize> = Vec::new();
        let mut frames: Vec<u8> = Vec::new();
        for &idx in &group.leaders {
            let frame = plan.frame(items, idx);
            if !chunk_items.is_empty()
                && (chunk_items.len() >= cfg.max_frames || frames.len() + frame.encoded_len() > cfg.max_bytes)
            {
                blob = None; // more than one chunk: the client's blob spans them
                let rx = coalescer.submit(&group.queue, &group.partition, std::mem::take(&mut chunk_items), std::mem::take(&mut frames), None);
                pending.push((std::mem::take(&mut chunk_idx), rx));
            }
            let start = frames.len();
            frame.encode_into(&mut frames).map_err(|e| Arc::new(PushError::from(e)))?;
            chunk_items.push(EntryItem { txn_hash: hashes[idx], message_id: message_ids[idx], frame: start..frames.len() });
            chunk_idx.push(idx);
        }
        if !chunk_items.is_empty() {
            let rx = coalescer.submit(&group.queue, &group.partition, chunk_items, frames, blob);
            pending.push((chunk_idx, rx));
        }
    }

    let mut outcomes: Vec<Option<Outcome>> = vec![None; n];
    let mut failure = None;
    for (idxs, rx) in pending {
        match rx.await {
            Ok(Ok(chunk)) => {
                for (idx, o) in idxs.into_iter().zip(chunk) {
                    outcomes[idx] = Some(o);
                }
            }
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some(Arc::new(PushError::Lost)),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    plan.settle_followers(&mut outcomes);
    let txns = plan.txns;
    Ok(items
        .iter()
        .zip(txns)
        .zip(outcomes)
        .enumerate()
        .map(|(index, ((item, transaction_id), o))| ItemResult {
            index,
            queue: &item.queue,
            partition: &item.partition,
            transaction_id,
            outcome: o.expect("every item has an outcome"),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(partition: &'static str, txn: Option<&'static str>, message_id: Option<Uuid>) -> PushItem<'static> {
        PushItem {
            queue: "q".into(),
            partition: partition.into(),
            transaction_id: txn.map(Cow::Borrowed),
            trace_id: None,
            payload: "1",
            message_id,
        }
    }

    #[test]
    fn slots_number_keys_in_order_of_first_sight() {
        let mut slots = Slots::default();
        let mut made = 0;
        let keys = ["a", "a", "b", "a", "c", "b", "b", "a"];
        let got: Vec<usize> = keys
            .iter()
            .map(|&k| {
                slots.slot(k, || {
                    made += 1;
                    made - 1
                })
            })
            .collect();
        assert_eq!(got, vec![0, 0, 1, 0, 2, 1, 1, 0]);
        assert_eq!(made, 3);
        let mut one = Slots::default();
        assert_eq!((one.slot(7, || 0), one.slot(7, || 1)), (0, 0));
        assert!(one.map.is_empty(), "one key builds no map");
    }

    #[test]
    fn the_plan_groups_by_partition_and_makes_repeats_followers() {
        let client_id = Uuid::now_v7();
        let items = [
            item("a", Some("t1"), None),
            item("a", None, None),
            item("b", Some("t1"), None), // another partition: its own leader
            item("a", Some("t1"), None), // back to a: follows item 0
            item("a", None, None),
            item("b", None, Some(client_id)),
            item("b", None, Some(client_id)), // the client's id twice: follows item 5
        ];
        let hasher = TxnHasher::new(&[7; 16]);
        let plan = PushPlan::new(&items, None, &crate::crypto::Encryption::default(), &hasher).unwrap();
        let leaders: Vec<(&str, Vec<usize>)> = plan.groups.iter().map(|g| (g.partition.as_str(), g.leaders.clone())).collect();
        assert_eq!(leaders, vec![("a", vec![0, 1, 4]), ("b", vec![2, 5])]);
        assert_eq!(plan.followers, vec![(3, 0), (6, 5)]);
        assert_ne!(plan.txns[1], plan.txns[4], "minted ids differ");
        assert_eq!(plan.txns[1], plan.message_ids[1].to_string());
        assert_eq!(plan.txns[5], client_id.to_string());
        let hashed: Vec<i64> = plan.txns.iter().map(|t| hasher.hash(t)).collect();
        assert_eq!(plan.hashes, hashed);
        assert!(matches!(&plan.txns[0], Cow::Borrowed("t1")), "a client's id is not copied");
    }
}
