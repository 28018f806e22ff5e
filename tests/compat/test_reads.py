"""The client's lease-free reads (issue 28 §2): changed_since walks
POST /api/v1/partitions/changed page by page and keeps the smallest safeTime."""

import asyncio

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


def test_the_kv_client_reads_writes_fences_and_counts(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            put = await q.kv.put("app", "cfg", {"mode": "a"}, ttl_seconds=60)
            assert put and put["applied"] is True and put["version"] > 0
            got = await q.kv.get("app", "cfg")
            assert got and got["value"] == {"mode": "a"} and got["version"] == put["version"]
            assert not await q.kv.get("app", "missing")
            stale = await q.kv.put("app", "cfg", {"mode": "b"}, forever=True, expect=put["version"] + 1000)
            assert not stale and stale["reason"] == "version" and stale["value"] == {"mode": "a"}
            assert not await q.kv.put_if_absent("app", "cfg", 1, forever=True)
            for i in range(5):
                await q.kv.incr("app", "hits", delta=2, forever=True)
            assert (await q.kv.get("app", "hits"))["value"] == 10
            capped = await q.kv.incr("app", "hits", delta=1, max=10, forever=True)
            assert not capped and capped["reason"] == "limit"
            for k in ("u:1", "u:2", "u:3"):
                await q.kv.put("app", k, k, forever=True)
            rows = await q.kv.list_all("app", "u:", limit=2)
            assert [r["key"] for r in rows] == ["u:1", "u:2", "u:3"]
            many = await q.kv.get_many("app", ["u:1", "nope"])
            assert [r["key"] for r in many["rows"]] == ["u:1"] and many["missing"] == ["nope"]
            assert await q.kv.check("app", "cfg", expect=got["version"])
            assert await q.kv.delete("app", "cfg")
            results = await q.kv.batch([q.kv.op.put("app", "x", 1, forever=True),
                                        q.kv.op.check("app", "lockless", expect=7, required=True)])
            assert [bool(r) for r in results] == [False, False]
            assert not await q.kv.get("app", "x"), "the required check rolled the put back"
    run(scenario())


def test_the_lock_client_acquires_renews_and_releases(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            first = q.lock("nightly", ttl_seconds=30, auto_renew=False)
            second = q.lock("nightly", ttl_seconds=30, auto_renew=False)
            assert await first.acquire()
            token = first.token
            assert token and first.guard()["expect"] == token
            assert not await second.acquire()
            assert await first.renew() and first.token > token
            state = await q.locks.get("nightly")
            assert state["held"] and state["holders"][0]["token"] == first.token
            assert await first.release()
            assert await second.acquire()
            await second.release()
            sem = [q.semaphore("pool", 2, ttl_seconds=30, auto_renew=False) for _ in range(3)]
            got = [await s.acquire() for s in sem]
            assert got == [True, True, False]
            for s in sem[:2]:
                await s.release()
    run(scenario())


def test_a_guarded_transaction_with_kv_riders_commits_once_and_a_once_gate_refuses_twice(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            lock = q.lock("reporter", ttl_seconds=30, auto_renew=False)
            assert await lock.acquire()
            done = await (q.transaction().guard(lock)
                          .queue("reports").push([{"data": {"day": 1}}])
                          .kv.put("reports", "last", 1, forever=True)
                          .commit())
            assert done["success"], done
            assert (await q.kv.get("reports", "last"))["value"] == 1
            first = await q.transaction().once("gate", "day-1", ttl_seconds=60).queue("reports").push([{"data": 2}]).commit()
            again = await q.transaction().once("gate", "day-1", ttl_seconds=60).queue("reports").push([{"data": 3}]).commit()
            assert first["success"] and not again["success"] and again["reason"] == "kv_precondition"
            assert again["kvReason"] == "exists"
            await lock.release()
            stale = await (q.transaction().guard(lock).queue("reports").push([{"data": 4}]).commit()) if lock.held else None
            assert stale is None, "a released handle cannot guard"
            depth = await q.admin.get_queue_depth("reports")
            assert depth["pending"] == 2, depth
    run(scenario())


def test_the_timer_client_schedules_peeks_cancels_and_a_timer_arrives_as_a_message(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            r = await q.timers.schedule("reminders", "user:7", {"remind": 7}, delay_ms=300)
            assert r and r["status"] == "scheduled" and r["messageId"]
            peek = await q.timers.peek("reminders", "user:7")
            assert peek["found"] and peek["payload"] == {"remind": 7}
            doomed = await q.timers.schedule("reminders", "user:8", {"remind": 8}, delay_ms=60_000)
            listed = await q.timers.list("reminders")
            assert [row["timerKey"] for row in listed["rows"]] == ["user:7", "user:8"]
            cancelled = await q.timers.cancel("reminders", "user:8", txn=doomed["txn"])
            assert cancelled and cancelled["status"] == "cancelled"
            assert not await q.timers.cancel("reminders", "user:8")
            got = await q.queue("reminders").batch(1).wait(True).timeout_millis(5000).pop()
            assert [m["data"] for m in got] == [{"remind": 7}]
            assert got[0]["transactionId"] == r["txn"] and got[0]["id"] == r["messageId"]
            assert not await q.timers.peek("reminders", "user:7")
    run(scenario())


def test_a_supervised_consume_loop_is_listed_among_live_consumers(broker):
    import httpx

    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("watched-work").push([{"data": i} for i in range(3)])
            seen = []

            async def handler(message):
                seen.append(message["data"])

            await (q.queue("watched-work").group("workers").supervision({"group": "billing-app"})
                   .batch(1).each().limit(3).idle_millis(2000).consume(handler))
            assert sorted(seen) == [0, 1, 2]
        async with httpx.AsyncClient() as http:
            listed = (await http.get(f"{broker.url}/api/v1/consumers?group=billing-app")).json()
        assert listed["total"] >= 1, listed
        assert listed["consumers"][0]["engine"] == "python"
        assert listed["consumers"][0]["pools"][0]["consumer_group"] == "workers"
    run(scenario())


def test_the_stream_processor_filters_maps_and_sums_tumbling_windows_exactly(broker):
    from queen import Stream

    async def wait_for(q, queue, n, seconds=20):
        # Leased pops acked at once (the builder's auto_ack is the consume
        # loop's, not the pop's): a leased batch would hold the partition.
        got = []
        for _ in range(seconds * 10):
            batch = await q.queue(queue).batch(100).wait(False).pop()
            for m in batch:
                await q.ack(m, True)
            got += batch
            if len(got) >= n:
                return got
            await asyncio.sleep(0.1)
        return got

    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("nums").partition("p").push([{"data": {"n": i}} for i in range(10)])
            evens = await (Stream.from_(q.queue("nums"))
                           .filter(lambda m: m["data"]["n"] % 2 == 0)
                           .map(lambda m: {"double": m["data"]["n"] * 2})
                           .to(q.queue("evens"))
                           .run(query_id="evens", url=broker.url))
            got = await wait_for(q, "evens", 5)
            await evens.stop()
            assert sorted(m["data"]["double"] for m in got) == [0, 4, 8, 12, 16]
            # Event-time tumbling windows of 10 s, flushed when idle.
            base = 1_700_000_000_000
            events = [{"ts": base + s * 1000, "v": s} for s in range(30)]
            await q.queue("events").partition("p").push([{"data": e} for e in events])
            sums = await (Stream.from_(q.queue("events"))
                          .window_tumbling(seconds=10, event_time=lambda m: m["data"]["ts"], idle_flush_ms=300)
                          .aggregate({"sum": lambda v: v["v"], "count": lambda v: 1})
                          .to(q.queue("sums"))
                          .run(query_id="sums", url=broker.url))
            windows = await wait_for(q, "sums", 2)
            # The third window closes when event time passes its end.
            await q.queue("events").partition("p").push([{"data": {"ts": base + 45_000, "v": 1000}}])
            windows += await wait_for(q, "sums", 3 - len(windows))
            await asyncio.sleep(1)
            windows += await wait_for(q, "sums", 1, seconds=1)
            await sums.stop()
            totals = sorted((w["data"]["count"], w["data"]["sum"]) for w in windows)
            assert totals == [(10, 45), (10, 145), (10, 245)], totals
    run(scenario())


def test_a_stream_refuses_a_changed_config_unless_reset_and_sums_ten_thousand_messages_exactly(broker):
    from queen import Stream

    async def scenario():
        async with Queen(broker.url) as q:
            # 10,000 events over 50 partitions, one event-time window each.
            parts = 50
            for p in range(parts):
                await q.queue("ledger").partition(f"p{p}").push([{"data": {"ts": 1_000 + i, "v": p * 1000 + i}} for i in range(200)])

            def build(seconds):
                return (Stream.from_(q.queue("ledger"))
                        .window_tumbling(seconds=seconds, event_time=lambda m: m["data"]["ts"], idle_flush_ms=300)
                        .aggregate({"sum": lambda v: v["v"], "count": lambda v: 1})
                        .to(q.queue("totals")))

            runner = await build(10).run(query_id="ledger-sums", url=broker.url)
            # Close every partition's window with a later event.
            for p in range(parts):
                await q.queue("ledger").partition(f"p{p}").push([{"data": {"ts": 60_000, "v": 0}}])
            got = []
            for _ in range(300):
                batch = await q.queue("totals").batch(100).wait(False).pop()
                for m in batch:
                    await q.ack(m, True)
                got += batch
                if len(got) >= parts:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1)
            extra = await q.queue("totals").batch(100).wait(False).pop()
            await runner.stop()
            assert not extra, "no window emitted twice"
            assert len(got) == parts
            assert sum(w["data"]["count"] for w in got) == parts * 200
            assert sum(w["data"]["sum"] for w in got) == sum(p * 1000 * 200 + sum(range(200)) for p in range(parts))

            # Another configuration under the same name is refused, unless reset.
            from queen.streams.runtime.register import StreamsConfigHashMismatch
            refused = False
            try:
                await build(20).run(query_id="ledger-sums", url=broker.url)
            except StreamsConfigHashMismatch:
                refused = True
            assert refused, "a changed config_hash must be refused"
            again = await build(20).run(query_id="ledger-sums", url=broker.url, reset=True)
            await again.stop()
    run(scenario())


def test_a_stream_killed_mid_window_resumes_without_losing_or_repeating_a_window(broker, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import httpx
    from queen import Stream

    parts, per = 10, 100
    worker = tmp_path / "stream_worker.py"
    worker.write_text(
        "import asyncio, sys, time\n"
        "from queen import Queen, Stream\n"
        "def slow(m):\n"
        "    time.sleep(0.003)\n"
        "    return m\n"
        "async def main(url):\n"
        "    async with Queen(url) as q:\n"
        "        await (Stream.from_(q.queue('clicks'))\n"
        "               .map(slow)\n"
        "               .window_tumbling(seconds=10, event_time=lambda m: m['data']['ts'], idle_flush_ms=200)\n"
        "               .aggregate({'sum': lambda v: v['data']['v'], 'count': lambda v: 1})\n"
        "               .to(q.queue('click-totals'))\n"
        "               .run(query_id='clicks', url=url, batch_size=20))\n"
        "        await asyncio.sleep(3600)\n"
        "asyncio.run(main(sys.argv[1]))\n")

    async def drain(q, queue):
        got = []
        while True:
            batch = await q.queue(queue).batch(100).wait(False).pop()
            if not batch:
                return got
            for m in batch:
                await q.ack(m, True)
            got += batch

    async def scenario():
        async with httpx.AsyncClient() as http:
            # Short leases: the killed worker's batches come back in seconds.
            r = await http.post(f"{broker.url}/api/v1/configure", json={"queue": "clicks", "options": {"leaseTime": 2}})
            assert r.status_code == 200
        async with Queen(broker.url) as q:
            for p in range(parts):
                events = [{"data": {"ts": i * 1000, "v": p * 10_000 + i}} for i in range(per)]
                events.append({"data": {"ts": 500_000, "v": 0}})  # closes every window
                await q.queue("clicks").partition(f"p{p}").push(events)
            child = subprocess.Popen([sys.executable, str(worker), broker.url])
            try:
                await asyncio.sleep(2.5)
            finally:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
            first = await drain(q, "click-totals")
            assert 0 < len(first) < parts * 10, f"the kill came mid-stream ({len(first)} windows out)"

            def slow(m):
                return m

            runner = await (Stream.from_(q.queue("clicks"))
                            .map(slow)
                            .window_tumbling(seconds=10, event_time=lambda m: m["data"]["ts"], idle_flush_ms=200)
                            .aggregate({"sum": lambda v: v["data"]["v"], "count": lambda v: 1})
                            .to(q.queue("click-totals"))
                            .run(query_id="clicks", url=broker.url, batch_size=20))
            rest = []
            for _ in range(300):
                rest += await drain(q, "click-totals")
                if len(first) + len(rest) >= parts * 10:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1)
            rest += await drain(q, "click-totals")
            await runner.stop()
            windows = first + rest
            assert len(windows) == parts * 10, f"{len(windows)} windows: none lost, none twice"
            assert all(w["data"]["count"] == 10 for w in windows)
            assert sum(w["data"]["sum"] for w in windows) == sum(p * 10_000 * per + sum(range(per)) for p in range(parts))
    run(scenario())
