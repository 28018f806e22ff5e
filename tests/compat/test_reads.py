"""The read side of the log through the client (issue 28): changed_since
walks POST /api/v1/partitions/changed and keeps the smallest safeTime, fetch
reads by offset, a consume loop traces its messages, and the admin reads
traces and the analytics family."""

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


def test_a_consume_loop_traces_every_message_and_the_admin_reads_them_back(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("traced").push([{"data": {"order": i}} for i in range(4)])
            answers = []

            async def handler(message):
                order = message["data"]["order"]
                answers.append(await message["trace"]({
                    "traceName": [f"order-{order}", "batch-7"], "eventType": "processed", "data": {"order": order}}))

            await q.queue("traced").group("tracers").batch(1).each().limit(4).idle_millis(2000).consume(handler)
            assert len(answers) == 4 and all(a["success"] for a in answers), answers
            assert all(len(a["traceId"]) == 36 for a in answers)
            names = await q.admin.get_trace_names(search="batch")
            assert [(n["name"], n["traceCount"], n["messageCount"]) for n in names["names"]] == [("batch-7", 4, 4)]
            one = await q.admin.get_traces_by_name("order-2")
            assert one["total"] == 1 and one["traces"][0]["data"] == {"order": 2}
            t = one["traces"][0]
            assert (t["consumerGroup"], t["eventType"], t["queue"]) == ("tracers", "processed", "traced")
            mine = await q.admin.get_traces_for_message(t["partitionId"], t["transactionId"])
            assert [x["traceId"] for x in mine["traces"]] == [t["traceId"]]
            paged = await q.admin.get_traces_by_name("batch-7", limit=3, offset=0)
            assert paged["total"] == 4 and len(paged["traces"]) == 3
    run(scenario())


def test_the_admin_reads_system_and_worker_metrics(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("watched").push([{"data": {"n": i}} for i in range(3)])
            system = await q.admin.get_system_metrics(interval="hour")
            assert system["interval"] == "hour" and isinstance(system["series"]["rssBytes"], list)
            workers = await q.admin.get_worker_metrics(queue="watched")
            assert isinstance(workers["workers"], list) and "window" in workers
    run(scenario())
