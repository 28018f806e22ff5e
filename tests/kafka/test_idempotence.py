"""An idempotent producer's batch sent again (its answer lost) is answered
with its first offset and not written twice, by the same broker, by the
same broker after a SIGKILL, and by another broker of the database; a gap
in its sequence and an old epoch are refused, and an epoch bump outlives
a restart. Spoken byte by byte, since no client resends on demand; then
confluent-kafka's idempotent producer across two SIGKILLs."""

import os
import socket
import struct
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import KafkaBroker, wait_for


def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def varint(n):
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def batch(producer_id, epoch, first_seq, values):
    records = b""
    for i, v in enumerate(values):
        body = b"\x00" + varint(0) + varint(i) + varint(-1) + varint(len(v)) + v + varint(0)
        records += varint(len(body)) + body
    tail = struct.pack(">hiqqqhii", 0, len(values) - 1, 1000, 1000, producer_id, epoch, first_seq, len(values)) + records
    head = struct.pack(">qiib", 0, 4 + 1 + 4 + len(tail), 0, 2) + struct.pack(">I", crc32c(tail))
    return head + tail


def produce(sock, correlation, topic, partition, records):
    """A Produce v3 with one partition; answers (error code, base offset)."""
    name = topic.encode()
    body = struct.pack(">hhih", 0, 3, correlation, 1) + b"t"
    body += struct.pack(">hhi", -1, -1, 10000)  # no transactional id, acks=all, timeout
    body += struct.pack(">ih", 1, len(name)) + name + struct.pack(">ii", 1, partition)
    body += struct.pack(">i", len(records)) + records
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    answer = sock.recv(size, socket.MSG_WAITALL)
    got_correlation, _topics, name_len = struct.unpack(">iih", answer[:10])
    assert got_correlation == correlation
    at = 10 + name_len
    _partitions, index, error, base = struct.unpack(">iihq", answer[at:at + 18])
    assert index == partition
    return error, base


def init_producer(sock, correlation, producer_id=-1, epoch=-1):
    """An InitProducerId v3 (flexible) without a transactional id; with an
    id and epoch it asks for the next epoch (KIP-360). Answers (error code,
    producer id, epoch)."""
    body = struct.pack(">hhih", 22, 3, correlation, 1) + b"t" + b"\x00"  # header v2: client id, no tags
    body += b"\x00" + struct.pack(">iqh", 60000, producer_id, epoch) + b"\x00"  # null transactional id, timeout, id, epoch, no tags
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    answer = sock.recv(size, socket.MSG_WAITALL)
    got_correlation, = struct.unpack(">i", answer[:4])
    assert got_correlation == correlation
    _throttle, error, pid, got_epoch = struct.unpack(">ihqh", answer[5:21])
    return error, pid, got_epoch


