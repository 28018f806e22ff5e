//! `queen-bench`: load generator for a running broker.
//!
//! Scenarios: `push`, `consume`, `fetch`, `e2e`, `fanout`, `idle`, `wake`,
//! the coordination families `kv`, `locks`, `timers`
//! (src/bench/coordination.rs), `streams` and `ephemeral`. Each run
//! prints a human table and one JSON line (`{"scenario":…}`) for scripts.
//! Every loop is bounded by a duration; only the given URL is contacted.

use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

#[path = "../bench/coordination.rs"]
mod coordination;
#[path = "../bench/ephemeral.rs"]
mod ephemeral;
#[path = "../bench/lean.rs"]
mod lean;
#[path = "../bench/streams.rs"]
mod streams;
use serde_json::json;

#[derive(Parser)]
#[command(name = "queen-bench", about = "Load generator for a Queen broker")]
struct Cli {
    /// Broker base URL
    #[arg(long, default_value = "http://127.0.0.1:6632", global = true)]
    url: String,
    #[command(subcommand)]
    scenario: Scenario,
}

/// One side of `queen-bench streams`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StreamSide {
    Stream,
    Plain,
}

#[derive(Subcommand)]
enum Scenario {
    /// An ephemeral queue beside a durable one: push, pop+ack, wake, RSS per million queued
    Ephemeral {
        #[arg(long, default_value_t = 1_000_000)]
        messages: usize,
        #[arg(long, default_value_t = 10)]
        partitions: usize,
        #[arg(long, default_value_t = 8)]
        clients: usize,
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Wake trials (a parked pop woken by one push)
        #[arg(long, default_value_t = 200)]
        trials: usize,
    },
    /// A tumbling-window sum through /streams/v1/cycle beside a plain leased consume of the same messages
    Streams {
        #[arg(long, default_value_t = 100_000)]
        messages: usize,
        #[arg(long, default_value_t = 20)]
        partitions: usize,
        /// Concurrent stream workers (and plain consumers)
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// Messages per pop
        #[arg(long, default_value_t = 200)]
        batch: usize,
        #[arg(long, default_value_t = 120)]
        duration: u64,
        /// Run one side only (`stream` or `plain`), so that the CPU each
        /// process spends can be sampled for it alone (scripts/bench-streams.sh)
        #[arg(long)]
        only: Option<StreamSide>,
    },
    /// KV calls per second: single puts, single gets, or 100-put batches
    Kv {
        #[arg(long, value_enum, default_value = "put")]
        mode: coordination::KvMode,
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        #[arg(long, default_value_t = 10)]
        duration: u64,
    },
    /// Lock acquire/release cycles per second
    Locks {
        #[arg(long, default_value_t = 32)]
        contenders: usize,
        /// Distinct lock names the contenders cycle over
        #[arg(long, default_value_t = 1)]
        locks: usize,
        /// Milliseconds a refused contender waits before trying again
        #[arg(long, default_value_t = 10)]
        retry_ms: u64,
        #[arg(long, default_value_t = 10)]
        duration: u64,
    },
    /// Schedule timers due over a window, drain them as they fire: lateness and duplicates
    Timers {
        #[arg(long, default_value_t = 100_000)]
        count: usize,
        /// Seconds from the start of the run to the first due time
        #[arg(long, default_value_t = 10)]
        start: u64,
        /// Seconds the due times spread over
        #[arg(long, default_value_t = 10)]
        spread: u64,
        /// Concurrent scheduling clients
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
    },
    /// Producers only: concurrent clients pushing batches round-robin over partitions
    Push {
        /// Messages per request
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Partitions of the queue
        #[arg(long, default_value_t = 10)]
        partitions: usize,
        /// Concurrent clients (each with its own keep-alive connection)
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Seconds to run
        #[arg(long, default_value_t = 20)]
        duration: u64,
        /// Payload size in bytes (a JSON string of this length)
        #[arg(long, default_value_t = 100)]
        payload_size: usize,
        /// Queue name (default: a fresh one per run)
        #[arg(long)]
        queue: Option<String>,
        /// Spread the requests over this many queues of `partitions` each
        /// (named `<queue>.0`, `<queue>.1`, …): request n goes to queue
        /// n mod queues, so N requests over N queue-partitions touch each once
        #[arg(long, default_value_t = 1)]
        queues: usize,
        /// Send `QPB1` bodies with pre-framed, pre-compressed groups (flag 8)
        /// instead of JSON
        #[arg(long)]
        binary: bool,
        /// Configure the queue's dedupWindowSeconds first (0: no dedup and no
        /// transaction index; default: the broker's 3600)
        #[arg(long)]
        dedup_window: Option<u32>,
        /// Configure the queue with encryptionEnabled first (the broker
        /// needs QUEEN_ENCRYPTION_KEY)
        #[arg(long)]
        encrypted: bool,
        /// High-entropy payloads (random base64 text, 4,096 different ones)
        /// instead of one repeated character, which compresses to nothing
        #[arg(long)]
        random_payload: bool,
        /// Who mints each message's transactionId: `client` (a random v4
        /// uuid per message, as every official client does: the path users
        /// take, and the default) or `broker` (none sent: the broker mints
        /// time-ordered v7 ids)
        #[arg(long, value_enum, default_value_t = Ids::Client)]
        ids: Ids,
        /// Spread the requests over this many tenants (`x-queen-tenant`;
        /// the broker needs QUEEN_TENANCY_HEADER and QUEEN_TRUSTED_PROXY):
        /// request n goes to tenant n mod tenants, each tenant's queue of
        /// the same name, as `--queues` spreads over queues
        #[arg(long, default_value_t = 0, conflicts_with = "queues")]
        tenants: usize,
    },
    /// Drain a pre-filled backlog: leased pops + ack/batch (or autoAck)
    Consume {
        /// Messages pre-filled before the clock starts
        #[arg(long, default_value_t = 100_000)]
        messages: usize,
        /// Partitions of the queue
        #[arg(long, default_value_t = 10)]
        partitions: usize,
        /// Pop budget per call
        #[arg(long, default_value_t = 500)]
        batch: usize,
        /// Partitions one pop may claim
        #[arg(long, default_value_t = 4)]
        pop_partitions: usize,
        /// Concurrent consumers
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Commit inside the pop instead of leasing and acking
        #[arg(long)]
        auto_ack: bool,
        /// Ask for framed (`QPF1`) answers and decode them as a client would
        /// (with --auto-ack)
        #[arg(long, requires = "auto_ack")]
        frames: bool,
        /// Longest run, seconds
        #[arg(long, default_value_t = 120)]
        duration: u64,
        #[arg(long, default_value_t = 100)]
        payload_size: usize,
        /// Configure the queue with encryptionEnabled before the prefill
        /// (the broker needs QUEEN_ENCRYPTION_KEY)
        #[arg(long)]
        encrypted: bool,
        /// High-entropy payloads, as for push
        #[arg(long)]
        random_payload: bool,
        /// Trace every message before acking it, as a client's handler
        /// calling `message.trace(...)` does: one `POST /api/v1/traces` per
        /// message, awaited in turn (leased mode only)
        #[arg(long, conflicts_with = "auto_ack")]
        trace: bool,
        /// Long-poll (`wait=true`, 1 s), as the clients' consume loops do,
        /// instead of sleeping 5 ms after an empty answer
        #[arg(long)]
        wait: bool,
        /// Spread the backlog over this many queues of `partitions` each;
        /// each consumer pops its share of them in turn, one pop each
        #[arg(long, default_value_t = 1)]
        queues: usize,
        /// Drain this queue as it is (one `fill` made) instead of
        /// pre-filling a fresh one: the clock measures the drain alone
        #[arg(long, conflicts_with_all = ["encrypted", "queues"])]
        queue: Option<String>,
        /// The consumer group: `bench`, or `e2e` (the group `e2e` reads
        /// with), to bring its cursors to the end of a queue first
        #[arg(long, default_value = "bench", value_parser = ["bench", "e2e"])]
        group: String,
        /// Spread the backlog over this many tenants' queues of the same
        /// name (`x-queen-tenant`; the broker needs QUEEN_TENANCY_HEADER and
        /// QUEEN_TRUSTED_PROXY), as `--queues` spreads it over queues
        #[arg(long, default_value_t = 0, conflicts_with_all = ["encrypted", "queues", "queue"])]
        tenants: usize,
    },
    /// Read one partition of a pre-filled backlog by offset (`POST
    /// /api/v1/fetch`, no lease), then drain the same partition with leased
    /// pops + ack/batch: msg/s and MB/s of each
    Fetch {
        /// Messages pre-filled into the one partition
        #[arg(long, default_value_t = 1_000_000)]
        messages: usize,
        /// Payload bytes one fetch entry may carry
        #[arg(long, default_value_t = 8 << 20)]
        max_bytes: usize,
        #[arg(long, default_value_t = 100)]
        payload_size: usize,
        /// Longest run of each half, seconds
        #[arg(long, default_value_t = 120)]
        duration: u64,
    },
    /// Producers at a fixed rate and long-poll consumers together: delivery latency
    E2e {
        /// Messages per second, all producers together
        #[arg(long, default_value_t = 5000)]
        rate: usize,
        /// Messages per push request
        #[arg(long, default_value_t = 100)]
        batch: usize,
        #[arg(long, default_value_t = 10)]
        partitions: usize,
        /// Concurrent long-poll consumers
        #[arg(long, default_value_t = 4)]
        consumers: usize,
        #[arg(long, default_value_t = 20)]
        duration: u64,
        /// Also time a 4 KiB write + fdatasync in this directory every 10 ms
        /// while the producers run: the disk's own commit latency in the same
        /// window (give the PostgreSQL data directory), the bound on any
        /// durable push's tail
        #[arg(long)]
        fsync_probe: Option<std::path::PathBuf>,
        /// Payload size in bytes: the send-time stamp every payload carries,
        /// padded to this length (default: the stamp alone, about 20 bytes)
        #[arg(long)]
        payload_size: Option<usize>,
        /// Queue name (default: a fresh one per run); an existing queue's
        /// partitions `p0`, `p1`, … are pushed to as they are, so a queue
        /// `fill` made wide measures long-polls spread over its partitions
        #[arg(long)]
        queue: Option<String>,
    },
    /// Only the prefill of `consume`: MESSAGES spread evenly over PARTITIONS
    /// partitions (`p0`, `p1`, …) of QUEUE, up to 1,000 messages a request,
    /// so a wide queue is made in seconds rather than one request per
    /// partition
    Fill {
        #[arg(long)]
        queue: String,
        #[arg(long, default_value_t = 1_000_000)]
        messages: usize,
        #[arg(long, default_value_t = 1_000_000)]
        partitions: usize,
    },
    /// One producer side, G consumer groups each reading everything
    Fanout {
        /// Messages pushed in all
        #[arg(long, default_value_t = 200_000)]
        messages: usize,
        /// Messages per push request
        #[arg(long, default_value_t = 100)]
        batch: usize,
        #[arg(long, default_value_t = 10)]
        partitions: usize,
        /// Concurrent producers
        #[arg(long, default_value_t = 2)]
        producers: usize,
        /// Consumer groups, each of which reads every message
        #[arg(long, default_value_t = 4)]
        groups: usize,
        /// Long-poll consumers per group (leased pops + ack/batch)
        #[arg(long, default_value_t = 2)]
        consumers: usize,
        /// Longest run, seconds
        #[arg(long, default_value_t = 120)]
        duration: u64,
        /// Payload size in bytes: the send-time stamp every payload carries,
        /// padded to this length (default: the stamp alone, about 20 bytes)
        #[arg(long)]
        payload_size: Option<usize>,
        /// Offered push rate, messages a second over all producers (default:
        /// as fast as they can)
        #[arg(long)]
        rate: Option<f64>,
    },
    /// N parked long-poll consumers on N queues: broker CPU, RSS and database
    /// connections while nothing happens (read from the broker's /metrics)
    Idle {
        /// Parked consumers (one queue each)
        #[arg(long, default_value_t = 10_000)]
        consumers: usize,
        /// Seconds to measure once all are parked
        #[arg(long, default_value_t = 30)]
        duration: u64,
    },
    /// Long-poll wake latency: one parked pop, one push, repeated
    Wake {
        /// Number of trials
        #[arg(long, default_value_t = 200)]
        trials: usize,
        /// How long the pop is parked before the push, in ms
        #[arg(long, default_value_t = 50)]
        park_ms: u64,
        /// The queue's delayedProcessing in seconds: latency is then measured
        /// from the moment the message becomes visible (push + delay)
        #[arg(long, default_value_t = 0)]
        delayed_s: u64,
        /// The queue's windowBuffer in seconds: each push then carries a whole
        /// batch, so the broker's hold should end as it lands
        #[arg(long, default_value_t = 0)]
        window_s: u64,
        /// Park the pops on this broker (another broker on the same
        /// database) while pushing through --url
        #[arg(long)]
        pop_url: Option<String>,
    },
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    match cli.scenario {
        Scenario::Push { batch, partitions, concurrency, duration, payload_size, queue, queues, binary, dedup_window, encrypted, random_payload, ids, tenants } => {
            let queue = queue.unwrap_or_else(|| format!("bench.push.{}", uuid::Uuid::now_v7().simple()));
            let mut options = serde_json::Map::new();
            if let Some(window) = dedup_window {
                options.insert("dedupWindowSeconds".into(), json!(window));
            }
            if encrypted {
                options.insert("encryptionEnabled".into(), json!(true));
            }
            if !options.is_empty() {
                configure_queue(&cli.url, &queue, options.into()).await;
            }
            let how = PushKind { binary, dedup_window, encrypted, random_payload, ids, queues: queues.max(1), tenants };
            push(&cli.url, &queue, batch, partitions.max(1), concurrency.max(1), Duration::from_secs(duration), payload_size, how).await
        }
        Scenario::Wake { trials, park_ms, delayed_s, window_s, pop_url } => {
            let pop_url = pop_url.unwrap_or_else(|| cli.url.clone());
            wake(&cli.url, &pop_url, trials, Duration::from_millis(park_ms), Duration::from_secs(delayed_s), window_s).await
        }
        Scenario::Ephemeral { messages, partitions, clients, batch, trials } => {
            ephemeral::run(&cli.url, messages.max(1), partitions.max(1), clients.max(1), batch.max(1), trials).await
        }
        Scenario::Streams { messages, partitions, workers, batch, duration, only } => {
            let limit = Duration::from_secs(duration);
            let (workers, batch, partitions) = (workers.max(1), batch.max(1), partitions.max(1));
            let side = |s: StreamSide| only.is_none_or(|o| o == s);
            let (mut stream, mut plain) = (None, None);
            if side(StreamSide::Stream) {
                let source = format!("bench.streams.{}", uuid::Uuid::now_v7().simple());
                prefill(&cli.url, &source, messages, partitions, 1, payload_pool(100, false)).await;
                println!("prefilled {messages} messages for the stream");
                stream = Some(streams::run_stream(&cli.url, &source, messages, workers, batch, limit).await);
            }
            if side(StreamSide::Plain) {
                let plain_queue = format!("bench.streams.plain.{}", uuid::Uuid::now_v7().simple());
                prefill(&cli.url, &plain_queue, messages, partitions, 1, payload_pool(100, false)).await;
                println!("prefilled {messages} messages for the plain consume");
                let started = Instant::now();
                let how = Drain {
                    queue: plain_queue, mode: Mode::Leased, encrypted: false, random_payload: false, prefilled: true, trace: false, wait: false, queues: 1,
                    group: "bench", tenants: 0,
                };
                consume(&cli.url, messages, partitions, batch, 1, workers, how, limit, 100).await;
                plain = Some(messages as f64 / started.elapsed().as_secs_f64());
            }
            let ratio = stream.zip(plain).map(|(s, p)| s / p);
            println!("{}", json!({"scenario": "streams", "messages": messages, "partitions": partitions, "workers": workers, "batch": batch,
                                  "stream_msg_per_s": stream, "plain_msg_per_s": plain, "ratio": ratio}));
        }
        Scenario::Kv { mode, concurrency, duration } => coordination::kv(&cli.url, mode, concurrency.max(1), Duration::from_secs(duration)).await,
        Scenario::Locks { contenders, locks, retry_ms, duration } => {
            coordination::locks(&cli.url, contenders.max(1), locks.max(1), Duration::from_millis(retry_ms), Duration::from_secs(duration)).await
        }
        Scenario::Timers { count, start, spread, concurrency } => {
            coordination::timers(&cli.url, count.max(1), Duration::from_secs(start), Duration::from_secs(spread), concurrency.max(1)).await
        }
        Scenario::Idle { consumers, duration } => idle(&cli.url, consumers.max(1), Duration::from_secs(duration)).await,
        Scenario::Consume {
            messages, partitions, batch, pop_partitions, concurrency, auto_ack, frames, duration, payload_size, encrypted, random_payload, trace, wait, queues,
            queue, group, tenants,
        } => {
            assert!(!(encrypted && queues > 1), "--encrypted configures one queue; use it without --queues");
            let mode = match (auto_ack, frames) {
                (_, true) => Mode::Frames,
                (true, false) => Mode::AutoAck,
                (false, false) => Mode::Leased,
            };
            let prefilled = queue.is_some();
            let queue = queue.unwrap_or_else(|| format!("bench.consume.{}", uuid::Uuid::now_v7().simple()));
            if encrypted {
                configure_queue(&cli.url, &queue, json!({"encryptionEnabled": true})).await;
            }
            let group: &'static str = if group == "e2e" { "e2e" } else { "bench" };
            let how = Drain { queue, mode, encrypted, random_payload, prefilled, trace, wait, queues: queues.max(1), group, tenants };
            consume(&cli.url, messages, partitions.max(1), batch, pop_partitions, concurrency.max(1), how, Duration::from_secs(duration), payload_size).await
        }
        Scenario::Fetch { messages, max_bytes, payload_size, duration } => {
            let queue = format!("bench.fetch.{}", uuid::Uuid::now_v7().simple());
            let filled = Instant::now();
            prefill(&cli.url, &queue, messages, 1, 1, payload_pool(payload_size, false)).await;
            println!("prefilled {messages} messages into one partition in {:.1}s", filled.elapsed().as_secs_f64());
            fetch_all(&cli.url, &queue, messages, max_bytes, Duration::from_secs(duration)).await;
            let how = Drain {
                queue, mode: Mode::Leased, encrypted: false, random_payload: false, prefilled: true, trace: false, wait: false, queues: 1, group: "bench",
                tenants: 0,
            };
            consume(&cli.url, messages, 1, 500, 1, 1, how, Duration::from_secs(duration), payload_size).await
        }
        Scenario::Fanout { messages, batch, partitions, producers, groups, consumers, duration, payload_size, rate } => {
            let shape = Shape { batch: batch.max(1), partitions: partitions.max(1), payload_size };
            fanout(&cli.url, messages, shape, producers.max(1), groups.max(1), consumers.max(1), Duration::from_secs(duration), rate).await
        }
        Scenario::E2e { rate, batch, partitions, consumers, duration, fsync_probe, payload_size, queue } => {
            let shape = Shape { batch: batch.max(1), partitions: partitions.max(1), payload_size };
            let queue = queue.unwrap_or_else(|| format!("bench.e2e.{}", uuid::Uuid::now_v7().simple()));
            e2e(&cli.url, &queue, rate.max(1), shape, consumers.max(1), Duration::from_secs(duration), fsync_probe).await
        }
        Scenario::Fill { queue, messages, partitions } => {
            let filled = Instant::now();
            prefill(&cli.url, &queue, messages, partitions.max(1), 1, payload_pool(100, false)).await;
            let secs = filled.elapsed().as_secs_f64();
            println!("filled {messages} messages over {partitions} partitions of {queue} in {secs:.1} s ({:.0} msg/s)", messages as f64 / secs);
        }
    }
}

