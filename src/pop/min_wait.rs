//! `minPopWaitTime` (a queue option, ms, clamped to 60000): a non-empty but
//! under-full pop may wait for more messages so that one claim carries more.
//!
//! The wait happens here, in the broker, before any permit or connection is
//! taken: waiting inside the stored function would pin a connection, a
//! backend and row locks for the whole window. It applies to a wildcard pop
//! that asked to block (`wait=true`) with `batch > 1`, in both candidate
//! modes, on every such pop (leased or autoAck, first or later, on new
//! partitions too), never on an empty queue, and ends at the first of: the
//! batch would be full, the window elapsed, the caller's deadline.
//!
//! How much is pending comes from `pending`: the hot-list's count when it
//! knows one, else a bounded probe in PostgreSQL (`claim::pending_count`,
//! a pooled connection for one statement, no permit). Each push to the queue
//! (its wake gate) asks again.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Holds an under-full, non-empty pop until the batch would fill, `window`
/// elapses or `deadline` passes. Returns at once when nothing is pending,
/// enough is, or the count cannot be had. Returns whether it held.
pub async fn hold_for_a_fuller_batch<F, Fut>(gate: &Notify, batch: i32, window: Duration, deadline: Instant, mut pending: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<u64>>,
{
    let until = (Instant::now() + window).min(deadline);
    let mut held = false;
    loop {
        let woken = gate.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        match pending().await {
            Some(n) if n > 0 && n < batch as u64 => held = true,
            _ => return held,
        }
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep_until(until) => return held,
        }
    }
}
