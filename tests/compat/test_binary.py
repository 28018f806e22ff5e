"""The binary forms (scenario 9): QPB1 pushes (flags 4 and 8), QTB1
transactions and QPF1 framed pops, through the client's opt-in flags."""

from conftest import run
from queen import Queen


def test_binary_push_with_transaction_ids_and_dedup(broker):
    async def scenario():
        async with Queen(url=broker.url, binary_push=True) as q:
            await q.queue("bin").partition("p").push([{"transactionId": "t1", "data": {"a": 1}}, {"data": [1, 2]}, {"data": None}])
            dups = []

            async def on_dup(items, _err):
                dups.extend(items)

            await q.queue("bin").partition("p").push([{"transactionId": "t1", "data": "again"}]).on_duplicate(on_dup)
            assert len(dups) == 1
            got = await q.queue("bin").partition("p").batch(10).wait(False).pop()
            assert [m["data"] for m in got] == [{"a": 1}, [1, 2], None]
            assert got[0]["transactionId"] == "t1"
    run(scenario())


def test_compressed_pre_framed_push_keeps_the_client_message_ids(broker):
    async def scenario():
        async with Queen(url=broker.url, binary_push=True, push_compression=True) as q:
            await q.queue("framed").push([{"transactionId": f"f{i}", "data": {"i": i}} for i in range(5)])
            got = await q.queue("framed").batch(10).wait(False).pop()
            assert [m["data"]["i"] for m in got] == list(range(5))
            assert [m["transactionId"] for m in got] == [f"f{i}" for i in range(5)]
            assert all(m["id"][14] == "7" for m in got), "UUIDv7 ids minted by the client"
    run(scenario())


def test_framed_pop_returns_frames_and_acks_work(broker):
    async def scenario():
        async with Queen(url=broker.url) as plain:
            await plain.queue("fp").partition("p1").push([{"data": i} for i in range(3)])
            await plain.queue("fp").partition("p1").push([{"data": i} for i in range(3, 6)])
        async with Queen(url=broker.url, framed_pop=True) as q:
            first = await q.queue("fp").batch(4).wait(False).pop()
            assert [m["data"] for m in first] == [0, 1, 2, 3]
            assert [m["offset"] for m in first] == [0, 1, 2, 3], "frames carry offsets, JSON does not"
            assert all(m["deliveryAttempt"] == 1 and m["partitionId"].isdigit() for m in first)
            assert (await q.ack(first, True))["success"] is True
            rest = await q.queue("fp").batch(10).wait(False).pop()
            assert [m["data"] for m in rest] == [4, 5]
            assert (await q.ack(rest, True))["success"] is True
            assert await q.queue("fp").batch(10).wait(False).pop() == []
    run(scenario())


def test_a_binary_transaction_acks_and_pushes_atomically(broker):
    async def scenario():
        async with Queen(url=broker.url, binary_push=True, push_compression=True) as q:
            await q.queue("tin").push([{"data": "job"}])
            [m] = await q.queue("tin").batch(1).wait(False).pop()
            r = await q.transaction().ack(m).queue("tout").push([{"data": {"done": True}}]).commit()
            assert r["success"] is True
            assert [x["type"] for x in r["results"]] == ["ack", "push"], r
            out = await q.queue("tout").batch(10).wait(False).pop()
            assert [x["data"] for x in out] == [{"done": True}]
            assert await q.queue("tin").batch(1).wait(False).pop() == []
    run(scenario())
