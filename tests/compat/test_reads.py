"""The client's lease-free reads (issue 28 §2): changed_since walks
POST /api/v1/partitions/changed page by page and keeps the smallest safeTime."""

from conftest import run
from queen import Queen


def test_changed_since_lists_every_partition_then_only_what_changed(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            for p in ("north", "south", "east"):
                await q.queue("stores").partition(p).push([{"data": {"store": p}}])
            everything = await q.queue("stores").changed_since(None)
            assert [p["name"] for p in everything["partitions"]] == ["north", "south", "east"]
            assert all(p["lastOffset"] == 0 for p in everything["partitions"])
            safe = everything["safeTime"]
            assert isinstance(safe, str) and safe.endswith("Z")
            await q.queue("stores").partition("south").push([{"data": {"store": "south", "n": 2}}])
            later = await q.queue("stores").changed_since(safe)
            assert [(p["name"], p["lastOffset"]) for p in later["partitions"]] == [("south", 1)]
            nothing = await q.queue("no-such-queue").changed_since(None)
            assert nothing["partitions"] == []
    run(scenario())


def test_fetch_reads_every_record_to_the_first_high_watermark(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("ledger").partition("a").push([{"data": {"n": i}} for i in range(5)])
            await q.queue("ledger").partition("b").push([{"data": {"n": 10}}])
            read = await q.queue("ledger").fetch(["a", "b", "missing"])
            assert [r["payload"] for r in read["a"]["records"]] == [{"n": i} for i in range(5)]
            assert [r["offset"] for r in read["a"]["records"]] == [0, 1, 2, 3, 4]
            assert read["a"]["highWatermark"] == 5 and read["a"]["nextOffset"] == 5
            assert [r["payload"] for r in read["b"]["records"]] == [{"n": 10}]
            assert read["missing"]["records"] == []
            # Only what is new since the last read.
            await q.queue("ledger").partition("a").push([{"data": {"n": 5}}])
            again = await q.queue("ledger").fetch("a", offsets={"a": read["a"]["nextOffset"]})
            assert [r["payload"] for r in again["a"]["records"]] == [{"n": 5}]
            # Small byte budgets: the client loops to the watermark all the same.
            small = await q.queue("ledger").fetch("a", max_bytes=8)
            assert [r["offset"] for r in small["a"]["records"]] == [0, 1, 2, 3, 4, 5]
    run(scenario())
