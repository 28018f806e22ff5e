//! Brokers that know about each other (issue 32 §1): every broker on one
//! database hears which partitions the others just wrote, so that a
//! long-poll parked on broker B wakes when a push commits through broker A,
//! and B's hot-list learns that the partition has data, without waiting for
//! B's backoff or its ring's reseed.
//!
//! The channel is PostgreSQL's own `LISTEN/NOTIFY` on one dedicated
//! connection per broker (docs/DECISIONS.md says why not a peer mesh):
//! committed pushes leave a hint in an in-process queue, and this service
//! sends whatever has piled up as one `pg_notify` (many partitions per
//! notification, never a `NOTIFY` inside a push transaction, which would
//! serialise commits); while one is in flight the next batch piles up, so
//! under load a notification carries many partitions and at rest a hint
//! leaves at once. The same connection listens and keeps this broker's row
//! in `queen.brokers` (migration 0017) fresh with a heartbeat.
//!
//! A broker alone on its database sends nothing: every notification is a
//! PostgreSQL transaction (and takes the server's notification lock at
//! commit), and at batch 1 they were most of the commits a push run cost
//! (0.42 of 0.53 commits per message, docs/PERFORMANCE.md). Whether others
//! are live is read with each heartbeat; a broker that joins is heard from
//! within a second, and a hint missed meanwhile costs what a lost one does.
//!
//! Hints are an optimisation, never the correctness: a lost one (the
//! connection broke, PostgreSQL restarted, hints are switched off with
//! `QUEEN_PEER_HINTS=false`) costs at most one long-poll backoff interval
//! and one ring reseed, which is what a broker without peers gets anyway.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use crate::pop::PopService;

/// The notification channel.
const CHANNEL: &str = "queen_pushes";
/// `pg_notify` payloads must stay under 8000 bytes.
const PAYLOAD_LIMIT: usize = 7000;
/// How often this broker's row is refreshed.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A broker whose heartbeat is older than this is not live.
pub const LIVE_WITHIN_SECONDS: f64 = 5.0;

/// What this broker tells the others.
enum Hint {
    /// A partition it just wrote.
    Pushed { queue: String, partition_id: i64, partition: String, count: u64 },
    /// A lease of the queue ended (an ack, a nack): a long-poll held back by
    /// it may claim now.
    Released { queue: String },
    /// A switch or a queue's settings changed: reread them.
    Reload,
}

/// This broker's end of the channel.
pub struct Cluster {
    /// This process among the brokers (a v7 uuid: unique even for two
    /// brokers that share a host name).
    pub instance: String,
    hints: Option<mpsc::UnboundedSender<Hint>>,
    /// Notified when another broker announces a change of switches or
    /// queue settings (app.rs rereads them then).
    pub reloads: Arc<tokio::sync::Notify>,
    /// The service's task, awaited at shutdown so that its row is gone
    /// before the process is (see [`Cluster::stopped`]).
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Cluster {
    /// A cluster end that tells nobody anything (hints switched off).
    pub fn silent() -> Cluster {
        Cluster {
            instance: uuid::Uuid::now_v7().simple().to_string(),
            hints: None,
            reloads: Arc::new(tokio::sync::Notify::new()),
            task: std::sync::Mutex::new(None),
        }
    }

    /// Waits (at most `limit`) for the service to end after the shutdown
    /// signal: it deletes this broker's row on the way out, and a process
    /// that exits first leaves the row live for LIVE_WITHIN_SECONDS, so a
    /// broker started right after it (a restart, a deploy) believes it has
    /// company and sends hints nobody reads.
    pub async fn stopped(&self, limit: Duration) {
        let task = self.task.lock().expect("cluster task lock poisoned").take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(limit, task).await;
        }
    }

    /// Notes that `count` messages were committed to a partition (cheap: a
    /// channel send; the service batches).
    pub fn pushed(&self, queue: &str, partition_id: i64, partition: &str, count: u64) {
        if let Some(tx) = &self.hints {
            let _ = tx.send(Hint::Pushed { queue: queue.to_string(), partition_id, partition: partition.to_string(), count });
        }
    }

    /// Notes that a lease on `queue` ended here (the others' long-polls on
    /// the queue may claim what it held back).
    pub fn released(&self, queue: &str) {
        if let Some(tx) = &self.hints {
            let _ = tx.send(Hint::Released { queue: queue.to_string() });
        }
    }

    /// Tells the other brokers to reread the switches and queue settings now
    /// (they also do at their cache refresh, should this be lost).
    pub fn announce_change(&self) {
        if let Some(tx) = &self.hints {
            let _ = tx.send(Hint::Reload);
        }
    }

