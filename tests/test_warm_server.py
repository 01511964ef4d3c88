"""The project's warm Spark Connect server as runs use it: ``make ui`` starts it and two tables' runs share
it at once, stopping ``make ui`` stops it; a run whose server dies fails saying so, commits nothing half-way,
and the next run starts a fresh server.

Every server runs on a free loopback port with its state in the test's temp folder (``CDC_SPARK_SERVER_DIR``,
``SPARK_CONNECT_PORT``), and every process started here is stopped, whatever the outcome.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import requests

from cdc_assets.engines import connect_server
from cdc_assets.engines.process import process_alive
from resources.storage import WarehouseStorage
from cdc_assets.engines.process import free_port
from tests.processes import stop_process_tree, tail

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DAGSTER = REPO / ".venv" / "bin" / "dagster"
SERVER_CONF = '{"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.driver.memory": "1g"}'


def _environment(tmp_path: Path, tables: list[str], **extra: str) -> dict[str, str]:
    """A Dagster home, a warehouse and the shipped configs of ``tables`` on the checked-in samples."""
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    configs = tmp_path / "configs"
    configs.mkdir(exist_ok=True)
    for table in tables:
        shutil.copy(REPO / "table_configs" / f"{table}.yaml", configs / f"{table}.yaml")
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_REMOTE", "CDC_SPARK_MASTER", "CDC_SPARK")}
    env.update(
        DAGSTER_HOME=str(home),
        CDC_WAREHOUSE=str(tmp_path / "warehouse"),
        CDC_DATA_ROOT=str(REPO),
        CDC_TABLE_CONFIGS=str(configs),
        CDC_SPARK_SERVER_DIR=str(tmp_path / "spark-server"),
        SPARK_CONNECT_PORT=str(free_port()),
        SPARK_LOCAL_IP="127.0.0.1",
        CDC_SPARK_CONF=SERVER_CONF,
        **extra,
    )
    return env


def _materialize(env: dict, table: str, day: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(DAGSTER), "asset", "materialize", "-m", "cdc_assets.defs.definitions", "--select", f"group:{table}", "--partition", day],
        env=env, cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
    )


def _stored_rows(warehouse: Path, table: str, asset: str, day: str) -> int | None:
    """Rows of the stored date (the Iceberg table's manifests, no Spark), None if the table does not hold it."""
    storage = WarehouseStorage(str(warehouse))
    if not storage.has_partition(table, asset, day):
        return None
    return storage.row_counts(table, asset, [day])[day]


def test_a_run_whose_server_dies_fails_saying_so_and_the_next_run_starts_a_new_server(tmp_path):
    env = _environment(tmp_path, ["orders"], CDC_SPARK="server", CDC_SPARK_CONNECT_TIMEOUT="5")
    state = Path(env["CDC_SPARK_SERVER_DIR"])
    warehouse = Path(env["CDC_WAREHOUSE"])
    marker, release = tmp_path / "paused", tmp_path / "release"
    paused = {**env, "CDC_PAUSE_BEFORE_COMMIT": "orders/hashed_incoming", "CDC_PAUSE_MARKER": str(marker), "CDC_PAUSE_RELEASE": str(release)}
    log = tmp_path / "first.log"
    first = _materialize(paused, "orders", "2024-01-01", log)
    try:
        # The run started the project's server itself (CDC_SPARK=server, none running), and paused before
        # writing its first output: kill the server there, with all its processes, then let the run go on.
        deadline = time.monotonic() + 600
        while not marker.exists():
            assert first.poll() is None and time.monotonic() < deadline, tail(log)
            time.sleep(0.5)
        server = connect_server.running_server(state)
        assert server is not None, tail(log)
        os.killpg(server.pid, signal.SIGKILL)
        release.touch()
        began = time.monotonic()
        first.wait(timeout=300)
        gave_up_after = time.monotonic() - began
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    output = log.read_text()
    assert first.returncode != 0, output[-4000:]
    assert "SparkServerGoneError" in output and server.url in output and "died or stopped answering" in output, output[-6000:]
    assert "The next run starts a new server" in output
    print(f"the run failed {gave_up_after:.1f} s after its server was killed (CDC_SPARK_CONNECT_TIMEOUT=5)")
    # Its first write (hashed_incoming's Iceberg commit) needed the server that was gone: nothing the run
    # wrote reached readers, not even part of a table.
    for asset in ("hashed_incoming", "rejects", "current_table", "history_partition", "hash_join_classification"):
        assert _stored_rows(warehouse, "orders", asset, "2024-01-01") is None, asset

    second_log = tmp_path / "second.log"
    second = _materialize(env, "orders", "2024-01-01", second_log)
    assert second.wait(timeout=900) == 0, tail(second_log)
    try:
        fresh = connect_server.running_server(state)
        assert fresh is not None and fresh.pid != server.pid
        assert "started for this run" in second_log.read_text()
        assert _stored_rows(warehouse, "orders", "current_table", "2024-01-01") == 6
        assert _stored_rows(warehouse, "orders", "history_partition", "2024-01-01") == 6
        assert _stored_rows(warehouse, "orders", "hashed_incoming", "2024-01-01") == 6
    finally:
        connect_server.stop_server(state)


LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
RUN_STATUS = """
query Run($runId: ID!) {
  runOrError(runId: $runId) { __typename ... on Run { status } }
}
"""
RUN_LOGS = """
query Logs($runId: ID!) {
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message }
        ... on ExecutionStepFailureEvent { error { message stack cause { message stack } } }
        ... on RunFailureEvent { pipelineFailureError: error { message } }
      }
    }
  }
}
"""


def _graphql(url: str, query: str, variables: dict) -> dict:
    response = requests.post(url, json={"query": query, "variables": variables}, timeout=60)
    response.raise_for_status()
    body = response.json()
    assert not body.get("errors"), body["errors"]
    return body["data"]


def test_make_ui_keeps_one_warm_server_for_runs_of_two_tables_at_once_and_stops_it_at_the_end(tmp_path):
    env = _environment(tmp_path, ["orders", "accounts"])
    state = Path(env["CDC_SPARK_SERVER_DIR"])
    port = free_port()
    url = f"http://127.0.0.1:{port}/graphql"
    log = tmp_path / "make_ui.log"
    process = subprocess.Popen(
        ["make", "--no-print-directory", "ui", f"UI_PORT={port}", f"DAGSTER_HOME={env['DAGSTER_HOME']}"],
        cwd=REPO, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,  # noqa: SIM115
        start_new_session=True,
    )
    known: dict[int, psutil.Process] = {}
    server = None
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, tail(log)
            assert time.monotonic() < deadline, tail(log)
            server = server or connect_server.running_server(state)
            try:
                if server is not None and requests.get(f"http://127.0.0.1:{port}/server_info", timeout=5).ok:
                    query = "{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name } } } }"
                    workspace = requests.post(url, json={"query": query}, timeout=30).json()
                    if workspace.get("data", {}).get("repositoriesOrError", {}).get("nodes"):
                        break
            except requests.RequestException:
                pass
            time.sleep(1)
        ui_pids = {child.pid for child in psutil.Process(process.pid).children()}
        assert connect_server.server_owner(state) in {f"make ui (pid {pid})" for pid in ui_pids}, "make ui started the server"

        # One run per table, launched together: each one date of its own table's job.
        runs = {}
        for table, day in (("orders", "2024-01-01"), ("accounts", "2024-02-01")):
            params = {
                "selector": {"repositoryLocationName": "cdc_assets", "repositoryName": "__repository__", "jobName": "__ASSET_JOB"},
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": day}]},
                "stepKeys": None,
                "mode": "default",
                "runConfigData": {},
            }
            params["selector"]["assetSelection"] = [{"path": [table, name]} for name in ("hashed_incoming", "rejects")]
            launched = _graphql(url, LAUNCH_RUN, {"params": params})["launchRun"]
            assert launched["__typename"] == "LaunchRunSuccess", launched
            runs[table] = launched["run"]["runId"]
        deadline = time.monotonic() + 900
        statuses = {}
        while True:
            for proc in psutil.Process(process.pid).children(recursive=True):
                known.setdefault(proc.pid, proc)
            statuses = {table: _graphql(url, RUN_STATUS, {"runId": run})["runOrError"]["status"] for table, run in runs.items()}
            if all(status in ("SUCCESS", "FAILURE", "CANCELED") for status in statuses.values()):
                break
            assert time.monotonic() < deadline, (statuses, tail(log))
            time.sleep(2)
        messages = {
            table: [event.get("message", "") for event in _graphql(url, RUN_LOGS, {"runId": run})["logsForRun"]["events"]]
            for table, run in runs.items()
        }
        failures = {
            table: [event for event in _graphql(url, RUN_LOGS, {"runId": run})["logsForRun"]["events"] if event["__typename"].endswith("FailureEvent")]
            for table, run in runs.items()
        }
        assert statuses == {"orders": "SUCCESS", "accounts": "SUCCESS"}, (statuses, failures, tail(log))
        application = connect_server.probe(server.port, token=server.token)["spark.app.id"]
        for table in runs:
            warm = f"Spark for this run: the project's warm Spark Connect server {server.url} (pid {server.pid})"
            assert any(warm in m for m in messages[table]), messages[table]
            assert any(f"on application {application}" in m for m in messages[table]), messages[table]
        assert connect_server.running_server(state).pid == server.pid  # one server all along
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)  # what a service manager does to make
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
        stopped_by_ui = server is not None and not process_alive(server.pid)
        stop_process_tree(process, env["DAGSTER_HOME"], known)
        if server is not None and process_alive(server.pid):
            connect_server.stop_server(state)
    assert stopped_by_ui, f"make ui left its Spark Connect server running\n{tail(log)}"
    assert connect_server.running_server(state) is None
    assert "stopped the Spark Connect server it started" in log.read_text()
