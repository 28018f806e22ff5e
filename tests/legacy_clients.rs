//! What the older Queen clients send (issue 27 §1): the JavaScript client
//! and the pre-2.x Python client spell some parameters differently from
//! 2.6.0, and the broker reads every spelling in docs/DECISIONS.md's table.

#[macro_use]
mod common;

use common::Broker;
use serde_json::json;

both_modes!(from_beginning_is_a_spelling_of_all_for_a_groups_first_pop);

/// `subscriptionMode=from_beginning`, the older clients' "all": a new group
/// reads the whole backlog (where `new` would skip it), in any case.
async fn from_beginning_is_a_spelling_of_all_for_a_groups_first_pop(hotlist: bool) {
    let b = common::broker_in_mode(hotlist).await;
    b.push_to("legacy", "p", &[json!("old-1"), json!("old-2")]).await;
    for (group, mode) in [("js", "from_beginning"), ("py", "FROM-BEGINNING")] {
        let r = b.pop(&format!("/api/v1/pop/queue/legacy?consumerGroup={group}&subscriptionMode={mode}&batch=10&autoAck=true")).await;
        assert_eq!(r.data(), [json!("old-1"), json!("old-2")], "{mode}");
    }
    assert_eq!(b.pop("/api/v1/pop/queue/legacy?consumerGroup=fresh&subscriptionMode=new_only&batch=10").await.status, 204, "new_only skips it");
}

/// A value that is no spelling of anything stays a 400 that lists every
/// accepted one, and changes nothing.
#[tokio::test]
async fn an_unknown_subscription_mode_is_refused_with_the_accepted_spellings() {
    let b = Broker::start().await;
    b.push_to("legacy", "p", &[json!(1)]).await;
    let r = b.pop("/api/v1/pop/queue/legacy?consumerGroup=g&subscriptionMode=sometimes").await;
    assert_eq!(r.status, 400);
    let err = r.body.unwrap()["error"].as_str().unwrap().to_string();
    assert_eq!(err, "subscriptionMode: must be one of all, from_beginning, from-beginning, new, new-only, new_only, got \"sometimes\"");
    let cursors: i64 = b.sql().await.query_one("SELECT count(*) FROM queen.consumers", &[]).await.unwrap().get(0);
    assert_eq!(cursors, 0, "the refused pop registered nothing");
}

/// `DEFAULT_SUBSCRIPTION_MODE` takes the same spellings: `from_beginning`
/// boots a broker whose new groups read the backlog.
#[tokio::test]
async fn the_server_default_takes_the_same_spellings() {
    let b = Broker::start_with(&[("DEFAULT_SUBSCRIPTION_MODE", "from_beginning")]).await;
    b.push_to("legacy", "p", &[json!("kept")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/legacy?consumerGroup=g&autoAck=true").await.data(), [json!("kept")]);
    let b = Broker::start_with(&[("DEFAULT_SUBSCRIPTION_MODE", "new-only")]).await;
    b.push_to("legacy", "p", &[json!("skipped")]).await;
    assert_eq!(b.pop("/api/v1/pop/queue/legacy?consumerGroup=g").await.status, 204);
}

/// The older clients' snake_case spellings, on every route that reads a
/// camelCase field (docs/DECISIONS.md "Every spelling a client sends"):
/// push `transaction_id`, pop `consumer_group`/`auto_ack`/`lease_seconds`,
/// ack `transaction_id`/`partition_id`/`lease_id`/`consumer_group`, configure
/// options, and transactions.
#[tokio::test]
async fn snake_case_spellings_are_read_wherever_camel_case_is() {
    let b = Broker::start().await;
    let (status, conf) = b.post("/api/v1/configure", json!({"queue": "snake", "options": {"lease_time": 45, "retry_limit": 7}})).await;
    assert_eq!(status, 200);
    assert_eq!((conf["options"]["leaseTime"].clone(), conf["options"]["retryLimit"].clone()), (json!(45), json!(7)));
    let (_, pushed) = b
        .post("/api/v1/push", json!({"items": [{"queue": "snake", "partition": "p", "transaction_id": "s-1", "payload": 1},
                                               {"queue": "snake", "partition": "p", "transaction_id": "s-2", "payload": 2}]}))
        .await;
    assert_eq!(pushed[0]["transactionId"], "s-1");
    let r = b.pop("/api/v1/pop/queue/snake?consumer_group=old&batch=1&lease_seconds=30").await;
    assert_eq!(r.messages()[0]["transactionId"], "s-1");
    assert_eq!(r.body.as_ref().unwrap()["consumerGroup"], "old");
    let pid = r.messages()[0]["partitionId"].as_str().unwrap().to_string();
    let lease = r.body.as_ref().unwrap()["leaseId"].as_str().unwrap().to_string();
    let (status, acked) = b
        .post("/api/v1/ack", json!({"transaction_id": "s-1", "partition_id": pid, "lease_id": lease, "status": "completed", "consumer_group": "old"}))
        .await;
    assert_eq!((status, acked[0]["success"].clone()), (200, json!(true)), "{acked}");
    assert_eq!(b.cursor(&pid, "old").await.0, 0, "the snake_case ack committed old's cursor");
    let r = b.pop("/api/v1/pop/queue/snake?consumer_group=old&batch=1").await;
    let lease = r.body.as_ref().unwrap()["leaseId"].as_str().unwrap().to_string();
    let (_, txn) = b
        .post("/api/v1/transaction", json!({"operations": [{"type": "ack", "transaction_id": "s-2", "partition_id": pid, "consumer_group": "old", "lease_id": lease, "status": "completed"}],
                                            "required_leases": [lease]}))
        .await;
    assert_eq!(txn["success"], true, "{txn}");
    assert_eq!(b.cursor(&pid, "old").await.0, 1);
    let auto = b.pop("/api/v1/pop/queue/snake?consumer_group=other&auto_ack=true&batch=5").await;
    assert_eq!(auto.body.as_ref().unwrap()["leaseId"], "", "auto_ack is autoAck");
}

/// A JSON `false` status is a nack on every ack route, transactions included
/// (it used to read as absent there, which is `completed`).
#[tokio::test]
async fn a_false_status_in_a_transaction_is_a_nack() {
    let b = Broker::start().await;
    b.push_to("bools", "p", &[json!(1)]).await;
    let r = b.pop("/api/v1/pop/queue/bools?consumerGroup=g&batch=1").await;
    let m = &r.messages()[0];
    let pid = m["partitionId"].as_str().unwrap().to_string();
    let (_, txn) = b
        .post("/api/v1/transaction", json!({"operations": [{"type": "ack", "transactionId": m["transactionId"], "partitionId": pid,
                                                             "consumerGroup": "g", "leaseId": m["leaseId"], "status": false}]}))
        .await;
    assert_eq!(txn["success"], true, "{txn}");
    let (committed, lease, retries) = b.cursor(&pid, "g").await;
    assert_eq!((committed, lease, retries), (-1, None, 1), "nacked: not committed, lease released, one retry spent");
}
