"""SASL PLAIN on the Kafka port when JWT is on: the password is a Queen JWT,
its roles mean what they mean over HTTP, and nothing is served before it."""

import base64
import hashlib
import hmac
import json
import socket
import struct
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from conftest import wait_for

SECRET = "kafka-test-secret"
JWT = {"JWT_ENABLED": "true", "JWT_ALGORITHM": "HS256", "JWT_SECRET": SECRET}


def token(role, sub="svc", **claims):
    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": sub, "role": role, "exp": int(time.time()) + 3600, **claims}).encode())
    sig = b64(hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


def sasl(broker, password, **extra):
    conf = {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": "svc", "sasl.password": password}
    conf.update(extra)
    return conf


def deliver(conf, topic, n=3, prefix="v", **extra):
    """Produces n records; answers the delivery errors' names (None for success)."""
    p = Producer({**conf, "enable.idempotence": False, "message.timeout.ms": 10000, "retries": 0, **extra})
    results = []
    for i in range(n):
        p.produce(topic, value=f"{prefix}{i}".encode(), partition=0,
                  on_delivery=lambda err, msg: results.append(err.name() if err else None))
    p.flush(20)
    return results


@pytest.mark.broker_env(JWT)
def test_a_read_write_token_produces_and_a_read_only_one_reads_but_cannot_produce(broker):
    assert deliver(sasl(broker, token("read-write")), "secured") == [None, None, None]
    assert deliver(sasl(broker, token("read-only")), "secured") == ["TOPIC_AUTHORIZATION_FAILED"] * 3
    c = Consumer(sasl(broker, token("read-only"), **{"group.id": "readers", "enable.auto.commit": False}))
    c.assign([TopicPartition("secured", 0, 0)])
    got = []
    wait_for(lambda: (got.append(m) if (m := c.poll(0.2)) is not None and not m.error() else None) or len(got) == 3,
             30, "three records")
    assert [m.value() for m in got] == [b"v0", b"v1", b"v2"]
    # Committing is consuming: a read-only token may not.
    with pytest.raises(KafkaException) as refused:
        c.commit(message=got[-1], asynchronous=False)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    c.close()
    # Deleting a topic is an admin's.
    for role, want in [("read-write", "TOPIC_AUTHORIZATION_FAILED"), ("admin", None)]:
        admin = AdminClient(sasl(broker, token(role)))
        f = admin.delete_topics(["secured"])["secured"]
        try:
            f.result(timeout=20)
            outcome = None
        except KafkaException as e:
            outcome = e.args[0].name()
        assert outcome == want, role


@pytest.mark.broker_env(JWT)
def test_a_bad_password_fails_authentication_and_nothing_is_served_before_it(broker):
    errors = []
    p = Producer({**sasl(broker, "not-a-jwt"), "error_cb": lambda e: errors.append(e.code()), "message.timeout.ms": 5000})
    p.produce("secured", value=b"x", partition=0)
    p.flush(10)
    assert KafkaError._AUTHENTICATION in errors
    wait_for(lambda: any("SASL authentication failed" in line for line in broker.logs), 10, "the refusal in the log")
    # A client that skips SASL is cut off at its first real request.
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        body = struct.pack(">hhih", 3, 1, 9, 1) + b"t" + struct.pack(">i", -1)
        s.sendall(struct.pack(">i", len(body)) + body)
        assert s.recv(100) == b""
    wait_for(lambda: any("Metadata before SASL authentication" in line for line in broker.logs), 10, "the refusal in the log")


DEFAULT = "00000000-0000-0000-0000-000000000001"
A = "6f1c2a34-0000-4000-8000-00000000000a"
B = "6f1c2a34-0000-4000-8000-00000000000b"
TENANTS = {**JWT, "QUEEN_TENANT_CLAIM": "tid", "QUEEN_TENANCY_ADMIN_ALL": "true", "QUEEN_QUOTA_SAMPLE_MS": "200"}


def http(broker, method, path, bearer, body=None):
    req = urllib.request.Request(broker.url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {bearer}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read() or b"null")


@pytest.mark.broker_env(TENANTS)
def test_two_tenants_clients_use_the_same_topic_group_and_transactional_id_as_strangers(broker):
    """A SASL token's tenant claim is the connection's tenant (issue 49):
    two tenants' `orders`, `billing` and `t1` are their own, at once."""
    a, b = sasl(broker, token("read-write", tid=A)), sasl(broker, token("read-write", tid=B))
    assert deliver(a, "orders", 3, "a") == [None] * 3
    assert deliver(b, "orders", 2, "b") == [None] * 2
    assert deliver(b, "b-only", 1, "b") == [None]
    # One group name, one member in each tenant, consuming together: were
    # the membership shared, partition 0 would be one member's only.
    consumers = {t: Consumer({**conf, "group.id": "billing", "auto.offset.reset": "earliest", "enable.auto.commit": False})
                 for t, conf in (("a", a), ("b", b))}
    got = {t: [] for t in consumers}
    for c in consumers.values():
        c.subscribe(["orders"])

    def both():
        for t, c in consumers.items():
            m = c.poll(0.2)
            if m is not None and not m.error():
                got[t].append(m.value())
        return len(got["a"]) >= 3 and len(got["b"]) >= 2
    wait_for(both, 60, "each tenant's records")
    assert got == {"a": [b"a0", b"a1", b"a2"], "b": [b"b0", b"b1"]}
    for c in consumers.values():
        c.commit(asynchronous=False)
    assert [consumers[t].committed([TopicPartition("orders", 0)], timeout=20)[0].offset for t in "ab"] == [3, 2]
    # Listings are the tenant's, by the names it gave.
    topics = {t: set(AdminClient(conf).list_topics(timeout=20).topics) for t, conf in (("a", a), ("b", b))}
    assert "orders" in topics["a"] and "b-only" not in topics["a"] and {"orders", "b-only"} <= topics["b"], topics
    assert not any("\x01" in t for ts in topics.values() for t in ts)
    admin_a = AdminClient(a)
    assert "billing" in {g.group_id for g in admin_a.list_consumer_groups().result(timeout=30).valid}
    described = admin_a.describe_consumer_groups(["billing"])["billing"].result(timeout=30)
    assert len(described.members) == 1, described.members
    for c in consumers.values():
        c.close()
    default = sasl(broker, token("read-write", tid=DEFAULT))
    assert "orders" not in AdminClient(default).list_topics(timeout=20).topics
    # The records are the tenant's queue over HTTP too.
    status, popped = http(broker, "GET", "/api/v1/pop/queue/orders?consumerGroup=http&batch=10&wait=false", token("read-write", tid=A))
    assert status == 200 and [base64.b64decode(m["data"]["value"]) for m in popped["messages"]] == [b"a0", b"a1", b"a2"], popped
    # One transactional id in both tenants: neither session fences the other.
    producers = {t: Producer({**conf, "transactional.id": "t1"}) for t, conf in (("a", a), ("b", b))}
    for p in producers.values():
        p.init_transactions(30)
    for t, p in producers.items():
        p.begin_transaction()
        p.produce("txns", value=t.encode(), partition=0)
        p.commit_transaction(30)
    rows = broker.sql("SELECT tenant_id, count(*) FROM queen.kafka_producers WHERE transactional_id IS NOT NULL GROUP BY 1 ORDER BY 1")
    assert rows == [(A, "1"), (B, "1")], rows
    # A producer id of one tenant is a stranger's to the other: a bump of
    # it gets a new id and leaves the owner's epoch; a batch under it is fenced.
    (pid, epoch), = broker.sql(f"SELECT producer_id, epoch FROM queen.kafka_producers WHERE tenant_id = '{A}' LIMIT 1")
    (new, new_epoch), = broker.sql(f"SELECT * FROM queen.kafka_init_producer_v2({pid}, {epoch}::int2, '{B}')")
    assert new != pid and new_epoch == "0"
    assert broker.sql(f"SELECT epoch FROM queen.kafka_producers WHERE producer_id = {pid}") == [(epoch,)]
    fenced = broker.sql(f"SELECT o_epoch FROM queen.kafka_produce_begin_v2({pid}, {epoch}::int2, ARRAY['x'], ARRAY['0'], '{B}')")
    assert fenced == [("32767",)], fenced


@pytest.mark.broker_env(TENANTS)
def test_a_tenants_push_rate_throttles_its_producers_and_its_queue_quota_refuses_new_topics(broker):
    admin = token("admin", tid=DEFAULT)
    b = sasl(broker, token("read-write", tid=B))
    assert deliver(b, "first", 1, "b") == [None]
    status, _ = http(broker, "POST", "/api/v1/resources/quota", admin,
                     {"tenant": B, "kind": "queues", "maxMessagesPerSecond": 4, "maxQueues": 1})
    assert status == 200
    wait_for(lambda: http(broker, "GET", f"/api/v1/resources/quota?tenant={B}", admin)[1]["usage"].get("queues") == 1, 10,
             "the tenant's queues sampled")
    # Over its rate a producer is throttled, not refused (HTTP would answer
    # 429): 12 records at 4 a second are admitted into a debt of 8 and the
    # answer says to wait 2 s; the tenant's next connection is read only
    # once the debt is paid. None is lost.
    throttles = []
    assert deliver(b, "first", 12, "r", throttle_cb=lambda e: throttles.append(e.throttle_time)) == [None] * 12
    assert throttles and max(throttles) >= 1.5, throttles
    started = time.monotonic()
    assert deliver(b, "first", 4, "s") == [None] * 4
    assert time.monotonic() - started >= 1.5
    assert broker.sql(f"SELECT last_offset + 1 FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.tenant_id = '{B}'") == [("17",)]
    # A second topic is over the queue quota: refused with the reason, nothing created.
    assert deliver(b, "second", 1, "r") == ["POLICY_VIOLATION"]
    assert broker.sql(f"SELECT count(*) FROM queen.queues WHERE tenant_id = '{B}'") == [("1",)]
    # Another tenant is not limited.
    assert deliver(sasl(broker, token("read-write", tid=A)), "second", 12, "a") == [None] * 12
