"""Kafka transactions with confluent-kafka's transactional producer: a
committed transaction is read whole, an aborted one never, by Kafka
consumers and HTTP pops alike; a consume-transform-produce loop commits
its input offsets with its output, across broker SIGKILLs; a zombie
(an older session of the same transactional.id) is fenced; a transaction
left open times out and its records never appear."""

import base64
import json
import threading
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from conftest import wait_for


def read_committed(bootstrap, topic, partitions, settle=2.0, group="reader"):
    """Every record a read_committed consumer finds, by partition, once
    nothing new has come for `settle` seconds."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = {p: [] for p in range(partitions)}
    quiet = time.monotonic() + settle
    deadline = time.monotonic() + 60
    while time.monotonic() < quiet and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got[m.partition()].append(m.value())
            quiet = time.monotonic() + settle
    c.close()
    return got


def txn_producer(broker, txn_id, **extra):
    conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id, "linger.ms": 5}
    conf.update(extra)
    p = Producer(conf)
    p.init_transactions(30)
    return p


def http_pop_all(broker, queue, partition):
    url = f"{broker.url}/api/v1/pop/queue/{queue}/partition/{partition}?consumerGroup=http&batch=100&autoAck=true"
    out = []
    while True:
        with urllib.request.urlopen(url, timeout=10) as r:
            if r.status == 204:
                return out
            body = json.load(r)
        if not body.get("messages"):
            return out
        out.extend(m["data"] for m in body["messages"])


def test_a_committed_transaction_is_read_whole_and_an_aborted_one_never(broker):
    p = txn_producer(broker, "t-basic")
    p.begin_transaction()
    for i in range(10):
        p.produce("txn", value=f"a{i}".encode(), partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(5):
        p.produce("txn", value=f"aborted{i}".encode(), partition=i % 2)
    p.flush(30)
    # Flushed, not committed: no reader sees them.
    assert read_committed(broker.bootstrap, "txn", 2, settle=1.0, group="early") == {
        0: [b"a0", b"a2", b"a4", b"a6", b"a8"], 1: [b"a1", b"a3", b"a5", b"a7", b"a9"]}
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(3):
        p.produce("txn", value=f"b{i}".encode(), partition=0)
    p.commit_transaction(30)
    got = read_committed(broker.bootstrap, "txn", 2)
    assert got == {0: [b"a0", b"a2", b"a4", b"a6", b"a8", b"b0", b"b1", b"b2"], 1: [b"a1", b"a3", b"a5", b"a7", b"a9"]}
    # A read_uncommitted consumer and an HTTP pop read the same: nothing aborted.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "u", "isolation.level": "read_uncommitted"})
    assert c.get_watermark_offsets(TopicPartition("txn", 0), timeout=10) == (0, 8)
    c.close()
    popped = [base64.b64decode(d["value"]) for d in http_pop_all(broker, "txn", "1")]
    assert popped == [b"a1", b"a3", b"a5", b"a7", b"a9"]


def test_an_older_session_of_a_transactional_id_is_fenced(broker):
    old = txn_producer(broker, "t-zombie")
    old.begin_transaction()
    old.produce("zombie", value=b"from the zombie", partition=0)
    old.flush(30)
    new = txn_producer(broker, "t-zombie")  # its init aborts what the old one left open
    new.begin_transaction()
    new.produce("zombie", value=b"from the new one", partition=0)
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as e:
        old.produce("zombie", value=b"late", partition=0)
        old.commit_transaction(10)
    assert e.value.args[0].fatal() or e.value.args[0].code() in (KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                                                                    KafkaError.PRODUCER_FENCED), e.value
    assert read_committed(broker.bootstrap, "zombie", 1) == {0: [b"from the new one"]}


@pytest.mark.broker_env({"LOG_LEVEL": "warn,queen=info"})
def test_a_transaction_left_open_times_out_and_is_never_read(broker):
    p = txn_producer(broker, "t-timeout", **{"transaction.timeout.ms": 2000})
    p.begin_transaction()
    p.produce("timeout", value=b"never", partition=0)
    p.flush(30)
    wait_for(lambda: any("aborted kafka transactions open past their timeout" in line for line in broker.logs), 30,
             "the timeout abort")
    with pytest.raises(KafkaException):
        p.commit_transaction(10)
    assert read_committed(broker.bootstrap, "timeout", 1, settle=1.0) == {0: []}


def seed(broker, topic, total, partitions):
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(total):
        p.produce(topic, value=str(i).encode(), partition=i % partitions)
        p.poll(0)
    assert p.flush(60) == 0


def test_consume_transform_produce_across_two_sigkills_writes_each_input_exactly_once(broker):
    total, partitions = 100_000, 3
    seed(broker, "ctp-in", total, partitions)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ctp", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "metadata.recovery.strategy": "none"})
    consumer.subscribe(["ctp-in"])
    # librdkafka 2.10+ re-bootstraps when its only broker is gone and decommissions it, and a
    # transactional producer's send_offsets_to_transaction can then wait past its timeout
    # (docs/KAFKA.md): with one broker killed on purpose, the client keeps its brokers.
    keep = {"metadata.recovery.strategy": "none"}
    producer = txn_producer(broker, "t-ctp", **keep)
    done, kills, errors = 0, [], []
    deadline = time.monotonic() + 240

    def rewind():
        # Back to what the group committed: the aborted batch comes again.
        committed = consumer.committed(consumer.assignment(), timeout=30)
        for tp in committed:
            consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))

    def committed_total():
        tps = consumer.committed([TopicPartition("ctp-in", p) for p in range(partitions)], timeout=30)
        return sum(max(tp.offset, 0) for tp in tps)

    while time.monotonic() < deadline:
        if done >= total // 3 and len(kills) == 0 or done >= 2 * total // 3 and len(kills) == 1:
            kills and kills[-1].join()
            t = threading.Thread(target=broker.restart)
            t.start()
            kills.append(t)
        batch = [m for m in consumer.consume(500, 1.0) if not m.error()]
        if not batch:
            try:
                if committed_total() >= total:
                    break
            except KafkaException:
                pass  # the broker is restarting
            continue
        try:
            producer.begin_transaction()
            for m in batch:
                producer.produce("ctp-out", value=b"out-" + m.value(), partition=m.partition())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            try:
                producer.commit_transaction(60)
            except KafkaException as e:
                if not e.args[0].retriable():
                    raise
                producer.commit_transaction(60)  # a commit that did land is answered as done
            done += len(batch)
        except KafkaException as e:
            err = e.args[0]
            errors.append(err)
            try:
                if not err.txn_requires_abort():
                    raise e
                producer.abort_transaction(60)
            except KafkaException:
                producer = txn_producer(broker, "t-ctp", **keep)  # fences and aborts the old session
            rewind()
    for t in kills:
        t.join()
    assert len(kills) == 2
    assert committed_total() == total, f"the group committed {committed_total()} of {total}; errors: {errors[:5]}"
    got = read_committed(broker.bootstrap, "ctp-out", partitions, settle=2.0, group="check-out")
    values = sorted(int(v[4:]) for vs in got.values() for v in vs)
    assert values == list(range(total)), f"{len(values)} records; duplicates or gaps after {len(errors)} errors"
    consumer.close()
