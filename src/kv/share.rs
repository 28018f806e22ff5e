//! Shared commits for single KV writes: concurrent one-operation calls (a
//! `put`, `delete` or `incr` per request, what a service writing one key per
//! call sends) go to PostgreSQL in one transaction.
//!
//! Each such call is one statement whose verdict is computed under the
//! row's lock (`queen.kv_put_v1` and friends), and a lost verdict writes
//! nothing, so calls can sit side by side in one transaction without
//! savepoints: the writer sends them pipelined (one round trip), in (ns,
//! key) order so that two shared writes lock their rows in the same order
//! and cannot deadlock each other, then COMMITs, then answers each call with
//! its own result. If the write fails for any reason but an outage, each
//! call is run again alone, so a call PostgreSQL refuses fails only itself;
//! an outage fails them all with the same error. Reads, multi-operation
//! calls and the transaction route's riders run as before.
//!
//! The queueing is `db::share`'s, at most `QUEEN_KV_GROUP_WRITERS` writes in
//! flight, no timer: a lone put commits at once.

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::oneshot;

use super::{run_call, KvLimits, Op, Outcome};
use crate::db::share::{Share, Shared};
use crate::db::DbError;

/// Most calls one shared write carries.
const MAX_CALLS: usize = 1_000;

type Reply = oneshot::Sender<Result<Outcome, Arc<DbError>>>;

/// One single-write call waiting for a shared write.
pub struct Call {
    op: Op,
    reply: Reply,
}

impl Shared for Call {
    fn weight(&self) -> usize {
        1
    }
}

/// Runs KV calls, single writes in shared commits. Cheap to clone.
#[derive(Clone)]
pub struct KvWriter {
    pool: Pool,
    limits: KvLimits,
    share: Arc<Share<Call>>,
}

impl KvWriter {
    /// `writers`: most shared writes in flight.
    pub fn new(pool: Pool, limits: KvLimits, writers: usize) -> KvWriter {
        KvWriter { pool, limits, share: Arc::new(Share::new(writers, MAX_CALLS)) }
    }

    /// Runs a parsed call: a single write in a commit shared with the calls
    /// beside it, anything else on its own (`kv::run_call`).
    pub async fn call(&self, operations: &[Op]) -> Result<Outcome, Arc<DbError>> {
        let op = match operations {
            [op] if op.is_write() => op.clone(),
            _ => return run_call(&self.pool, operations, &self.limits).await.map_err(Arc::new),
        };
        let (reply, rx) = oneshot::channel();
        let me = self.clone();
        self.share.submit(Call { op, reply }, move |batch| {
            let me = me.clone();
            async move { me.write(batch).await }
        });
        rx.await.unwrap_or_else(|_| Err(Arc::new(DbError::Unexpected("the shared KV write was dropped".into()))))
    }

    async fn write(&self, mut batch: Vec<Call>) {
        // A lone plain put takes the one-insert path too: cheaper than
        // `kv_put_v1`'s two frames.
        if batch.len() > 1 || plain_puts(&batch).is_some() {
            if batch.len() > 1 {
                metrics::counter!(crate::metrics::KV_SHARED_CALLS).increment(batch.len() as u64);
            }
            batch.sort_by(|a, b| (a.op.ns(), a.op.key_str()).cmp(&(b.op.ns(), b.op.key_str())));
            match self.together(&batch).await {
                Ok(outcomes) => {
                    for (c, o) in batch.into_iter().zip(outcomes) {
                        let _ = c.reply.send(Ok(o));
                    }
                    return;
                }
                Err(e) if e.met_by_all() => {
                    let e = Arc::new(e);
                    for c in batch {
                        let _ = c.reply.send(Err(e.clone()));
                    }
                    return;
                }
                Err(e) => tracing::debug!(error = %e, calls = batch.len(), "a shared KV write failed; running its calls one by one"),
            }
        }
        for c in batch {
            let _ = c.reply.send(run_call(&self.pool, std::slice::from_ref(&c.op), &self.limits).await.map_err(Arc::new));
        }
    }

