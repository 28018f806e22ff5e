"""SASL PLAIN on the Kafka port when JWT is on: the password is a Queen JWT,
its roles mean what they mean over HTTP, and nothing is served before it."""

import base64
import hashlib
import hmac
import json
import socket
import struct
import time

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


def deliver(conf, topic, n=3):
    """Produces n records; answers the delivery errors' names (None for success)."""
    p = Producer({**conf, "enable.idempotence": False, "message.timeout.ms": 10000, "retries": 0})
    results = []
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=0,
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


@pytest.mark.broker_env({**JWT, "QUEEN_TENANT_CLAIM": "tid"})
def test_with_tenants_in_tokens_only_the_default_tenant_is_served(broker):
    """The listener serves the default tenant's queues (issue 49): a token
    naming another tenant fails authentication instead of reaching them."""
    default = token("read-write", tid="00000000-0000-0000-0000-000000000001")
    other = token("read-write", tid="6f1c2a34-0000-4000-8000-00000000abcd")
    assert deliver(sasl(broker, default), "tenanted") == [None, None, None]
    errors = []
    p = Producer({**sasl(broker, other), "error_cb": lambda e: errors.append(e.code()), "message.timeout.ms": 5000})
    p.produce("tenanted", value=b"x", partition=0)
    p.flush(10)
    assert KafkaError._AUTHENTICATION in errors
    wait_for(lambda: any("not served by the Kafka listener" in line for line in broker.logs), 10, "the refusal in the log")
