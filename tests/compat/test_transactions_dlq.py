"""Transactions, the DLQ and its retry (scenario 5)."""

import asyncio

from conftest import run
from queen import Queen


def test_a_transaction_acks_and_pushes_atomically(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("input").push([{"data": {"order": 7}}])
            [m] = await q.queue("input").batch(1).wait(False).pop()
            r = await q.transaction().ack(m).queue("output").push([{"data": {"shipped": 7}}]).commit()
            assert r["success"] is True
            out = await q.queue("output").batch(10).wait(False).pop()
            assert [x["data"] for x in out] == [{"shipped": 7}]
            assert await q.queue("input").batch(1).wait(False).pop() == []
    run(scenario())


def test_a_transaction_with_a_bad_lease_rolls_back(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("input").push([{"data": "keep"}])
            [m] = await q.queue("input").batch(1).wait(False).pop()
            forged = dict(m, leaseId="not-the-lease")
            try:
                await q.transaction().ack(forged).queue("output").push([{"data": "never"}]).commit()
                raise AssertionError("the commit should have raised")
            except Exception as e:  # the client raises the broker's error
                assert "lease" in str(e), e
            assert await q.queue("output").batch(10).wait(False).pop() == []
            assert (await q.ack(m, True))["success"] is True, "the real lease still holds"
    run(scenario())


def test_dlq_after_the_retry_limit_and_retry_from_the_dlq(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("risky").config({"retryLimit": 1, "dlqAfterMaxRetries": True}).create()
            await q.queue("risky").push([{"data": {"poison": True}}, {"data": {"fine": True}}])
            for _ in range(2):
                [m] = await q.queue("risky").batch(1).wait(False).pop()
                assert m["data"] == {"poison": True}
                await q.ack(m, False, {"error": "cannot parse"})
            [m] = await q.queue("risky").batch(1).wait(False).pop()
            assert m["data"] == {"fine": True}, "the cursor moved past the dead letter"
            await q.ack(m, True)
            dlq = await q.queue("risky").dlq().limit(10).get()
            assert dlq["total"] == 1
            [dead] = dlq["messages"]
            assert dead["data"] == {"poison": True}
            assert dead["errorMessage"] == "cannot parse"
            r = await q.admin.retry_message(dead["partitionId"], dead["transactionId"])
            assert r["success"] is True and r["result"] == "moved", r
            [back] = await q.queue("risky").batch(1).wait(False).pop()
            assert back["data"] == {"poison": True}
            assert (await q.queue("risky").dlq().get())["total"] == 0
    run(scenario())
