"""Several brokers on one database: each advertises itself, all give the
same metadata and the same coordinator, so a group whose members reach
different brokers is still one group; a coordinator killed hands its groups
and its transactions on to the survivors with no commit lost."""

import socket
import struct
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from conftest import KafkaBroker, wait_for
from test_confluent import consumer, produce
from test_transactions import read_committed


def test_a_group_spread_over_two_brokers_is_one_group_and_survives_its_coordinator(broker, tmp_path):
    other = KafkaBroker(tmp_path, db=broker.db)
    stop = threading.Event()
    try:
        admins = [AdminClient({"bootstrap.servers": b.bootstrap}) for b in (broker, other)]

        def both_listed():
            return all(len(a.list_topics(timeout=10).brokers) == 2 for a in admins)

        wait_for(both_listed, 30, "each broker listing both")
        cluster = admins[1].describe_cluster().result(timeout=30)
        assert cluster.cluster_id == "queen" and len(cluster.nodes) == 2
        assert cluster.controller.id == min(n.id for n in cluster.nodes)
        produce(broker, "spread", [(i % 8, None, f"v{i}".encode(), []) for i in range(400)])
        md = [a.list_topics("spread", timeout=10).topics["spread"].partitions for a in admins]
        leaders = [{p: m.leader for p, m in parts.items()} for parts in md]
        assert leaders[0] == leaders[1], "both brokers name the same leaders"
        assert len(set(leaders[0].values())) == 2, "the leaders are spread over the two"

        # One member bootstraps from each broker; they must still meet.
        seen, committed, lock, failures = [], set(), threading.Lock(), []

        def run(b, name):
            c = consumer(b, "spread-group", **{"client.id": name})
            c.subscribe(["spread"])
            try:
                while not stop.is_set():
                    msg = c.poll(0.2)
                    if msg is None or msg.error():
                        continue
                    key = (msg.partition(), msg.offset())
                    with lock:
                        if key in committed:
                            failures.append(f"{key} was committed and came again to {name}")
                        seen.append((name, key))
                    try:
                        c.commit(message=msg, asynchronous=False)
                        with lock:
                            committed.add(key)
                    except Exception:
                        pass  # the coordinator moved: not committed, may come again
            finally:
                c.close()

        threads = [threading.Thread(target=run, args=(b, n), daemon=True) for b, n in ((broker, "a"), (other, "b"))]
        for t in threads:
            t.start()
        wait_for(lambda: len({k for _, k in seen}) >= 200, 60, "half the records")
        # Both members read: the one reaching the second broker found the
        # same coordinator as the other and was given a share.
        wait_for(lambda: {m for m, _ in seen} == {"a", "b"}, 60, "both members reading")
        # Stop the second broker: its share of leaders and groups moves to the first.
        other.stop()
        produce(broker, "spread", [(i % 8, None, f"w{i}".encode(), []) for i in range(80)])
        wait_for(lambda: len({k for _, k in seen}) == 480, 90, "every record, the later ones through one broker")
        stop.set()
        for t in threads:
            t.join(30)
        assert failures == []
        again = len(seen) - len({k for _, k in seen})
        assert again <= 8, f"{again} records read twice: at most one uncommitted per partition"
    finally:
        stop.set()
        other.stop()


def coordinator_port(bootstrap, key):
    """The port of the coordinator a broker names for `key` (a
    FindCoordinator v1, spoken by hand: no client says which it found)."""
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        name = key.encode()
        body = struct.pack(">hhih", 10, 1, 1, 1) + b"t" + struct.pack(">h", len(name)) + name + b"\x00"
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        answer = s.recv(size, socket.MSG_WAITALL)
    _correlation, _throttle, error, message = struct.unpack(">iihh", answer[:12])
    assert error == 0, error
    at = 12 + max(message, 0) + 4
    host_len = struct.unpack(">h", answer[at:at + 2])[0]
    return struct.unpack(">i", answer[at + 2 + host_len:at + 6 + host_len])[0]


