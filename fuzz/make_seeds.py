"""Writes the seed corpus of the fuzz targets (run with a Python that has
`zstandard`, e.g. target/compat-venv/bin/python fuzz/make_seeds.py). The
targets prepend the magic, so seeds start at the flags byte."""

import os
import struct
import uuid

import zstandard

HERE = os.path.dirname(os.path.abspath(__file__))


def s16(b):
    return struct.pack("<H", len(b)) + b


def frame(txn, payload, trace=None):
    flags = 1 if trace else 0
    body = bytes([flags]) + uuid.UUID(int=0x0198F2C19A7B7D208E314C5D6E7F8A90).bytes
    if trace:
        body += trace.bytes
    body += s16(txn) + payload
    return struct.pack("<I", len(body)) + body


def z(data):
    return zstandard.ZstdCompressor(level=1, write_content_size=True).compress(data)


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


frames = frame(b"t1", b'{"a":1}') + frame(b"t2", b"[1,2]", uuid.uuid4()) + frame(b"t3", b"")
write("frame_codec", "three_frames", frames)
write("frame_codec", "empty_payload", frame(b"x", b""))

group = s16(b"orders") + s16(b"p1") + struct.pack("<I", 2) + s16(b"t1") + struct.pack("<I", 7) + b'{"a":1}' \
    + s16(b"") + struct.pack("<I", 5) + b"[1,2]"
body = struct.pack("<I", 1) + group
write("qpb1", "flag4", bytes([4]) + body)
write("qpb1", "flag4_zstd", bytes([5]) + struct.pack("<I", len(body)) + z(body))
framed = frame(b"a", b"1") + frame(b"b", b'{"x":2}')
fgroup = s16(b"q") + s16(b"p") + struct.pack("<I", 2) + struct.pack("<I", len(z(framed))) + z(framed)
write("qpb1", "flag8", bytes([8]) + struct.pack("<I", 1) + fgroup)
head = b'{"operations":[{"type":"ack","transactionId":"t","partitionId":"1"}],"requiredLeases":[]}'
write("qtb1", "head_and_group", bytes([0]) + struct.pack("<I", len(head)) + head + struct.pack("<I", 1) + fgroup)
