//! The two long-running commands: `queen push` (one message, or JSON lines
//! from a file or standard input, in batches, with a progress bar and the
//! rate on standard error) and `queen tail` (follow a queue like a console
//! consumer, until `--limit`, `--seconds` or Ctrl-C).

use std::io::BufRead;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::http::{exit, query, seg, Broker, Failure};
use super::{Push, Tail, Target};

/// `queen push`.
pub async fn push(t: &Target, p: Push) -> Result<(), Failure> {
    let b = Broker::new(&t.url, t.token.clone());
    let started = Instant::now();
    let mut pushed = 0u64;
    let mut duplicates = 0u64;
    let send = |batch: Vec<Value>| {
        let b = b.clone();
        let items: Vec<Value> = batch.into_iter().map(|payload| json!({"queue": p.queue, "partition": p.partition, "payload": payload})).collect();
        async move {
            let r = b.post("/api/v1/push", &json!({ "items": items })).await?;
            let results = r.as_array().cloned().unwrap_or_default();
            let failed: Vec<&Value> = results.iter().filter(|x| x["status"] == "failed").collect();
            if let Some(f) = failed.first() {
                return Err(Failure { code: exit::REFUSED, message: format!("push refused: {}", super::output::cell(&f["error"])) });
            }
            Ok((results.len() as u64, results.iter().filter(|x| x["status"] == "duplicate").count() as u64))
        }
    };
    match (&p.message, &p.file) {
        (Some(m), _) => {
            let payload = serde_json::from_str(m).unwrap_or_else(|_| Value::String(m.clone()));
            let (n, d) = send(vec![payload]).await?;
            pushed += n;
            duplicates += d;
        }
        (None, Some(path)) => {
            let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                let f = std::fs::File::open(path).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
                Box::new(std::io::BufReader::new(f))
            };
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {pos} messages pushed ({per_sec}) {elapsed}").expect("a valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            let mut batch = Vec::with_capacity(p.batch as usize);
            for (i, line) in reader.lines().enumerate() {
                let line = line.map_err(|e| Failure::usage(format!("line {}: {e}", i + 1)))?;
                if line.trim().is_empty() {
                    continue;
                }
                let payload: Value =
                    serde_json::from_str(&line).map_err(|e| Failure::usage(format!("line {}: not JSON ({e}); {pushed} messages were pushed before it", i + 1)))?;
                batch.push(payload);
                if batch.len() == p.batch as usize {
                    let (n, d) = send(std::mem::take(&mut batch)).await?;
                    pushed += n;
                    duplicates += d;
                    bar.set_position(pushed);
                }
            }
            if !batch.is_empty() {
                let (n, d) = send(batch).await?;
                pushed += n;
                duplicates += d;
            }
            bar.finish_and_clear();
        }
        (None, None) => return Err(Failure::usage("give a message, or --file FILE (- for standard input)")),
    }
    let secs = started.elapsed().as_secs_f64();
    let summary = json!({"queue": p.queue, "partition": p.partition, "pushed": pushed, "duplicates": duplicates, "seconds": secs,
                         "messagesPerSecond": pushed as f64 / secs.max(1e-9)});
    super::output::print(t.json, &summary, || {
        format!("pushed {pushed} messages to {}/{} in {secs:.2} s ({:.0} msg/s){}", p.queue, p.partition, pushed as f64 / secs.max(1e-9),
                if duplicates > 0 { format!(", {duplicates} of them duplicates") } else { String::new() })
    });
    Ok(())
}

/// `queen tail`.
pub async fn tail(t: &Target, a: Tail) -> Result<(), Failure> {
    let b = Broker::new(&t.url, t.token.clone());
    // The default is a group of this tail alone, so that following a queue
    // takes nothing from its consumers; it is removed when the tail ends.
    let throwaway = (a.group.is_none() && !a.queue_mode).then(|| format!("queen-tail-{}", uuid::Uuid::now_v7().simple()));
    let group = a.group.clone().or_else(|| throwaway.clone());
    let mode = throwaway.as_ref().map(|_| if a.from_beginning { "all" } else { "new" }.to_string());
    let path = match &a.partition {
        Some(p) => format!("/api/v1/pop/queue/{}/partition/{}", seg(&a.queue), seg(p)),
        None => format!("/api/v1/pop/queue/{}", seg(&a.queue)),
    };
    let pop = format!(
        "{path}{}",
        query(&[
            ("batch", Some("100".into())),
            ("wait", Some("true".into())),
            ("timeout", Some("5000".into())),
            ("consumerGroup", group.clone()),
            ("subscriptionMode", mode),
            ("autoAck", Some((!a.leased).to_string())),
        ])
    );
    let deadline = a.seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let mut seen = 0u64;
    let outcome = async {
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) || a.limit.is_some_and(|l| seen >= l) {
                return Ok(());
            }
            let answer = b.get(&pop).await?;
            let messages = answer["messages"].as_array().cloned().unwrap_or_default();
            let mut acks = Vec::new();
            for m in &messages {
                if a.limit.is_some_and(|l| seen >= l) {
                    break;
                }
                seen += 1;
                if a.raw {
                    println!("{}", serde_json::to_string(m).unwrap_or_default());
                } else {
                    println!(
                        "{} {} {}  {}",
                        super::output::cell(&m["createdAt"]),
                        super::output::cell(&m["partition"]),
                        super::output::cell(&m["transactionId"]),
                        serde_json::to_string(&m["data"]).unwrap_or_default()
                    );
                }
                if a.leased {
                    acks.push(json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}));
                }
            }
            if !acks.is_empty() {
                b.post("/api/v1/ack/batch", &json!({"acknowledgments": acks, "consumerGroup": group})).await?;
            }
        }
    };
    let result = tokio::select! {
        r = outcome => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    if let Some(g) = throwaway {
        let _ = b.delete(&format!("/api/v1/consumer-groups/{}/queues/{}", seg(&g), seg(&a.queue))).await;
    }
    result
}
