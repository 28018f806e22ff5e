"""Two brokers on one database behind the client's load balancer, with
failover when one goes away."""

import asyncio

from conftest import run
from queen import Queen


def test_two_urls_share_the_work_and_survive_one_broker_going_away(broker):
    other = broker.sibling()
    try:
        async def scenario():
            async with Queen({"urls": [broker.url, other.url], "load_balancing_strategy": "round-robin",
                              "retry_attempts": 3}) as q:
                for i in range(10):
                    await q.queue("lb").partition(f"p{i % 3}").push([{"data": i}])
                seen = []

                async def handler(message):
                    seen.append(message["data"])

                await q.queue("lb").batch(1).each().concurrency(2).limit(10).idle_millis(3000).consume(handler)
                assert sorted(seen) == list(range(10)), "each message once across both brokers"
                other.stop()
                for i in range(10, 14):
                    await q.queue("lb").push([{"data": i}])  # fails over to the live broker
                got = []
                for _ in range(10):
                    msgs = await q.queue("lb").batch(10).wait(False).pop()
                    got += [m["data"] for m in msgs]
                    await q.ack(msgs, True)
                    if len(got) >= 4:
                        break
                assert sorted(got) == [10, 11, 12, 13]
        run(scenario())
    finally:
        if other.proc.poll() is None:
            other.stop()
