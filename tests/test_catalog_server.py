"""The SQL server never serves a catalog with names missing: not the moment it listens, not during a sync.

A client that is connected the moment the port opens, over three starts of one warehouse and metastore
(the first on no metastore, the others on the one the first left); and a client querying in a loop while
syncs run, one of which adds the column a config gained.
"""

from __future__ import annotations

import getpass
import os
import queue
import re
import subprocess
import threading
import time
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cdc_assets.engines.process import free_port, port_accepts
from cdc_assets.engines.spark_home import spark_env, spark_home
from cdc_assets.cli.sql_server import PASSWORD_FILE, beeline_command, run_beeline
from resources.storage import WarehouseStorage

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"
TABLE = "tiny"
OBJECTS = [f"{TABLE}_current", f"{TABLE}_history", f"{TABLE}_latest", f"{TABLE}_scd2", "runs_log"]
# The first start creates every object, the second and third find them in the metastore and sync in place:
# both cases, the second one twice. The server syncs before it listens, so no start races another.
STARTS = 3
DAY_1, DAY_2 = "2024-01-01", "2024-01-02"
CONFIG = {
    "name": TABLE,
    "start_date": DAY_1,
    "load_type": "full",
    "source": {"path": "data/{date}.csv", "format": "csv"},
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}],
}
# What a run stores on each date (the columns the catalog reads; a run stores more): (id, name, key_hash, operation).
DAY_1_ROWS = [(1, "a", "h1", "I"), (2, "b", "h2", "I")]
DAY_1_SCHEMA = "id int, name string, key_hash string, operation string"
# Day 2 was written after the config gained the column "extra" (after business_date: the storage's Iceberg
# write refuses a new column before one the table has, see tests/test_catalog_sync.py).
DAY_2_ROWS = [(1, "a", "h1", "U", date(2024, 1, 2), 1.5), (3, "c", "h3", "I", date(2024, 1, 2), 2.5)]
DAY_2_SCHEMA = "id int, name string, key_hash string, operation string, business_date date, extra double"
_ROW = re.compile(r"(?:^|> )(\w+)\t(-?\d+)$")


def _store(spark, warehouse: Path, day: str, rows: list[tuple], schema: str) -> None:
    """``rows`` as the date of both assets, one Iceberg commit each (what a run does)."""
    storage = WarehouseStorage(str(warehouse))
    for asset in ("current_table", "history_partition"):
        storage.write(spark.createDataFrame(rows, schema), TABLE, asset, [day])
    storage.release()


@pytest.fixture(scope="module")
def tiny_lake(spark, tmp_path_factory):
    """A warehouse holding one date of a two-column table and one runs log row; the env of its CLI."""
    root = tmp_path_factory.mktemp("catalog_server")
    configs = root / "configs"
    configs.mkdir()
    (configs / f"{TABLE}.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    warehouse = root / "warehouse"
    _store(spark, warehouse, DAY_1, DAY_1_ROWS, DAY_1_SCHEMA)
    (warehouse / "_runs").mkdir()
    pq.write_table(pa.table({"table": [TABLE], "business_date": [DAY_1], "status": ["succeeded"]}), warehouse / "_runs" / f"{TABLE}-1.parquet")
    env = {key: value for key, value in os.environ.items() if key != "SPARK_REMOTE"}
    env.update(
        PYTHONPATH=str(REPO), CDC_TABLE_CONFIGS=str(configs), CDC_WAREHOUSE=str(warehouse), CDC_SPARK_MASTER="local[1]",
        CDC_SQL_SERVER_DIR=str(root / "sql-server"),
        # C1 only: a server that lives for a few queries starts faster without the optimizing compiler.
        CDC_SPARK_CONF='{"spark.sql.shuffle.partitions": "1", "spark.ui.enabled": "false", "spark.driver.memory": "1g", '
                       '"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}',
    )  # fmt: skip
    yield env
    _cli(env, "server", "stop")


def _cli(env, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "cdc-catalog"), *args], env=env, capture_output=True, text=True, timeout=timeout)


