"""Regenerates src/http/openapi/examples.json: one real request and answer
for every route of the broker, recorded against a running broker (its URL
is the first argument; use a fresh database: the scenario creates queues).

Why: the OpenAPI document (GET /api/v1/openapi.json) shows an example of
every request and answer, and derives their schemas from them; recorded
from the broker itself, an example cannot drift from what the broker says.
Long arrays are cut to their first element and long strings shortened.

Usage: python3 scripts/openapi-examples.py http://127.0.0.1:6632
"""
import json
import sys
import time
import urllib.error
import urllib.request

URL = sys.argv[1].rstrip("/")
OUT = "src/http/openapi/examples.json"
recorded = []


def call(method, path, template=None, body=None, record=True, raw=False):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        answer = json.loads(text) if text else None
    except ValueError:
        answer = None if raw else text[:200]
    if record:
        recorded.append({"method": method, "path": template or path.split("?")[0], "query": path.split("?")[1] if "?" in path else None,
                         "request": body, "status": status, "response": trim(answer)})
    return status, answer


def trim(v, depth=0):
    if isinstance(v, list):
        return [trim(v[0], depth + 1)] if v else []
    if isinstance(v, dict):
        return {k: trim(x, depth + 1) for k, x in v.items()}
    if isinstance(v, str) and len(v) > 120:
        return v[:117] + "..."
    return v