def test_three_brokers_one_killed_the_group_moves_to_the_survivors_and_its_transaction_completes(broker, tmp_path):
    brokers = [broker, KafkaBroker(tmp_path, db=broker.db), KafkaBroker(tmp_path, db=broker.db)]
    everyone = ",".join(b.bootstrap for b in brokers)
    stop = threading.Event()
    threads = []
    try:
        admins = [AdminClient({"bootstrap.servers": b.bootstrap}) for b in brokers]
        wait_for(lambda: all(len(a.list_topics(timeout=10).brokers) == 3 for a in admins), 30, "each broker listing all three")
        # Every broker names the same coordinator for the group; that one is killed.
        ports = {coordinator_port(b.bootstrap, "trio") for b in brokers}
        assert len(ports) == 1, ports
        port = ports.pop()
        victim = next(b for b in brokers if b.kafka_port == port)
        survivors = [b for b in brokers if b is not victim]
        # A transactional id coordinated by the same broker.
        txn_id = next(f"trio-tx-{i}" for i in range(1000) if coordinator_port(broker.bootstrap, f"trio-tx-{i}") == victim.kafka_port)

        produce(broker, "trio", [(i % 8, None, f"v{i}".encode(), []) for i in range(8)])
        seen, committed, lock, failures, assigned = [], {}, threading.Lock(), [], {}

        def run(b, name):
            c = consumer(b, "trio", **{"client.id": name})

            def on_assign(_c, partitions):
                assigned[name] = {tp.partition for tp in partitions}

            def on_revoke(_c, _partitions):
                assigned[name] = set()

            c.subscribe(["trio"], on_assign=on_assign, on_revoke=on_revoke)
            try:
                while not stop.is_set():
                    msg = c.poll(0.2)
                    if msg is None or msg.error():
                        continue
                    p, o = msg.partition(), msg.offset()
                    with lock:
                        if committed.get(p, -1) >= o:
                            failures.append(f"{(p, o)} came again to {name} after {committed[p]} was committed")
                        seen.append((name, (p, o)))
                    try:
                        c.commit(message=msg, asynchronous=False)
                        with lock:
                            committed[p] = max(committed.get(p, -1), o)
                    except Exception:
                        pass  # the coordinator moved: not committed, may come again
            finally:
                c.close()

        # One member bootstraps from each broker.
        threads = [threading.Thread(target=run, args=(b, n), daemon=True) for b, n in zip(brokers, "abc")]
        for t in threads:
            t.start()
        # The group settles with a share for each member, then the records come.
        wait_for(lambda: sorted(len(assigned.get(n, ())) for n in "abc") == [2, 3, 3], 60, "the 8 partitions shared")
        produce(broker, "trio", [(i % 8, None, f"v{i}".encode(), []) for i in range(8, 600)])
        wait_for(lambda: {m for m, _ in seen} == {"a", "b", "c"}, 60, "all three members reading")
        wait_for(lambda: len({k for _, k in seen}) >= 300, 60, "half the records")

        # A transaction opened on the victim's coordination: records and a
        # group's offsets staged, not committed.
        txn = Producer({"bootstrap.servers": everyone, "transactional.id": txn_id, "linger.ms": 5})
        txn.init_transactions(30)
        txn.begin_transaction()
        for i in range(100):
            txn.produce("trio-out", value=f"t{i}".encode(), partition=i % 2)
        assert txn.flush(30) == 0
        side = Consumer({"bootstrap.servers": everyone, "group.id": "trio-side"})
        txn.send_offsets_to_transaction([TopicPartition("trio", 0, 42)], side.consumer_group_metadata(), 30)

        victim.stop()  # SIGKILL
        produce(survivors[0], "trio", [(i % 8, None, f"w{i}".encode(), []) for i in range(90)])
        wait_for(lambda: len({k for _, k in seen}) == 690, 120, "every record, the later ones through the survivors")
        # The group lives on a survivor now, all three members in it again.
        assert coordinator_port(survivors[0].bootstrap, "trio") in {b.kafka_port for b in survivors}
        wait_for(lambda: sorted(len(assigned.get(n, ())) for n in "abc") == [2, 3, 3], 60, "the 8 partitions shared again")

        # The transaction is completed through a survivor, the coordinator now.
        txn.commit_transaction(60)
        got = read_committed(survivors[1].bootstrap, "trio-out", 2)
        assert sorted(got[0] + got[1], key=lambda v: int(v[1:])) == [f"t{i}".encode() for i in range(100)]
        check = Consumer({"bootstrap.servers": survivors[0].bootstrap, "group.id": "trio-side"})
        assert [tp.offset for tp in check.committed([TopicPartition("trio", 0)], timeout=30)] == [42]

        stop.set()
        for t in threads:
            t.join(30)
        assert failures == []
        # No committed offset was lost in the move: what the group holds is
        # at least what each member was told it had committed.
        check = Consumer({"bootstrap.servers": survivors[1].bootstrap, "group.id": "trio"})
        held = {tp.partition: tp.offset for tp in check.committed([TopicPartition("trio", p) for p in range(8)], timeout=30)}
        assert all(held[p] >= o + 1 for p, o in committed.items()), (held, committed)
        assert sum(held.values()) >= 690 - 8, "every partition committed to its end, but for at most its last record"
        again = len(seen) - len({k for _, k in seen})
        assert again <= 16, f"{again} records read twice: at most one uncommitted per partition and move"
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for b in brokers[1:]:
            b.stop()
