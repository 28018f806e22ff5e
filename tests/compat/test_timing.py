"""Long-poll wake-up (scenario 6), delayed processing and the window buffer
(scenario 7)."""

import asyncio
import time

from conftest import run
from queen import Queen


def test_a_long_poll_receives_a_push_within_100_ms(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("lp").batch(1).wait(False).pop()  # first contact, outside the measurement
            pushed_at = {}

            async def producer():
                await asyncio.sleep(1)
                await q.queue("lp").push([{"data": "wake"}])
                pushed_at["t"] = time.monotonic()

            task = asyncio.create_task(producer())
            msgs = await q.queue("lp").batch(1).wait(True).timeout_millis(10000).pop()
            received = time.monotonic()
            await task
            assert [m["data"] for m in msgs] == ["wake"]
            assert received - pushed_at["t"] < 0.1, f"woken {received - pushed_at['t']:.3f}s after the push"
    run(scenario())


def test_delayed_processing_and_window_buffer(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("later").config({"delayedProcessing": 1}).create()
            await q.queue("later").push([{"data": "x"}])
            assert await q.queue("later").batch(1).wait(False).pop() == []
            await asyncio.sleep(1.2)
            assert [m["data"] for m in await q.queue("later").batch(1).wait(False).pop()] == ["x"]

            await q.queue("window").config({"windowBuffer": 1}).create()
            await q.queue("window").push([{"data": 1}])
            await asyncio.sleep(0.5)
            await q.queue("window").push([{"data": 2}])
            assert await q.queue("window").batch(10).wait(False).pop() == [], "still being written"
            await asyncio.sleep(1.2)
            got = await q.queue("window").batch(10).wait(False).pop()
            assert [m["data"] for m in got] == [1, 2], "one fat batch after the quiet period"
    run(scenario())
