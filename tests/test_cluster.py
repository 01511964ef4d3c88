"""The pipeline on a Spark standalone cluster (``cdc_assets.engines.cluster``): a master and two workers on loopback.

The runs are real ``dagster asset materialize`` processes pointed at the cluster by configuration alone
(``CDC_SPARK_MASTER``, or ``SPARK_REMOTE`` of a Connect server whose master is the cluster); every output
must equal, row for row, what the same runs write on local Spark. The master's ``/json/`` and the
executors' own logs under the workers' work dirs show that the work ran on the cluster's executors. The
Python executable the runs name for executors (``PYSPARK_PYTHON``) does not exist: the pipeline needs no
Python on executors.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from cdc_assets.engines.cluster import ClusterLayout, master_state, registered_workers, running_cluster, start_cluster, stop_cluster
from cdc_assets.model.config import TableConfig, load_table_config
from cdc_assets.engines.connect_server import start_server, stop_server
from cdc_assets.cli.generate import generate
from tests.pipeline import definitions_for, operation_counts, partition_dir, run_dates, run_range, sorted_rows, stored_asset, write_table_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# Both tables on the orders sample's dates, so that one run can materialize both.
DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
SYNTHETIC_DAYS = DAYS[:2]
# Both shapes of run, two in all (each cluster run starts a driver and two executors, cold): the synthetic
# dates and the first two orders dates as one range (a single-run backfill), then the last orders date.
RUNS = [(("synthetic", "orders"), SYNTHETIC_DAYS), (("orders",), DAYS[2:])]
ASSETS = ("hashed_incoming", "rejects", "hash_join_classification", "inserts", "deletes", "updates",
          "current_table", "history_partition")
NO_PYTHON = "/nonexistent/python3"
# Every cluster run compiles Spark's code in three cold JVMs (driver, two executors) for a minute's work:
# the quick JIT tier alone took about 40% less CPU for this test than the default, with the same outputs.
QUICK_JIT = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1", "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
RUN_CONF = json.dumps({"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", **QUICK_JIT})


def _free_ports(count: int) -> list[int]:
    """Distinct loopback ports nothing listens on (each held until all are chosen, so none repeats)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A master and two workers of the default size (1 core, 2g) on free loopback ports; always stopped at the end."""
    state_dir = tmp_path_factory.mktemp("spark-cluster")
    port, webui, worker_1, worker_2 = _free_ports(4)
    handle = start_cluster(ClusterLayout(port, webui, (worker_1, worker_2)), state_dir)
    try:
        yield handle
    finally:
        stop_cluster(state_dir)


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> tuple[Path, TableConfig, TableConfig]:
    """``synthetic`` (the seed's shape, small: 1,000 + 1,000 rows) and ``orders`` (the checked-in deltas)."""
    root = tmp_path_factory.mktemp("tables")
    landing = root / "landing"
    generate(1000, 1000, 5, 10, 0.2, 0.4, 0.4, landing / DAYS[0], landing / DAYS[1], seed=13)
    configs = root / "configs"
    synthetic = write_table_config(configs, "synthetic", f"{landing}/{{date}}/", start_date=DAYS[0])
    orders_doc = yaml.safe_load((REPO / "table_configs" / "orders.yaml").read_text())
    orders_doc["source"]["path"] = str(REPO / "samples" / "orders" / "{date}.csv")
    (configs / "orders.yaml").write_text(yaml.safe_dump(orders_doc))
    return configs, synthetic, load_table_config(configs / "orders.yaml")


@pytest.fixture(scope="module")
def local_warehouse(spark, tables, tmp_path_factory) -> Path:
    """The same runs on local Spark (this process's session)."""
    _, synthetic, orders = tables
    configs = {"synthetic": synthetic, "orders": orders}
    warehouse = tmp_path_factory.mktemp("warehouse_local")
    instance = DagsterInstance.ephemeral()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_WAREHOUSE", str(warehouse))
        for names, dates in RUNS:
            defs = definitions_for(*(configs[name] for name in names))
            results = [run_range(defs, dates[0], dates[-1], instance)] if len(dates) > 1 else run_dates(defs, dates, instance)
            assert all(result.success for result in results)
    return warehouse


def _environment(root: Path, configs: Path, **spark) -> dict:
    home = root / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_REMOTE", "CDC_SPARK_MASTER", "CDC_SPARK_CONF")}
    env.update(PYTHONPATH=str(REPO), DAGSTER_HOME=str(home), CDC_TABLE_CONFIGS=str(configs), CDC_WAREHOUSE=str(root / "warehouse"),
               SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=NO_PYTHON, **spark)
    return env


def _materialize(env: dict, selection: str, *dates: str) -> None:
    """One run of ``dagster asset materialize``: one date, or a range (first, last) as a single-run backfill."""
    partition = ["--partition", dates[0]] if len(dates) == 1 else ["--partition-range", f"{dates[0]}...{dates[-1]}"]
    command = [str(REPO / ".venv/bin/dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions", "--select", selection, *partition]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "RUN_SUCCESS" in done.stderr + done.stdout, (done.stdout + done.stderr)[-6000:]


def _outputs(spark, warehouse: Path, table: str, day: str | None = None) -> dict:
    """Every row of every asset (one date's, or all dates'), audit columns left out."""
    return {asset: sorted_rows(spark, partition_dir(warehouse, table, asset, day) if day else stored_asset(warehouse, table, asset)) for asset in ASSETS}


def _applications(cluster) -> dict[str, dict]:
    state = master_state(cluster)
    return {app["id"]: app for app in state.get("activeapps", []) + state.get("completedapps", [])}


def _tasks_finished_by_executors(cluster, app_id: str) -> dict[str, int]:
    """Worker -> tasks its executors of ``app_id`` finished, from the executors' own logs."""
    return {
        stderr.parts[-4]: stderr.read_text(errors="replace").count("Executor: Finished task")
        for stderr in sorted(cluster.work_dir.glob(f"*/{app_id}/*/stderr"))
    }


def _wait_until_finished(cluster, app_ids: set[str], timeout: float = 60) -> dict[str, dict]:
    """The master marks an application finished once its driver has gone; that may take a moment."""
    deadline = time.monotonic() + timeout
    while True:
        apps = _applications(cluster)
        if all(apps.get(app_id, {}).get("state") == "FINISHED" for app_id in app_ids) or time.monotonic() > deadline:
            return apps
        time.sleep(0.5)


def test_a_run_through_a_connect_server_on_the_cluster_equals_local_spark(spark, tables, local_warehouse, cluster, tmp_path, monkeypatch):
    configs, _, _ = tables
    server_dir = tmp_path / "spark-server"
    before = set(_applications(cluster))
    monkeypatch.setenv("PYSPARK_PYTHON", NO_PYTHON)  # the server's executors, too, run no Python
    server = start_server(port=_free_ports(1)[0], state_dir=server_dir, master=cluster.master_url, conf={"spark.ui.enabled": "false", **QUICK_JIT})
    try:
        (server_app,) = set(_applications(cluster)) - before
        started_with = _tasks_finished_by_executors(cluster, server_app)
        env = _environment(tmp_path, configs, SPARK_REMOTE=server.client_url, CDC_SPARK_CONF='{"spark.sql.shuffle.partitions": "4"}')
        _materialize(env, "group:orders", DAYS[0])
        apps = _applications(cluster)
        assert apps[server_app]["state"] == "RUNNING" and apps[server_app]["name"] == "cdc_assets Spark Connect server"
        finished = _tasks_finished_by_executors(cluster, server_app)
    finally:
        stop_server(server_dir)

    # The server's executors, one on each worker, ran the run's tasks.
    assert sorted(finished) == ["worker-1", "worker-2"], finished
    assert sum(finished.values()) > sum(started_with.values()), (started_with, finished)
    warehouse = Path(env["CDC_WAREHOUSE"])
    assert _outputs(spark, warehouse, "orders", DAYS[0]) == _outputs(spark, local_warehouse, "orders", DAYS[0])


def test_the_daemons_listen_on_loopback_only_and_their_uis_cannot_kill(cluster):
    import psutil

    for name, pid in cluster.pids.items():
        daemon = psutil.Process(pid)
        listening = [conn.laddr for process in (daemon, *daemon.children(recursive=True))
                     for conn in process.net_connections(kind="inet") if conn.status == psutil.CONN_LISTEN]  # fmt: skip
        assert listening and {address.ip for address in listening} <= {"127.0.0.1", "::ffff:127.0.0.1"}, (name, listening)
    # With spark.ui.killEnabled the master's UI has a handler at /app/kill (which refused this request with 403);
    # without it there is none.
    request = urllib.request.Request(f"{cluster.webui_url}/app/kill/?id=app-none&terminate=true", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code in (404, 405)


@pytest.mark.lake
def test_the_same_runs_on_the_cluster_against_the_lake_equal_local_spark(spark, tables, local_warehouse, cluster, tmp_path, monkeypatch, lake):
    """Both shapes of run (``RUNS``) on the cluster, by configuration alone (``CDC_SPARK_MASTER``), each an
    application whose executors on both workers ran its tasks. The extracts, the warehouse's records and the
    tables (a REST catalog) all in a lake (SeaweedFS on loopback): the executors read and write the buckets
    themselves, with the keys of their own environment. (A cluster writing a local folder: the Connect test
    above. The same runs on a local folder were a test of their own until 2026-12-07: the lake's runs assert
    all it did.)"""
    from resources.storage import WarehouseStorage
    from tests.lake import lake_variables, pointed_at, upload

    configs, synthetic, _ = tables
    variables = lake_variables(lake)
    extracts = tmp_path / "extracts"
    shutil.copytree(Path(synthetic.source.path_for(DAYS[0])).parent, extracts / "synthetic")
    shutil.copytree(REPO / "samples" / "orders", extracts / "orders")
    upload(extracts, lake)
    lake_configs = tmp_path / "configs"
    write_table_config(lake_configs, "synthetic", "synthetic/{date}/", start_date=DAYS[0])
    orders_doc = yaml.safe_load((configs / "orders.yaml").read_text())
    orders_doc["source"]["path"] = "orders/{date}.csv"
    (lake_configs / "orders.yaml").write_text(yaml.safe_dump(orders_doc))
    env = {**_environment(tmp_path, lake_configs, CDC_SPARK_MASTER=cluster.master_url, CDC_SPARK_CONF=RUN_CONF), **variables}
    assert len(registered_workers(cluster)) == 2
    before = set(_applications(cluster))
    for names, dates in RUNS:
        _materialize(env, ",".join(f"group:{name}" for name in names), *dates)
    assert not (tmp_path / "warehouse").exists(), "nothing of the runs is a local file"

    # One application per run, each with an executor on both workers that ran its tasks.
    run_apps = set(_applications(cluster)) - before
    assert len(run_apps) == len(RUNS)
    apps = _wait_until_finished(cluster, run_apps)
    for app_id in run_apps:
        assert apps[app_id]["state"] == "FINISHED", apps[app_id]
        finished = _tasks_finished_by_executors(cluster, app_id)
        assert sorted(finished) == ["worker-1", "worker-2"], finished
        assert sum(finished.values()) > 0, finished
    assert running_cluster(cluster.state_dir) is not None

    local = WarehouseStorage(str(local_warehouse))
    with pointed_at(monkeypatch, variables):
        on_lake = WarehouseStorage(variables["CDC_WAREHOUSE"])
        for table in ("synthetic", "orders"):
            for asset in ASSETS:
                days = local.stored_dates(table, asset)
                assert on_lake.stored_dates(table, asset) == days, (table, asset)
                rows = [sorted_rows(spark, partition_dir(local_warehouse, table, asset, day)) for day in days]
                assert [_lake_rows(spark, on_lake, table, asset, day) for day in days] == rows, (table, asset)
    # Not vacuous: the seed's changes on day 2, and rows a delta did not supply kept as X.
    assert operation_counts(spark, partition_dir(local_warehouse, "synthetic", "history_partition", DAYS[1])) == {"I": 200, "U": 400, "D": 200}
    assert "X" in operation_counts(spark, stored_asset(local_warehouse, "orders", "current_table"))


def _lake_rows(spark, storage, table: str, asset: str, day: str) -> list[tuple]:
    from tests.pipeline import AUDIT_COLUMNS

    frame = storage.read_one(spark, table, asset, day).drop(*AUDIT_COLUMNS)
    return sorted((tuple(row) for row in frame.collect()), key=repr)