    /// Starts the service: one connection that listens, notifies and beats.
    pub fn spawn(pg: crate::db::Target, pop: Arc<PopService>, server_id: String, shutdown: broadcast::Receiver<()>) -> Arc<Cluster> {
        let (tx, rx) = mpsc::unbounded_channel();
        let reloads = Arc::new(tokio::sync::Notify::new());
        let instance = uuid::Uuid::now_v7().simple().to_string();
        let task = tokio::spawn(run(pg, pop, reloads.clone(), instance.clone(), server_id, rx, shutdown));
        Arc::new(Cluster { instance, hints: Some(tx), reloads, task: std::sync::Mutex::new(Some(task)) })
    }
}

/// Connects, and reconnects after a failure, until shutdown.
async fn run(
    pg: crate::db::Target,
    pop: Arc<PopService>,
    reloads: Arc<tokio::sync::Notify>,
    instance: String,
    server_id: String,
    mut hints: mpsc::UnboundedReceiver<Hint>,
    mut shutdown: broadcast::Receiver<()>,
) {
    let ears = Ears { pop: &pop, reloads: &reloads, instance: &instance };
    loop {
        match session(&pg, &ears, &server_id, &mut hints, &mut shutdown).await {
            Ok(Ended::Shutdown) => return,
            // A server closing the session cleanly (a fast shutdown, a
            // failover) is a break like any other: reconnect.
            Ok(Ended::Closed) => tracing::warn!("the brokers' hint channel was closed by the server; reconnecting"),
            Err(e) => tracing::warn!(error = %e, "the brokers' hint channel broke; reconnecting (hints meanwhile are lost: long-polls fall back on their backoff)"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.recv() => return,
        }
        // What piled up while disconnected is stale: the backoff covers it.
        while hints.try_recv().is_ok() {}
    }
}

/// What a heard notification acts on.
struct Ears<'a> {
    pop: &'a PopService,
    reloads: &'a tokio::sync::Notify,
    instance: &'a str,
}

/// How a session ended without an error.
enum Ended {
    Shutdown,
    Closed,
}

/// One connection's life.
async fn session(
    pg: &crate::db::Target,
    ears: &Ears<'_>,
    server_id: &str,
    hints: &mut mpsc::UnboundedReceiver<Hint>,
    shutdown: &mut broadcast::Receiver<()>,
) -> Result<Ended, tokio_postgres::Error> {
    let (client, mut connection) = pg.pg.connect(pg.tls.clone()).await?;
    let (ntx, mut notifications) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        loop {
            match futures_util::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    let _ = ntx.send(n.payload().to_string());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    });
    let instance = ears.instance;
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    let beat = "INSERT INTO queen.brokers (instance, server_id, version, started_at, heartbeat_at)
                VALUES ($1, $2, $3, now(), now())
                ON CONFLICT (instance) DO UPDATE SET heartbeat_at = now()";
    client.execute(beat, &[&instance, &server_id, &env!("CARGO_PKG_VERSION")]).await?;
    let others = "SELECT count(*) FROM queen.brokers WHERE instance <> $1 AND heartbeat_at > now() - make_interval(secs => $2)";
    let mut peers: i64 = client.query_one(others, &[&instance, &LIVE_WITHIN_SECONDS]).await?.get(0);
    // Say hello, so that brokers already running start telling this one at
    // once rather than at their next heartbeat.
    client.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &json!({"b": instance, "h": [], "w": [], "r": false}).to_string()]).await?;
    tracing::info!(instance, "listening for the other brokers' pushes");
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            payload = notifications.recv() => match payload {
                Some(p) => {
                    if heard(ears, &p) {
                        peers = peers.max(1); // another broker is there
                    }
                }
                None => break Ok(Ended::Closed),
            },
            first = hints.recv() => {
                let Some(first) = first else { break Ok(Ended::Shutdown) };
                let mut batch = vec![first];
                while let Ok(h) = hints.try_recv() {
                    batch.push(h);
                }
                if peers == 0 {
                    continue; // nobody to tell
                }
                for payload in payloads(instance, batch) {
                    client.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &payload]).await?;
                }
            }
            _ = heartbeat.tick() => {
                client.execute(beat, &[&instance, &server_id, &env!("CARGO_PKG_VERSION")]).await?;
                peers = client.query_one(others, &[&instance, &LIVE_WITHIN_SECONDS]).await?.get(0);
                // Rows of brokers gone for a day are forgotten.
                client.execute("DELETE FROM queen.brokers WHERE heartbeat_at < now() - interval '1 day'", &[]).await?;
            }
            _ = shutdown.recv() => {
                let _ = client.execute("DELETE FROM queen.brokers WHERE instance = $1", &[&instance]).await;
                return Ok(Ended::Shutdown);
            }
        }
    };
    driver.abort();
    match driver.await {
        Ok(Err(e)) => Err(e),
        _ => result,
    }
}