/// Percentile (0..=1) of sorted durations, in milliseconds.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Messages a wake trial's pop asks for (and a window trial pushes at once).
const WAKE_BATCH: usize = 10;

async fn wake(url: &str, pop_base: &str, trials: usize, park: Duration, delayed: Duration, window_s: u64) {
    let queue = format!("bench.wake.{}", uuid::Uuid::now_v7().simple());
    let client = reqwest::Client::new();
    if !delayed.is_zero() || window_s > 0 {
        let body = json!({"queue": queue, "options": {"delayedProcessing": delayed.as_secs(), "windowBuffer": window_s}});
        let r = client.post(format!("{url}/api/v1/configure")).json(&body).send().await.expect("broker reachable");
        assert!(r.status().is_success(), "configure answered {}", r.status());
    }
    let per_push = if window_s > 0 { WAKE_BATCH } else { 1 };
    let timeout_ms = 10_000 + delayed.as_millis();
    let pop_url = format!("{pop_base}/api/v1/pop/queue/{queue}?wait=true&timeout={timeout_ms}&autoAck=true&batch={WAKE_BATCH}");
    // First contact outside the measurement (on both brokers, when two).
    let _ = client.get(format!("{url}/api/v1/pop/queue/{queue}?autoAck=true")).send().await;
    let _ = client.get(format!("{pop_base}/api/v1/pop/queue/{queue}?autoAck=true")).send().await;
    let (mut from_send, mut from_commit) = (Vec::new(), Vec::new());
    let mut missed = 0;
    for i in 0..trials {
        let popper = {
            let client = client.clone();
            let pop_url = pop_url.clone();
            tokio::spawn(async move {
                let r = client.get(&pop_url).send().await.ok()?;
                let ok = r.status().as_u16() == 200;
                let _ = r.bytes().await;
                ok.then(Instant::now)
            })
        };
        tokio::time::sleep(park).await;
        // A delayed message is due at its visibility time: lateness counts from there.
        let sent = Instant::now() + delayed;
        let items: Vec<serde_json::Value> = (0..per_push).map(|k| json!({"queue": queue, "payload": i * per_push + k})).collect();
        let r = client.post(format!("{url}/api/v1/push")).json(&json!({ "items": items })).send().await;
        let committed = Instant::now() + delayed;
        if !matches!(r, Ok(ref r) if r.status().as_u16() == 201) {
            missed += 1;
            continue;
        }
        match popper.await.ok().flatten() {
            Some(answered) => {
                from_send.push(answered.saturating_duration_since(sent));
                from_commit.push(answered.saturating_duration_since(committed));
            }
            None => missed += 1,
        }
    }
    from_send.sort();
    from_commit.sort();
    let label = match (delayed.is_zero(), window_s) {
        (false, _) => format!("delayed {} s", delayed.as_secs()),
        (true, 0) if pop_base != url => "plain, other broker".to_string(),
        (true, 0) => "plain".to_string(),
        (true, w) => format!("window {w} s, full batch"),
    };
    println!("scenario  trials  queue                measured-from        p50 ms   p90 ms   p99 ms   max ms   missed");
    for (from, v) in [("push sent", &from_send), ("push answered 201", &from_commit)] {
        println!(
            "wake      {trials:<7} {label:<20} {from:<20} {:<8.2} {:<8.2} {:<8.2} {:<8.2} {missed}",
            percentile_ms(v, 0.5),
            percentile_ms(v, 0.9),
            percentile_ms(v, 0.99),
            percentile_ms(v, 1.0)
        );
    }
    println!(
        "{}",
        json!({"scenario": "wake", "queue": label, "trials": trials, "missed": missed,
               "from_push_sent_ms": {"p50": percentile_ms(&from_send, 0.5), "p90": percentile_ms(&from_send, 0.9),
                                     "p99": percentile_ms(&from_send, 0.99), "max": percentile_ms(&from_send, 1.0)},
               "from_push_answered_ms": {"p50": percentile_ms(&from_commit, 0.5), "p90": percentile_ms(&from_commit, 0.9),
                                         "p99": percentile_ms(&from_commit, 0.99), "max": percentile_ms(&from_commit, 1.0)}})
    );
}

