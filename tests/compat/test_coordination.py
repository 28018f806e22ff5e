"""Coordination on the log through the client's own APIs (issue 29):
client.kv, client.lock() and client.semaphore(), transactions that carry a
guard and KV riders, client.timers, and consumer supervision."""

from conftest import run
from queen import Queen


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
            # Who holds it is shown; the holder's token only to the holder (issue 45).
            assert state["held"] and state["holders"][0]["owner"] == first.owner
            assert "token" not in state["holders"][0]
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