class Client:
    """pyspark's beeline, its JVM up before the server listens: it connects and queries at once.

    Each query answers with a row ``name<TAB>count`` or with an error line; beeline goes on after errors.
    """

    def __init__(self, env):
        self.env = env
        command = [os.path.join(spark_home(), "bin", "beeline"), "--silent=true", "--showHeader=false", "--outputformat=tsv2"]
        self.process = subprocess.Popen(command, env={**env, **spark_env()}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, bufsize=1)  # fmt: skip
        self.answers: queue.Queue[tuple[str, str]] = queue.Queue()
        self.errors: list[str] = []
        threading.Thread(target=self._read, args=(self.process.stdout, False), daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stderr, True), daemon=True).start()

    def _read(self, stream, is_stderr: bool) -> None:
        for line in stream:
            line = line.rstrip("\n")
            row = _ROW.search(line)
            if row:
                self.answers.put((row.group(1), row.group(2)))
            elif is_stderr and line.startswith(("Error:", "No current connection")):
                self.errors.append(line)
                self.answers.put(("error", line))

    def send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def connect(self, port: int) -> None:
        password = (Path(self.env["CDC_SQL_SERVER_DIR"]) / PASSWORD_FILE).read_text().strip()  # on stdin, not a command line
        self.send(f"!connect jdbc:hive2://127.0.0.1:{port}/cdc {getpass.getuser()} {password}")

    def counts(self, queries: dict[str, str], timeout: float = 300) -> dict[str, str]:
        """Each query's answer: its count, or the error line in place of it."""
        for name, sql in queries.items():
            self.send(f"SELECT '{name}', {sql};")
        answers = {}
        for _ in queries:
            kind, value = self.answers.get(timeout=timeout)
            answers[kind if kind != "error" else f"error {len(answers)}"] = value
        return answers

    def close(self) -> None:
        self.send("!quit")
        self.process.communicate(timeout=60)


def _count_every_object() -> dict[str, str]:
    return {name: f"count(*) FROM cdc.{name}" for name in OBJECTS}


def _expected_counts() -> dict[str, str]:
    rows = len(DAY_1_ROWS)  # one date: every key is current, latest and one open version
    return {f"{TABLE}_current": str(rows), f"{TABLE}_history": str(rows), f"{TABLE}_latest": str(rows), f"{TABLE}_scd2": str(rows), "runs_log": "1"}


