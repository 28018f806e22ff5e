"""Consumer groups, subscriptions and seek (scenario 2)."""

import asyncio
import datetime

from conftest import run
from queen import Queen


async def drain(q, queue, group, **kw):
    out = []
    while True:
        b = q.queue(queue).group(group).batch(50).wait(False)
        if "mode" in kw:
            b = b.subscription_mode(kw["mode"])
        if "since" in kw:
            b = b.subscription_from(kw["since"])
        msgs = await b.pop()
        if not msgs:
            return out
        out += [m["data"] for m in msgs]
        await q.ack(msgs, True, {"group": group})


def test_two_groups_read_everything_independently(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("events").push([{"data": i} for i in range(5)])
            assert await drain(q, "events", "a") == list(range(5))
            assert await drain(q, "events", "b") == list(range(5))
            assert await drain(q, "events", "a") == []
    run(scenario())


def test_subscription_new_now_and_timestamp(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("subs").push([{"data": "old"}])
            await asyncio.sleep(0.05)
            cut = datetime.datetime.now(datetime.timezone.utc).isoformat()
            await asyncio.sleep(0.05)
            await q.queue("subs").push([{"data": "mid"}])
            assert await drain(q, "subs", "fresh", mode="new") == []
            assert await drain(q, "subs", "now", since="now") == []
            assert await drain(q, "subs", "ts", since=cut) == ["mid"]
            await q.queue("subs").push([{"data": "new"}])
            assert await drain(q, "subs", "fresh", mode="new") == ["new"]
            assert await drain(q, "subs", "now") == ["new"]
    run(scenario())


def test_seek_to_end_and_to_a_timestamp(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("seek").push([{"data": "one"}])
            await asyncio.sleep(0.05)
            cut = datetime.datetime.now(datetime.timezone.utc).isoformat()
            await asyncio.sleep(0.05)
            await q.queue("seek").push([{"data": "two"}])
            assert await drain(q, "seek", "g") == ["one", "two"]
            r = await q.admin.seek_consumer_group("g", "seek", {"timestamp": cut})
            assert r["success"] is True
            assert await drain(q, "seek", "g") == ["two"]
            await q.admin.seek_consumer_group("g", "seek", {"toEnd": True})
            assert await drain(q, "seek", "g") == []
    run(scenario())


def test_deleting_a_group_makes_it_read_again(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("dg").push([{"data": 1}])
            assert await drain(q, "dg", "g") == [1]
            r = await q.delete_consumer_group("g")
            assert r["success"] is True
            assert await drain(q, "dg", "g") == [1]
    run(scenario())
