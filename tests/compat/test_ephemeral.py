"""The 2.6.0 client's own ephemeral API (issue 33) against the broker:
configure, push, pop with and without waiting, groups, ack with every
outcome, the two kinds of 404 told apart, a full queue, reset, delete, the
list and the depth gauges."""

import asyncio

import pytest

from conftest import run
from queen import Queen


def test_the_clients_ephemeral_api_round_trips_every_verb(broker):
    from queen.ephemeral import EPHEMERAL_QUEUE_NOT_FOUND
    from queen.errors import EphemeralError, EphemeralQueueNotFoundError

    async def scenario():
        async with Queen(broker.url, retry_429={"max_attempts": 1, "base_ms": 10, "cap_ms": 10}) as q:
            eph = q.ephemeral
            r = await eph.configure("presence", max_length=5, lease_seconds=1, retry_limit=2, ttl_seconds=60)
            assert r["options"]["maxLength"] == 5
            assert (await eph.push("presence", [{"user": "ann"}, {"user": "bob"}], partition="room-1"))["pushed"] == 2
            # Fan-out: two groups each see both; queue mode is a third cursor.
            a = await eph.pop("presence", group="tab-a", batch=10)
            b = await eph.pop("presence", group="tab-b", batch=10, commit_on_delivery=True)
            assert [m["payload"]["user"] for m in a["messages"]] == ["ann", "bob"]
            assert [m["payload"]["user"] for m in b["messages"]] == ["ann", "bob"]
            assert all(m["partition"] == "room-1" and m["attempts"] == 1 for m in a["messages"])
            # A nack comes back first with attempts + 1; an ack settles.
            first, second = a["messages"]
            acked = await eph.ack("presence", [first["id"], {"id": second["id"], "status": "retry"}], group="tab-a")
            assert [x["outcome"] for x in acked["results"]] == ["acked", "redelivered"]
            again = await eph.pop("presence", group="tab-a", batch=10)
            assert [(m["payload"]["user"], m["attempts"]) for m in again["messages"]] == [("bob", 2)]
            await eph.ack("presence", again["messages"], group="tab-a", status=True)
            # A waiting pop is woken by a push.
            waiter = asyncio.create_task(eph.pop("presence", group="tab-a", wait=True, timeout=10_000))
            await asyncio.sleep(0.3)
            await eph.push("presence", {"user": "cy"}, partition="room-1")
            woke = await asyncio.wait_for(waiter, 5)
            assert [m["payload"]["user"] for m in woke["messages"]] == ["cy"]
            depth = await eph.depth("presence")
            assert depth["queue"] == "presence"
            groups = {g["group"]: g for g in depth["groups"]}
            assert groups["tab-a"]["inFlight"] == 1
            assert groups["tab-b"]["pending"] == 1
            listed = await eph.queues()
            assert [x["queue"] for x in listed["queues"]] == ["presence"]
            # A full queue under the default policy refuses the whole push.
            with pytest.raises(EphemeralError) as full:
                await eph.push("presence", [{"n": i} for i in range(5)])
            assert full.value.code == "ephemeral_queue_full"
            # Reset drops everything and makes earlier ids stale.
            dropped = await eph.reset("presence")
            assert dropped["dropped"] == 1  # what both groups settled already left the ring
            late = await eph.ack("presence", woke["messages"], group="tab-a")
            assert [x["outcome"] for x in late["results"]] == ["stale"]
            # Delete, then the depth of a missing queue is a data fact, not
            # "the broker does not support ephemeral".
            assert (await eph.delete("presence"))["deleted"] is True
            assert (await eph.delete("presence"))["deleted"] is False
            with pytest.raises(EphemeralQueueNotFoundError) as missing:
                await eph.depth("presence")
            assert missing.value.code == EPHEMERAL_QUEUE_NOT_FOUND
            # An empty pop answers an empty list.
            assert (await eph.pop("nobody-home"))["messages"] == []
    run(scenario())