/// A `QPB1` body of one flag-8 group: `batch` frames with fresh v7 message
/// ids and transactionIds minted as `minted` says (a random v4, or the
/// message id's text), compressed as a client would.
fn qpb1_flag8(queue: &str, partition: &str, batch: usize, payload: &str, minted: Ids) -> Vec<u8> {
    let payload = serde_json::to_string(payload).expect("a string serializes");
    let ids: Vec<(uuid::Uuid, String)> = (0..batch)
        .map(|_| {
            let id = uuid::Uuid::now_v7();
            let txn = if minted == Ids::Client { uuid::Uuid::new_v4() } else { id };
            (id, txn.to_string())
        })
        .collect();
    let mut raw = Vec::new();
    for (id, txn) in &ids {
        queen::log::Frame { message_id: *id, trace_id: None, transaction_id: txn, producer_sub: None, encrypted: false, payload: payload.as_bytes() }
            .encode_into(&mut raw).expect("bench transactionId fits a frame");
    }
    let z = queen::log::compress_frames(&raw, 3);
    let mut b = Vec::with_capacity(z.len() + 64);
    b.extend_from_slice(b"QPB1");
    b.push(8);
    b.extend_from_slice(&1u32.to_le_bytes());
    for name in [queue, partition] {
        b.extend_from_slice(&(name.len() as u16).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
    }
    b.extend_from_slice(&(batch as u32).to_le_bytes());
    b.extend_from_slice(&(z.len() as u32).to_le_bytes());
    b.extend_from_slice(&z);
    b
}

/// Configures `queue` with `options` before a run (creating the queue).
async fn configure_queue(url: &str, queue: &str, options: serde_json::Value) {
    let body = json!({"queue": queue, "options": options});
    let r = reqwest::Client::new().post(format!("{url}/api/v1/configure")).json(&body).send().await.expect("broker reachable");
    assert!(r.status().is_success(), "configure answered {}", r.status());
}

#[allow(clippy::too_many_arguments)]
async fn push(
    url: &str,
    queue: &str,
    batch: usize,
    partitions: usize,
    concurrency: usize,
    duration: Duration,
    payload_size: usize,
    how: PushKind,
) {
    let PushKind { binary, dedup_window, encrypted, random_payload, ids, queues, tenants } = how;
    let payloads = payload_pool(payload_size, random_payload);
    let started = Instant::now();
    let deadline = started + duration;
    let peak_rss = rss_sampler(url, deadline);
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        // The lean client (`lean.rs`): the load generator shares the two
        // cores with what it measures.
        let mut client = lean::Lean::new(url);
        let base = queue.to_string();
        let payloads = payloads.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let (mut sent, mut errors) = (0u64, 0u64);
            // Client c sends its requests to partitions c, c + concurrency,
            // c + 2·concurrency, …: together the clients send each request to
            // the next partition, so a run of N requests over N partitions
            // touches every one once (with a step of 1 each client would walk
            // the same partitions one behind another, every partition
            // receiving `concurrency` requests in a row).
            let mut round = c;
            while Instant::now() < deadline {
                let queue = queue_of(&base, queues, round);
                // Tenants spread the requests as queues do: tenant n mod tenants.
                let spread = queues.max(tenants);
                let tenant = (tenants > 0).then(|| uuid::Uuid::from_u128(0x1000 + (round % tenants) as u128).to_string());
                let partition = format!("p{}", (round / spread) % partitions);
                round += concurrency;
                let payload = |k: usize| &payloads[(round * batch + k) % payloads.len()];
                let (body, content_type) = if binary {
                    (qpb1_flag8(&queue, &partition, batch, payload(0), ids), "application/octet-stream")
                } else {
                    let items: Vec<_> = (0..batch)
                        .map(|k| match ids {
                            Ids::Client => json!({"queue": queue, "partition": partition, "payload": payload(k),
                                                  "transactionId": uuid::Uuid::new_v4().to_string()}),
                            Ids::Broker => json!({"queue": queue, "partition": partition, "payload": payload(k)}),
                        })
                        .collect();
                    (serde_json::to_vec(&json!({ "items": items })).expect("serializable"), "application/json")
                };
                let t = Instant::now();
                match client.post("/api/v1/push", content_type, body, tenant.as_deref().map(|t| ("x-queen-tenant", t))).await {
                    Some((201, _)) => {
                        sent += batch as u64;
                        latencies.push(t.elapsed());
                    }
                    _ => errors += 1,
                }
            }
            (sent, errors, latencies)
        }));
    }
    let (mut sent, mut errors, mut latencies) = (0u64, 0u64, Vec::new());
    for t in tasks {
        let (s, e, l) = t.await.expect("worker does not panic");
        sent += s;
        errors += e;
        latencies.extend(l);
    }
    let secs = started.elapsed().as_secs_f64();
    let peak_rss_mb = peak_rss.await.unwrap_or(0) as f64 / 1048576.0;
    latencies.sort();
    let pct = |p: f64| percentile_ms(&latencies, p);
    let rate = sent as f64 / secs;
    println!("scenario  body    batch  partitions  concurrency  payload  seconds  messages   msg/s      req p50 ms  req p99 ms  errors  peak rss MB");
    println!(
        "push      {:<7} {batch:<6} {partitions:<11} {concurrency:<12} {payload_size:<8} {secs:<8.1} {sent:<10} {rate:<10.0} {:<11.2} {:<11.2} {errors:<7} {peak_rss_mb:.1}",
        if binary { "QPB1" } else { "JSON" },
        pct(0.5),
        pct(0.99)
    );
    println!(
        "{}",
        json!({"scenario": "push", "body": if binary { "QPB1" } else { "JSON" }, "batch": batch, "partitions": partitions, "concurrency": concurrency,
               "payload_size": payload_size, "seconds": secs, "messages": sent, "msg_per_s": rate,
               "req_p50_ms": pct(0.5), "req_p99_ms": pct(0.99), "errors": errors, "broker_peak_rss_mb": peak_rss_mb,
               "dedup_window": dedup_window, "encrypted": encrypted, "random_payload": random_payload,
               "ids": format!("{ids:?}").to_lowercase()})
    );
}

