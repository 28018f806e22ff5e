//! Encryption at rest (issue 27; API.md §2.1, §3.2 flag 4): a queue with
//! `encryptionEnabled` stores AES-256-GCM envelopes that PostgreSQL never
//! sees through, and every read path opens them.

mod common;

use std::time::Duration;

use common::{cluster, eventually, Broker};
use serde_json::{json, Value};

const KEY_A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const KEY_B: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// A string no envelope contains by chance, and the payload carrying it.
const SECRET: &str = "card-4111-1111-1111-1111";

fn payload(n: usize) -> Value {
    json!({"secret": SECRET, "n": n})
}

async fn with_key(env: &[(&str, &str)]) -> Broker {
    let mut all = vec![("QUEEN_ENCRYPTION_KEY", KEY_A)];
    all.extend_from_slice(env);
    Broker::start_with(&all).await
}

/// A broker on `db` with exactly these keys.
async fn on_db(db: &str, env: &[(&str, &str)]) -> Broker {
    let mut all = vec![("QUEEN_DATABASE_URL".to_string(), cluster().url(db))];
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Broker::spawn(db.to_string(), all).await
}

async fn encrypt(b: &Broker, queue: &str, extra: Value) {
    let mut options = json!({"encryptionEnabled": true});
    for (k, v) in extra.as_object().into_iter().flatten() {
        options[k] = v.clone();
    }
    let (status, body) = b.post("/api/v1/configure", json!({"queue": queue, "options": options})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["options"]["encryptionEnabled"], true);
}