def read_all(bootstrap, topic, partitions, expected):
    """Every record of the topic's partitions, as {partition: [values]}."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = {p: [] for p in range(partitions)}
    count, deadline = 0, time.monotonic() + 60
    while count < expected:
        assert time.monotonic() < deadline, f"{count} of {expected} records: " + ", ".join(f"{p}: {len(v)}" for p, v in got.items())
        m = c.poll(0.2)
        if m is not None and not m.error():
            got[m.partition()].append(m.value())
            count += 1
    extra = c.poll(1.0)  # nothing more: a duplicate would be here
    assert extra is None or extra.error(), f"a record past the {expected} expected: {extra.value()!r}"
    c.close()
    return got


def test_a_resend_after_a_sigkill_or_to_another_broker_is_answered_with_its_offsets(broker, tmp_path):
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        assert produce(s, 1, "durable", 0, batch(77, 0, 0, [b"a", b"b"])) == (0, 0)
        assert produce(s, 2, "durable", 0, batch(77, 0, 2, [b"c"])) == (0, 2)
    # The answer to the second batch was "lost"; the broker dies before the resend.
    broker.restart()
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        assert produce(s, 3, "durable", 0, batch(77, 0, 2, [b"c"])) == (0, 2), "the resend: its offset, nothing written"
        assert produce(s, 4, "durable", 0, batch(77, 0, 0, [b"a", b"b"])) == (0, 0)
        assert produce(s, 5, "durable", 0, batch(77, 0, 9, [b"x"])) == (45, -1), "a gap is still a gap after a restart"
        assert produce(s, 6, "durable", 0, batch(77, 0, 3, [b"d"])) == (0, 3)
    other = KafkaBroker(tmp_path, db=broker.db)
    try:
        with socket.create_connection(("127.0.0.1", other.kafka_port), timeout=10) as s:
            assert produce(s, 7, "durable", 0, batch(77, 0, 3, [b"d"])) == (0, 3), "another broker knows the batch"
            assert produce(s, 8, "durable", 0, batch(77, 0, 4, [b"e"])) == (0, 4)
        with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
            assert produce(s, 9, "durable", 0, batch(77, 0, 4, [b"e"])) == (0, 4), "and the first knows what the other wrote"
    finally:
        other.stop()
    assert read_all(broker.bootstrap, "durable", 1, 5) == {0: [b"a", b"b", b"c", b"d", b"e"]}


def test_an_epoch_bump_fences_the_old_epoch_across_a_restart(broker):
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        error, pid, epoch = init_producer(s, 1)
        assert (error, epoch) == (0, 0) and pid >= 0
        error2, pid2, _ = init_producer(s, 2)
        assert error2 == 0 and pid2 != pid, "every producer its own id"
        assert produce(s, 3, "bump", 0, batch(pid, 0, 0, [b"a"])) == (0, 0)
        assert init_producer(s, 4, pid, 0) == (0, pid, 1), "KIP-360: the next epoch"
        assert init_producer(s, 5, pid, 0) == (0, pid, 1), "the bump retried: the same answer"
        assert init_producer(s, 6, pid, 7) == (47, -1, -1), "an epoch that is not the producer's: INVALID_PRODUCER_EPOCH"
    broker.restart()
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        assert produce(s, 7, "bump", 0, batch(pid, 0, 1, [b"zombie"])) == (47, -1), "the old epoch stays fenced"
        assert produce(s, 8, "bump", 0, batch(pid, 1, 0, [b"b"])) == (0, 1)
        assert produce(s, 9, "bump", 0, batch(pid, 1, 0, [b"b"])) == (0, 1)
    assert read_all(broker.bootstrap, "bump", 1, 2) == {0: [b"a", b"b"]}


def test_an_idempotent_client_killed_under_twice_writes_each_record_once_in_order(broker):
    total, partitions = 20_000, 4
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "message.timeout.ms": 120_000, "retry.backoff.ms": 100, "reconnect.backoff.ms": 50,
                  "reconnect.backoff.max.ms": 500})
    failed = []
    kills = []

    def report(err, _msg):
        if err is not None:
            failed.append(err)

    for i in range(total):
        if i in (total // 3, 2 * total // 3) and not os.environ.get("NOKILL"):
            for t in kills:
                t.join()  # one restart at a time
            t = threading.Thread(target=broker.restart)
            t.start()
            kills.append(t)
        while True:
            try:
                p.produce("exactly", value=str(i).encode(), partition=i % partitions, on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0.02 if i % 500 == 0 else 0)  # spread over the restarts, not all queued before the first
    for t in kills:
        t.join()
    assert p.flush(120) == 0
    assert not failed, failed[:5]
    got = read_all(broker.bootstrap, "exactly", partitions, total)
    for part, values in got.items():
        assert values == [str(i).encode() for i in range(part, total, partitions)], f"partition {part}: each record once, in order"


def test_a_resent_batch_is_not_written_twice_and_gaps_and_old_epochs_are_refused(broker):
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        assert produce(s, 1, "idem", 0, batch(42, 3, 0, [b"a", b"b"])) == (0, 0)
        assert produce(s, 2, "idem", 0, batch(42, 3, 2, [b"c"])) == (0, 2)
        assert produce(s, 3, "idem", 0, batch(42, 3, 0, [b"a", b"b"])) == (0, 0), "a resend: its offsets, nothing written"
        assert produce(s, 4, "idem", 0, batch(42, 3, 2, [b"c"])) == (0, 2)
        assert produce(s, 5, "idem", 0, batch(42, 3, 5, [b"x"])) == (45, -1), "a gap: OUT_OF_ORDER_SEQUENCE_NUMBER"
        assert produce(s, 6, "idem", 0, batch(42, 2, 3, [b"x"])) == (47, -1), "an old epoch: INVALID_PRODUCER_EPOCH"
        assert produce(s, 7, "idem", 0, batch(42, 3, 3, [b"d"])) == (0, 3)
        # A corrupt batch is refused alone, with CORRUPT_MESSAGE.
        bad = bytearray(batch(43, 0, 0, [b"z"]))
        bad[-1] ^= 1
        assert produce(s, 8, "idem", 0, bytes(bad)) == (2, -1)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check", "enable.auto.commit": False})
    c.assign([TopicPartition("idem", 0, 0)])
    got = []
    wait_for(lambda: (got.append(m.value()) if (m := c.poll(0.2)) is not None and not m.error() else None) or len(got) >= 4,
             30, "the records")
    assert c.get_watermark_offsets(TopicPartition("idem", 0), timeout=10) == (0, 4)
    c.close()
    assert got == [b"a", b"b", b"c", b"d"]