def _every_name_the_moment_each_start_listens(tiny_lake) -> int:
    """Three starts over one metastore; each time a client queries every object as soon as the port opens.
    Each server is stopped but the last, which serves on: its port."""
    expected = _expected_counts()
    client = Client(tiny_lake)  # one client JVM for every start, connected anew to each server
    try:
        for start in range(STARTS):
            port = free_port()
            starting = subprocess.Popen([str(BIN / "cdc-catalog"), "server", "start", "--port", str(port)], env=tiny_lake,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            serves_on = False
            try:
                while not port_accepts(port):
                    assert starting.poll() is None, starting.communicate()[1][-5000:]
                    time.sleep(0.02)
                client.connect(port)
                answers = client.counts(_count_every_object())
                client.send("!close")
                url, errors = starting.communicate(timeout=600)
                assert starting.returncode == 0, errors[-5000:]
                assert url.strip() == f"jdbc:hive2://127.0.0.1:{port}/cdc", url
                assert answers == expected, f"start {start + 1}: {answers}"
                serves_on = start == STARTS - 1
            finally:
                if not serves_on:
                    stopped = _cli(tiny_lake, "server", "stop")
                    assert stopped.returncode == 0 and "stopped" in stopped.stderr, stopped.stderr
    finally:
        client.close()
    return port


def _created(env, port: int) -> dict[str, str]:
    """Each object's creation time in the metastore: what a sync that dropped and re-created it changes."""
    statements = " ".join(f"DESCRIBE TABLE EXTENDED cdc.{name};" for name in OBJECTS)
    command = beeline_command(port, "cdc", ["--silent=true", "--showHeader=false", "--outputformat=tsv2", "-e", statements],
                              Path(env["CDC_SQL_SERVER_DIR"]) / PASSWORD_FILE)  # fmt: skip
    done = subprocess.run(command, env={**env, **spark_env()}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    created = [line.split("\t")[1] for line in done.stdout.splitlines() if line.split("\t")[0].endswith("Created Time")]
    assert len(created) == len(OBJECTS), done.stdout[-3000:]
    return dict(zip(OBJECTS, created))


def test_every_name_is_there_at_each_start_and_during_syncs_and_a_gained_column_reads_null_on_older_dates(spark, tiny_lake):
    """The starts' test, then, on the server of its last start (one start fewer than a test each), a reader
    querying in a loop while syncs run."""
    port = _every_name_the_moment_each_start_listens(tiny_lake)

    # The table gained a column: its config lists it, and a date stored since has it.
    _store(spark, Path(tiny_lake["CDC_WAREHOUSE"]), DAY_2, DAY_2_ROWS, DAY_2_SCHEMA)
    config = Path(tiny_lake["CDC_TABLE_CONFIGS"]) / f"{TABLE}.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "non_keys": [*CONFIG["non_keys"], {"name": "extra", "type": "double"}]}, sort_keys=False))

    created = _created(tiny_lake, port)
    client = Client(tiny_lake)
    client.connect(port)
    syncing = threading.Event()
    done = threading.Event()
    rounds: list[tuple[bool, dict[str, str]]] = []

    def read_in_a_loop():
        while not done.is_set():
            began_syncing = syncing.is_set()
            answers = client.counts(_count_every_object())
            rounds.append((began_syncing or syncing.is_set(), answers))

    reader = threading.Thread(target=read_in_a_loop)
    reader.start()
    try:
        while not rounds:  # the reader is connected and answered once before the syncs begin
            time.sleep(0.1)
        syncing.set()
        for _ in range(2):  # the first adds the column, the second changes nothing
            synced = _cli(tiny_lake, "sync")
            assert synced.returncode == 0, synced.stderr[-5000:]
        syncing.clear()
    finally:
        done.set()
        reader.join(timeout=600)
    during = [answers for was_syncing, answers in rounds if was_syncing]
    assert during, "no query ran while a sync did"
    assert not client.errors, client.errors[:5]
    assert all(set(answers) == set(OBJECTS) for _, answers in rounds), rounds
    assert _created(tiny_lake, port) == created  # changed in place, never dropped

    # The column the config gained: NULL on the date stored before it, the stored values after.
    answers = client.counts({
        "day1_rows": f"count(*) FROM cdc.{TABLE}_current WHERE business_date = DATE '{DAY_1}'",
        "day1_extra": f"count(extra) FROM cdc.{TABLE}_current WHERE business_date = DATE '{DAY_1}'",
        "day2_extra": f"count(extra) FROM cdc.{TABLE}_current WHERE business_date = DATE '{DAY_2}'",
        "history_extra": f"count(extra) FROM cdc.{TABLE}_history",
        "scd2_extra": f"count(extra) FROM cdc.{TABLE}_scd2",
        "latest_extra": f"count(extra) FROM cdc.{TABLE}_latest",
    })  # fmt: skip
    client.close()
    with_extra = sum(row[-1] is not None for row in DAY_2_ROWS)
    assert answers == {
        "day1_rows": str(len(DAY_1_ROWS)), "day1_extra": "0", "day2_extra": str(with_extra),
        "history_extra": str(with_extra), "scd2_extra": str(with_extra), "latest_extra": str(with_extra),
    }  # fmt: skip


def test_a_batch_the_server_refused_runs_again(capfd, tmp_path):
    """beeline on a port where no server listens (yet): the batch is tried again, then its error passed on."""
    password = tmp_path / "password"
    password.write_text("unused")
    assert run_beeline(free_port(), "cdc", ["-e", "SELECT 1; SELECT 2"], password, attempts=2) != 0
    captured = capfd.readouterr()
    assert captured.err.count("rejected the statement (Could not open client transport); trying again") == 1
    assert "Connection refused" in captured.err  # the last attempt's own error, passed on


def test_a_stop_waits_for_the_catalog_lock_and_names_a_process_that_keeps_it(tmp_path):
    """`cdc-catalog server stop` says stopped only once the catalog can be opened: while another process
    holds the lock's descriptor it waits, then fails naming it; once that process is gone it returns."""
    from cdc_assets.cli.sql_server import LOCK_FILE, _wait_until_catalog_free, hold_catalog

    fd = hold_catalog(tmp_path, "a test's stand-in server")
    holder = subprocess.Popen(["sleep", "60"], pass_fds=(fd,))  # keeps the lock's open description
    os.close(fd)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=rf"pid {holder.pid} \(sleep 60\) still holds {re.escape(str(tmp_path / LOCK_FILE))}"):
            _wait_until_catalog_free(tmp_path, timeout=1)
        assert time.monotonic() - started >= 1
    finally:
        holder.kill()
        holder.wait()
    _wait_until_catalog_free(tmp_path, timeout=5)
    os.close(hold_catalog(tmp_path, "a test"))  # free again
