"""The admin surface through the client (scenario 8)."""

from conftest import run
from queen import Queen


def test_create_read_list_depth_lag_metrics_health_delete(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            r = await q.queue("adm.jobs").config({"leaseTime": 45, "retryLimit": 5, "windowBuffer": 0}).create()
            assert r["configured"] is True
            detail = await q.admin.get_queue("adm.jobs")
            assert detail["options"]["leaseTime"] == 45 and detail["options"]["retryLimit"] == 5
            await q.queue("adm.jobs").partition("a").push([{"data": i} for i in range(3)])
            await q.queue("adm.jobs").partition("b").push([{"data": 9}])
            listed = await q.admin.list_queues()
            assert [x["name"] for x in listed["queues"]] == ["adm.jobs"]
            depth = await q.admin.get_queue_depth("adm.jobs")
            assert depth["pending"] == 4 and depth["partitionsPending"] == 2
            msgs = await q.queue("adm.jobs").partition("a").group("w").batch(1).wait(False).pop()
            await q.ack(msgs, True, {"group": "w"})
            groups = await q.admin.list_consumer_groups()
            [w] = [g for g in groups if g["name"] == "w"]
            assert w["totalLag"] == 2, w
            g = await q.admin.get_consumer_group("w")
            assert g["adm.jobs"]["partitions"][0]["offsetLag"] == 2
            health = await q.admin.health()
            assert health["status"] == "healthy"
            metrics = await q.admin.metrics()
            assert metrics["messages"]["pushed"] == 4
            gone = await q.queue("adm.jobs").delete()
            assert gone["deleted"] is True
            again = await q.queue("adm.jobs").delete()
            assert again["deleted"] is False and again["existed"] is False
    run(scenario())


def test_group_lag_and_status_routes_answer_json(broker):
    async def scenario():
        async with Queen(broker.url) as q:
            await q.queue("st").push([{"data": 1}])
            status = await q.admin.get_status()
            assert status["messages"]["total"] == 1
            stats = await q.admin.get_queue_stats()
            assert stats["queues"][0]["name"] == "st"
            overview = await q.admin.get_overview()
            assert overview["queues"] == 1
            lagging = await q.admin.get_lagging_consumers(0)
            assert isinstance(lagging, list)
    run(scenario())
