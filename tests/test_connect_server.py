"""The long-lived Spark Connect server (``cdc_assets.engines.connect_server``): started from the installed pyspark,
listening on loopback only, reached by clients in subprocesses (this process may hold a classic
SparkSession, and pyspark refuses a Connect session next to one).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from cdc_assets.engines.connect_server import jvm_pid, running_server, start_server, stop_server
from cdc_assets.engines.process import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}

# SPARK_REMOTE alone turns SparkSession.builder into a Connect client, as in a pipeline run.
CLIENT = """
import sys, warnings
from pyspark.sql import SparkSession

out = sys.argv[1]
spark = SparkSession.builder.getOrCreate()
print("module", type(spark).__module__)
print("timezone", spark.conf.get("spark.sql.session.timeZone"))
print("partitions", spark.conf.get("spark.sql.shuffle.partitions"))
spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id INT, name STRING").write.mode("overwrite").parquet(out)
print("rows", spark.read.parquet(out).count())
# Static conf is the server's: a client's builder can only warn about it.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    SparkSession.builder.config("spark.driver.memory", "8g").getOrCreate()
warned = any("CANNOT_MODIFY_CONFIG" in str(warning.message) for warning in caught)
print("driver_memory", spark.conf.get("spark.driver.memory"), "warned", warned)
spark.stop()
"""


def _client_env(url: str) -> dict[str, str]:
    return {**os.environ, "SPARK_REMOTE": url}


def _listening(pid: int) -> list:
    return [conn.laddr for conn in psutil.Process(pid).net_connections(kind="inet") if conn.status == psutil.CONN_LISTEN]


def test_a_connect_client_writes_and_reads_parquet(connect_server, tmp_path):
    out = tmp_path / "rows.parquet"
    completed = subprocess.run(
        [sys.executable, "-c", CLIENT, str(out)],
        cwd=REPO,
        env=_client_env(connect_server.client_url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    printed = dict(line.split(" ", 1) for line in completed.stdout.splitlines() if " " in line)
    assert printed["module"] == "pyspark.sql.connect.session"
    assert printed["timezone"] == "UTC"
    assert printed["partitions"] == "4"  # the fixture's server conf reaches every Connect session
    assert printed["rows"] == "3"
    assert printed["driver_memory"] == "2g warned True"
    # The server wrote the files, at the client's absolute path, on this machine's disk.
    assert (out / "_SUCCESS").exists()
    assert list(out.glob("part-*.parquet"))
    assert pq.read_table(out).num_rows == 3


def test_the_server_listens_on_loopback_only_and_reports_its_conf(connect_server):
    listening = _listening(jvm_pid(connect_server))
    assert connect_server.port in {address.port for address in listening}
    assert {address.ip for address in listening} <= LOOPBACK, listening

    completed = subprocess.run(
        [sys.executable, "-m", "cdc_assets.engines.connect_server", "status", "--state-dir", str(connect_server.state_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.startswith(f"{connect_server.url} pid {connect_server.pid} ")
    for pair in ("spark.master=local[2]", "spark.sql.session.timeZone=UTC", "spark.driver.memory=2g", "spark.sql.shuffle.partitions=4"):
        assert pair in completed.stdout.split()


# A client that reaches the port is refused unless it presents the server's token: any local user can open
# a loopback port, and a Connect session runs whatever SQL it is sent as the server's owner.
UNAUTHENTICATED_CLIENT = """
import sys
from pyspark.sql import SparkSession

for url in sys.argv[1:]:
    try:
        SparkSession.builder.remote(url).create().sql("SELECT 1").collect()
        print("served", url)
    except Exception as error:
        print("refused" if "UNAUTHENTICATED" in str(error) else f"failed {error}", url)
"""


def test_a_client_without_the_servers_token_is_refused(connect_server):
    assert connect_server.token, "the server was started without a token"
    token_file = connect_server.state_dir / "server.token"
    assert token_file.read_text().strip() == connect_server.token
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert (connect_server.state_dir / "server.properties").stat().st_mode & 0o777 == 0o600
    tokenless, wrong = connect_server.url, f"sc://localhost:{connect_server.port}/;token=not-{connect_server.token}"
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN")}
    completed = subprocess.run(
        [sys.executable, "-c", UNAUTHENTICATED_CLIENT, tokenless, wrong, connect_server.client_url],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.splitlines() == [f"refused {tokenless}", f"refused {wrong}", f"served {connect_server.client_url}"], completed.stdout
    assert connect_server.token not in (connect_server.state_dir / "server.log").read_text()


def test_a_taken_port_fails_at_once(connect_server, tmp_path):
    with pytest.raises(RuntimeError, match="in use"):
        start_server(port=connect_server.port, state_dir=tmp_path / "other")
    assert not (tmp_path / "other" / "server.pid").exists()


def test_start_is_idempotent_and_stop_stops_the_server(tmp_path):
    state = tmp_path / "server"
    port = free_port()
    conf = {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"}  # the UI stays on: it must bind to loopback too
    first = start_server(port=port, state_dir=state, master="local[1]", conf=conf)
    try:
        assert first.url == f"sc://127.0.0.1:{port}"
        assert (state / "server.pid").read_text().strip() == str(first.pid)
        assert first.log_path == state / "server.log" and first.log_path.exists()
        # Detached: a session of its own, so the caller's Ctrl-C (its process group) does not reach it.
        assert os.getsid(first.pid) == first.pid != os.getsid(0)

        again = start_server(port=port, state_dir=state, master="local[1]", conf=conf)
        assert again == first
        assert running_server(state) == first
        with pytest.raises(RuntimeError, match=f"already runs on port {port}"):
            start_server(port=free_port(), state_dir=state)

        jvm = jvm_pid(first)
        assert psutil.Process(jvm).name() == "java"
        assert "VmHWM:" in Path(f"/proc/{jvm}/status").read_text()
        listening = _listening(jvm)
        assert port in {address.port for address in listening}
        assert {address.ip for address in listening} <= LOOPBACK, listening
    finally:
        stopped = stop_server(state)

    assert stopped
    assert not psutil.pid_exists(first.pid)
    assert not (state / "server.pid").exists()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert stop_server(state) is False
    assert running_server(state) is None
