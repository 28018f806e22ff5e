"""Two brokers on one database: each advertises itself, both give the same
metadata and the same coordinator, so a group whose members reach different
brokers is still one group; a coordinator that stops hands its groups on
with no commit lost."""

import threading
import time

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from conftest import KafkaBroker, wait_for
from test_confluent import consumer, produce


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
