"""Produce and consume with the official client (issue 6, scenario 1)."""

import asyncio

from conftest import run
from queen import Queen


def test_push_then_pop_wildcard_and_single_partition(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("orders").push([{"data": {"n": 1}}])
            await q.queue("orders").partition("p1").push([{"data": {"n": i}} for i in range(2, 5)])
            first = await q.queue("orders").partition("p1").batch(10).wait(False).pop()
            assert [m["data"]["n"] for m in first] == [2, 3, 4]
            assert all(m["partition"] == "p1" and m["partitionId"] for m in first)
            assert (await q.ack(first, True))["success"] is True
            rest = await q.queue("orders").batch(10).wait(False).pop()
            assert [m["data"] for m in rest] == [{"n": 1}]
            await q.ack(rest, True)
            assert await q.queue("orders").batch(10).wait(False).pop() == []
    run(scenario())


def test_discovery_by_namespace_and_task(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("billing.invoices").push([{"data": "inv"}])
            await q.queue("billing.refunds").push([{"data": "ref"}])
            await q.queue("shipping.labels").push([{"data": "lab"}])
            got = await q.queue().namespace("billing").batch(10).partitions(10).wait(False).pop()
            assert sorted(m["data"] for m in got) == ["inv", "ref"]
            got = await q.queue().task("labels").batch(10).wait(False).pop()
            assert [m["data"] for m in got] == ["lab"]
    run(scenario())


def test_consume_with_limit_auto_ack_and_concurrency(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            for p in range(4):
                await q.queue("work").partition(f"p{p}").push([{"data": {"p": p, "i": i}} for i in range(5)])
            seen = []

            async def handler(message):
                seen.append((message["data"]["p"], message["data"]["i"]))

            await q.queue("work").concurrency(4).batch(1).each().limit(20).idle_millis(3000).consume(handler)
            assert sorted(seen) == [(p, i) for p in range(4) for i in range(5)]
            for p in range(4):
                assert [i for (pp, i) in seen if pp == p] == list(range(5)), "order per partition"
            depth = await q.admin.get_queue_depth("work")
            assert depth["pending"] == 0, depth
    run(scenario())


def test_a_failed_handler_redelivers_in_order(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("retry").push([{"data": i} for i in range(4)])
            seen, failed = [], set()

            async def handler(message):
                seen.append(message["data"])
                if message["data"] == 1 and 1 not in failed:
                    failed.add(1)
                    raise RuntimeError("first attempt fails")

            await q.queue("retry").batch(1).each().limit(5).idle_millis(3000).consume(handler)
            assert seen == [0, 1, 1, 2, 3], seen
    run(scenario())


def test_batch_handler_and_idle_stop(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("batches").push([{"data": i} for i in range(7)])
            batches = []

            async def handler(messages):
                batches.append([m["data"] for m in messages])

            await q.queue("batches").batch(3).wait(False).idle_millis(800).consume(handler)
            assert [d for b in batches for d in b] == list(range(7))
            assert max(len(b) for b in batches) <= 3
    run(scenario())


def test_manual_ack_and_nack(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("manual").push([{"data": "a"}, {"data": "b"}])
            [a] = await q.queue("manual").batch(1).wait(False).pop()
            assert (await q.ack(a, False))["success"] is True  # nack: redelivered
            [again] = await q.queue("manual").batch(1).wait(False).pop()
            assert again["data"] == "a" and again["transactionId"] == a["transactionId"]
            assert (await q.ack(again, True))["success"] is True
            [b] = await q.queue("manual").batch(1).wait(False).pop()
            assert b["data"] == "b"
    run(scenario())