/// How a push scenario writes: the body, and the queue's options.
#[derive(Clone, Copy)]
struct PushKind {
    binary: bool,
    dedup_window: Option<u32>,
    encrypted: bool,
    random_payload: bool,
    ids: Ids,
    /// Queues the requests are spread over (`push --queues`).
    queues: usize,
    /// Tenants the requests are spread over (`push --tenants`; 0: none named).
    tenants: usize,
}

/// The name of queue `i` of a run spread over `queues` queues: `base`
/// itself when there is one.
fn queue_of(base: &str, queues: usize, i: usize) -> String {
    if queues <= 1 {
        base.to_string()
    } else {
        format!("{base}.{}", i % queues)
    }
}

/// Who mints a pushed message's transactionId (`push --ids`).
#[derive(Clone, Copy, PartialEq, Debug, clap::ValueEnum)]
enum Ids {
    /// A random v4 uuid per message, sent by the client.
    Client,
    /// None sent; the broker mints a v7.
    Broker,
}

/// The payloads a run cycles through: one string of `size - 2` repeated
/// characters (JSON quotes make `size`), or 4,096 random base64 strings of
/// that length, so that no segment holds the same payload twice and zstd
/// finds about as little to remove as in real data of high entropy.
fn payload_pool(size: usize, random: bool) -> std::sync::Arc<Vec<String>> {
    let len = size.saturating_sub(2);
    if !random {
        return std::sync::Arc::new(vec!["x".repeat(len)]);
    }
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut rng = rand::rng();
    std::sync::Arc::new(
        (0..4096)
            .map(|_| (0..len).map(|_| ALPHABET[rand::Rng::random_range(&mut rng, 0..64)] as char).collect())
            .collect(),
    )
}

