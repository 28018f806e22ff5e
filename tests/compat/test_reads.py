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
