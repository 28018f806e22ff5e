"""Conformance harness: every test gets its own database on the private
PostgreSQL cluster that scripts/compat.sh started, and its own broker process
(the real `queen` binary) on a random port. Nothing here mocks the broker.
"""

import asyncio
import itertools
import os
import subprocess
import threading
import time

import pytest

PG_DIR = os.environ["QUEEN_COMPAT_PG_DIR"]
PG_PORT = os.environ.get("QUEEN_COMPAT_PG_PORT", "5432")
QUEEN_BIN = os.environ["QUEEN_BIN"]
PSQL = os.environ.get("QUEEN_COMPAT_PSQL", "psql")
_counter = itertools.count()


def psql(db, sql):
    """Runs SQL on a test database and returns the rows as tuples of strings."""
    out = subprocess.run(
        [PSQL, "-h", PG_DIR, "-p", PG_PORT, "-U", "postgres", "-d", db, "-At", "-F", "\t", "-c", sql],
        check=True, capture_output=True, text=True,
    ).stdout
    return [tuple(line.split("\t")) for line in out.splitlines() if line]


class Broker:
    """One `queen serve` process on its own database."""

    def __init__(self, tmp_path, extra_env=None, db=None):
        self.tmp_path = tmp_path
        self.db = db or f"compat_{os.getpid()}_{next(_counter)}"
        if db is None:
            psql("postgres", f"CREATE DATABASE {self.db}")
        env = dict(os.environ)
        env.pop("PG_HOST", None)
        env.update({
            "QUEEN_DATABASE_URL": f"host={PG_DIR} port={PG_PORT} user=postgres dbname={self.db}",
            "HOST": "127.0.0.1", "PORT": "0", "LOG_LEVEL": "warn,queen=info",
            "FILE_BUFFER_DIR": str(tmp_path / f"spool-{next(_counter)}"),
        })
        env.update(extra_env or {})
        self.env = env
        self.logs = []
        self.start()

    def start(self):
        self.proc = subprocess.Popen([QUEEN_BIN, "serve"], env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        found = threading.Event()

        def drain():
            for line in self.proc.stdout:
                self.logs.append(line.rstrip())
                if "listening on http://" in line and not found.is_set():
                    self.url = "http://" + line.split("listening on http://")[1].split()[0]
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(60):
            raise RuntimeError("broker did not start:\n" + "\n".join(self.logs))

    def sibling(self):
        """A second broker process on the same database."""
        return Broker(self.tmp_path, db=self.db)

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def sql(self, query):
        return psql(self.db, query)


@pytest.fixture
def broker(tmp_path, request):
    marker = request.node.get_closest_marker("broker_env")
    b = Broker(tmp_path, marker.args[0] if marker else None)
    yield b
    b.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print("\n".join(b.logs[-200:]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_configure(config):
    config.addinivalue_line("markers", "broker_env(env): extra environment for the broker")


def run(coro):
    """Runs one async scenario to completion, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def eventually(check, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
