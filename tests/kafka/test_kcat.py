"""kcat (Debian's) against the broker's Kafka listener: metadata, produce
from stdin, consume from the beginning, and as a consumer group."""

import json
import subprocess
import urllib.request


def kcat(broker, *args, stdin=None):
    out = subprocess.run(["kcat", "-b", broker.bootstrap, *args], input=stdin, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_kcat_lists_produces_and_consumes(broker):
    kcat(broker, "-t", "orders", "-K:", "-P", "-p", "3", stdin="k1:hello\nk2:world\n")
    kcat(broker, "-t", "orders", "-P", "-p", "5", stdin="plain\n")
    listing = kcat(broker, "-L", "-t", "orders")
    assert "1 brokers:" in listing and f"broker 1 at {broker.bootstrap}" in listing  # the first node registered
    assert 'topic "orders" with 8 partitions:' in listing
    lines = kcat(broker, "-t", "orders", "-C", "-o", "beginning", "-e", "-q", "-f", "%p %o %k %s\\n").splitlines()
    assert sorted(lines) == sorted(["3 0 k1 hello", "3 1 k2 world", "5 0  plain"])
    # As a group: everything from the start once, committed as Queen cursors.
    grouped = kcat(broker, "-G", "readers", "-o", "beginning", "-e", "-q", "-f", "%p %o %s\\n", "orders").splitlines()
    assert sorted(grouped) == ["3 0 hello", "3 1 world", "5 0 plain"]
    with urllib.request.urlopen(broker.url + "/api/v1/consumer-groups", timeout=10) as r:
        groups = json.loads(r.read())
    assert next(g for g in groups if g["name"] == "readers")["totalLag"] == 0
