"""Leases: expiry, refusal of an expired lease, renewal (scenario 3), and
commit on delivery (scenario 4)."""

import asyncio

from conftest import run
from queen import Queen


def test_an_expired_lease_redelivers_and_its_ack_is_refused(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("short").config({"leaseTime": 1}).create()
            await q.queue("short").push([{"data": "x"}])
            [m] = await q.queue("short").batch(1).wait(False).pop()
            await asyncio.sleep(1.3)
            [again] = await q.queue("short").batch(1).wait(False).pop()
            assert again["transactionId"] == m["transactionId"]
            assert again["leaseId"] != m["leaseId"]
            stale = await q.ack(m, True)
            assert stale["success"] is False and "lease" in stale["error"]
            assert (await q.ack(again, True))["success"] is True
    run(scenario())


def test_renewal_keeps_a_slow_handler_lease_alive(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("slow").config({"leaseTime": 2}).create()
            await q.queue("slow").push([{"data": "long job"}])
            [m] = await q.queue("slow").batch(1).wait(False).pop()
            for _ in range(4):
                await asyncio.sleep(0.8)
                r = await q.renew(m)
                assert r["success"] is True and r["renewed"] == 1, r
            # 3.2 s after the pop, past the 2 s lease: still ours.
            assert await q.queue("slow").batch(1).wait(False).pop() == []
            assert (await q.ack(m, True))["success"] is True

            await q.queue("slow").push([{"data": "consumed slowly"}])
            calls = []

            async def handler(message):
                calls.append(message["data"])
                await asyncio.sleep(3)

            await (q.queue("slow").batch(1).each().renew_lease(True, 500).limit(1).idle_millis(2000)
                   .consume(handler))
            assert calls == ["consumed slowly"]
            assert await q.queue("slow").batch(1).wait(False).pop() == [], "acked, not redelivered"
    run(scenario())


def test_commit_on_delivery_is_at_most_once(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("cod").push([{"data": 1}, {"data": 2}])
            got = await q.queue("cod").group("dash").batch(10).commit_on_delivery().wait(False).pop()
            assert [m["data"] for m in got] == [1, 2]
            assert all(m["leaseId"] == "" for m in got)
            assert await q.queue("cod").group("dash").batch(10).wait(False).pop() == []
    run(scenario())
