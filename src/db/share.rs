//! Commit sharing: small requests that arrive while a write is in flight go
//! to PostgreSQL together, in one transaction.
//!
//! A broker between many small clients and one database can combine their
//! work: thirty-two concurrent one-row writes are one commit's worth, not
//! thirty-two. A [`Share`] queues requests and keeps at most `writers` write
//! tasks running; each task takes everything pending (up to a weight bound)
//! and hands it to the family's write function, which applies the batch in
//! one transaction and answers every request on its own channel after
//! COMMIT. It batches only what load produces: a lone request is written
//! at once, and there is no timer. What a failed batch means (retry request by request, or the
//! same outage for all) is the family's to say: `ack::share`, `kv::share`,
//! `reads::traces`, and the push side's group committer, `push::group`.

use std::future::Future;
use std::sync::{Arc, Mutex};

/// A request waiting for a shared write, and how much of one it fills.
pub trait Shared: Send + 'static {
    /// The request's share of a write's bound (items, operations).
    fn weight(&self) -> usize;
}

struct State<R> {
    pending: Vec<R>,
    writers: usize,
}

/// The queue of requests waiting for a shared write.
pub struct Share<R> {
    state: Mutex<State<R>>,
    max_writers: usize,
    /// Most requests one write carries.
    max_count: usize,
    /// Most weight one write carries; a single request heavier than this
    /// still goes (alone).
    max_weight: usize,
}

impl<R: Shared> Share<R> {
    pub fn new(max_writers: usize, max_weight: usize) -> Share<R> {
        Share::bounded(max_writers, usize::MAX, max_weight)
    }

    /// With a bound on the requests of one write as well as on its weight.
    pub fn bounded(max_writers: usize, max_count: usize, max_weight: usize) -> Share<R> {
        Share {
            state: Mutex::new(State { pending: Vec::new(), writers: 0 }),
            max_writers: max_writers.max(1),
            max_count: max_count.max(1),
            max_weight,
        }
    }

    /// Queues `request`; starts a writer running `write` when fewer than
    /// `max_writers` run. `write` must answer every request it is given.
    pub fn submit<W, Fut>(self: &Arc<Self>, request: R, write: W)
    where
        W: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let mut st = self.state.lock().expect("share lock poisoned");
        st.pending.push(request);
        if st.writers < self.max_writers {
            st.writers += 1;
            let me = self.clone();
            tokio::spawn(async move {
                // A write that panics must not take its writer slot with
                // it: after `max_writers` such panics nothing would ever be
                // written again. Its own requests learn of it (their reply
                // senders drop); the next submit starts a writer for the rest.
                let mut slot = Slot { share: me.clone(), held: true };
                while let Some(batch) = me.next_batch() {
                    write(batch).await;
                }
                slot.held = false; // next_batch gave it back
            });
        }
    }

    /// What the next write takes: the pending requests in arrival order up
    /// to the count and weight bounds (at least one); `None` (and one
    /// writer fewer) when nothing is pending.
    fn next_batch(&self) -> Option<Vec<R>> {
        let mut st = self.state.lock().expect("share lock poisoned");
        if st.pending.is_empty() {
            st.writers -= 1;
            return None;
        }
        let mut weight = 0;
        let take = st
            .pending
            .iter()
            .take(self.max_count)
            .take_while(|r| {
                weight += r.weight();
                weight <= self.max_weight
            })
            .count()
            .max(1);
        Some(st.pending.drain(..take).collect())
    }
}

/// A running writer's place among `max_writers`, given back if the writer
/// ends without `next_batch` having done it (a panic).
struct Slot<R> {
    share: Arc<Share<R>>,
    held: bool,
}

impl<R> Drop for Slot<R> {
    fn drop(&mut self) {
        if self.held {
            if let Ok(mut st) = self.share.state.lock() {
                st.writers -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    struct Req(usize, oneshot::Sender<usize>);
    impl Shared for Req {
        fn weight(&self) -> usize {
            self.0
        }
    }

    #[tokio::test]
    async fn requests_behind_a_write_go_together_within_the_bound_and_each_is_answered() {
        let share = Arc::new(Share::<Req>::new(1, 10));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let writes = Arc::new(AtomicUsize::new(0));
        let write = {
            let (sizes, gate, writes) = (sizes.clone(), gate.clone(), writes.clone());
            move |batch: Vec<Req>| {
                let (sizes, gate, writes) = (sizes.clone(), gate.clone(), writes.clone());
                async move {
                    // The first write waits until the rest have queued.
                    if writes.fetch_add(1, Ordering::SeqCst) == 0 {
                        gate.acquire().await.unwrap().forget();
                    }
                    sizes.lock().unwrap().push(batch.iter().map(|r| r.0).collect::<Vec<_>>());
                    let n = batch.len();
                    for r in batch {
                        let _ = r.1.send(n);
                    }
                }
            }
        };
        let mut answers = Vec::new();
        for w in [1, 4, 4, 4, 12] {
            let (tx, rx) = oneshot::channel();
            share.submit(Req(w, tx), write.clone());
            answers.push(rx);
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        let got: Vec<usize> = futures_util::future::join_all(answers).await.into_iter().map(Result::unwrap).collect();
        // One alone, then 4+4 (a third 4 would pass 10), then 4, then the
        // 12 that is over the bound by itself.
        assert_eq!(*sizes.lock().unwrap(), vec![vec![1], vec![4, 4], vec![4], vec![12]]);
        assert_eq!(got, vec![1, 2, 2, 1, 1]);
        tokio::task::yield_now().await;
        assert_eq!(share.state.lock().unwrap().writers, 0, "the writer ends when nothing is pending");
    }

    #[tokio::test]
    async fn a_write_that_panics_gives_its_writer_slot_back() {
        let share = Arc::new(Share::<Req>::new(1, 10));
        // Weight 0 panics: a bug in a family's write, say.
        let write = |batch: Vec<Req>| async move {
            assert!(batch.iter().all(|r| r.0 > 0), "a write that panics");
            for r in batch {
                let _ = r.1.send(r.0);
            }
        };
        let (tx, rx) = oneshot::channel();
        share.submit(Req(0, tx), write);
        assert!(rx.await.is_err(), "the panicked write's request learns it was dropped");
        for _ in 0..100 {
            if share.state.lock().unwrap().writers == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        let (tx, rx) = oneshot::channel();
        share.submit(Req(3, tx), write);
        let answer = tokio::time::timeout(std::time::Duration::from_secs(5), rx).await;
        assert_eq!(answer.expect("a writer starts for the next request").unwrap(), 3);
    }
}
