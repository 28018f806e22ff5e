"""Kafka client harness: every test gets its own database on the private
PostgreSQL cluster that scripts/kafka.sh started and its own broker process
(the real `queen` binary) with its Kafka listener on a free loopback port.
The broker class is the conformance suite's (tests/compat/conftest.py).
"""

import importlib.util
import os
import socket
import time

import pytest

_spec = importlib.util.spec_from_file_location(
    "compat_harness", os.path.join(os.path.dirname(__file__), "..", "compat", "conftest.py"))
compat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compat)

eventually = compat.eventually
pytest_runtest_makereport = compat.pytest_runtest_makereport


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KafkaBroker(compat.Broker):
    """A broker whose Kafka listener has a fixed port, so a restarted
    process is found where the clients left it."""

    def __init__(self, tmp_path, extra_env=None, db=None, kafka_port=None):
        self.kafka_port = kafka_port or free_port()
        env = {"QUEEN_KAFKA_LISTEN": f"127.0.0.1:{self.kafka_port}"}
        env.update(extra_env or {})
        super().__init__(tmp_path, env, db)
        self.bootstrap = f"127.0.0.1:{self.kafka_port}"

    def start(self):
        super().start()
        eventually(lambda: any("kafka listening on" in line for line in self.logs), 30, "the kafka listener")

    def restart(self):
        """Kills the process (SIGKILL) and starts a new one on the same
        database and ports."""
        self.stop()
        port = self.url.rsplit(":", 1)[1]
        self.env["PORT"] = port
        self.logs = []
        self.start()


@pytest.fixture
def broker(tmp_path, request):
    marker = request.node.get_closest_marker("broker_env")
    b = KafkaBroker(tmp_path, marker.args[0] if marker else None)
    yield b
    b.stop()
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        print("\n".join(b.logs[-200:]))


def pytest_configure(config):
    config.addinivalue_line("markers", "broker_env(env): extra environment for the broker")


def wait_for(check, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
