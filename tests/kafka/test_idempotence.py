"""An idempotent producer's batch sent again (its answer lost) is answered
with its first offset and not written twice; a gap in its sequence and an
old epoch are refused. Spoken byte by byte, since no client resends on
demand."""

import socket
import struct

from confluent_kafka import Consumer, TopicPartition

from conftest import wait_for


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