/// The notifications carrying `batch`: one partition once, with its counts
/// summed, cut below the payload limit; released queues (`w`, once each)
/// and a reload announcement (`r`) ride with the first.
fn payloads(instance: &str, batch: Vec<Hint>) -> Vec<String> {
    let mut merged: HashMap<i64, (String, String, u64)> = HashMap::new();
    let mut released: Vec<String> = Vec::new();
    let mut reload = false;
    for h in batch {
        match h {
            Hint::Pushed { queue, partition_id, partition, count } => merged.entry(partition_id).or_insert((queue, partition, 0)).2 += count,
            Hint::Released { queue } => {
                if !released.contains(&queue) {
                    released.push(queue);
                }
            }
            Hint::Reload => reload = true,
        }
    }
    let mut out = Vec::new();
    let mut current: Vec<Value> = Vec::new();
    let mut size: usize = released.iter().map(|q| q.len() + 3).sum();
    for (pid, (queue, partition, count)) in merged {
        let entry = json!([queue, pid, partition, count]);
        let len = entry.to_string().len() + 1;
        if size + len > PAYLOAD_LIMIT && !current.is_empty() {
            out.push(json!({"b": instance, "h": std::mem::take(&mut current), "w": std::mem::take(&mut released), "r": std::mem::take(&mut reload)}).to_string());
            size = 0;
        }
        size += len;
        current.push(entry);
    }
    if !current.is_empty() || !released.is_empty() || reload {
        out.push(json!({"b": instance, "h": current, "w": released, "r": reload}).to_string());
    }
    out
}

/// Applies another broker's notification: wake gates and hot-lists, as a
/// local push would, and a reload when it announces one. Whether it came
/// from another broker.
fn heard(ears: &Ears<'_>, payload: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(payload) else { return false };
    if v["b"].as_str() == Some(ears.instance) {
        return false;
    }
    for h in v["h"].as_array().into_iter().flatten() {
        if let (Some(queue), Some(pid), Some(partition), Some(count)) = (h[0].as_str(), h[1].as_i64(), h[2].as_str(), h[3].as_u64()) {
            ears.pop.pushed(queue, pid, partition, count);
        }
    }
    for q in v["w"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        ears.pop.wake.pushed(q);
    }
    if v["r"] == true {
        ears.reloads.notify_one();
    }
    true
}

/// `GET /api/v1/system/brokers`: the brokers on this database.
pub async fn brokers(pool: &deadpool_postgres::Pool, instance: &str) -> Result<Value, crate::db::DbError> {
    let rows = pool
        .get()
        .await?
        .query(
            "SELECT instance, server_id, version, started_at, heartbeat_at, EXTRACT(EPOCH FROM now() - heartbeat_at)::float8
             FROM queen.brokers ORDER BY started_at",
            &[],
        )
        .await?;
    let brokers: Vec<Value> = rows
        .iter()
        .map(|r| {
            let age: f64 = r.get(5);
            let id: String = r.get(0);
            json!({"instance": id, "serverId": r.get::<_, String>(1), "version": r.get::<_, String>(2),
                   "startedAt": crate::json::iso_ms(r.get(3)), "heartbeatAt": crate::json::iso_ms(r.get(4)),
                   "secondsSinceHeartbeat": (age * 1000.0).round() / 1000.0, "live": age <= LIVE_WITHIN_SECONDS, "self": id == instance})
        })
        .collect();
    let live = brokers.iter().filter(|b| b["live"] == true).count();
    Ok(json!({"brokers": brokers, "live": live}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_names_each_partition_once_and_stays_under_the_payload_limit() {
        let batch: Vec<Hint> = (0..2000)
            .map(|i| Hint::Pushed { queue: "orders".into(), partition_id: i % 1000, partition: format!("p{}", i % 1000), count: 1 })
            .collect();
        let mut batch = batch;
        batch.push(Hint::Released { queue: "orders".into() });
        batch.push(Hint::Released { queue: "orders".into() });
        batch.push(Hint::Reload);
        let out = payloads("me", batch);
        let first: Value = serde_json::from_str(&out[0]).unwrap();
        assert_eq!((first["w"].clone(), first["r"].clone()), (json!(["orders"]), json!(true)), "once, with the first");
        assert!(out.len() > 1, "1000 partitions do not fit one notification");
        let mut seen = HashMap::new();
        for p in &out {
            assert!(p.len() < 8000, "{} bytes", p.len());
            let v: Value = serde_json::from_str(p).unwrap();
            assert_eq!(v["b"], "me");
            for h in v["h"].as_array().unwrap() {
                assert!(seen.insert(h[1].as_i64().unwrap(), h[3].as_u64().unwrap()).is_none());
            }
        }
        assert_eq!(seen.len(), 1000);
        assert!(seen.values().all(|&c| c == 2), "counts summed");
    }
}