    /// Every call of the batch in one statement (`queen.kv_write_v1` once
    /// per call, migration 0027), in batch order, committed as one; a batch
    /// of plain puts of distinct keys as one insert (`plain_puts`).
    async fn together(&self, batch: &[Call]) -> Result<Vec<Outcome>, DbError> {
        if let Some(puts) = plain_puts(batch) {
            return self.puts(batch, puts).await;
        }
        let n = batch.len();
        let (mut kinds, mut nss, mut keys, mut values) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut ttls, mut expects, mut deltas, mut mins, mut maxes) =
            (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for c in batch {
            let (kind, value, ttl, expect, delta, min, max) = match &c.op {
                Op::Put { value, ttl, expect, .. } => ("put", Some(value.as_str()), *ttl, *expect, None, None, None),
                Op::Delete { expect, .. } => ("delete", None, None, *expect, None, None, None),
                Op::Incr { delta, min, max, ttl, .. } => ("incr", None, *ttl, None, Some(delta.as_str()), min.as_deref(), max.as_deref()),
                _ => return Err(DbError::Unexpected("a shared KV write holds a read".into())),
            };
            kinds.push(kind);
            nss.push(c.op.ns());
            keys.push(c.op.key_str());
            values.push(value);
            ttls.push(ttl);
            expects.push(expect);
            deltas.push(delta);
            mins.push(min);
            maxes.push(max);
        }
        let client = self.pool.get().await?;
        let stmt = super::stmt(
            &client,
            "SELECT v.applied, v.reason, v.value::text, v.version, v.expires_at, v.updated_at
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::int8[], $7::text[], $8::text[], $9::text[])
                  WITH ORDINALITY AS c (op, ns, key, value, ttl, expect, delta, min, max, i)
             CROSS JOIN LATERAL queen.kv_write_v1(c.op, c.ns, c.key, c.value::jsonb, c.ttl, c.expect,
                                                  c.delta::numeric, c.min::numeric, c.max::numeric) v
             ORDER BY c.i",
        )
        .await?;
        // One statement is one transaction: every call's write commits together.
        let rows = client.query(&stmt, &[&kinds, &nss, &keys, &values, &ttls, &expects, &deltas, &mins, &maxes]).await?;
        if rows.len() != n {
            return Err(DbError::Unexpected(format!("a shared KV write answered {} verdicts for {n} calls", rows.len())));
        }
        Ok(batch.iter().zip(rows).map(|(c, row)| super::single_write(&c.op, row)).collect())
    }

    /// A batch of plain puts in one statement (`queen.kv_put_many_v1`,
    /// migration 0044): the verdicts `kv_put_v1` would give, for a
    /// fraction of PostgreSQL's time per put.
    async fn puts(&self, batch: &[Call], puts: Vec<(&str, Option<i32>)>) -> Result<Vec<Outcome>, DbError> {
        let nss: Vec<&str> = batch.iter().map(|c| c.op.ns()).collect();
        let keys: Vec<&str> = batch.iter().map(|c| c.op.key_str()).collect();
        let (values, ttls): (Vec<&str>, Vec<Option<i32>>) = puts.into_iter().unzip();
        let client = self.pool.get().await?;
        // The verdict's columns first, as `single_write` reads them.
        let stmt = super::stmt(
            &client,
            "SELECT true, NULL::text, o_value, o_version, o_expires_at, o_updated_at, o_ns, o_key
             FROM queen.kv_put_many_v1($1::text[], $2::text[], $3::text[], $4::int4[])",
        )
        .await?;
        let mut rows = client.query(&stmt, &[&nss, &keys, &values, &ttls]).await?;
        if rows.len() != batch.len() {
            return Err(DbError::Unexpected(format!("a shared KV put answered {} rows for {} calls", rows.len(), batch.len())));
        }
        // RETURNING's order is not the input's: back to the batch's by key.
        rows.sort_by(|a, b| (a.get::<_, &str>(6), a.get::<_, &str>(7)).cmp(&(b.get::<_, &str>(6), b.get::<_, &str>(7))));
        Ok(batch.iter().zip(rows).map(|(c, row)| super::single_write(&c.op, row)).collect())
    }
}

/// The (value, ttl) of each call when the batch (sorted by (ns, key)) is
/// plain puts, none with an expected version, no key twice: what one
/// `INSERT … ON CONFLICT` can write.
fn plain_puts(batch: &[Call]) -> Option<Vec<(&str, Option<i32>)>> {
    let distinct = batch.windows(2).all(|w| (w[0].op.ns(), w[0].op.key_str()) != (w[1].op.ns(), w[1].op.key_str()));
    if !distinct {
        return None;
    }
    batch
        .iter()
        .map(|c| match &c.op {
            Op::Put { value, ttl, expect: None, .. } => Some((value.as_str(), *ttl)),
            _ => None,
        })
        .collect()
}
