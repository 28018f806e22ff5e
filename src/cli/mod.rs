//! The operator CLI (issue 31 §2): `queen queues|groups|dlq|push|tail|status`
//! talk to a running broker over its HTTP API (`--url` / `QUEEN_URL`,
//! `--token` / `QUEEN_TOKEN`), print human tables by default and the
//! broker's JSON with `--json`, and exit with a code that says what
//! happened ([`http::exit`]). The broker's own commands (`serve`,
//! `migrate`) stay in main.rs; everything here is a client like any other,
//! so it works the same against a broker on another host.

pub mod http;
mod output;
mod stream;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use http::{query, seg, Broker, Failure};
use output::{cell, Table};

/// Where the broker is and how to talk to it: global options.
#[derive(Args, Clone)]
pub struct Target {
    /// The broker's base URL
    #[arg(long, env = "QUEEN_URL", default_value = "http://127.0.0.1:6632", global = true)]
    pub url: String,
    /// A bearer token (when the broker has JWT_ENABLED)
    #[arg(long, env = "QUEEN_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print the broker's JSON instead of a table
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum Queues {
    /// Every queue with its partitions and message count
    List {
        /// Only names containing this text
        #[arg(long)]
        filter: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One queue: its options, partitions and consumer groups
    Show { queue: String },
    /// Sets options of a queue (creating it): `--set leaseTime=30 --set retryLimit=5`
    Configure {
        queue: String,
        /// An option as name=value; the value is read as JSON when it parses, else as text
        #[arg(long = "set", value_name = "NAME=VALUE", required = true)]
        set: Vec<String>,
    },
    /// Deletes a queue and everything in it
    Delete {
        queue: String,
        /// Confirm the deletion
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Subcommand)]
pub enum Groups {
    /// Every consumer group with its lag
    List,
    /// One group's cursors, partition by partition
    Show { group: String },
    /// Partitions whose oldest unconsumed message is older than `--min-lag-seconds`
    Lag {
        #[arg(long, default_value_t = 0)]
        min_lag_seconds: u64,
    },
    /// Moves a group's cursors on a queue to the end or to a timestamp
    Seek {
        group: String,
        queue: String,
        /// Past every message there is now
        #[arg(long, conflicts_with = "to")]
        to_end: bool,
        /// To the first message at or after this ISO 8601 time
        #[arg(long, required_unless_present = "to_end")]
        to: Option<String>,
        /// Only this partition
        #[arg(long)]
        partition: Option<String>,
    },
    /// Deletes a group's cursors (on one queue with `--queue`)
    Delete {
        group: String,
        #[arg(long)]
        queue: Option<String>,
        /// Confirm the deletion
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Subcommand)]
pub enum Dlq {
    /// A queue's dead letters, newest first
    List {
        queue: String,
        #[arg(long)]
        group: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One dead letter of a queue, with its payload and error
    Show { queue: String, id: String },
    /// Pushes a dead letter back onto its queue
    Retry { id: String },
    /// Removes a queue's dead letters (of one group with `--group`)
    Purge {
        queue: String,
        #[arg(long)]
        group: Option<String>,
        /// Confirm the purge
        #[arg(long)]
        yes: bool,
    },
}

/// The arguments of `queen push`.
#[derive(Args)]
pub struct Push {
    pub queue: String,
    /// One message's payload, as JSON (text that is not JSON is sent as a string)
    pub message: Option<String>,
    #[arg(long, default_value = "Default")]
    pub partition: String,
    /// JSON lines to push, one payload a line (`-` for standard input)
    #[arg(long, conflicts_with = "message")]
    pub file: Option<std::path::PathBuf>,
    /// Messages per request
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub batch: u32,
}

/// The arguments of `queen tail`.
#[derive(Args)]
pub struct Tail {
    pub queue: String,
    /// Read as this consumer group (default: a throwaway group of this tail,
    /// removed when it ends, starting at new messages)
    #[arg(long, conflicts_with = "queue_mode")]
    pub group: Option<String>,
    /// Read in queue mode (no group): competes with the queue's other queue-mode consumers
    #[arg(long)]
    pub queue_mode: bool,
    /// Only this partition
    #[arg(long)]
    pub partition: Option<String>,
    /// A throwaway group starts at the queue's first message instead of new ones
    #[arg(long)]
    pub from_beginning: bool,
    /// Lease each batch and ack it once printed (default: committed at delivery)
    #[arg(long)]
    pub leased: bool,
    /// One JSON object a line instead of the pretty form
    #[arg(long)]
    pub raw: bool,
    /// Stop after this many messages
    #[arg(long)]
    pub limit: Option<u64>,
    /// Stop after this many seconds
    #[arg(long)]
    pub seconds: Option<u64>,
}

/// `queen queues …`.
pub async fn queues(t: &Target, cmd: Queues) -> Result<(), Failure> {
    let b = Broker::new(&t.url, t.token.clone());
    match cmd {
        Queues::List { filter, limit } => {
            let v = b.get(&format!("/api/v1/resources/queues{}", query(&[("filter", filter), ("limit", Some(limit.to_string()))]))).await?;
            output::print(t.json, &v, || {
                let mut table = Table::new(&["QUEUE", "NAMESPACE", "TASK", "PARTITIONS", "MESSAGES", "CREATED"]);
                for q in v["queues"].as_array().into_iter().flatten() {
                    table.row(vec![cell(&q["name"]), cell(&q["namespace"]), cell(&q["task"]), cell(&q["partitions"]), cell(&q["messages"]), cell(&q["createdAt"])]);
                }
                format!("{}\n{} of {} queues", table.render(), v["queues"].as_array().map_or(0, Vec::len), cell(&v["total"]))
            });
        }
        Queues::Show { queue } => {
            let v = b.get(&format!("/api/v1/resources/queues/{}", seg(&queue))).await?;
            output::print(t.json, &v, || {
                let mut table = Table::new(&["FIELD", "VALUE"]);
                for k in ["name", "namespace", "task", "partitions", "messages", "lastWriteAt", "createdAt"] {
                    table.row(vec![k.to_string(), cell(&v[k])]);
                }
                table.row(vec!["consumerGroups".into(), v["consumerGroups"].as_array().map_or(String::new(), |g| g.iter().map(cell).collect::<Vec<_>>().join(", "))]);
                let mut options = Table::new(&["OPTION", "VALUE"]);
                if let Some(o) = v["options"].as_object() {
                    for (k, val) in o {
                        options.row(vec![k.clone(), cell(val)]);
                    }
                }
                format!("{}\n\n{}", table.render(), options.render())
            });
        }
        Queues::Configure { queue, set } => {
            let mut options = serde_json::Map::new();
            for kv in set {
                let Some((k, v)) = kv.split_once('=') else { return Err(Failure::usage(format!("--set {kv:?}: expected NAME=VALUE"))) };
                let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
                options.insert(k.trim().to_string(), value);
            }
            let v = b.post("/api/v1/configure", &json!({"queue": queue, "options": options})).await?;
            output::print(t.json, &v, || format!("configured {queue}"));
        }
        Queues::Delete { queue, yes } => {
            confirm(yes, &format!("deleting queue {queue:?} removes every message and cursor in it"))?;
            let v = b.delete(&format!("/api/v1/resources/queues/{}", seg(&queue))).await?;
            output::print(t.json, &v, || format!("deleted {queue}"));
        }
    }
    Ok(())
}

/// `queen groups …`.
pub async fn groups(t: &Target, cmd: Groups) -> Result<(), Failure> {
    let b = Broker::new(&t.url, t.token.clone());
    match cmd {
        Groups::List => {
            let v = b.get("/api/v1/consumer-groups").await?;
            output::print(t.json, &v, || {
                let mut table = Table::new(&["GROUP", "QUEUES", "MEMBERS", "LAG", "MAX LAG S", "STATE", "SUBSCRIPTION"]);
                for g in v.as_array().into_iter().flatten() {
                    let queues = g["queues"].as_array().map_or(String::new(), |q| q.iter().map(cell).collect::<Vec<_>>().join(", "));
                    table.row(vec![cell(&g["name"]), queues, cell(&g["members"]), cell(&g["totalLag"]), cell(&g["maxTimeLag"]), cell(&g["state"]), cell(&g["subscriptionMode"])]);
                }
                table.render()
            });
        }
        Groups::Show { group } => {
            let v = b.get(&format!("/api/v1/consumer-groups/{}", seg(&group))).await?;
            if v.as_object().is_some_and(|o| o.is_empty()) {
                return Err(Failure::not_found(format!("no consumer group {group:?}")));
            }
            output::print(t.json, &v, || {
                let mut table = Table::new(&["QUEUE", "PARTITION", "COMMITTED", "LAG", "LAG S", "LEASED", "LAST CONSUMED"]);
                for (queue, q) in v.as_object().into_iter().flatten() {
                    for p in q["partitions"].as_array().into_iter().flatten() {
                        table.row(vec![queue.clone(), cell(&p["partition"]), cell(&p["committedOffset"]), cell(&p["offsetLag"]), cell(&p["timeLagSeconds"]), cell(&p["leaseActive"]), cell(&p["lastConsumedAt"])]);
                    }
                }
                table.render()
            });
        }
        Groups::Lag { min_lag_seconds } => {
            let v = b.get(&format!("/api/v1/consumer-groups/lagging?minLagSeconds={min_lag_seconds}")).await?;
            output::print(t.json, &v, || {
                let mut table = Table::new(&["GROUP", "QUEUE", "PARTITION", "LAG", "LAG S", "OLDEST UNCONSUMED"]);
                for r in v.as_array().into_iter().flatten() {
                    table.row(vec![cell(&r["consumer_group"]), cell(&r["queue_name"]), cell(&r["partition_name"]), cell(&r["offset_lag"]), cell(&r["time_lag_seconds"]), cell(&r["oldest_unconsumed_at"])]);
                }
                table.render()
            });
        }
        Groups::Seek { group, queue, to_end, to, partition } => {
            let body = if to_end { json!({"toEnd": true}) } else { json!({"timestamp": to}) };
            let path = match &partition {
                Some(p) => format!("/api/v1/consumer-groups/{}/queues/{}/partitions/{}/seek", seg(&group), seg(&queue), seg(p)),
                None => format!("/api/v1/consumer-groups/{}/queues/{}/seek", seg(&group), seg(&queue)),
            };
            let v = b.post(&path, &body).await?;
            let target = if to_end { "the end".to_string() } else { to.unwrap_or_default() };
            output::print(t.json, &v, || format!("{group} on {queue}: cursors moved to {target}"));
        }
        Groups::Delete { group, queue, yes } => {
            confirm(yes, &format!("deleting group {group:?} forgets where it read"))?;
            let path = match &queue {
                Some(q) => format!("/api/v1/consumer-groups/{}/queues/{}", seg(&group), seg(q)),
                None => format!("/api/v1/consumer-groups/{}", seg(&group)),
            };
            let v = b.delete(&path).await?;
            output::print(t.json, &v, || format!("deleted group {group}"));
        }
    }
    Ok(())
}

/// `queen dlq …`.
pub async fn dlq(t: &Target, cmd: Dlq) -> Result<(), Failure> {
    let b = Broker::new(&t.url, t.token.clone());
    match cmd {
        Dlq::List { queue, group, limit } => {
            let v = b.get(&format!("/api/v1/dlq{}", query(&[("queue", Some(queue)), ("consumerGroup", group), ("limit", Some(limit.to_string()))]))).await?;
            output::print(t.json, &v, || {
                let mut table = Table::new(&["ID", "QUEUE", "PARTITION", "GROUP", "RETRIES", "ERROR", "FAILED AT"]);
                for m in v["messages"].as_array().into_iter().flatten() {
                    table.row(vec![cell(&m["id"]), cell(&m["queue"]), cell(&m["partition"]), cell(&m["consumerGroup"]), cell(&m["retryCount"]), output::clip(&cell(&m["errorMessage"]), 60), cell(&m["dlqTimestamp"])]);
                }
                format!("{}\n{} of {} dead letters", table.render(), v["messages"].as_array().map_or(0, Vec::len), cell(&v["total"]))
            });
        }
        Dlq::Show { queue, id } => {
            let m = find_dead_letter(&b, &queue, &id).await?;
            output::print(t.json, &m, || {
                let mut table = Table::new(&["FIELD", "VALUE"]);
                for k in ["id", "queue", "partition", "consumerGroup", "transactionId", "retryCount", "errorMessage", "dlqTimestamp", "createdAt"] {
                    table.row(vec![k.to_string(), cell(&m[k])]);
                }
                let payload = m.get("data").or_else(|| m.get("payload")).cloned().unwrap_or(Value::Null);
                format!("{}\n\n{}", table.render(), serde_json::to_string_pretty(&payload).unwrap_or_default())
            });
        }
        Dlq::Retry { id } => {
            let v = b.post(&format!("/api/v1/dlq/{}/replay", seg(&id)), &json!({})).await?;
            output::print(t.json, &v, || format!("dead letter {id} pushed back"));
        }
        Dlq::Purge { queue, group, yes } => {
            confirm(yes, &format!("purging the dead letters of {queue:?} removes them for good"))?;
            let v = b.call(reqwest::Method::DELETE, &format!("/api/v1/dlq{}", query(&[("queue", Some(queue.clone())), ("consumerGroup", group)])), None).await?;
            output::print(t.json, &v, || format!("purged {} dead letters of {queue}", cell(&v["deleted"])));
        }
    }
    Ok(())
}

/// A dead letter of `queue` by id, paging through its DLQ (bounded: 100
/// pages of 1,000).
async fn find_dead_letter(b: &Broker, queue: &str, id: &str) -> Result<Value, Failure> {
    for page in 0..100u32 {
        let v = b.get(&format!("/api/v1/dlq{}", query(&[("queue", Some(queue.to_string())), ("limit", Some("1000".into())), ("offset", Some((page * 1000).to_string()))]))).await?;
        let messages = v["messages"].as_array().cloned().unwrap_or_default();
        if let Some(m) = messages.iter().find(|m| m["id"].as_str() == Some(id)) {
            return Ok(m.clone());
        }
        if messages.len() < 1000 {
            break;
        }
    }
    Err(Failure::not_found(format!("no dead letter {id:?}")))
}

/// `queen status`: the broker's health and totals.
pub async fn status(t: &Target) -> Result<(), Failure> {
    let b = Broker::new(&t.url, t.token.clone());
    let health = b.get("/health").await?;
    let s = b.get("/api/v1/status").await?;
    let v = json!({"health": health, "status": s});
    output::print(t.json, &v, || {
        let mut table = Table::new(&["", ""]);
        let rows: [(&str, String); 9] = [
            ("broker", format!("{} {} at {}", cell(&health["status"]), cell(&health["version"]), t.url)),
            ("database", cell(&health["database"])),
            ("queues", cell(&s["queues"])),
            ("partitions", cell(&s["partitions"])),
            ("messages", format!("{} ({} pending)", cell(&s["messages"]["total"]), cell(&s["messages"]["pending"]))),
            ("consumer groups", cell(&s["consumerGroups"])),
            ("active leases", cell(&s["leases"]["active"])),
            ("max lag", format!("{} s", cell(&s["maxLagSeconds"]))),
            ("dead letters", cell(&s["deadLetters"])),
        ];
        for (k, v) in rows {
            table.row(vec![k.to_string(), v]);
        }
        table.render()
    });
    Ok(())
}

pub use stream::{push, tail};

fn confirm(yes: bool, what: &str) -> Result<(), Failure> {
    if yes {
        Ok(())
    } else {
        Err(Failure::usage(format!("{what}; add --yes to do it")))
    }
}
