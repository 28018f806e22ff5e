"""The client's own stream processor against the broker (issue 30):
operators into a sink, event-time tumbling windows, exact totals over many
partitions, a changed configuration, and a processor killed mid-window."""

import asyncio

import pytest

from conftest import run
from queen import Queen


async def drain_acked(q, queue, want=None, seconds=20):
    """Pops `queue` and acks at once what it gets (a leased batch left
    unacked would hold its partition; the builder's auto_ack is the consume
    loop's, not the pop's), until `want` messages came, or, without `want`,
    until a pop comes back empty; at most `seconds`."""
    got = []
    for _ in range(seconds * 10):
        batch = await q.queue(queue).batch(100).wait(False).pop()
        for m in batch:
            await q.ack(m, True)
        got += batch
        if (want is None and not batch) or (want is not None and len(got) >= want):
            break
        await asyncio.sleep(0.1)
    return got


def test_the_stream_processor_filters_maps_and_sums_tumbling_windows_exactly(broker):
    from queen import Stream

    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("nums").partition("p").push([{"data": {"n": i}} for i in range(10)])
            evens = await (Stream.from_(q.queue("nums"))
                           .filter(lambda m: m["data"]["n"] % 2 == 0)
                           .map(lambda m: {"double": m["data"]["n"] * 2})
                           .to(q.queue("evens"))
                           .run(query_id="evens", url=broker.url))
            got = await drain_acked(q, "evens", 5)
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
            windows = await drain_acked(q, "sums", 2)
            # The third window closes when event time passes its end.
            await q.queue("events").partition("p").push([{"data": {"ts": base + 45_000, "v": 1000}}])
            windows += await drain_acked(q, "sums", 3 - len(windows))
            await asyncio.sleep(1)
            windows += await drain_acked(q, "sums", 1, seconds=1)
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
            got = await drain_acked(q, "totals", parts, seconds=30)
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
            first = await drain_acked(q, "click-totals")
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
                rest += await drain_acked(q, "click-totals")
                if len(first) + len(rest) >= parts * 10:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1)
            rest += await drain_acked(q, "click-totals")
            await runner.stop()
            windows = first + rest
            assert len(windows) == parts * 10, f"{len(windows)} windows: none lost, none twice"
            assert all(w["data"]["count"] == 10 for w in windows)
            assert sum(w["data"]["sum"] for w in windows) == sum(p * 10_000 * per + sum(range(per)) for p in range(parts))
    run(scenario())




def test_two_streams_read_one_source_each_exactly_and_sessions_close_on_their_gap(broker):
    from queen import Stream

    async def scenario():
        async with Queen(broker.url) as q:
            # Two streams over one source, each with its own group and state.
            await q.queue("orders").partition("a").push([{"data": {"ts": i * 1000, "amount": i}} for i in range(20)])
            await q.queue("orders").partition("a").push([{"data": {"ts": 100_000, "amount": 0}}])

            def totals(sink):
                return (Stream.from_(q.queue("orders"))
                        .window_tumbling(seconds=10, event_time=lambda m: m["data"]["ts"], idle_flush_ms=200)
                        .aggregate({"sum": lambda v: v["amount"], "count": lambda v: 1})
                        .to(q.queue(sink)))

            first = await totals("orders-sum-1").run(query_id="orders-1", url=broker.url)
            second = await totals("orders-sum-2").run(query_id="orders-2", url=broker.url)
            one = await drain_acked(q, "orders-sum-1", 2)
            two = await drain_acked(q, "orders-sum-2", 2)
            await asyncio.sleep(0.5)
            one += await drain_acked(q, "orders-sum-1", 1, seconds=1)
            two += await drain_acked(q, "orders-sum-2", 1, seconds=1)
            await first.stop()
            await second.stop()
            for got in (one, two):
                assert sorted((w["data"]["count"], w["data"]["sum"]) for w in got) == [(10, 45), (10, 145)]

            # Sessions: bursts of activity separated by more than the gap.
            bursts = [0, 1_000, 2_000, 30_000, 31_000, 90_000]
            await q.queue("visits").partition("u1").push([{"data": {"ts": t, "n": 1}} for t in bursts])
            await q.queue("visits").partition("u1").push([{"data": {"ts": 500_000, "n": 1}}])
            sessions = await (Stream.from_(q.queue("visits"))
                              .window_session(gap=10, event_time=lambda m: m["data"]["ts"], idle_flush_ms=200)
                              .aggregate({"count": lambda v: 1})
                              .to(q.queue("sessions"))
                              .run(query_id="visits", url=broker.url))
            got = await drain_acked(q, "sessions", 3)
            await asyncio.sleep(0.5)
            got += await drain_acked(q, "sessions", 1, seconds=1)
            await sessions.stop()
            assert sorted(w["data"]["count"] for w in got) == [1, 2, 3], [w["data"] for w in got]
    run(scenario())


@pytest.mark.broker_env({"QUEEN_ENCRYPTION_KEY": "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
                         "RETENTION_INTERVAL": "2000", "EVICTION_INTERVAL": "2000", "STATS_INTERVAL_MS": "2000"})
def test_concurrent_cycles_of_many_partitions_keep_every_partitions_aggregate_exact(broker):
    """Issue 44 §3: one key per partition (a customer each), events arriving
    one at a time while two processors of one query run, so that cycles and
    idle flushes of different partitions run at once, on an encrypted source
    with an encryption key and 2 s sweeps (the report's broker). After the
    window closed, each partition's one aggregate holds exactly its own
    events: none lost, none counted twice."""
    from queen import Stream

    parts, rounds, per_round = 24, 6, 1
    base = 1_700_000_000_000

    def value(p, i):
        return p * 100 + i * 7 + 1

    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("purchases").config({"encryptionEnabled": True}).create()
            def build():
                return (Stream.from_(q.queue("purchases"))
                        .window_tumbling(seconds=60, event_time=lambda m: m["data"]["ts"], idle_flush_ms=100)
                        .aggregate({"sum": lambda v: v["v"], "count": lambda v: 1})
                        .to(q.queue("per-customer")))

            runners = [await build().run(query_id="per-customer", url=broker.url, batch_size=2) for _ in range(2)]
            for r in range(rounds):
                for p in range(parts):
                    events = [{"data": {"ts": base + (r * per_round + i) * 1000, "v": value(p, r * per_round + i)}}
                              for i in range(per_round)]
                    await q.queue("purchases").partition(f"c{p}").push(events)
                await asyncio.sleep(0.15)
            for p in range(parts):
                await q.queue("purchases").partition(f"c{p}").push([{"data": {"ts": base + 600_000, "v": 0}}])
            got = []
            for _ in range(300):
                for part in range(parts):
                    batch = await q.queue("per-customer").partition(f"c{part}").batch(10).wait(False).pop()
                    for m in batch:
                        await q.ack(m, True)
                        got.append((part, m["data"]["count"], m["data"]["sum"]))
                if len(got) >= parts:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)
            for part in range(parts):
                for m in await q.queue("per-customer").partition(f"c{part}").batch(10).wait(False).pop():
                    got.append((part, m["data"]["count"], m["data"]["sum"]))
            for r in runners:
                await r.stop()
            n = rounds * per_round
            want = sorted((p, n, sum(value(p, i) for i in range(n))) for p in range(parts))
            assert sorted(got) == want, f"got {sorted(got)}"
    run(scenario())
