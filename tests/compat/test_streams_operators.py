"""The client's own stream processor, one operator or window kind at a time
(issue 30): flatMap, keyBy, foreach, gate, sliding and cron windows with
grace, and event time with both lateness policies. Each scenario checks the
exact values the processor emitted."""

import asyncio

from conftest import run
from queen import Queen


async def settled(runner, messages, seconds=20):
    """Waits until the runner has committed the cycles of `messages` source
    messages (its messagesTotal counts after each commit); at most `seconds`."""
    for _ in range(seconds * 20):
        if runner.metrics()["messagesTotal"] >= messages:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the stream processed {runner.metrics()['messagesTotal']} of {messages} messages")


async def until(check, seconds=10):
    for _ in range(seconds * 20):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


def test_flat_map_splits_into_a_sink_and_foreach_sees_every_value_in_order(broker):
    from queen import Stream

    sentences = [f"w{i}a w{i}b w{i}c" for i in range(40)]

    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("sentences").partition("p").push([{"data": {"text": s}} for s in sentences])
            seen = []
            words = await (Stream.from_(q.queue("sentences"))
                           .flat_map(lambda m: m["data"]["text"].split())
                           .foreach(lambda w: seen.append(w))
                           .run(query_id="words-foreach", url=broker.url, batch_size=7))
            sunk = await (Stream.from_(q.queue("sentences"))
                          .flat_map(lambda m: [{"word": w} for w in m["data"]["text"].split()])
                          .to(q.queue("words"), partition="all")
                          .run(query_id="words-sink", url=broker.url, batch_size=7))
            await settled(words, len(sentences))
            await settled(sunk, len(sentences))
            await words.stop()
            await sunk.stop()
            expected = [w for s in sentences for w in s.split()]
            assert seen == expected
            out = []
            for _ in range(20):
                batch = await q.queue("words").partition("all").batch(100).wait(False).pop()
                for m in batch:
                    await q.ack(m, True)
                out += [m["data"]["word"] for m in batch]
                if not batch:
                    break
            # The sink keeps the source's order inside the target partition.
            assert out == expected
    run(scenario())


def test_key_by_windows_each_key_apart_within_a_partition(broker):
    from queen import Stream

    users = ["ann", "bob", "cy"]

    async def scenario():
        async with Queen(broker.url) as q:
            events = [{"data": {"user": users[i % 3], "amount": i, "ts": 1_000 + i * 10}} for i in range(90)]
            await q.queue("spend").partition("p").push(events)
            # One later event moves the partition's watermark past the window.
            await q.queue("spend").partition("p").push([{"data": {"user": "zed", "amount": 0, "ts": 120_000}}])
            out = []
            runner = await (Stream.from_(q.queue("spend"))
                            .key_by(lambda m: m["data"]["user"])
                            .window_tumbling(seconds=60, event_time=lambda m: m["data"]["ts"], idle_flush_ms=200)
                            .aggregate({"sum": lambda v: v["amount"], "count": lambda v: 1})
                            .foreach(lambda v, ctx: out.append((ctx["key"], v["count"], v["sum"])))
                            .run(query_id="spend-per-user", url=broker.url, batch_size=25))
            await settled(runner, 91)
            await until(lambda: len(out) >= 3)
            await asyncio.sleep(0.6)  # two more flush ticks: nothing more may come
            await runner.stop()
            assert sorted(out) == [
                (u, 30, sum(i for i in range(90) if users[i % 3] == u)) for u in users
            ]
    run(scenario())


def test_a_gate_holds_back_what_it_denies_and_lets_it_through_in_order_later(broker):
    import httpx
    from queen import Stream
    from queen.streams.helpers.rate_limiter import token_bucket_gate

    async def scenario():
        async with httpx.AsyncClient() as http:
            # Denied messages stay leased until the lease ends, then come back.
            r = await http.post(f"{broker.url}/api/v1/configure", json={"queue": "requests", "options": {"leaseTime": 1}})
            assert r.status_code == 200
        async with Queen(broker.url) as q:
            await q.queue("requests").partition("tenant-1").push([{"data": {"n": i}} for i in range(20)])
            runner = await (Stream.from_(q.queue("requests"))
                            .gate(token_bucket_gate(capacity=6, refill_per_sec=4))
                            # After a gate the value is the payload.
                            .map(lambda v: {"n": v["n"], "admitted": True})
                            .to(q.queue("admitted"))
                            .run(query_id="limiter", url=broker.url, batch_size=20))
            out = []
            for _ in range(300):
                batch = await q.queue("admitted").batch(100).wait(False).pop()
                for m in batch:
                    await q.ack(m, True)
                out += [m["data"]["n"] for m in batch]
                if len(out) >= 20:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.5)
            extra = await q.queue("admitted").batch(100).wait(False).pop()
            stats = runner.metrics()
            await runner.stop()
            # Every request once, in order, though the gate refused some at first.
            assert out == list(range(20)), out
            assert not extra
            assert stats.get("gateDenialsTotal", 0) > 0, stats
    run(scenario())