/// Which queue a drain reads, and how.
struct Drain {
    queue: String,
    mode: Mode,
    encrypted: bool,
    random_payload: bool,
    /// The queue already holds the messages (the fetch scenario's).
    prefilled: bool,
    /// One trace per message before the ack.
    trace: bool,
    /// Long-polling pops.
    wait: bool,
    /// Queues the backlog is spread over (`consume --queues`).
    queues: usize,
    /// The consumer group that drains it.
    group: &'static str,
    /// Tenants the backlog is spread over (`consume --tenants`; 0: none named).
    tenants: usize,
}

/// Tenant `i` of a run spread over tenants (`--tenants`): neither the
/// default tenant nor a reserved one.
fn bench_tenant(i: usize) -> String {
    uuid::Uuid::from_u128(0x1000 + i as u128).to_string()
}

/// [`prefill`] over `tenants` tenants' queues named `queue`: each tenant's
/// share pushed in requests of its own (a request is one tenant's).
async fn prefill_tenants(url: &str, queue: &str, messages: usize, partitions: usize, tenants: usize, payloads: std::sync::Arc<Vec<String>>) {
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (client, url, queue, payloads) = (client.clone(), url.to_string(), queue.to_string(), payloads.clone());
        tasks.push(tokio::spawn(async move {
            for t in (worker..tenants).step_by(8) {
                // A partition's share in requests of its own, as `prefill`
                // sends a slot's: the segments are as large.
                let share = messages / tenants + usize::from(t < messages % tenants);
                for p in 0..partitions {
                    let n = share / partitions + usize::from(p < share % partitions);
                    let items: Vec<_> = (0..n).map(|k| json!({"queue": queue, "partition": format!("p{p}"), "payload": payloads[k % payloads.len()]})).collect();
                    for chunk in items.chunks(1000) {
                        let r = client.post(format!("{url}/api/v1/push")).header("x-queen-tenant", bench_tenant(t)).json(&json!({ "items": chunk })).send().await;
                        assert!(matches!(r, Ok(ref r) if r.status().as_u16() == 201), "prefill push failed");
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("prefill worker");
    }
}

/// Pushes `messages` spread evenly over `partitions` partitions of `queue`,
/// up to 1,000 per request (fewer when there are more partitions than
/// 1,000-message chunks, so that every partition gets its share).
/// Pushes `messages` evenly over `queues` × `partitions` (queue-partition
/// c gets chunk c, c + slots, …), a request carrying up to 1,000 messages:
/// one partition's chunk, or the chunks of several shallow partitions, so
/// a backlog of ten messages in each of 1,000,000 partitions takes 10,000
/// requests, not 1,000,000.
async fn prefill(url: &str, queue: &str, messages: usize, partitions: usize, queues: usize, payloads: std::sync::Arc<Vec<String>>) {
    let client = reqwest::Client::new();
    let slots = partitions * queues;
    let per = (messages / slots).clamp(1, 1000);
    let chunks: Vec<usize> = (0..messages.div_ceil(per)).collect();
    let requests: Vec<Vec<usize>> = chunks.chunks((1000 / per).max(1)).map(<[usize]>::to_vec).collect();
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (client, url, queue, payloads) = (client.clone(), url.to_string(), queue.to_string(), payloads.clone());
        let mine: Vec<Vec<usize>> = requests.iter().enumerate().filter(|(i, _)| i % 8 == worker).map(|(_, r)| r.clone()).collect();
        tasks.push(tokio::spawn(async move {
            for request in mine {
                let mut items = Vec::new();
                for c in request {
                    let n = per.min(messages - c * per);
                    let slot = c % slots;
                    let (queue, partition) = (queue_of(&queue, queues, slot), format!("p{}", slot / queues));
                    items.extend((0..n).map(|k| json!({"queue": queue, "partition": partition, "payload": payloads[(c * per + k) % payloads.len()]})));
                }
                let r = client.post(format!("{url}/api/v1/push")).json(&json!({ "items": items })).send().await;
                assert!(matches!(r, Ok(ref r) if r.status().as_u16() == 201), "prefill push failed");
            }
        }));
    }
    for t in tasks {
        t.await.expect("prefill worker");
    }
}

/// How `consume` reads: leased JSON pops + `ack/batch`, JSON pops with
/// `autoAck`, or framed pops with `autoAck`.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Leased,
    AutoAck,
    Frames,
}

/// Messages in a `QPF1` answer, decoded as a client does: every shipped
/// segment decompressed and sliced to its claim's `start..=end`.
fn count_framed(body: &[u8]) -> usize {
    struct R<'a>(&'a [u8], usize);
    impl<'a> R<'a> {
        fn take(&mut self, n: usize) -> &'a [u8] {
            let s = &self.0[self.1..self.1 + n];
            self.1 += n;
            s
        }
        fn u16(&mut self) -> usize { u16::from_le_bytes(self.take(2).try_into().expect("2")) as usize }
        fn u32(&mut self) -> usize { u32::from_le_bytes(self.take(4).try_into().expect("4")) as usize }
        fn u64(&mut self) -> u64 { u64::from_le_bytes(self.take(8).try_into().expect("8")) }
        fn str16(&mut self) { let n = self.u16(); self.take(n); }
    }
    let mut r = R(body, 0);
    assert_eq!(r.take(4), b"QPF1", "framed answer");
    if r.take(1)[0] == 1 {
        let n = r.u32();
        r.take(n);
    }
    r.str16();
    r.str16();
    r.str16();
    let mut count = 0;
    for _ in 0..r.u32() {
        r.u64();
        r.str16();
        let (start, end) = (r.u64(), r.u64());
        r.u32();
        for _ in 0..r.u32() {
            let base = r.u64();
            r.u64();
            r.u32();
            r.take(1);
            let len = r.u32();
            let frames = queen::log::decompress_frames(r.take(len), 1 << 30).expect("segment decodes");
            for (i, f) in queen::log::FrameReader::new(&frames).enumerate() {
                let offset = base + i as u64;
                if (start..=end).contains(&offset) {
                    std::hint::black_box(f.expect("frame decodes").payload_json());
                    count += 1;
                }
            }
        }
    }
    count
}

#[allow(clippy::too_many_arguments)]
async fn consume(url: &str, messages: usize, partitions: usize, batch: usize, pop_partitions: usize, concurrency: usize, how: Drain, limit: Duration, payload_size: usize) {
    let Drain { queue, mode, encrypted, random_payload, prefilled, trace, wait, queues, group, tenants } = how;
    if !prefilled {
        let filled = Instant::now();
        if tenants > 0 {
            prefill_tenants(url, &queue, messages, partitions, tenants, payload_pool(payload_size, random_payload)).await;
        } else {
            prefill(url, &queue, messages, partitions, queues, payload_pool(payload_size, random_payload)).await;
        }
        println!("prefilled {messages} messages in {:.1}s", filled.elapsed().as_secs_f64());
    }
    let consumed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + limit;
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let (consumed, base) = (consumed.clone(), queue.clone());
        // The lean client (`lean.rs`): the load generator shares the two
        // cores with what it measures.
        let mut client = lean::Lean::new(url);
        tasks.push(tokio::spawn(async move {
            let auto_ack = mode != Mode::Leased;
            let frames = if mode == Mode::Frames { "&frames=true" } else { "" };
            let wait = if wait { "&wait=true&timeout=1000" } else { "" };
            // Over several queues (or tenants), consumer c pops queues c, c +
            // concurrency, … in turn, one pop each (all of them, in turn,
            // when there are fewer queues than consumers).
            let slots = queues.max(tenants);
            let mine: Vec<usize> =
                if slots > concurrency { (c..slots).step_by(concurrency).collect() } else { (0..slots).map(|q| (q + c) % slots).collect() };
            let pops: Vec<(String, Option<String>)> = mine
                .iter()
                .map(|&q| {
                    let (queue, tenant) = if tenants > 0 { (base.clone(), Some(bench_tenant(q))) } else { (queue_of(&base, queues, q), None) };
                    let query = format!("batch={batch}&partitions={pop_partitions}&consumerGroup={group}&autoAck={auto_ack}{frames}{wait}");
                    (format!("/api/v1/pop/queue/{queue}?{query}"), tenant)
                })
                .collect();
            let mut turn = 0usize;
            let mut first = None;
            while consumed.load(std::sync::atomic::Ordering::Relaxed) < messages && Instant::now() < deadline {
                let (pop, tenant) = &pops[turn % pops.len()];
                turn += 1;
                // The tenant of this pop, on it and on its ack (`--tenants`).
                let tenant = tenant.as_deref().map(|t| ("x-queen-tenant", t));
                let Some((status, bytes)) = client.get(pop, tenant).await else { continue };
                if status != 200 {
                    // Nothing there: back off, once per round of its queues.
                    if turn % pops.len() == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    continue;
                }
                first.get_or_insert_with(|| started.elapsed());
                if mode == Mode::Frames {
                    consumed.fetch_add(count_framed(&bytes), std::sync::atomic::Ordering::Relaxed);
                    continue;
                }
                let answer: PopAnswer = serde_json::from_slice(&bytes).expect("pop answer is JSON");
                if trace {
                    for m in &answer.messages {
                        let body = json!({"transactionId": m.transaction_id, "partitionId": m.partition_id, "consumerGroup": group,
                                          "traceNames": ["bench"], "eventType": "processed", "data": {"step": "handled"}});
                        let r = client.post("/api/v1/traces", "application/json", body.to_string(), None).await;
                        assert!(matches!(r, Some((200..=299, _))), "a trace was refused");
                    }
                }
                if !auto_ack {
                    let _ = client.post("/api/v1/ack/batch", "application/json", ack_body(&answer, group), tenant).await;
                }
                consumed.fetch_add(answer.messages.len(), std::sync::atomic::Ordering::Relaxed);
            }
            first
        }));
    }
    // When the last consumer got its first messages: the group's first
    // contact with the queue (registration, cursor seeding, first claims).
    let mut first_all = Duration::ZERO;
    for t in tasks {
        first_all = first_all.max(t.await.expect("consumer").unwrap_or(Duration::ZERO));
    }
    let first_ms = first_all.as_secs_f64() * 1000.0;
    let secs = started.elapsed().as_secs_f64();
    let n = consumed.load(std::sync::atomic::Ordering::Relaxed);
    let mode = match mode {
        Mode::Leased => "leased",
        Mode::AutoAck => "autoAck",
        Mode::Frames => "frames",
    };
    let mode = if trace { "traced" } else { mode };
    println!("scenario  messages  partitions  batch  pop-partitions  consumers  mode     seconds  msg/s     all-served ms");
    println!("consume   {n:<9} {partitions:<11} {batch:<6} {pop_partitions:<15} {concurrency:<10} {mode:<8} {secs:<8.1} {:<9.0} {first_ms:.0}", n as f64 / secs);
    println!("{}", json!({"scenario": "consume", "messages": n, "partitions": partitions, "batch": batch, "pop_partitions": pop_partitions,
                          "consumers": concurrency, "mode": mode, "wait": wait, "seconds": secs, "msg_per_s": n as f64 / secs,
                          "all_served_ms": first_ms, "encrypted": encrypted, "random_payload": random_payload}));
}