/// Every stored frame of `queue`: (flags byte's encryption bit, payload bytes),
/// decoded here from the segment rows as PostgreSQL holds them.
async fn stored_frames(b: &Broker, queue: &str) -> Vec<(bool, Vec<u8>, uuid::Uuid)> {
    let sql = b.sql().await;
    let rows = sql
        .query(
            "SELECT s.blob FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
             JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY p.id, s.base_offset",
            &[&queue],
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    for r in rows {
        let blob: Vec<u8> = r.get(0);
        assert!(!contains(&blob, SECRET.as_bytes()), "the compressed segment hides the payload");
        let frames = queen::log::decompress_frames(&blob, 1 << 30).unwrap();
        for f in queen::log::FrameReader::collect_all(&frames).unwrap() {
            out.push((f.encrypted, f.payload.to_vec(), f.message_id));
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The key check value a broker names its key by (first 4 bytes of
/// AES-256 of a zero block), computed independently of the broker.
fn key_id(hex: &str) -> Vec<u8> {
    use aes_gcm::aes::cipher::{BlockEncrypt, KeyInit};
    let key: Vec<u8> = (0..32).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
    let aes = aes_gcm::aes::Aes256::new_from_slice(&key).unwrap();
    let mut block = aes_gcm::aes::Block::default();
    aes.encrypt_block(&mut block);
    block[..4].to_vec()
}

#[tokio::test]
async fn an_encrypted_queue_stores_no_plaintext_and_every_read_path_opens_it() {
    let b = with_key(&[]).await;
    encrypt(&b, "vault", json!({"namespace": "vault"})).await;
    b.push_to("vault", "p1", &[payload(0), payload(1), payload(2)]).await;

    // PostgreSQL: flag 4 on every frame, the envelope names key A, no plaintext.
    let frames = stored_frames(&b, "vault").await;
    assert_eq!(frames.len(), 3);
    for (encrypted, bytes, _) in &frames {
        assert!(encrypted, "flag 4 is set");
        assert!(!contains(bytes, SECRET.as_bytes()), "no plaintext inside the frame");
        assert_eq!(bytes[0], 1, "envelope version");
        assert_eq!(&bytes[1..5], key_id(KEY_A).as_slice(), "the envelope names its key");
    }
    let dump: i64 = b
        .sql()
        .await
        .query_one("SELECT count(*) FROM queen.segments WHERE position($1::bytea IN blob) > 0", &[&SECRET.as_bytes()])
        .await
        .unwrap()
        .get(0);
    assert_eq!(dump, 0);

    // The JSON pop opens them, in order.
    let popped = b.pop("/api/v1/pop/queue/vault?consumerGroup=g&batch=2").await;
    assert_eq!(popped.status, 200);
    assert_eq!(popped.data(), vec![payload(0), payload(1)]);
    // The partition route and the discovery route open them too.
    assert_eq!(b.pop("/api/v1/pop/queue/vault/partition/p1?consumerGroup=s&batch=1").await.data(), vec![payload(0)]);
    assert_eq!(b.pop("/api/v1/pop?namespace=vault&consumerGroup=d&batch=1").await.data(), vec![payload(0)]);
    // A framed pop answers JSON on a broker with a key (API.md §3.4).
    let r = b.http.get(format!("{}/api/v1/pop/queue/vault?consumerGroup=f&batch=3&frames=true", b.url)).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/json");
    let body: Value = r.json().await.unwrap();
    let data: Vec<Value> = body["messages"].as_array().unwrap().iter().map(|m| m["data"].clone()).collect();
    assert_eq!(data, vec![payload(0), payload(1), payload(2)]);

    // Message detail and listing.
    let m = &popped.messages()[0];
    let (status, detail) =
        b.get(&format!("/api/v1/messages/{}/{}", m["partitionId"].as_str().unwrap(), m["transactionId"].as_str().unwrap())).await;
    assert_eq!(status, 200);
    assert_eq!((detail["data"].clone(), detail["isEncrypted"].clone()), (payload(0), json!(true)));
    let (_, list) = b.get("/api/v1/messages?queue=vault").await;
    let mut listed: Vec<Value> = list["messages"].as_array().unwrap().iter().map(|m| m["data"].clone()).collect();
    listed.sort_by_key(|d| d["n"].as_i64());
    assert_eq!(listed, vec![payload(0), payload(1), payload(2)]);

    // A nack to the DLQ keeps the snapshot sealed; the listing and the replay open it.
    let acks = b.ack_batch(Some("g"), &[
        (m["transactionId"].as_str().unwrap(), m["partitionId"].as_str().unwrap(), "dlq", popped.body.as_ref().unwrap()["leaseId"].as_str()),
    ]).await;
    assert_eq!(acks[0]["success"], true, "{acks:?}");
    let sql = b.sql().await;
    let row = sql.query_one("SELECT payload IS NULL, sealed FROM queen.dead_letters", &[]).await.unwrap();
    let sealed: Vec<u8> = row.get(1);
    assert!(row.get::<_, bool>(0), "no plaintext snapshot");
    assert!(!contains(&sealed, SECRET.as_bytes()));
    let (_, dlq) = b.get("/api/v1/dlq?queue=vault").await;
    assert_eq!(dlq["messages"][0]["data"], payload(0));
    assert_eq!(dlq["messages"][0]["isEncrypted"], true);
    let (status, replay) = b
        .post(&format!("/api/v1/messages/{}/{}/retry", m["partitionId"].as_str().unwrap(), m["transactionId"].as_str().unwrap()), json!({}))
        .await;
    assert_eq!(status, 200, "{replay}");
    assert_eq!(replay["result"], "moved");
    let frames = stored_frames(&b, "vault").await;
    assert_eq!(frames.len(), 4, "the replay is a fourth message");
    assert!(frames[3].0, "and it is sealed again");
    let again = b.pop("/api/v1/pop/queue/vault?consumerGroup=replayed&batch=10").await;
    assert_eq!(again.data().last(), Some(&payload(0)));
}

#[tokio::test]
async fn a_transaction_pushes_sealed_and_a_plain_queue_beside_it_stays_plain() {
    let b = with_key(&[]).await;
    encrypt(&b, "tx-vault", json!({})).await;
    let (status, body) = b
        .post(
            "/api/v1/transaction",
            json!({"operations": [{"type": "push", "items": [
                {"queue": "tx-vault", "payload": payload(7), "transactionId": "t1"},
                {"queue": "tx-plain", "payload": payload(8), "transactionId": "t2"}]}], "requiredLeases": []}),
        )
        .await;
    assert_eq!((status, body["success"].clone()), (200, json!(true)), "{body}");
    let sealed = stored_frames(&b, "tx-vault").await;
    assert!(sealed.len() == 1 && sealed[0].0);
    let plain = b.sql().await.query_one(
        "SELECT count(*) FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'tx-plain'",
        &[],
    ).await.unwrap().get::<_, i64>(0);
    assert_eq!(plain, 1);
    assert_eq!(b.pop("/api/v1/pop/queue/tx-vault?batch=5").await.data(), vec![payload(7)]);
    assert_eq!(b.pop("/api/v1/pop/queue/tx-plain?batch=5").await.data(), vec![payload(8)]);
}

#[tokio::test]
async fn a_rotated_key_reads_what_the_old_one_wrote_and_writes_under_the_new_one() {
    let mut a = with_key(&[]).await;
    encrypt(&a, "rot", json!({})).await;
    a.push_to("rot", "p", &[payload(1)]).await;
    a.kill();
    let older = KEY_A.to_string();
    let b = on_db(&a.db, &[("QUEEN_ENCRYPTION_KEY", KEY_B), ("QUEEN_ENCRYPTION_KEYS", &older)]).await;
    b.push_to("rot", "p", &[payload(2)]).await;
    let frames = stored_frames(&b, "rot").await;
    assert_eq!(&frames[0].1[1..5], key_id(KEY_A).as_slice());
    assert_eq!(&frames[1].1[1..5], key_id(KEY_B).as_slice(), "new envelopes are sealed under the current key");
    assert_eq!(b.pop("/api/v1/pop/queue/rot?batch=5").await.data(), vec![payload(1), payload(2)]);
}

#[tokio::test]
async fn a_wrong_key_answers_500_naming_the_partition_and_commits_nothing() {
    let mut a = with_key(&[]).await;
    encrypt(&a, "locked", json!({"leaseTime": 1})).await;
    a.push_to("locked", "p", &[payload(1)]).await;
    a.kill();
    let wrong = on_db(&a.db, &[("QUEEN_ENCRYPTION_KEY", KEY_B)]).await;
    let r = wrong.http.get(format!("{}/api/v1/pop/queue/locked?consumerGroup=g&batch=1", wrong.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 500);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "decrypt failed");
    let pid: i64 = wrong.sql().await.query_one("SELECT id FROM queen.partitions", &[]).await.unwrap().get(0);
    assert_eq!(body["partitionId"], pid.to_string());
    assert!(body["detail"].as_str().unwrap().contains(&hex(&key_id(KEY_A))), "names the key it lacks: {body}");
    let (lacked, current) = (hex(&key_id(KEY_A)), hex(&key_id(KEY_B)));
    eventually("the log to name both keys", Duration::from_secs(5), || async {
        wrong.logs().iter().any(|l| l.contains("did not open") && l.contains(&lacked) && l.contains(&current))
    })
    .await;
    // Admin reads say so beside a null payload rather than failing whole.
    let (_, list) = wrong.get("/api/v1/messages?queue=locked").await;
    assert_eq!(list["messages"][0]["data"], Value::Null);
    assert!(list["messages"][0]["decryptError"].as_str().unwrap().starts_with("decrypt failed"));
    // Nothing was committed: with the right key the message is delivered once the lease lapses.
    let right = on_db(&a.db, &[("QUEEN_ENCRYPTION_KEY", KEY_A)]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let delivered = loop {
        let d = right.pop("/api/v1/pop/queue/locked?consumerGroup=g&batch=1").await.data();
        if !d.is_empty() || std::time::Instant::now() > deadline {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(delivered, vec![payload(1)]);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test]
async fn the_spool_holds_no_plaintext_of_an_encrypted_queue_and_replays_it() {
    let b = with_key(&[]).await;
    encrypt(&b, "spool-vault", json!({})).await;
    assert_eq!(b.post("/api/v1/system/maintenance", json!({"enabled": true})).await.0, 200);
    let (status, r) = b.post("/api/v1/push", json!({"items": [{"queue": "spool-vault", "payload": payload(5)}]})).await;
    assert_eq!((status, r[0]["status"].clone()), (201, json!("buffered")));
    let dir = b.spool_dir().expect("a private spool");
    let mut on_disk = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        on_disk.extend(std::fs::read(e.unwrap().path()).unwrap());
    }
    assert!(contains(&on_disk, b"\"sealed\""), "the line carries an envelope");
    assert!(!contains(&on_disk, SECRET.as_bytes()), "no plaintext on disk");
    b.post("/api/v1/system/maintenance", json!({"enabled": false})).await;
    let sql = b.sql().await;
    eventually("the spool to replay", Duration::from_secs(10), || async {
        sql.query_one("SELECT count(*) FROM queen.segments", &[]).await.unwrap().get::<_, i64>(0) == 1
    })
    .await;
    assert!(stored_frames(&b, "spool-vault").await[0].0, "replayed sealed");
    assert_eq!(b.pop("/api/v1/pop/queue/spool-vault?batch=5").await.data(), vec![payload(5)]);
}

/// Issue 45: a broker started without the key, on the database of one that
/// has it, refused to turn encryption on but wrote an encrypting queue's
/// pushes in the clear. Every way in is refused with 503 and nothing lands.
#[tokio::test]
async fn a_keyless_broker_refuses_to_write_an_encrypting_queue_in_the_clear() {
    let a = with_key(&[]).await;
    encrypt(&a, "vault", json!({})).await;
    let keyless = on_db(&a.db, &[]).await;
    let one = json!({"items": [{"queue": "vault", "payload": payload(1)}]});
    for _ in 0..2 {
        let (status, body) = keyless.post("/api/v1/push", one.clone()).await;
        assert_eq!((status, body["code"].clone()), (503, json!("encryption_key_missing")), "{body}");
        assert!(body["error"].as_str().unwrap().contains("\"vault\"") && body["error"].as_str().unwrap().contains("QUEEN_ENCRYPTION_KEY"), "{body}");
    }
    let (status, body) = keyless
        .post("/api/v1/transaction", json!({"operations": [{"type": "push", "items": [{"queue": "vault", "payload": payload(2)}]}]}))
        .await;
    assert_eq!((status, body["code"].clone()), (503, json!("encryption_key_missing")), "{body}");
    // A plain queue beside it is not affected.
    assert_eq!(keyless.post("/api/v1/push", json!({"items": [{"queue": "open", "payload": 3}]})).await.0, 201);
    assert!(stored_frames(&a, "vault").await.is_empty(), "nothing of the encrypting queue was written");
    let said = keyless.logs().iter().filter(|l| l.contains("no QUEEN_ENCRYPTION_KEY")).count();
    assert_eq!(said, 1, "logged once, not per push");
    // Through the broker with the key, the same push is sealed.
    assert_eq!(a.post("/api/v1/push", one).await.0, 201);
    assert!(stored_frames(&a, "vault").await[0].0);
}

#[tokio::test]
async fn without_a_key_encryption_is_refused_and_a_malformed_key_stops_the_boot() {
    let b = Broker::start().await;
    let (status, body) = b.post("/api/v1/configure", json!({"queue": "q", "options": {"encryptionEnabled": true}})).await;
    assert_eq!(status, 400);
    assert_eq!(body["invalid"], "encryptionEnabled");
    assert!(body["error"].as_str().unwrap().contains("QUEEN_ENCRYPTION_KEY"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_queen"))
        .arg("serve")
        .env("QUEEN_ENCRYPTION_KEY", "not-hex")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("QUEEN_ENCRYPTION_KEY") && err.contains("64 hex characters") && !err.contains("not-hex"), "{err}");
}

#[tokio::test]
async fn turning_encryption_off_keeps_old_envelopes_readable_and_writes_plain() {
    let b = with_key(&[]).await;
    encrypt(&b, "toggle", json!({})).await;
    b.push_to("toggle", "p", &[payload(1)]).await;
    let (status, _) = b.post("/api/v1/configure", json!({"queue": "toggle", "options": {"encryptionEnabled": false}})).await;
    assert_eq!(status, 200);
    b.push_to("toggle", "p", &[payload(2)]).await;
    let flags: Vec<bool> = stored_frames(&b, "toggle").await.iter().map(|f| f.0).collect();
    assert_eq!(flags, vec![true, false]);
    assert_eq!(b.pop("/api/v1/pop/queue/toggle?batch=5").await.data(), vec![payload(1), payload(2)]);
}

#[tokio::test]
async fn an_auto_ack_pop_that_cannot_open_its_payload_puts_the_cursor_back() {
    let mut a = with_key(&[]).await;
    encrypt(&a, "auto", json!({})).await;
    a.push_to("auto", "p", &[payload(1), payload(2)]).await;
    a.kill();
    let wrong = on_db(&a.db, &[("QUEEN_ENCRYPTION_KEY", KEY_B)]).await;
    let r = wrong.http.get(format!("{}/api/v1/pop/queue/auto?consumerGroup=g&batch=5&autoAck=true", wrong.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 500);
    let pid: String = wrong.sql().await.query_one("SELECT id::text FROM queen.partitions", &[]).await.unwrap().get(0);
    assert_eq!(wrong.cursor(&pid, "g").await.0, -1, "the claim's commit was undone");
    let right = on_db(&a.db, &[("QUEEN_ENCRYPTION_KEY", KEY_A)]).await;
    assert_eq!(right.pop("/api/v1/pop/queue/auto?consumerGroup=g&batch=5&autoAck=true").await.data(), vec![payload(1), payload(2)]);
    assert_eq!(right.cursor(&pid, "g").await.0, 1);
}

#[tokio::test]
async fn a_pre_compressed_binary_push_is_sealed_and_deduplication_still_sees_the_transaction_id() {
    let b = with_key(&[]).await;
    encrypt(&b, "bin-vault", json!({})).await;
    let plain = payload(3).to_string();
    let (body, _, ids) = common::flag8_body("bin-vault", "p", &[("b1", &plain)], 3);
    let (status, answer) = b.post_raw("/api/v1/push", "application/octet-stream", body).await;
    assert_eq!((status, answer[0]["status"].clone()), (201, json!("queued")), "{answer}");
    let frames = stored_frames(&b, "bin-vault").await;
    assert_eq!(frames.len(), 1);
    assert!(frames[0].0, "re-framed and sealed, not stored as the client packed it");
    assert_eq!(frames[0].2, ids[0], "the client's message id is kept");
    // The transactionId stays clear: a repeat is a duplicate naming the original.
    let (_, again) = b.post("/api/v1/push", json!({"items": [{"queue": "bin-vault", "partition": "p", "transactionId": "b1", "payload": 9}]})).await;
    assert_eq!(again[0]["status"], "duplicate");
    assert_eq!(again[0]["message_id"], ids[0].to_string());
    assert_eq!(b.pop("/api/v1/pop/queue/bin-vault?batch=5").await.data(), vec![payload(3)]);
}

/// Issue 45: a timer of an encrypting queue kept its payload in the clear
/// in `queen.timers` until it fired. It is sealed from the schedule on,
/// opened by the fire (and by the peek), and a broker without the key
/// refuses to schedule one.
#[tokio::test]
async fn a_timer_of_an_encrypting_queue_is_sealed_until_it_fires() {
    use base64::Engine as _;
    let a = with_key(&[]).await;
    encrypt(&a, "vault", json!({})).await;
    let schedule = |key: &str, delay_ms: i64| {
        json!({"operations": [{"op": "schedule", "queue": "vault", "timerKey": key, "delayMs": delay_ms, "txn": format!("t-{key}"),
                               "payload": base64::engine::general_purpose::STANDARD.encode(payload(1).to_string())}]})
    };
    let (status, r) = a.post("/api/v1/timers", schedule("later", 600_000)).await;
    assert_eq!((status, r["results"][0]["status"].clone()), (200, json!("scheduled")), "{r}");
    let due = chrono::DateTime::parse_from_rfc3339(r["results"][0]["deliverAt"].as_str().unwrap()).unwrap();
    assert!(due.with_timezone(&chrono::Utc) < chrono::Utc::now() + chrono::Duration::minutes(11), "the answer says the real due time");
    let sql = a.sql().await;
    let row = sql.query_one("SELECT payload, sealed, deliver_at::text FROM queen.timers WHERE timer_key = 'later'", &[]).await.unwrap();
    let (clear, sealed, deliver_at): (String, Option<Vec<u8>>, String) = (row.get(0), row.get(1), row.get(2));
    assert!(!clear.contains(SECRET) && !contains(sealed.as_deref().unwrap(), SECRET.as_bytes()), "no plaintext at rest");
    assert!(deliver_at.starts_with("9999-"), "out of an older broker's sight: {deliver_at}");
    let (_, peek) = a.get("/api/v1/timers/vault/later").await;
    assert_eq!((peek["encrypted"].clone(), peek["payload"].clone()), (json!(true), payload(1)), "{peek}");
    assert!(!peek["deliverAt"].as_str().unwrap().starts_with("9999"), "{peek}");
    // A keyless broker on the same database refuses to schedule one.
    let keyless = on_db(&a.db, &[]).await;
    let (status, body) = keyless.post("/api/v1/timers", schedule("keyless", 0)).await;
    assert_eq!((status, body["code"].clone()), (503, json!("encryption_key_missing")), "{body}");
    // Due now: fired, delivered opened, stored sealed again.
    assert_eq!(a.post("/api/v1/timers", schedule("now", 0)).await.0, 200);
    let popped = a.pop("/api/v1/pop/queue/vault?wait=true&timeout=5000").await;
    assert_eq!(popped.data(), vec![payload(1)]);
    assert!(stored_frames(&a, "vault").await.iter().all(|(sealed, body, _)| *sealed && !contains(body, SECRET.as_bytes())));
    let left: i64 = sql.query_one("SELECT count(*) FROM queen.timers", &[]).await.unwrap().get(0);
    assert_eq!(left, 1, "the far one waits, the keyless one never was");
    // With only the keyless broker up, a due sealed timer is left alone: not
    // taken, not marked failed, its due time not pushed back past the
    // brokers that can fire it.
    let mut a = a;
    sql.execute("UPDATE queen.timers SET sealed_due_at = now() - interval '1 second' WHERE timer_key = 'later'", &[]).await.unwrap();
    a.kill();
    let before: String = sql.query_one("SELECT sealed_due_at::text FROM queen.timers WHERE timer_key = 'later'", &[]).await.unwrap().get(0);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await; // thirty of the keyless broker's 50 ms looks
    let row = sql.query_one("SELECT sealed_due_at::text, attempts, last_error FROM queen.timers WHERE timer_key = 'later'", &[]).await.unwrap();
    let (after, attempts, error): (String, i32, Option<String>) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((after, attempts, error), (before, 0, None), "the keyless broker did not touch it");
    drop(keyless);
    // The key holder comes back and fires it.
    a.restart().await;
    common::eventually("the key holder to fire it", std::time::Duration::from_secs(10), || async {
        sql.query_one("SELECT count(*) FROM queen.timers", &[]).await.unwrap().get::<_, i64>(0) == 0
    })
    .await;
    assert_eq!(stored_frames(&a, "vault").await.len(), 2, "fired once, as a message");
}