def main():
    call("GET", "/", record=False)
    recorded.append({"method": "GET", "path": "/", "query": None, "request": None, "status": 200, "response": "<!doctype html>..."})
    recorded.append({"method": "GET", "path": "/dashboard/{file}", "query": None, "request": None, "status": 200, "response": "/* app.js */"})
    recorded.append({"method": "GET", "path": "/api/v1/openapi.json", "query": None, "request": None, "status": 200,
                     "response": {"openapi": "3.1.0", "info": {"title": "Queen", "version": "0.1.0"}, "paths": {"/health": {"get": {"summary": "..."}}}}})
    call("GET", "/health")
    call("GET", "/auth/me")
    # JWT off: a redirect to the dashboard, which urllib would follow.
    recorded.append({"method": "GET", "path": "/auth/login", "query": None, "request": None, "status": 303,
                     "response": "(303 to /: no body)"})
    call("POST", "/auth/logout")
    call("GET", "/metrics")
    recorded.append({"method": "GET", "path": "/metrics/prometheus", "query": None, "request": None, "status": 200,
                     "response": "# TYPE queen_messages_pushed_total counter\nqueen_messages_pushed_total{queue=\"orders\"} 2\n"})
    call("POST", "/api/v1/configure", body={"queue": "orders", "options": {"leaseTime": 30, "retryLimit": 3}})
    call("POST", "/api/v1/push", body={"items": [{"queue": "orders", "partition": "customer-42", "transactionId": "order-91", "payload": {"total": 4200}},
                                                 {"queue": "orders", "partition": "customer-42", "transactionId": "order-92", "payload": {"total": 990}}]})
    _, popped = call("GET", "/api/v1/pop/queue/orders?consumerGroup=billing&batch=1", "/api/v1/pop/queue/{queue}")
    m = popped["messages"][0]
    pid, lease = m["partitionId"], popped["leaseId"]
    call("POST", "/api/v1/lease/" + lease + "/extend", "/api/v1/lease/{lease_id}/extend", body={"seconds": 60})
    call("POST", "/api/v1/ack", body={"transactionId": m["transactionId"], "partitionId": pid, "leaseId": lease, "status": "completed", "consumerGroup": "billing"})
    _, popped = call("GET", "/api/v1/pop/queue/orders/partition/customer-42?consumerGroup=billing&batch=10", "/api/v1/pop/queue/{queue}/partition/{partition}")
    m = popped["messages"][0]
    call("POST", "/api/v1/ack/batch", body={"consumerGroup": "billing", "acknowledgments": [{"transactionId": m["transactionId"], "partitionId": pid, "leaseId": popped["leaseId"], "status": "completed"}]})
    call("POST", "/api/v1/configure", body={"queue": "jobs", "namespace": "shop", "task": "email", "options": {"retryLimit": 0}}, record=False)
    call("POST", "/api/v1/push", body={"items": [{"queue": "jobs", "payload": {"to": "ann@example.com"}}]}, record=False)
    _, popped = call("GET", "/api/v1/pop?namespace=shop&batch=1&consumerGroup=mailer", "/api/v1/pop")
    m = popped["messages"][0]
    call("POST", "/api/v1/ack", body={"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": popped["leaseId"], "status": "dlq", "error": "mailbox full", "consumerGroup": "mailer"}, record=False)
    _, popped2 = call("GET", "/api/v1/pop/queue/orders?consumerGroup=audit&batch=1", record=False)
    a = popped2["messages"][0]
    call("POST", "/api/v1/transaction", body={"operations": [
        {"type": "ack", "transactionId": a["transactionId"], "partitionId": a["partitionId"], "leaseId": popped2["leaseId"], "consumerGroup": "audit", "status": "completed"},
        {"type": "push", "items": [{"queue": "invoices", "partition": "customer-42", "payload": {"order": "order-91"}}]}]})
    call("GET", "/api/v1/resources/queues")
    call("GET", "/api/v1/resources/queues/orders", "/api/v1/resources/queues/{queue}")
    call("GET", "/api/v1/resources/queues/orders/depth", "/api/v1/resources/queues/{queue}/depth")
    call("GET", "/api/v1/resources/overview")
    call("GET", "/api/v1/resources/namespaces")
    call("GET", "/api/v1/resources/tasks")
    call("POST", "/api/v1/resources/quota", body={"kind": "queues", "maxMessagesPerSecond": 1000, "maxQueues": 50})
    call("GET", "/api/v1/resources/quota")
    call("GET", "/api/v1/resources/tenants")
    call("DELETE", "/api/v1/resources/tenant?tenant=6f1c2a34-0000-4000-8000-00000000abcd", "/api/v1/resources/tenant")
    call("GET", "/api/v1/consumer-groups")
    call("GET", "/api/v1/consumer-groups/lagging?minLagSeconds=0")
    call("GET", "/api/v1/consumer-groups/billing", "/api/v1/consumer-groups/{group}")
    call("POST", "/api/v1/consumer-groups/billing/subscription", "/api/v1/consumer-groups/{group}/subscription", body={"subscriptionTimestamp": "2026-12-01T00:00:00Z"})
    call("POST", "/api/v1/consumer-groups/billing/queues/orders/seek", "/api/v1/consumer-groups/{group}/queues/{queue}/seek", body={"toEnd": True})
    call("POST", "/api/v1/consumer-groups/billing/queues/orders/partitions/customer-42/seek", "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek", body={"timestamp": "2026-12-01T00:00:00Z"})
    call("POST", "/api/v1/stats/refresh", body={})
    call("GET", "/status")
    call("GET", "/api/v1/system/brokers")
    call("GET", "/api/v1/status")
    call("GET", "/api/v1/status/buffers")
    call("GET", "/api/v1/status/queues")
    call("GET", "/api/v1/status/queues/orders", "/api/v1/status/queues/{queue}")
    call("GET", "/api/v1/status/queues/orders/messages?limit=1", "/api/v1/status/queues/{queue}/messages")
    call("GET", "/api/v1/status/analytics")
    for r in ["system-metrics", "worker-metrics", "queue-lag", "queue-ops", "workload", "queue-parked-replicas", "retention",
              "dlq-signatures", "partition-liveness", "postgres-stats"]:
        call("GET", "/api/v1/analytics/" + r)
    _, dlq = call("GET", "/api/v1/dlq?queue=jobs")
    dead = dlq["messages"][0]
    call("GET", f"/api/v1/messages?queue=orders&limit=1", "/api/v1/messages")
    call("GET", f"/api/v1/messages/{pid}/order-91", "/api/v1/messages/{partition_id}/{transaction_id}")
    call("POST", "/api/v1/traces", body={"transactionId": "order-91", "partitionId": pid, "consumerGroup": "billing", "traceNames": ["order-91"], "eventType": "charged", "data": {"amount": 4200}})
    time.sleep(0.3)
    call("GET", "/api/v1/traces/names")
    call("GET", "/api/v1/traces/by-name/order-91", "/api/v1/traces/by-name/{name}")
    call("GET", f"/api/v1/traces/{pid}/order-91", "/api/v1/traces/{partition_id}/{transaction_id}")
    call("POST", "/api/v1/fetch", body={"entries": [{"queue": "orders", "partition": "customer-42", "offset": 0, "maxBytes": 1048576}]})
    call("POST", "/api/v1/partitions/changed", body={"entries": [{"queue": "orders", "since": "2026-01-01T00:00:00Z", "limit": 100}]})
    call("POST", "/api/v1/kv", body={"operations": [{"op": "put", "ns": "config", "key": "feature/x", "value": {"on": True}, "forever": True},
                                                   {"op": "get", "ns": "config", "key": "feature/x"}]})
    call("GET", "/api/v1/kv/config/feature/x", "/api/v1/kv/{ns}/{*key}")
    call("PUT", "/api/v1/kv/config/feature/x", "/api/v1/kv/{ns}/{*key}", body={"value": {"on": False}, "forever": True})
    call("DELETE", "/api/v1/kv/config/feature/x", "/api/v1/kv/{ns}/{*key}")
    call("POST", "/api/v1/locks", body={"operations": [{"op": "acquire", "name": "nightly-report", "owner": "worker-1", "ttlSeconds": 30}]})
    call("GET", "/api/v1/consumers")
    call("GET", "/api/v1/resources/kv/namespaces")
    call("POST", "/api/v1/resources/kv/list", body={"ns": "queen-locks", "limit": 10})
    call("POST", "/api/v1/timers", body={"operations": [{"op": "schedule", "queue": "orders", "timerKey": "order-91:expire", "payload": "eyJleHBpcmUiOnRydWV9", "delayMs": 600000, "txn": "t-1"}]})
    call("GET", "/api/v1/timers/orders", "/api/v1/timers/{queue}")
    call("GET", "/api/v1/timers/orders/order-91:expire", "/api/v1/timers/{queue}/{*key}")
    call("DELETE", "/api/v1/timers/orders/order-91:expire", "/api/v1/timers/{queue}/{*key}")
    call("POST", "/api/v1/ephemeral/configure", body={"queue": "presence", "options": {"maxLength": 1000, "ttlSeconds": 60}})
    call("POST", "/api/v1/ephemeral/push", body={"queue": "presence", "partition": "room-7", "messages": [{"payload": {"user": "ann", "typing": True}}]})
    _, e = call("GET", "/api/v1/ephemeral/pop?queue=presence&group=tabs&batch=10", "/api/v1/ephemeral/pop")
    call("POST", "/api/v1/ephemeral/ack", body={"queue": "presence", "group": "tabs", "acks": [{"id": e["messages"][0]["id"], "status": "completed"}]})
    call("GET", "/api/v1/ephemeral/queues")
    call("GET", "/api/v1/ephemeral/queues/presence/depth", "/api/v1/ephemeral/queues/{queue}/depth")
    call("POST", "/api/v1/ephemeral/reset", body={"queue": "presence"})
    call("DELETE", "/api/v1/ephemeral/queue/presence", "/api/v1/ephemeral/queue/{queue}")
    _, reg = call("POST", "/streams/v1/queries", body={"name": "order-totals", "source_queue": "orders", "config_hash": "c0ffee", "reset": False})
    call("POST", "/streams/v1/state/get", body={"query_id": reg["query_id"], "partition_id": pid, "keys": []})
    call("POST", "/streams/v1/cycle", body={"query_id": reg["query_id"], "partition_id": pid, "consumer_group": "streams.order-totals",
                                            "state_ops": [{"type": "upsert", "key": "tumb:60\u001forder\u001f2026-12-02T08:00:00.000Z", "value": {"acc": {"sum": 5190}, "windowEnd": 1764662460000}}],
                                            "push_items": [], "ack": None, "release_lease": False})
    for path in ["/api/v1/system/maintenance", "/api/v1/system/maintenance/pop", "/api/v1/system/kv-timers", "/api/v1/system/ephemeral"]:
        call("GET", path)
        call("POST", path, body={"enabled": path.endswith("kv-timers") or path.endswith("ephemeral")})
    call("POST", f"/api/v1/dlq/{dead['id']}/replay", "/api/v1/dlq/{id}/replay", body={})
    call("POST", "/api/v1/ack", body={"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "dlq", "error": "x", "consumerGroup": "mailer"}, record=False)
    _, popped = call("GET", "/api/v1/pop?namespace=shop&batch=1&consumerGroup=mailer", record=False)
    if popped and popped.get("messages"):
        m2 = popped["messages"][0]
        call("POST", "/api/v1/ack", body={"transactionId": m2["transactionId"], "partitionId": m2["partitionId"], "leaseId": popped["leaseId"], "status": "dlq", "error": "mailbox full", "consumerGroup": "mailer"}, record=False)
        call("POST", f"/api/v1/messages/{m2['partitionId']}/{m2['transactionId']}/retry", "/api/v1/messages/{partition_id}/{transaction_id}/retry", body={})
    _, popped = call("GET", "/api/v1/pop?namespace=shop&batch=1&consumerGroup=mailer", record=False)
    if popped and popped.get("messages"):
        m3 = popped["messages"][0]
        call("POST", "/api/v1/ack", body={"transactionId": m3["transactionId"], "partitionId": m3["partitionId"], "leaseId": popped["leaseId"], "status": "dlq", "error": "mailbox full", "consumerGroup": "mailer"}, record=False)
        call("DELETE", f"/api/v1/messages/{m3['partitionId']}/{m3['transactionId']}", "/api/v1/messages/{partition_id}/{transaction_id}")
    call("DELETE", "/api/v1/dlq?queue=jobs", "/api/v1/dlq")
    call("DELETE", "/api/v1/consumer-groups/audit/queues/orders", "/api/v1/consumer-groups/{group}/queues/{queue}")
    call("DELETE", "/api/v1/consumer-groups/billing", "/api/v1/consumer-groups/{group}")
    call("DELETE", "/api/v1/resources/queues/invoices", "/api/v1/resources/queues/{queue}")
    seen = {}
    for r in recorded:
        seen.setdefault((r["method"], r["path"]), r)
    with open(OUT, "w") as f:
        json.dump(sorted(seen.values(), key=lambda r: (r["path"], r["method"])), f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(seen)} routes recorded in {OUT}")


main()
