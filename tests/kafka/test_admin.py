"""Kafka's admin API (confluent-kafka's AdminClient) on Queen: topics as
queues, groups as Queen consumer groups."""

import json
import urllib.request

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from conftest import wait_for
from test_confluent import consumer, http, produce


def wait(futures):
    """Each future's error code, or None when it succeeded."""
    out = {}
    for key, f in futures.items():
        try:
            f.result(timeout=30)
            out[key] = None
        except KafkaException as e:
            out[key] = e.args[0].name()
    return out


def width(admin, topic):
    return len(admin.list_topics(topic, timeout=10).topics[topic].partitions)


def test_topics_are_created_widened_and_deleted_as_queues(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert wait(admin.create_topics([NewTopic("t3", 3, 1), NewTopic("__internal", 1, 1), NewTopic("t0", 0, 1)])) == {
        "t3": None, "__internal": "TOPIC_EXCEPTION", "t0": "INVALID_PARTITIONS"}
    assert wait(admin.create_topics([NewTopic("t3", 3, 1)])) == {"t3": "TOPIC_ALREADY_EXISTS"}
    assert width(admin, "t3") == 3
    status, queue = http(broker, "GET", "/api/v1/resources/queues/t3")
    assert status == 200 and queue["name"] == "t3"
    assert wait(admin.create_partitions([NewPartitions("t3", 5)])) == {"t3": None}
    assert width(admin, "t3") == 5
    assert wait(admin.create_partitions([NewPartitions("t3", 4), NewPartitions("nope", 9)])) == {
        "t3": "INVALID_PARTITIONS", "nope": "UNKNOWN_TOPIC_OR_PART"}
    # A numeric partition written over HTTP past the declared width widens the topic.
    http(broker, "POST", "/api/v1/push", {"items": [{"queue": "t3", "partition": "9", "payload": 1}]})
    assert width(admin, "t3") == 10
    assert wait(admin.delete_topics(["t3", "nope"])) == {"t3": None, "nope": "UNKNOWN_TOPIC_OR_PART"}
    with pytest.raises(urllib.error.HTTPError) as gone:
        http(broker, "GET", "/api/v1/resources/queues/t3")
    assert gone.value.code == 404
    assert "t3" not in admin.list_topics(timeout=10).topics


def test_groups_are_listed_described_and_deleted_with_queens_own(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    produce(broker, "work", [(p, None, b"x", []) for p in range(4)])
    # A Queen consumer group made over HTTP...
    status, _ = http(broker, "GET", "/api/v1/pop/queue/work?consumerGroup=http-group&batch=10&autoAck=true")
    assert status == 200
    # ... and a live Kafka group.
    c = consumer(broker, "kafka-group", **{"client.id": "member-one"})
    c.subscribe(["work"])
    def assigned():
        c.poll(0.2)
        return len(c.assignment()) == 8

    wait_for(assigned, 30, "an assignment")
    c.commit(offsets=[TopicPartition("work", 0, 1)], asynchronous=False)
    listed = admin.list_consumer_groups().result(timeout=30)
    states = {g.group_id: g.state.name for g in listed.valid}
    assert states.get("kafka-group") == "STABLE" and states.get("http-group") == "EMPTY"
    described = admin.describe_consumer_groups(["kafka-group", "http-group", "nobody"])
    live = described["kafka-group"].result(timeout=30)
    assert live.state.name == "STABLE" and live.partition_assignor == "range"
    [member] = live.members
    assert member.client_id == "member-one" and member.host.endswith("127.0.0.1")
    assert sorted(tp.partition for tp in member.assignment.topic_partitions) == list(range(8))
    assert described["http-group"].result(timeout=30).state.name == "EMPTY"
    assert described["nobody"].result(timeout=30).state.name == "DEAD"
    # A group with members cannot be deleted; one without can, with its cursors.
    assert wait(admin.delete_consumer_groups(["kafka-group", "http-group", "nobody"])) == {
        "kafka-group": "NON_EMPTY_GROUP", "http-group": None, "nobody": "GROUP_ID_NOT_FOUND"}
    c.close()
    _, groups = http(broker, "GET", "/api/v1/consumer-groups")
    assert "http-group" not in {g["name"] for g in groups}
    # Offsets as Kafka's admin sees them: the group's cursors.
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("kafka-group", [TopicPartition("work", 0)])])
    [tp] = offsets["kafka-group"].result(timeout=30).topic_partitions
    assert (tp.partition, tp.offset) == (0, 1)


def test_retention_ms_is_the_queues_retention_and_compaction_is_refused(broker):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert wait(admin.create_topics([NewTopic("kept", 2, 1)])) == {"kept": None}
    res = ConfigResource(ResourceType.TOPIC, "kept")

    def configs():
        entries = admin.describe_configs([res])[res].result(timeout=30)
        return {k: e.value for k, e in entries.items()}

    assert configs() == {"retention.ms": "-1", "cleanup.policy": "delete"}
    alter = ConfigResource(ResourceType.TOPIC, "kept", incremental_configs=[
        ConfigEntry("retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([alter])[alter].result(timeout=30)
    assert configs()["retention.ms"] == "86400000"
    _, queue = http(broker, "GET", "/api/v1/resources/queues/kept")
    assert queue["options"]["retentionSeconds"] == 86400
    compact = ConfigResource(ResourceType.TOPIC, "kept", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([compact])[compact].result(timeout=30)
    assert refused.value.args[0].name() == "INVALID_CONFIG"
    assert configs()["retention.ms"] == "86400000", "a refused alter changes nothing"


@pytest.mark.broker_env({"QUEEN_TENANCY_HEADER": "true", "QUEEN_TRUSTED_PROXY": "true"})
def test_with_tenancy_on_the_listener_serves_the_default_tenant_only(broker):
    """Another tenant's queues and groups are not in Metadata or ListGroups,
    and a topic of the same name is the default tenant's own."""
    def push(queue, tenant=None):
        headers = {"content-type": "application/json"}
        if tenant:
            headers["x-queen-tenant"] = tenant
        req = urllib.request.Request(broker.url + "/api/v1/push", method="POST", headers=headers,
                                     data=json.dumps({"items": [{"queue": queue, "partition": "0", "payload": {"t": tenant}}]}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 201
    other = "6f1c2a34-0000-4000-8000-00000000abcd"
    push("hidden", other)
    push("both", other)
    push("both")
    pop = urllib.request.Request(broker.url + "/api/v1/pop/queue/both?consumerGroup=theirs&batch=1&autoAck=true",
                                 headers={"x-queen-tenant": other})
    with urllib.request.urlopen(pop, timeout=30) as r:
        assert r.status == 200
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topics = admin.list_topics(timeout=10).topics
    assert "both" in topics and "hidden" not in topics and not any("\x01" in t for t in topics), sorted(topics)
    groups = admin.list_consumer_groups().result(timeout=30).valid
    assert "theirs" not in {g.group_id for g in groups}
    c = consumer(broker, "mine")
    c.assign([TopicPartition("both", 0, 0)])
    msg = wait_for(lambda: c.poll(0.5), 30, "the default tenant's record")
    assert json.loads(msg.value()) == {"t": None}, msg.value()
    c.close()