/// Reads partition `p0` of `queue` by offset from 0 to its high watermark,
/// one fetch after another, as the client's `fetch` loops.
async fn fetch_all(url: &str, queue: &str, messages: usize, max_bytes: usize, limit: Duration) {
    #[derive(serde::Deserialize)]
    struct Record {
        offset: i64,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        records: Vec<Record>,
        #[serde(rename = "highWatermark")]
        high_watermark: i64,
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        entries: Vec<Entry>,
    }
    let client = reqwest::Client::new();
    let started = Instant::now();
    let (mut next, mut read, mut bytes, mut calls) = (0i64, 0usize, 0usize, 0usize);
    let mut end = None;
    while Instant::now() < started + limit {
        let body = json!({"entries": [{"queue": queue, "partition": "p0", "offset": next, "maxBytes": max_bytes}], "maxBytes": max_bytes});
        let r = client.post(format!("{url}/api/v1/fetch")).json(&body).send().await.expect("broker reachable");
        let raw = r.bytes().await.expect("fetch answer");
        calls += 1;
        bytes += raw.len();
        let answer: Answer = serde_json::from_slice(&raw).expect("fetch answer is JSON");
        let e = &answer.entries[0];
        let end = *end.get_or_insert(e.high_watermark);
        read += e.records.len();
        match e.records.last() {
            Some(last) => next = last.offset + 1,
            None => break,
        }
        if next >= end {
            break;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let mb = bytes as f64 / 1_048_576.0;
    println!("scenario  messages  calls  seconds  msg/s     MB/s");
    println!("fetch     {read:<9} {calls:<6} {secs:<8.2} {:<9.0} {:.1}", read as f64 / secs, mb / secs);
    println!("{}", json!({"scenario": "fetch", "messages": read, "expected": messages, "calls": calls, "seconds": secs,
                          "msg_per_s": read as f64 / secs, "answer_mb": mb, "mb_per_s": mb / secs, "max_bytes": max_bytes}));
}

/// What a pushing scenario sends: messages per request, partitions, and the
/// payload's size (`None`: the send-time stamp alone).
#[derive(Clone, Copy)]
struct Shape {
    batch: usize,
    partitions: usize,
    payload_size: Option<usize>,
}

/// A payload carrying its send time `t` (µs since the run's epoch), which the
/// consumers read back for the latency; padded to `size` bytes of JSON when
/// asked (`{"t":…,"pad":"xx…"}`), never cut below the stamp.
fn stamped(t: u64, size: Option<usize>) -> serde_json::Value {
    let bare = json!({ "t": t });
    let Some(size) = size else { return bare };
    let stamp_len = bare.to_string().len() + ",\"pad\":\"\"".len();
    json!({"t": t, "pad": "x".repeat(size.saturating_sub(stamp_len))})
}

async fn e2e(url: &str, queue: &str, rate: usize, shape: Shape, consumers: usize, duration: Duration, probe_dir: Option<std::path::PathBuf>) {
    let Shape { batch, partitions, payload_size } = shape;
    let latencies = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let epoch = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..consumers {
        let tally = Tally { latencies: latencies.clone(), count: Default::default() };
        tasks.push(tokio::spawn(long_poll_consumer(url.to_string(), queue.to_string(), "e2e".into(), epoch, tally, stop.clone())));
    }
    // One producer loop per partition group, paced to the target rate.
    let requests_per_s = (rate as f64 / batch as f64).max(0.1);
    let interval = Duration::from_secs_f64(1.0 / requests_per_s);
    let client = reqwest::Client::new();
    let started = Instant::now();
    let probe = probe_dir.map(|dir| fsync_probe(dir, started + duration));
    let mut sent = 0usize;
    let mut next = Instant::now();
    let mut inflight = Vec::new();
    while started.elapsed() < duration {
        let partition = format!("p{}", (sent / batch) % partitions);
        let t = epoch.elapsed().as_micros() as u64;
        let payload = stamped(t, payload_size);
        let items: Vec<_> = (0..batch).map(|_| json!({"queue": queue, "partition": partition, "payload": payload})).collect();
        let (client, url) = (client.clone(), url.to_string());
        inflight.push(tokio::spawn(async move { client.post(format!("{url}/api/v1/push")).json(&json!({ "items": items })).send().await.is_ok() }));
        sent += batch;
        next += interval;
        tokio::time::sleep_until(next.into()).await;
    }
    for f in inflight {
        let _ = f.await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let mut l = latencies.lock().expect("latency lock").clone();
    l.sort();
    let secs = duration.as_secs_f64();
    println!("scenario  target msg/s  delivered  seconds  p50 ms   p90 ms   p99 ms   max ms");
    println!("e2e       {rate:<13} {:<10} {secs:<8.1} {:<8.2} {:<8.2} {:<8.2} {:<8.2}", l.len(),
             percentile_ms(&l, 0.5), percentile_ms(&l, 0.9), percentile_ms(&l, 0.99), percentile_ms(&l, 1.0));
    println!("{}", json!({"scenario": "e2e", "rate": rate, "batch": batch, "partitions": partitions, "consumers": consumers,
                          "payload_size": payload_size,
                          "sent": sent, "delivered": l.len(), "seconds": secs,
                          "latency_ms": {"p50": percentile_ms(&l, 0.5), "p90": percentile_ms(&l, 0.9), "p99": percentile_ms(&l, 0.99), "max": percentile_ms(&l, 1.0)}}));
    if let Some(probe) = probe {
        let mut d = probe.join().expect("fsync probe thread");
        d.sort();
        let slow = d.iter().filter(|x| **x > Duration::from_millis(25)).count();
        println!("disk      syncs        over 25 ms           p50 ms   p90 ms   p99 ms   max ms");
        println!("fdatasync {:<12} {slow:<20} {:<8.2} {:<8.2} {:<8.2} {:<8.2}", d.len(),
                 percentile_ms(&d, 0.5), percentile_ms(&d, 0.9), percentile_ms(&d, 0.99), percentile_ms(&d, 1.0));
        println!("{}", json!({"scenario": "fsync-probe", "syncs": d.len(), "over_25ms": slow,
                              "latency_ms": {"p50": percentile_ms(&d, 0.5), "p90": percentile_ms(&d, 0.9), "p99": percentile_ms(&d, 0.99), "max": percentile_ms(&d, 1.0)}}));
    }
}

/// Times a 4 KiB write + `fdatasync` into a scratch file in `dir` every 10 ms
/// until `deadline`, on its own thread (a blocking call must not hold up the
/// load generator's runtime). Like PostgreSQL's WAL, the file is allocated
/// first and overwritten in place, so a sync flushes data, not metadata. A
/// durable commit cannot be faster than this.
fn fsync_probe(dir: std::path::PathBuf, deadline: Instant) -> std::thread::JoinHandle<Vec<Duration>> {
    std::thread::spawn(move || {
        use std::os::unix::fs::FileExt;
        const BLOCK: usize = 4096;
        const BLOCKS: u64 = 1024;
        let path = dir.join(format!("queen-bench-fsync-{}", std::process::id()));
        let mut samples = Vec::new();
        let file = std::fs::File::create(&path)
            .and_then(|f| f.write_all_at(&vec![0u8; BLOCK * BLOCKS as usize], 0).and_then(|_| f.sync_all()).map(|_| f));
        let Ok(file) = file else {
            eprintln!("fsync probe: cannot prepare {}", path.display());
            return samples;
        };
        let block = [1u8; BLOCK];
        for n in 0u64.. {
            if Instant::now() >= deadline {
                break;
            }
            let t = Instant::now();
            if file.write_all_at(&block, (n % BLOCKS) * BLOCK as u64).and_then(|_| file.sync_data()).is_err() {
                break;
            }
            samples.push(t.elapsed());
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_file(&path);
        samples
    })
}

/// Samples the broker's RSS every 250 ms until `deadline`; yields the peak.
fn rss_sampler(url: &str, deadline: Instant) -> tokio::task::JoinHandle<u64> {
    let url = url.to_string();
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut peak = 0;
        while Instant::now() < deadline {
            if let Ok(r) = client.get(format!("{url}/metrics")).send().await {
                if let Ok(m) = r.json::<serde_json::Value>().await {
                    peak = peak.max(m["memory"]["rss"].as_u64().unwrap_or(0));
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        peak
    })
}

/// The fields of a JSON pop answer a consumer uses, borrowed from the body:
/// the load generator shares the cores with the broker, so it parses no
/// more than a client must (payloads stay raw).
#[derive(serde::Deserialize)]
struct PopAnswer<'a> {
    #[serde(borrow, default)]
    messages: Vec<PopMessage<'a>>,
}

#[derive(serde::Deserialize)]
struct PopMessage<'a> {
    #[serde(rename = "transactionId", borrow)]
    transaction_id: std::borrow::Cow<'a, str>,
    #[serde(rename = "partitionId", borrow)]
    partition_id: std::borrow::Cow<'a, str>,
    #[serde(rename = "leaseId", borrow, default)]
    lease_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    data: &'a serde_json::value::RawValue,
}

/// The `ack/batch` body completing every message of `answer`.
fn ack_body(answer: &PopAnswer<'_>, group: &str) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Ack<'a> {
        #[serde(rename = "transactionId")]
        transaction_id: &'a str,
        #[serde(rename = "partitionId")]
        partition_id: &'a str,
        status: &'static str,
        #[serde(rename = "leaseId")]
        lease_id: Option<&'a str>,
    }
    #[derive(serde::Serialize)]
    struct Batch<'a> {
        acknowledgments: Vec<Ack<'a>>,
        #[serde(rename = "consumerGroup")]
        consumer_group: &'a str,
    }
    let acknowledgments = answer
        .messages
        .iter()
        .map(|m| Ack { transaction_id: &m.transaction_id, partition_id: &m.partition_id, status: "completed", lease_id: m.lease_id.as_deref() })
        .collect();
    serde_json::to_vec(&Batch { acknowledgments, consumer_group: group }).expect("serializable")
}

/// What a consumer records: delivery latencies and a message count.
#[derive(Clone)]
struct Tally {
    latencies: std::sync::Arc<std::sync::Mutex<Vec<Duration>>>,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A leased long-poll consumer of `group` (pops of 500 over up to 4
/// partitions, `ack/batch`), until `stop`. Latency is measured from the
/// `t` (µs since `epoch`) each payload carries.
async fn long_poll_consumer(url: String, queue: String, group: String, epoch: Instant, tally: Tally, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let client = reqwest::Client::new();
    let pop = format!("{url}/api/v1/pop/queue/{queue}?batch=500&partitions=4&consumerGroup={group}&wait=true&timeout=1000");
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Ok(r) = client.get(&pop).send().await else { continue };
        if r.status().as_u16() != 200 {
            continue;
        }
        let bytes = r.bytes().await.expect("pop answer");
        let now = epoch.elapsed();
        let answer: PopAnswer = serde_json::from_slice(&bytes).expect("pop answer is JSON");
        {
            #[derive(serde::Deserialize)]
            struct Stamp {
                t: u64,
            }
            let mut l = tally.latencies.lock().expect("latency lock");
            for m in &answer.messages {
                let sent = serde_json::from_str::<Stamp>(m.data.get()).map_or(0, |s| s.t);
                l.push(now.saturating_sub(Duration::from_micros(sent)));
            }
        }
        let _ = client
            .post(format!("{url}/api/v1/ack/batch"))
            .header("content-type", "application/json")
            .body(ack_body(&answer, &group))
            .send()
            .await;
        tally.count.fetch_add(answer.messages.len(), std::sync::atomic::Ordering::Relaxed);
    }
}

#[allow(clippy::too_many_arguments)]
async fn fanout(url: &str, messages: usize, shape: Shape, producers: usize, groups: usize, consumers: usize, limit: Duration, rate: Option<f64>) {
    let push_latencies = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let Shape { batch, partitions, payload_size } = shape;
    let queue = format!("bench.fanout.{}", uuid::Uuid::now_v7().simple());
    let epoch = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tallies: Vec<Tally> = (0..groups).map(|_| Tally { latencies: Default::default(), count: Default::default() }).collect();
    // Consumers first, so every group subscribes before the first push.
    let mut tasks = Vec::new();
    for (g, tally) in tallies.iter().enumerate() {
        for _ in 0..consumers {
            tasks.push(tokio::spawn(long_poll_consumer(url.to_string(), queue.clone(), format!("fan{g}"), epoch, tally.clone(), stop.clone())));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let deadline = started + limit;
    let requests = messages.div_ceil(batch);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut pushers = Vec::new();
    for _ in 0..producers {
        let (next, url, queue, push_latencies) = (next.clone(), url.to_string(), queue.clone(), push_latencies.clone());
        pushers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let r = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if r >= requests || Instant::now() >= deadline {
                    return;
                }
                // Paced: request r leaves no earlier than its place in the
                // offered rate.
                if let Some(rate) = rate {
                    tokio::time::sleep_until((started + Duration::from_secs_f64((r * batch) as f64 / rate)).into()).await;
                }
                let sent = Instant::now();
                let n = batch.min(messages - r * batch);
                let t = epoch.elapsed().as_micros() as u64;
                let partition = format!("p{}", r % partitions);
                let payload = stamped(t, payload_size);
                let items: Vec<_> = (0..n).map(|_| json!({"queue": queue, "partition": partition, "payload": payload})).collect();
                let ok = client.post(format!("{url}/api/v1/push")).json(&json!({ "items": items })).send().await.is_ok_and(|r| r.status().as_u16() == 201);
                assert!(ok, "fanout push failed");
                push_latencies.lock().expect("latency lock").push(sent.elapsed());
            }
        }));
    }
    for p in pushers {
        p.await.expect("producer");
    }
    let pushed_in = started.elapsed().as_secs_f64();
    while tallies.iter().any(|t| t.count.load(std::sync::atomic::Ordering::Relaxed) < messages) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let delivered: usize = tallies.iter().map(|t| t.count.load(std::sync::atomic::Ordering::Relaxed)).sum();
    let mut l: Vec<Duration> = tallies.iter().flat_map(|t| t.latencies.lock().expect("latency lock").clone()).collect();
    l.sort();
    let (push_rate, delivery_rate) = (messages as f64 / pushed_in, delivered as f64 / secs);
    let complete = tallies.iter().filter(|t| t.count.load(std::sync::atomic::Ordering::Relaxed) >= messages).count();
    let mut pl = push_latencies.lock().expect("latency lock").clone();
    pl.sort();
    println!(
        "push: {push_rate:.0} msg/s offered {}, request p50 {:.2} ms, p99 {:.2} ms; groups that read everything: {complete} of {groups}",
        rate.map_or("as fast as possible".to_string(), |r| format!("{r:.0} msg/s")),
        percentile_ms(&pl, 0.5),
        percentile_ms(&pl, 0.99)
    );
    println!("scenario  messages  groups  consumers/group  push msg/s  delivered  delivery msg/s  seconds  p50 ms   p99 ms   max ms");
    println!("fanout    {messages:<9} {groups:<7} {consumers:<16} {push_rate:<11.0} {delivered:<10} {delivery_rate:<15.0} {secs:<8.1} {:<8.2} {:<8.2} {:<8.2}",
             percentile_ms(&l, 0.5), percentile_ms(&l, 0.99), percentile_ms(&l, 1.0));
    println!("{}", json!({"scenario": "fanout", "messages": messages, "batch": batch, "partitions": partitions, "producers": producers,
                          "payload_size": payload_size,
                          "groups": groups, "groups_complete": complete, "offered_rate": rate, "push_p99_ms": percentile_ms(&pl, 0.99), "consumers_per_group": consumers, "push_msg_per_s": push_rate, "delivered": delivered,
                          "delivery_msg_per_s": delivery_rate, "seconds": secs,
                          "latency_ms": {"p50": percentile_ms(&l, 0.5), "p90": percentile_ms(&l, 0.9), "p99": percentile_ms(&l, 0.99), "max": percentile_ms(&l, 1.0)}}));
}

/// The broker's own view of itself: (cpu seconds, rss bytes, open db connections, in use).
async fn broker_usage(client: &reqwest::Client, url: &str) -> (f64, u64, u64, u64) {
    let m: serde_json::Value = client.get(format!("{url}/metrics")).send().await.expect("metrics").json().await.expect("metrics JSON");
    let cpu = m["cpu"]["userSeconds"].as_f64().unwrap_or(0.0) + m["cpu"]["systemSeconds"].as_f64().unwrap_or(0.0);
    (cpu, m["memory"]["rss"].as_u64().unwrap_or(0), m["database"]["connections"].as_u64().unwrap_or(0), m["database"]["inUse"].as_u64().unwrap_or(0))
}

async fn idle(url: &str, consumers: usize, duration: Duration) {
    let run = uuid::Uuid::now_v7().simple().to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let parked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let client = reqwest::Client::builder().pool_max_idle_per_host(consumers + 16).build().expect("http client");
    let mut tasks = Vec::new();
    for i in 0..consumers {
        let (stop, parked, client, url) = (stop.clone(), parked.clone(), client.clone(), url.to_string());
        let queue = format!("bench.idle.{run}.{i}");
        tasks.push(tokio::spawn(async move {
            // First contact (creates the queue and the ring), then park until
            // told to stop. Like the real clients, back off a second on 5xx.
            loop {
                match client.get(format!("{url}/api/v1/pop/queue/{queue}")).send().await {
                    Ok(r) if r.status().is_success() => break,
                    _ => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
            parked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match client.get(format!("{url}/api/v1/pop/queue/{queue}?wait=true&timeout=30000")).send().await {
                    Ok(r) if r.status().is_success() => {}
                    _ => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
        }));
        if i % 500 == 499 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let probe = reqwest::Client::new();
    while parked.load(std::sync::atomic::Ordering::Relaxed) < consumers {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await; // let the last ones park and reseed
    let (cpu0, _, _, _) = broker_usage(&probe, url).await;
    let t0 = Instant::now();
    tokio::time::sleep(duration).await;
    let (cpu1, rss, conns, in_use) = broker_usage(&probe, url).await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu_percent = (cpu1 - cpu0) / secs * 100.0;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    println!("scenario  parked   seconds  broker cpu %  broker rss MB  db connections  in use");
    println!("idle      {consumers:<8} {secs:<8.1} {cpu_percent:<13.2} {:<14.1} {conns:<15} {in_use}", rss as f64 / 1048576.0);
    println!("{}", json!({"scenario": "idle", "parked": consumers, "seconds": secs, "broker_cpu_percent": cpu_percent,
                          "broker_rss_bytes": rss, "db_connections": conns, "db_in_use": in_use}));
    // The parked pops end with their 30 s timeout; do not wait for them.
    for t in tasks {
        t.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamped_payload_has_the_asked_size_and_keeps_its_stamp() {
        for t in [0u64, 7, 1_234_567_890] {
            assert_eq!(stamped(t, None), json!({ "t": t }));
            for size in [64, 100, 1000] {
                let p = stamped(t, Some(size));
                assert_eq!(p.to_string().len(), size, "t={t}, size={size}: {p}");
                assert_eq!(p["t"], json!(t));
            }
            // Smaller than the stamp itself: the stamp stays whole.
            assert_eq!(stamped(t, Some(3))["t"], json!(t));
        }
    }
}
