"""The SQL catalog through the real tools: spark-sql, the Spark Thrift server with beeline, and runs.

A backfill, a re-run of a date, two tables' runs in separate JVMs while the SQL server holds the
metastore, and a fresh machine (the catalog folder deleted): each time the catalog must show exactly
what the warehouse holds. tests/test_catalog_server.py checks that no name goes missing meanwhile.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from cdc_assets.usecases.catalog_ddl import catalog_dir
from cdc_assets.model.config import load_table_config
from cdc_assets.usecases.readers import scd2_view
from cdc_assets.engines.process import free_port
from cdc_assets.engines.spark_home import spark_env
from cdc_assets.cli.sql_server import CONNECT_PORT_FILE, PID_FILE, CatalogBusy, beeline_command, hold_catalog, password_file, server_state_dir
from resources.storage import WarehouseStorage
from resources.storage.tables import STAGING_PREFIX
from tests.pipeline import definitions_for, run_dates, run_range
from tests.test_listening import LOOPBACK, _listening, _tree

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"
ORDERS_DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
ACCOUNTS_DAY = "2024-02-01"
_PROMPT = re.compile(r"^\d+: jdbc:hive2://\S+> ")


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """orders backfilled for its first two dates (one run) into a temp warehouse; accounts configured, not run."""
    root = tmp_path_factory.mktemp("catalog")
    configs = root / "configs"
    configs.mkdir()
    for name in ("orders", "accounts"):
        shutil.copy(REPO / "table_configs" / f"{name}.yaml", configs / f"{name}.yaml")
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    with DagsterInstance.from_config(str(home)):
        pass  # the instance's storage exists before a CLI run starts
    env = {key: value for key, value in os.environ.items() if key != "SPARK_REMOTE"}
    env.update(
        PYTHONPATH=str(REPO), DAGSTER_HOME=str(home), CDC_TABLE_CONFIGS=str(configs), CDC_DATA_ROOT=str(REPO),
        CDC_WAREHOUSE=str(root / "warehouse"), CDC_SQL_SERVER_DIR=str(root / "sql-server"),
        CDC_SPARK_CONF='{"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "spark.driver.memory": "1g"}',
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for key in ("CDC_TABLE_CONFIGS", "CDC_DATA_ROOT", "CDC_WAREHOUSE"):
            patch.setenv(key, env[key])
        defs = definitions_for(load_table_config(configs / "orders.yaml"))
        assert run_range(defs, ORDERS_DAYS[0], ORDERS_DAYS[1]).success
    yield env
    subprocess.run([str(BIN / "cdc-catalog"), "server", "stop"], env=env, capture_output=True)


def _storage(env) -> WarehouseStorage:
    return WarehouseStorage(env["CDC_WAREHOUSE"])


def _spark_sql(env, *queries: str) -> list[list[list[str]]]:
    """Rows of each query, all run by one ``cdc-catalog sql -S -e`` (spark-sql on the catalog: a JVM each time)."""
    separator = "---next query---"
    batch = f"; SELECT '{separator}'; ".join(queries)
    done = subprocess.run([str(BIN / "cdc-catalog"), "sql", "-S", "-e", batch], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    results: list[list[list[str]]] = [[]]
    for line in done.stdout.splitlines():
        if line.strip() == separator:
            results.append([])
        elif line.strip():
            results[-1].append(line.split("\t"))
    assert len(results) == len(queries), done.stdout[-3000:]
    return results


def _beeline(env, port: int, query: str) -> list[list[str]]:
    """Rows of ``query`` through the SQL server, with pyspark's beeline as a JDBC client would send it (header dropped)."""
    command = beeline_command(port, "cdc", ["--silent=true", "--outputformat=tsv2", "-e", query], password_file(_server_state(env)))
    done = subprocess.run(command, env={**spark_env(), **env}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    lines = [_PROMPT.sub("", line) for line in done.stdout.splitlines()]
    return [line.split("\t") for line in lines if line.strip()][1:]


def _staged_current_dates(storage: WarehouseStorage) -> set[str]:
    """The dates ``current_table`` holds on any run's staging branch (pyiceberg, read fresh)."""
    loaded = storage.tables.load("orders", "current_table")
    return {
        day
        for name, ref in loaded.metadata.refs.items() if name.startswith(STAGING_PREFIX)
        for day in storage.tables.stored("orders", "current_table", loaded.snapshot_by_id(ref.snapshot_id))
    }


def _server_state(env) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        for key in ("CDC_WAREHOUSE", "CDC_SQL_SERVER_DIR"):
            if key in env:
                patch.setenv(key, env[key])
        return server_state_dir(catalog_dir(_storage(env)))


def _counts_by_date(rows: list[list[str]]) -> dict[str, int]:
    return {day: int(count) for day, count in rows}


def _stored_counts(env, table: str, asset: str) -> dict[str, int]:
    storage = _storage(env)
    return storage.row_counts(table, asset, storage.stored_dates(table, asset))


def _materialize(env, table: str, day: str, log=subprocess.PIPE) -> subprocess.Popen:
    """``dagster asset materialize`` of the table's group for ``day``; its output to ``log`` (a file while
    the caller polls: a pipe nobody reads would fill and stop the run)."""
    command = [str(BIN / "dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions", "--select", f"group:{table}", "--partition", day]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)


def test_spark_sql_reads_every_table_of_a_backfill_by_name(spark, lake):
    shown, current, history, latest, (versions,), (logged,) = _spark_sql(
        lake,
        "SHOW TABLES IN cdc",
        "SELECT business_date, count(*) FROM cdc.orders_current GROUP BY 1 ORDER BY 1",
        "SELECT business_date, count(*) FROM cdc.orders_history GROUP BY 1 ORDER BY 1",
        "SELECT business_date, count(*) FROM cdc.orders_latest GROUP BY 1",
        "SELECT count(*) FROM cdc.orders_scd2",
        "SELECT count(*) FROM cdc.runs_log WHERE `table` = 'orders' AND status = 'succeeded'",
    )
    tables = {row[-2] if len(row) > 2 else row[0] for row in shown}
    assert {"orders_current", "orders_history", "orders_latest", "orders_scd2", "runs_log"} <= tables
    assert not {name for name in tables if name.startswith("accounts_")}  # configured, nothing stored yet

    assert _counts_by_date(current) == _stored_counts(lake, "orders", "current_table")
    assert list(_counts_by_date(current)) == ORDERS_DAYS[:2]
    assert _counts_by_date(history) == _stored_counts(lake, "orders", "history_partition")
    assert latest == [[ORDERS_DAYS[1], str(_stored_counts(lake, "orders", "current_table")[ORDERS_DAYS[1]])]]

    with pytest.MonkeyPatch.context() as patch:
        for key in ("CDC_TABLE_CONFIGS", "CDC_WAREHOUSE"):
            patch.setenv(key, lake[key])
        expected_versions = scd2_view(spark, "orders").count()
    assert int(versions[0]) == expected_versions > 0
    assert int(logged[0]) == 2  # one row per date of the backfill


def test_sql_server_sees_reruns_and_new_commits_while_two_tables_run(spark, lake):
    storage = _storage(lake)
    with pytest.MonkeyPatch.context() as patch:
        for key in ("CDC_TABLE_CONFIGS", "CDC_DATA_ROOT", "CDC_WAREHOUSE"):
            patch.setenv(key, lake[key])
        defs = definitions_for(load_table_config(Path(lake["CDC_TABLE_CONFIGS"]) / "orders.yaml"))
        (rerun,) = run_dates(defs, [ORDERS_DAYS[1]])  # replaces every partition of the date
    assert rerun.success

    port = free_port()
    started = subprocess.run([str(BIN / "cdc-catalog"), "server", "start", "--port", str(port)], env=lake, capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, started.stderr[-5000:]
    assert started.stdout.strip() == f"jdbc:hive2://127.0.0.1:{port}/cdc"

    # The server holds the metastore: another opener is told who does, rather than getting Derby's error.
    with pytest.raises(CatalogBusy, match=f"the SQL server on 127.0.0.1:{port}"):
        hold_catalog(catalog_dir(storage), "a test")
    # The server's JVM listens on loopback only: Thrift, and Spark Connect, the syncs' way into its metastore.
    state = _server_state(lake)
    listening = _listening(_tree(int((state / PID_FILE).read_text())))
    assert {port, int((state / CONNECT_PORT_FILE).read_text())} <= {bound for _, _, bound in listening}, listening
    assert {address for _, address, _ in listening} <= LOOPBACK, listening

    # The replaced date as the re-run committed it, not the old files (still in the date's data folder
    # until they are expired) nor a mix: I and U rows carry the re-run's id, N and X rows keep the writer
    # of their stored version (README, "Audit columns").
    query = f"SELECT process_id, count(*) FROM orders_current WHERE business_date = DATE '{ORDERS_DAYS[1]}' GROUP BY 1"
    on_disk = storage.read(spark, "orders", "current_table", [ORDERS_DAYS[1]]).groupBy("process_id").count().collect()
    writers = {process_id: int(count) for process_id, count in _beeline(lake, port, query)}
    assert writers == {row["process_id"]: row["count"] for row in on_disk}
    assert rerun.run_id in writers
    current = _beeline(lake, port, "SELECT business_date, count(*) FROM orders_current GROUP BY 1 ORDER BY 1")
    assert _counts_by_date(current) == _stored_counts(lake, "orders", "current_table")

    # Write, audit, publish, seen through the SQL endpoint: a run of orders' date 3 whose declared check
    # fails. Polled all along the run, and while date 3 is staged on the run's branch (written, its checks
    # running or failed), the endpoint never shows date 3 in any output; the fixed run below publishes it.
    refusing = Path(lake["CDC_TABLE_CONFIGS"]).parent / "configs_refusing"
    refusing.mkdir()
    document = yaml.safe_load((Path(lake["CDC_TABLE_CONFIGS"]) / "orders.yaml").read_text())
    document["checks"] = [{"type": "sql", "name": "refuse_every_row", "predicate": "true"}]
    (refusing / "orders.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    log = refusing / "run.log"
    with log.open("w") as written:
        failing = _materialize({**lake, "CDC_TABLE_CONFIGS": str(refusing)}, "orders", ORDERS_DAYS[2], written)
    polls: list[tuple[bool, set[str]]] = []
    ended = False
    while not ended:  # all along the run, and once after it: the failed run's branch keeps date 3 staged
        ended = failing.poll() is not None
        staged = _staged_current_dates(storage)  # before the query: staged then, still unpublished after
        # One query, one beeline JVM a poll: each JVM's start is most of a poll's CPU.
        both = "SELECT business_date FROM orders_current UNION SELECT business_date FROM orders_history"
        seen = {row[0] for row in _beeline(lake, port, both)}
        polls.append((ORDERS_DAYS[2] in staged, seen))
    failing.wait(timeout=60)
    output = log.read_text()
    assert failing.returncode != 0 and "refuse_every_row" in output, output[-6000:]
    assert any(was_staged for was_staged, _ in polls), polls  # at least one poll while date 3 sat staged
    assert all(ORDERS_DAYS[2] not in seen for _, seen in polls), polls
    assert ORDERS_DAYS[2] in _staged_current_dates(storage)  # kept on the failed run's branch
    current = _beeline(lake, port, "SELECT business_date, count(*) FROM orders_current GROUP BY 1 ORDER BY 1")
    assert list(_counts_by_date(current)) == ORDERS_DAYS[:2]

    # Two tables' runs at once, each in a JVM of its own, while the server holds the metastore: orders
    # through the CLI (date 3 again, its check as shipped: published), accounts in this process's session.
    orders_run = _materialize(lake, "orders", ORDERS_DAYS[2])
    with pytest.MonkeyPatch.context() as patch:
        for key in ("CDC_TABLE_CONFIGS", "CDC_DATA_ROOT", "CDC_WAREHOUSE"):
            patch.setenv(key, lake[key])
        (accounts_run,) = run_dates(definitions_for(load_table_config(Path(lake["CDC_TABLE_CONFIGS"]) / "accounts.yaml")), [ACCOUNTS_DAY])
    output, _ = orders_run.communicate(timeout=900)
    assert orders_run.returncode == 0, output[-6000:]
    assert accounts_run.success

    # orders' new date is there without any registration: each query reads the Iceberg table's current snapshot.
    current = _beeline(lake, port, "SELECT business_date, count(*) FROM orders_current GROUP BY 1 ORDER BY 1")
    assert list(_counts_by_date(current)) == ORDERS_DAYS
    assert _counts_by_date(current) == _stored_counts(lake, "orders", "current_table")
    # accounts is a new table: it appears with the next sync, which goes through the server.
    assert not [row for row in _beeline(lake, port, "SHOW TABLES IN cdc") if "accounts_current" in row]
    synced = subprocess.run([str(BIN / "cdc-catalog"), "sync"], env=lake, capture_output=True, text=True, timeout=600)
    assert synced.returncode == 0, synced.stderr[-5000:]
    accounts = _beeline(lake, port, "SELECT business_date, count(*) FROM accounts_current GROUP BY 1")
    assert _counts_by_date(accounts) == _stored_counts(lake, "accounts", "current_table") != {}

    stopped = subprocess.run([str(BIN / "cdc-catalog"), "server", "stop"], env=lake, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0 and "stopped" in stopped.stderr
    os.close(hold_catalog(catalog_dir(storage), "a test"))  # the lock went with the server

    # A fresh machine: no metastore at all, the same warehouse. Every partition of both tables is back.
    shutil.rmtree(catalog_dir(storage))
    current, history = _spark_sql(
        lake,
        "SELECT business_date, count(*) FROM cdc.orders_current GROUP BY 1 ORDER BY 1",
        "SELECT business_date, count(*) FROM cdc.accounts_history GROUP BY 1",
    )
    assert _counts_by_date(current) == _stored_counts(lake, "orders", "current_table")
    assert _counts_by_date(history) == _stored_counts(lake, "accounts", "history_partition")
