//! The Kafka nodes of one database: every broker's listener registers its
//! advertised address in `queen.kafka_nodes` (migrations/0026) under a node
//! id of its own, keeps the row fresh once a second, and reads the live
//! ones (a heartbeat within five seconds) in the same round trip.
//!
//! Every broker then gives the same answers: Metadata lists every live
//! node, a partition's leader and a group's coordinator are chosen from them
//! by rendezvous hashing, so all brokers agree and a node's departure moves
//! only its own share. Any broker still serves Produce and Fetch for any
//! partition (the log is in PostgreSQL); the leader is where clients are
//! sent, which spreads them. A group's membership lives on its coordinator
//! only, and the others answer NOT_COORDINATOR, so two members reaching two
//! brokers still meet; the committed offsets are in PostgreSQL, so a
//! coordinator that moves loses none.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::broadcast;

/// How often the row is refreshed and the live nodes reread.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// One node as clients see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: i32,
    pub host: String,
    pub port: i32,
}

/// This broker's node and the live ones it last read.
pub struct Nodes {
    me: RwLock<Node>,
    live: RwLock<Vec<Node>>,
}

impl Nodes {
    /// This broker alone, as node 0, until it registers.
    pub fn alone(host: String, port: i32) -> Arc<Nodes> {
        let me = Node { id: 0, host, port };
        Arc::new(Nodes { live: RwLock::new(vec![me.clone()]), me: RwLock::new(me) })
    }

    pub fn me(&self) -> Node {
        self.me.read().expect("nodes lock").clone()
    }

    /// The live nodes, this one always among them, by id.
    pub fn live(&self) -> Vec<Node> {
        self.live.read().expect("nodes lock").clone()
    }

    /// The node that owns `key` (a partition's leadership, a group's
    /// coordination): the live node with the highest hash of (key, id).
    pub fn owner(&self, key: &str) -> Node {
        let live = self.live.read().expect("nodes lock");
        owner_of(&live, key).cloned().unwrap_or_else(|| self.me())
    }

    /// Whether this broker owns `key`.
    pub fn mine(&self, key: &str) -> bool {
        self.owner(key).id == self.me.read().expect("nodes lock").id
    }

