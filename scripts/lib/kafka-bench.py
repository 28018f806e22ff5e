"""The Kafka side of scripts/bench-kafka.sh: librdkafka (confluent-kafka)
producing with its defaults, and one consumer group member draining with
its defaults (auto commit), each printing one JSON line like queen-bench's.

    kafka-bench.py produce BOOTSTRAP TOPIC MESSAGES [SIZE [plain|idempotent]]
    kafka-bench.py consume BOOTSTRAP TOPIC MESSAGES GROUP
"""

import json
import os
import sys
import time

from confluent_kafka import Consumer, Producer


def produce(bootstrap, topic, messages, size, idempotent=False, warm=False):
    # librdkafka's defaults (idempotence is off unless asked for).
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": idempotent})
    value = (b"x" * size)
    failed = [0]
    if warm:
        # Steady state only: one record delivered before the clock starts.
        # An idempotent librdkafka producer waits for its producer id, and
        # asks for it on a 500 ms timer when its first broker connection is
        # not up yet (debug=eos: "No brokers available for Idempotent
        # producer"), a fixed start-up cost that is not idempotence's cost
        # per record, and the same against any Kafka broker.
        p.produce(topic, value=value)
        assert p.flush(30) == 0

    def report(err, _msg):
        if err is not None:
            failed[0] += 1

    started = time.monotonic()
    for _ in range(messages):
        while True:
            try:
                p.produce(topic, value=value, on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
    left = p.flush(120)
    secs = time.monotonic() - started
    print(json.dumps({"scenario": "kafka-produce-idempotent" if idempotent else "kafka-produce", "messages": messages, "payload_size": size, "seconds": secs,
                      "msg_per_s": messages / secs, "failed": failed[0] + left}))


def consume(bootstrap, topic, messages, group):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, started = 0, None
    deadline = time.monotonic() + 300
    while got < messages and time.monotonic() < deadline:
        batch = c.consume(10000, 1.0)
        if batch and started is None:
            started = time.monotonic()
        got += sum(1 for m in batch if not m.error())
    secs = time.monotonic() - (started or time.monotonic())
    c.commit(asynchronous=False)
    c.close()
    print(json.dumps({"scenario": "kafka-consume", "messages": got, "expected": messages, "seconds": secs,
                      "msg_per_s": got / secs if secs else 0}))


if __name__ == "__main__":
    mode, bootstrap, topic, messages = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if mode == "produce":
        # A sixth argument (plain or idempotent) is the idempotence comparison, timed warm.
        produce(bootstrap, topic, messages, int(sys.argv[5]) if len(sys.argv) > 5 else 100,
                len(sys.argv) > 6 and sys.argv[6] == "idempotent", warm=len(sys.argv) > 6)
    else:
        consume(bootstrap, topic, messages, sys.argv[5])
