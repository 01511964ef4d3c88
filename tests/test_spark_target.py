"""Where a run's Spark runs (resources/session/spark_target.py): the project's warm server found without being
named, the opt-outs, a bounded wait on a dead server, the server's size, and the caches a run leaves.

The server here is the session's ``connect_server`` fixture, found through its state folder as the
project's server is (``CDC_SPARK_SERVER_DIR``), never through ``SPARK_REMOTE``.
"""

from __future__ import annotations

import socket
import time

import pytest
from pyspark.sql.connect.client.retries import DefaultPolicy

from cdc_assets.engines import connect_server
from cdc_assets.core import caching
from resources.session.spark_target import (
    SparkServerGoneError,
    SparkTarget,
    bounded_retry_policy,
    explain_server_loss,
    resolve_spark_target,
)


@pytest.fixture()
def no_remote(monkeypatch):
    for name in ("SPARK_REMOTE", "CDC_SPARK", "CDC_SPARK_MASTER"):
        monkeypatch.delenv(name, raising=False)


def test_a_running_project_server_is_found_without_spark_remote(connect_server, monkeypatch, no_remote):
    monkeypatch.setenv("CDC_SPARK_SERVER_DIR", str(connect_server.state_dir))
    target = resolve_spark_target()
    assert (target.url, target.server_pid) == (connect_server.client_url, connect_server.pid)
    # The connection string carries the server's token; what a run shows does not.
    assert connect_server.token and connect_server.token in target.url
    assert target.display_url == connect_server.url and connect_server.token not in target.description + repr(target)
    assert "warm" in target.description

    monkeypatch.setenv("CDC_SPARK_MASTER", "spark://cluster:7077")  # a master named: the run's own session there
    assert resolve_spark_target().url is None
    monkeypatch.delenv("CDC_SPARK_MASTER")

    monkeypatch.setenv("CDC_SPARK", "local")  # the opt-out wins over a running server
    assert resolve_spark_target().url is None

    monkeypatch.setenv("CDC_SPARK", "auto")
    monkeypatch.setenv("SPARK_REMOTE", "sc://elsewhere:15099")  # any other server, named, wins over both
    assert resolve_spark_target().url == "sc://elsewhere:15099"


def test_without_a_running_server_auto_runs_cold_and_says_how_to_go_warm(tmp_path, monkeypatch, no_remote):
    monkeypatch.setenv("CDC_SPARK_SERVER_DIR", str(tmp_path / "none"))
    target = resolve_spark_target()
    assert target.url is None
    assert "cold" in target.description and "make ui" in target.description
    monkeypatch.setenv("CDC_SPARK", "sometimes")
    with pytest.raises(ValueError, match="CDC_SPARK='sometimes'"):
        resolve_spark_target()


def test_a_dead_server_is_given_up_on_within_the_connect_timeout():
    for timeout in (5, 30, 120):
        policy = bounded_retry_policy(DefaultPolicy, timeout)
        waits, backoff = [], policy.initial_backoff
        for _ in range(policy.max_retries):
            waits.append(min(backoff, policy.max_backoff) / 1000)
            backoff *= policy.backoff_multiplier
        jitter = policy.jitter / 1000 * sum(wait * 1000 > policy.min_jitter_threshold for wait in waits)
        # At least the timeout, and at most one more backoff (plus pyspark's jitter) beyond it.
        assert timeout <= sum(waits) <= timeout + policy.max_backoff / 1000, (timeout, waits)
        assert sum(waits) + jitter < timeout * 1.5 + 5
    policy = DefaultPolicy()  # pyspark's own: about ten minutes
    assert sum(min(policy.initial_backoff * policy.backoff_multiplier**i, policy.max_backoff) for i in range(policy.max_retries)) > 500_000


def test_a_failure_after_the_server_died_says_so_and_what_to_do(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "server.log"
    log.write_text("java.lang.OutOfMemoryError: Java heap space\n")
    gone = SparkTarget("server", f"sc://127.0.0.1:{port}", "test", server_pid=2**22 + 7, server_log=log)
    with pytest.raises(SparkServerGoneError) as raised:
        with explain_server_loss(gone):
            raise RuntimeError("<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE>")
    message = str(raised.value)
    assert f"sc://127.0.0.1:{port}" in message and "died" in message and "make spark-server" in message
    assert "Nothing was committed half-way" in message and "OutOfMemoryError" in message
    assert isinstance(raised.value.__cause__, RuntimeError)
    # A failure of a run whose server is alive stays what it was.
    with pytest.raises(KeyError):
        with explain_server_loss(None):
            raise KeyError("a bug of our own")


def test_the_server_heap_is_sized_from_the_machine_and_the_run_queue(tmp_path, monkeypatch):
    assert connect_server.server_heap_gib(24, 4) == 8  # the reference machine and instance/dagster.yaml
    assert connect_server.server_heap_gib(8, 4) == 4  # at most half a small machine
    assert connect_server.server_heap_gib(2, 1) == 2  # never below 2 GiB
    assert connect_server.server_heap_gib(256, 10) == 17
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert connect_server.shared_runs() == connect_server.DEFAULT_SHARED_RUNS
    (home / "dagster.yaml").write_text("concurrency:\n  runs:\n    max_concurrent_runs: 7\n")
    assert connect_server.shared_runs() == 7
    master, conf = connect_server.server_conf(15002)
    assert conf["spark.scheduler.mode"] == "FAIR"
    expected = connect_server.server_heap_gib(connect_server.machine_memory_gib(), 7)
    assert master.startswith("local") and conf["spark.driver.memory"] == f"{expected}g"
    monkeypatch.setenv("CDC_SPARK_CONF", '{"spark.driver.memory": "3g"}')  # the user's figure wins
    assert connect_server.server_conf(15002)[1]["spark.driver.memory"] == "3g"


def test_the_end_of_a_run_releases_what_it_cached(spark):
    caching.release_persisted()  # what earlier tests cached outside a run (no run's end released it)
    frames = [caching.persist(spark.range(100).withColumnRenamed("id", f"c{i}")) for i in range(3)]
    for frame in frames:
        frame.count()
        assert frame.storageLevel.useDisk
    frames[0].unpersist()  # a step's own release; the rest is left, as by a step that failed half-way
    started = time.monotonic()
    assert caching.release_persisted() == 3
    assert all(not frame.storageLevel.useDisk for frame in frames)
    assert caching.release_persisted() == 0 and time.monotonic() - started < 60
