"""kafkajs (Node.js) against the broker's Kafka listener: produce, then a
group consume that commits (tests/kafka/js/kafkajs.mjs)."""

import json
import os
import subprocess
import urllib.request

JS = os.path.join(os.path.dirname(__file__), "js")


def test_kafkajs_produces_and_consumes_as_a_group(broker):
    out = subprocess.run(["node", "kafkajs.mjs", broker.bootstrap, "js-topic", "40"], cwd=JS, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(r["partition"] for r in result["sent"]) == [0, 1, 2, 3]
    got = result["got"]
    assert sorted(int(m["key"][1:]) for m in got) == list(range(40))
    for m in got:
        i = int(m["key"][1:])
        assert (m["partition"], m["offset"], m["value"], m["h"]) == (i % 4, i // 4, f"v{i}", f"x{i}")
    # kafkajs commits as it goes; by its disconnect the group's lag is 0.
    with urllib.request.urlopen(broker.url + "/api/v1/consumer-groups", timeout=10) as r:
        groups = json.loads(r.read())
    assert next(g for g in groups if g["name"] == "kafkajs-group")["totalLag"] == 0
