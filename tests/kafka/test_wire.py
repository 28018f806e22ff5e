"""Bad input on the Kafka port: frames that are too long, too short, of an
unknown key or version, or that do not decode close the connection with a
warning naming the peer; the broker keeps serving everyone else."""

import socket
import struct

from confluent_kafka.admin import AdminClient

from conftest import wait_for


def send(broker, frame, read=True):
    """Sends raw bytes; answers what came back before the broker closed
    (b"" when it closed without answering)."""
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        s.sendall(frame)
        if not read:
            return None
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def request(key, version, correlation, body=b"", client=b"t"):
    payload = struct.pack(">hhih", key, version, correlation, len(client)) + client + body
    return struct.pack(">i", len(payload)) + payload


def test_bad_frames_close_the_connection_and_the_broker_keeps_serving(broker):
    cases = {
        "too long": struct.pack(">i", 200 << 20) + b"x" * 16,
        "too short": struct.pack(">i", 3) + b"abc",
        "negative": struct.pack(">i", -5),
        "unknown key": request(9999, 0, 1),
        "unserved key": request(21, 0, 2),  # DeleteRecords
        "version too high": request(0, 99, 3),
        "truncated body": request(3, 1, 4, body=b"\x00\x00\x00\x05"),
        "lying array": request(3, 1, 5, body=b"\x7f\xff\xff\xff"),
    }
    for name, frame in cases.items():
        assert send(broker, frame) == b"", f"{name}: answered instead of closing"
    # ApiVersions above v3: a v0 answer with UNSUPPORTED_VERSION (35) and
    # the table, and the connection stays open for the client's retry.
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as s:
        s.sendall(request(18, 9, 77))
        size, correlation, error, count = struct.unpack(">iihi", s.recv(14, socket.MSG_WAITALL))
        assert (correlation, error) == (77, 35)
        table = s.recv(size - 10, socket.MSG_WAITALL)
        keys = {struct.unpack(">hhh", table[i * 6:i * 6 + 6])[0] for i in range(count)}
        assert {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18} <= keys
        s.sendall(request(18, 0, 78))
        assert struct.unpack(">iih", s.recv(10, socket.MSG_WAITALL))[1:] == (78, 0)
    assert all(f"peer=127.0.0.1" in line for line in broker.logs if "kafka frame length refused" in line)
    wait_for(lambda: sum("closing the connection" in line for line in broker.logs) >= len(cases), 10, "a warning per refused frame")
    # And a real client is served as before.
    md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert list(md.brokers) == [1]  # the first node registered on this database
    assert broker.proc.poll() is None, "the broker is still running"