    /// Registers this node (before the listener takes its first client,
    /// so a client never sees its id change), then keeps its row fresh
    /// until `shutdown` and deletes it. While PostgreSQL is unreachable the
    /// node serves alone, as node 0, and registers when it can.
    pub async fn start(self: &Arc<Self>, pool: Pool, mut shutdown: broadcast::Receiver<()>) {
        let registered = match tokio::time::timeout(Duration::from_secs(5), self.beat(&pool, false)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "kafka node not registered yet; serving alone as node 0 until it is");
                false
            }
            Err(_) => {
                tracing::warn!("kafka node registration timed out; serving alone as node 0 until it is");
                false
            }
        };
        let nodes = self.clone();
        tokio::spawn(async move {
            let mut registered = registered;
            let mut tick = tokio::time::interval(HEARTBEAT);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = shutdown.recv() => break,
                }
                match nodes.beat(&pool, registered).await {
                    Ok(()) => registered = true,
                    Err(e) => {
                        static FAILING: crate::telemetry::Throttle = crate::telemetry::Throttle::new(10_000);
                        if let Some(skipped) = FAILING.admit() {
                            tracing::warn!(error = %e, skipped, "kafka node heartbeat failed; serving as before");
                        }
                    }
                }
            }
            if registered {
                let id = nodes.me().id;
                if let Ok(c) = pool.get().await {
                    let _ = c.execute("DELETE FROM queen.kafka_nodes WHERE node_id = $1", &[&id]).await;
                }
            }
        });
    }

    /// One heartbeat: registers (or re-registers a row another broker
    /// swept), then reads the live nodes.
    async fn beat(&self, pool: &Pool, registered: bool) -> Result<(), crate::db::DbError> {
        let client = pool.get().await?;
        let me = self.me();
        let kept = registered
            && client.execute("UPDATE queen.kafka_nodes SET heartbeat_at = now() WHERE node_id = $1", &[&me.id]).await? == 1;
        if !kept {
            // A node that advertised this very address is this broker in an
            // earlier life (killed before it could leave): its id is taken
            // over, as a Kafka broker restarts under its broker.id. A new id
            // would make clients see the old one vanish from Metadata with
            // their coordinators on it, which librdkafka handles badly (a
            // transactional producer's send_offsets_to_transaction can hang).
            let id: i32 = client
                .query_one(
                    "WITH mine AS (
                         UPDATE queen.kafka_nodes SET heartbeat_at = now()
                         WHERE node_id = (SELECT min(node_id) FROM queen.kafka_nodes WHERE host = $1 AND port = $2)
                         RETURNING node_id),
                     made AS (
                         INSERT INTO queen.kafka_nodes (host, port, heartbeat_at)
                         SELECT $1, $2, now() WHERE NOT EXISTS (SELECT 1 FROM mine)
                         RETURNING node_id)
                     SELECT node_id FROM mine UNION ALL SELECT node_id FROM made",
                    &[&me.host, &me.port],
                )
                .await?
                .get(0);
            self.me.write().expect("nodes lock").id = id;
            tracing::info!(node = id, host = %me.host, port = me.port, "kafka node registered");
            client
                .execute("DELETE FROM queen.kafka_nodes WHERE host = $1 AND port = $2 AND node_id <> $3", &[&me.host, &me.port, &id])
                .await?;
            client.execute("DELETE FROM queen.kafka_nodes WHERE heartbeat_at < now() - interval '1 day'", &[]).await?;
        }
        let me = self.me();
        let rows = client
            .query(
                "SELECT node_id, host, port FROM queen.kafka_nodes
                 WHERE heartbeat_at > now() - make_interval(secs => $1) ORDER BY node_id",
                &[&crate::cluster::LIVE_WITHIN_SECONDS],
            )
            .await?;
        let mut live: Vec<Node> = rows.iter().map(|r| Node { id: r.get(0), host: r.get(1), port: r.get(2) }).collect();
        if !live.contains(&me) {
            live.push(me);
            live.sort_by_key(|n| n.id);
        }
        *self.live.write().expect("nodes lock") = live;
        Ok(())
    }
}

/// Rendezvous hashing: the node with the highest hash of (key, node id).
fn owner_of<'a>(nodes: &'a [Node], key: &str) -> Option<&'a Node> {
    nodes.iter().max_by_key(|n| {
        let mut bytes = key.as_bytes().to_vec();
        bytes.extend_from_slice(&n.id.to_be_bytes());
        (xxhash_rust::xxh3::xxh3_64(&bytes), n.id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: i32) -> Node {
        Node { id, host: "h".into(), port: 9092 + id }
    }

    #[test]
    fn every_broker_picks_the_same_owner_and_a_departure_moves_only_its_share() {
        let three = [node(1), node(2), node(3)];
        let keys: Vec<String> = (0..3000).map(|i| format!("group-{i}")).collect();
        let before: Vec<i32> = keys.iter().map(|k| owner_of(&three, k).unwrap().id).collect();
        for id in [1, 2, 3] {
            let share = before.iter().filter(|o| **o == id).count();
            assert!((800..1200).contains(&share), "node {id} owns {share} of 3000");
        }
        let mut shuffled = three.clone();
        shuffled.reverse();
        assert_eq!(keys.iter().map(|k| owner_of(&shuffled, k).unwrap().id).collect::<Vec<_>>(), before, "order does not matter");
        let two = [node(1), node(3)];
        for (k, was) in keys.iter().zip(&before) {
            let now = owner_of(&two, k).unwrap().id;
            if *was != 2 {
                assert_eq!(now, *was, "{k} moved though its owner stayed");
            }
        }
    }
}
