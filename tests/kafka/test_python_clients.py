"""kafka-python and aiokafka, the two pure-Python Kafka clients: produce,
a group consume with commits, a restart of the group from its commits, and
a seek."""

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition


def test_kafka_python_produces_consumes_in_a_group_commits_and_seeks(broker):
    p = KafkaProducer(bootstrap_servers=broker.bootstrap)
    futures = [p.send("kp", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 4, headers=[("h", b"\x00")])
               for i in range(200)]
    p.flush(30)
    offsets = [f.get(timeout=30) for f in futures]
    assert sorted(m.offset for m in offsets if m.partition == 0) == list(range(50))
    p.close()

    def group_read(n, linger=0):
        c = KafkaConsumer("kp", bootstrap_servers=broker.bootstrap, group_id="kpg", auto_offset_reset="earliest",
                          enable_auto_commit=False, max_poll_records=10, session_timeout_ms=6000,
                          heartbeat_interval_ms=500)
        got = []
        for _ in range(300):
            for records in c.poll(timeout_ms=200).values():
                got.extend(records)
            if len(got) >= n:
                break
        for _ in range(linger):  # nothing more may come
            for records in c.poll(timeout_ms=100).values():
                got.extend(records)
        # Commit exactly what was read: the next reader starts after it.
        got = got if linger else got[:n]
        last = {}
        for r in got:
            last[r.partition] = max(last.get(r.partition, -1), r.offset)
        from kafka.structs import OffsetAndMetadata
        c.commit({TopicPartition("kp", part): OffsetAndMetadata(o + 1, "", -1) for part, o in last.items()})
        c.close()
        return got

    first = group_read(80)
    assert len(first) == 80
    ends = {}
    for r in first:
        ends[r.partition] = max(ends.get(r.partition, -1), r.offset)
    remaining = 200 - sum(o + 1 for o in ends.values())
    rest = group_read(remaining, linger=10)
    assert len(rest) == remaining
    # The second reader starts where the first committed, on every partition.
    starts = {}
    for r in rest:
        starts[r.partition] = min(starts.get(r.partition, 10**9), r.offset)
    for part, o in ends.items():
        assert starts.get(part, o + 1) == o + 1
    assert len({(r.partition, r.offset) for r in rest}) == remaining
    assert all(r.headers == [("h", b"\x00")] for r in first)

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    tp = TopicPartition("kp", 2)
    c.assign([tp])
    c.seek(tp, 40)
    records = []
    for _ in range(100):
        records.extend(c.poll(timeout_ms=200).get(tp, []))
        if records:
            break
    assert (records[0].offset, records[0].key) == (40, b"k162")  # partition 2 holds i = 2, 6, 10, ...
    c.close()


def test_aiokafka_produces_consumes_in_a_group_commits_and_seeks(broker):
    async def scenario():
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await p.start()
        try:
            for i in range(100):
                await p.send("ak", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
            await p.flush()
        finally:
            await p.stop()

        c = AIOKafkaConsumer("ak", bootstrap_servers=broker.bootstrap, group_id="akg", auto_offset_reset="earliest",
                             enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500)
        await c.start()
        got = []
        try:
            while len(got) < 100:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=500), 30)
                for records in batch.values():
                    got.extend(records)
            await c.commit()
        finally:
            await c.stop()
        assert sorted(int(r.value[1:]) for r in got) == list(range(100))

        # The group committed everything: a new member of it reads nothing.
        c = AIOKafkaConsumer("ak", bootstrap_servers=broker.bootstrap, group_id="akg", auto_offset_reset="earliest",
                             enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500)
        await c.start()
        try:
            tps = set()
            for _ in range(60):
                tps = c.assignment()
                if tps:
                    break
                await asyncio.sleep(0.2)
            committed = {tp.partition: await c.committed(tp) for tp in tps}
            # The topic is 8 wide (QUEEN_KAFKA_DEFAULT_PARTITIONS); 2-7 were never written.
            assert committed == {0: 50, 1: 50, **{p: None for p in range(2, 8)}}
            # And a seek reads again from where it says.
            tp = AioTopicPartition("ak", 1)
            c.seek(tp, 45)
            again = []
            while len(again) < 5:
                batch = await asyncio.wait_for(c.getmany(tp, timeout_ms=500), 30)
                again.extend(batch.get(tp, []))
            assert [r.offset for r in again[:5]] == [45, 46, 47, 48, 49]
        finally:
            await c.stop()

    asyncio.run(asyncio.wait_for(scenario(), 120))