def test_sliding_and_cron_windows_close_after_their_grace_with_exact_sums(broker):
    from queen import Stream

    base = 1_700_000_040_000  # a whole minute

    async def scenario():
        async with Queen(broker.url) as q:
            # One event per second for 30 s, v = the second.
            await q.queue("ticks").partition("p").push([{"data": {"ts": base + s * 1000, "v": s}} for s in range(30)])
            slides, crons = [], []
            sliding = await (Stream.from_(q.queue("ticks"))
                             .window_sliding(size=10, slide=5, grace_period=5,
                                             event_time=lambda m: m["data"]["ts"], idle_flush_ms=200)
                             .aggregate({"sum": lambda v: v["v"], "count": lambda v: 1})
                             .foreach(lambda v, ctx: slides.append((ctx["windowStart"] - base, v["count"], v["sum"])))
                             .run(query_id="sliding", url=broker.url))
            cron = await (Stream.from_(q.queue("ticks"))
                          .window_cron(every="minute", grace_period=20,
                                       event_time=lambda m: m["data"]["ts"], idle_flush_ms=200)
                          .aggregate({"sum": lambda v: v["v"], "count": lambda v: 1})
                          .foreach(lambda v, ctx: crons.append((ctx["windowStart"] - base, v["count"], v["sum"])))
                          .run(query_id="cron", url=broker.url))
            await settled(sliding, 30)
            await settled(cron, 30)
            # Watermark 38 s: [0,10), [5,15), ... ending by 33 s (38 - grace 5)
            # close; the minute window stays open (its end + grace is 80 s).
            await q.queue("ticks").partition("p").push([{"data": {"ts": base + 38_000, "v": 0}}])
            await settled(sliding, 31)
            await settled(cron, 31)
            events = [(s * 1000, s) for s in range(30)] + [(38_000, 0)]

            def windows(closed_by):
                out = []
                for start in range(-5_000, 100_000, 5_000):
                    vs = [v for ts, v in events if start <= ts < start + 10_000]
                    if vs and start + 10_000 <= closed_by:
                        out.append((start, len(vs), sum(vs)))
                return out
            await until(lambda: len(slides) >= len(windows(33_000)))
            await asyncio.sleep(0.6)
            assert crons == []
            assert sorted(slides) == windows(33_000)
            # Watermark 100 s closes the rest of both.
            await q.queue("ticks").partition("p").push([{"data": {"ts": base + 100_000, "v": 0}}])
            await until(lambda: len(slides) >= len(windows(95_000)) and len(crons) >= 1)
            await asyncio.sleep(0.6)
            await sliding.stop()
            await cron.stop()
            assert sorted(slides) == windows(95_000), slides
            assert crons == [(0, 31, sum(range(30)))]
    run(scenario())


def test_event_time_lateness_drops_or_includes_late_events_by_policy(broker):
    from queen import Stream

    async def one(q, policy):
        src = f"late-{policy}"
        out = []
        runner = await (Stream.from_(q.queue(src))
                        .window_tumbling(seconds=10, grace_period=5, allowed_lateness=5, on_late=policy,
                                         event_time=lambda m: m["data"]["ts"], idle_flush_ms=200)
                        .aggregate({"sum": lambda v: v["v"], "count": lambda v: 1})
                        .foreach(lambda v, ctx: out.append((ctx["windowStart"], v["count"], v["sum"])))
                        .run(query_id=f"lateness-{policy}", url=broker.url))
        steps = [
            [1_000, 2_000, 3_000],  # watermark -2 s
            [14_000],               # watermark 9 s: [0,10) is still open (grace)
            [9_500],                # out of order but within the lateness: counted
            [4_000],                # before the watermark: late
            [40_000],               # watermark 35 s closes [0,10) and [10,20)
        ]
        done = 0
        for ts_list in steps:
            await q.queue(src).partition("p").push([{"data": {"ts": t, "v": t // 500}} for t in ts_list])
            done += len(ts_list)
            await settled(runner, done)
        await until(lambda: len(out) >= 2)
        await asyncio.sleep(0.6)
        stats = runner.metrics()
        await runner.stop()
        return sorted(out), stats["lateEventsTotal"]

    async def scenario():
        async with Queen(broker.url) as q:
            dropped, late = await one(q, "drop")
            assert dropped == [(0, 4, 2 + 4 + 6 + 19), (10_000, 1, 28)]
            assert late == 1
            included, late = await one(q, "include")
            assert included == [(0, 5, 2 + 4 + 6 + 19 + 8), (10_000, 1, 28)]
            assert late == 0
    run(scenario())


def test_reduce_folds_a_processing_time_window_that_idle_flush_closes_without_new_events(broker):
    from queen import Stream

    async def scenario():
        async with Queen(broker.url) as q:
            out = []
            runner = await (Stream.from_(q.queue("orders"))
                            .window_tumbling(seconds=1, idle_flush_ms=200)
                            .reduce(lambda acc, v: {"n": acc["n"] + 1, "total": acc["total"] + v["amount"]},
                                    {"n": 0, "total": 0})
                            .foreach(lambda v: out.append(v))
                            .run(query_id="orders-per-second", url=broker.url))
            await q.queue("orders").partition("p").push([{"data": {"amount": a}} for a in range(1, 13)])
            await settled(runner, 12)
            # No later message arrives: the wall clock alone closes the window.
            await until(lambda: sum(v["n"] for v in out) >= 12, seconds=5)
            await asyncio.sleep(1.5)
            await runner.stop()
            assert sum(v["n"] for v in out) == 12, out
            assert sum(v["total"] for v in out) == sum(range(1, 13)), out
            assert len(out) <= 2  # one window, or two when the push straddled a second
    run(scenario())
