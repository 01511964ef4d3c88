"""Iceberg commits under faults and concurrency (issue 34): a run killed with ``kill -9`` while one of its
commits is in flight, and two writers of one table and date that the writer lock does not keep apart.

The pause inside a commit is real: the test holds the catalog's SQLite file with ``BEGIN IMMEDIATE``
(:class:`CatalogLock`), so a commit writes its data files, manifests and metadata file and then waits
at the catalog's ``UPDATE`` (the JDBC driver's busy timeout is 60 s), the very last step of a commit.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance
from pyspark.sql import functions as F

from cdc_assets.model.names import CDC_OUTPUTS, HASHED_INCOMING, REJECTS
from resources.storage import ConcurrentWriteError, WarehouseStorage, WriterLockTimeout
from resources.storage.lake import catalog_file
from resources.storage.tables import STAGING_PREFIX
from tests.pipeline import definitions_for, partition_dir, run_dates, sorted_rows, write_table_config
from tests.processes import tail

REPO = Path(__file__).resolve().parent.parent
TABLE = "shop"
DAY1, DAY2 = "2024-01-01", "2024-01-02"
ALL_ASSETS = (HASHED_INCOMING, REJECTS, *CDC_OUTPUTS)
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}


class CatalogLock:
    """A transaction on the catalog's SQLite file held by this (non-JVM) process. ``IMMEDIATE`` (a
    RESERVED lock): others still read the catalog, but a commit waits at its ``UPDATE``, every file written."""

    def __init__(self, root: Path, mode: str = "IMMEDIATE"):
        self.path, self.mode, self.connection = catalog_file(str(root)), mode, None

    def __enter__(self) -> "CatalogLock":
        self.connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.connection.execute(f"BEGIN {self.mode}")
        return self

    def release(self) -> None:
        if self.connection is not None:
            self.connection.execute("ROLLBACK")
            self.connection.close()
            self.connection = None

    def __exit__(self, *exc) -> None:
        self.release()


def _metadata_files(warehouse: Path, table: str, asset: str) -> set[str]:
    folder = warehouse / table / asset / "metadata"
    return {name for name in os.listdir(folder) if name.endswith(".metadata.json")} if folder.exists() else set()


def _wait_until(condition, timeout: float, what: str, processes=(), logs=()) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        ended = [process.returncode for process in processes if process.poll() is not None]
        if ended or time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached (exit codes {ended})\n" + "\n".join(tail(log, 60) for log in logs))
        time.sleep(0.2)


def _referenced_files(loaded) -> set[str]:
    """Every data file some snapshot of the table's history reads."""
    found = set()
    for snapshot in loaded.snapshots():
        for task in loaded.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            found.add(task.file.file_path.removeprefix("file:"))
    return {"/" + path.lstrip("/") for path in found}


def _data_files(warehouse: Path, table: str, asset: str, day: str) -> set[str]:
    folder = warehouse / table / asset / "data" / f"business_date={day}"
    return {str(path) for path in folder.glob("*.parquet")} if folder.exists() else set()


# --- in one process: the write is serializable from the snapshot the run read ---------------------


def test_a_write_of_a_date_another_writer_committed_since_the_run_read_fails_naming_the_conflict(spark, tmp_path, monkeypatch):
    """Two writers of one table that the lock does not keep apart (``flock`` a no-op, as on a file system
    without locks): the later writer of a date fails and commits nothing; other dates are not affected."""
    import fcntl

    warehouse = tmp_path / "warehouse"
    seed = WarehouseStorage(str(warehouse), run_id="seed")
    frame = spark.range(3).select(F.col("id").cast("int").alias("id"), F.lit("seed").alias("writer"))
    seed.write(frame, "t", "a", [DAY1])
    seed.release()
    seed_snapshot = seed.tables.load("t", "a").current_snapshot().snapshot_id

    monkeypatch.setattr(fcntl, "flock", lambda fd, operation: None)
    late = WarehouseStorage(str(warehouse), run_id="late")
    late.hold_writer_lock("t")  # becomes the writer: the table as it is now is what it writes from
    other = WarehouseStorage(str(warehouse), run_id="other")
    other.write(frame.withColumn("writer", F.lit("other")), "t", "a", [DAY1])
    with pytest.raises(ConcurrentWriteError) as raised:
        late.write(frame.withColumn("writer", F.lit("late")), "t", "a", [DAY1])
    message = str(raised.value)
    assert f"t/a: conflicting write of {DAY1}" in message and f"snapshot {seed_snapshot}" in message, message
    assert "nothing of this write was committed" in message and "ValidationException" in message, message
    loaded = late.tables.load("t", "a")
    assert [dict(s.summary.additional_properties).get("cdc.run-id") for s in loaded.snapshots()] == ["seed", "other"]
    assert {row.writer for row in late.read(spark, "t", "a", [DAY1]).collect()} == {"other"}
    # Another date is no conflict, and the run's own commit is its new base: its next write of the date passes.
    late.write(frame.withColumn("writer", F.lit("late")), "t", "a", [DAY2])
    late.write(frame.withColumn("writer", F.lit("late-again")), "t", "a", [DAY2])
    assert {row.writer for row in late.read(spark, "t", "a", [DAY2]).collect()} == {"late-again"}
    late.release()


# --- two processes, one table and date, at once ------------------------------------------------------

WRITER = """
import fcntl, sys, time
from pathlib import Path

# This writer's file system has no working locks (a second host, NFS without a lock manager): the
# warehouse's flock writer lock lets everyone in, and only Iceberg's validation keeps writers apart.
fcntl.flock = lambda fd, operation: None

from pyspark.sql import functions as F
from resources.session.spark_session import build_spark_session
from resources.storage import ConcurrentWriteError, WarehouseStorage

root, name, day, barrier = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
spark = build_spark_session(master="local[1]", conf=%(conf)r, app_name=name)
storage = WarehouseStorage(root, run_id=name)
storage.hold_writer_lock("t")
# Read the date as stored, and compute this writer's own content for it.
rows = storage.read(spark, "t", "a", [day]).select("id", F.lit(name).alias("writer"), (F.col("n") + F.lit(%(step)s)).alias("n"))
rows.count()
(barrier / (name + ".ready")).touch()
while not (barrier / "go").exists():
    time.sleep(0.05)
try:
    storage.write(rows.withColumn("business_date", F.lit(day).cast("date")), "t", "a", [day])
except ConcurrentWriteError as error:
    print("CONFLICT", error, flush=True)
    sys.exit(3)
print("COMMITTED", flush=True)
"""


@pytest.mark.slow
def test_two_processes_writing_one_table_and_date_at_once_one_wins_whole_and_the_other_fails_naming_the_conflict(spark, tmp_path):
    """Two Python processes, each with its own JVM, sharing nothing but the warehouse folder and its
    catalog, bypass the writer lock (their ``flock`` is a no-op: a second host, or NFS without locks),
    read the same date, compute different contents for it and commit at the same moment: both commits
    wait at the catalog's UPDATE (the test holds it), then go at once. Exactly one lands, whole; the
    other fails naming the conflict and nothing of it is in any snapshot of the table's history."""
    warehouse = tmp_path / "warehouse"
    seed = WarehouseStorage(str(warehouse), run_id="seed")
    rows = spark.range(20).select(F.col("id").cast("int").alias("id"), F.lit("seed").alias("writer"), F.col("id").cast("int").alias("n"))
    seed.write(rows.withColumn("business_date", F.lit(DAY1).cast("date")).unionByName(
        rows.withColumn("business_date", F.lit(DAY2).cast("date"))), "t", "a", [DAY1, DAY2])
    seed.release()
    seed_snapshot = seed.tables.load("t", "a").current_snapshot().snapshot_id
    before = _metadata_files(warehouse, "t", "a")

    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1", "TZ": "UTC"}
    writers, logs = {}, {}
    for name, step in (("writer-a", 100), ("writer-b", 200)):
        logs[name] = tmp_path / f"{name}.log"
        with logs[name].open("w") as log:
            writers[name] = subprocess.Popen(
                [sys.executable, "-c", WRITER % {"conf": SPARK_CONF, "step": step}, str(warehouse), name, DAY1, str(barrier)],
                env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
    try:
        _wait_until(lambda: len(list(barrier.glob("*.ready"))) == 2, 300, "both writers read the date",
                    writers.values(), logs.values())
        with CatalogLock(warehouse) as lock:
            (barrier / "go").touch()
            # Both commits wrote their metadata file and wait at the catalog's UPDATE: in flight at once.
            _wait_until(lambda: len(_metadata_files(warehouse, "t", "a") - before) >= 2, 45, "both commits in flight",
                        writers.values(), logs.values())
            lock.release()
        codes = {name: writer.wait(timeout=300) for name, writer in writers.items()}
    finally:
        for writer in writers.values():
            if writer.poll() is None:
                os.killpg(writer.pid, signal.SIGKILL)
                writer.wait(timeout=60)

    outputs = {name: logs[name].read_text() for name in writers}
    # Without a serializable write both would commit, the later silently replacing the earlier (a lost update).
    assert sorted(codes.values()) == [0, 3], {name: tail(logs[name], 20) for name in writers}
    [winner] = [name for name, code in codes.items() if code == 0]
    [loser] = [name for name, code in codes.items() if code == 3]
    assert "COMMITTED" in outputs[winner], outputs[winner][-3000:]
    conflict = next(line for line in outputs[loser].splitlines() if line.startswith("CONFLICT"))
    assert f"t/a: conflicting write of {DAY1}" in conflict and f"at snapshot {seed_snapshot}" in conflict, outputs[loser][-3000:]
    assert "ValidationException" in outputs[loser] and "Found conflicting files" in outputs[loser]

    storage = WarehouseStorage(str(warehouse))
    loaded = storage.tables.load("t", "a")
    history = [(snapshot.snapshot_id, snapshot.summary.additional_properties.get("cdc.run-id")) for snapshot in loaded.snapshots()]
    assert [run for _, run in history] == ["seed", winner]  # one commit of the date landed: the winner's
    # At every snapshot of the history the date is wholly one writer's rows: never mixed, never both.
    for snapshot_id, run in history:
        stored = loaded.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
        day1 = [row for row in stored if str(row["business_date"]) == DAY1]
        assert {row["writer"] for row in day1} == {run} and len(day1) == 20, (run, len(day1))
        day2 = [row for row in stored if str(row["business_date"]) == DAY2]
        assert {row["writer"] for row in day2} == {"seed"} and len(day2) == 20
    step = 100 if winner == "writer-a" else 200
    current = sorted((row.id, row.writer, row.n) for row in storage.read(spark, "t", "a", [DAY1]).collect())
    assert current == [(i, winner, i + step) for i in range(20)]
    # Nothing of the loser is readable: its run is in no snapshot (above), and Spark's abort of the failed
    # write deleted its data file, so every data file of the date is one a snapshot reads (the seed's, the winner's).
    assert _data_files(warehouse, "t", "a", DAY1) == _referenced_files(loaded) & _data_files(warehouse, "t", "a", DAY1)
    assert len(_data_files(warehouse, "t", "a", DAY1)) == 2


# --- kill -9 of a run inside a commit ----------------------------------------------------------------

RUN_ONE_DATE = """
import sys
from dagster import DagsterInstance
from cdc_assets.model.config import load_table_config
from tests.pipeline import definitions_for

job = definitions_for(load_table_config(sys.argv[1])).resolve_implicit_global_asset_job_def()
job.execute_in_process(partition_key=sys.argv[2], instance=DagsterInstance.ephemeral())
"""

HEADER = "id,name,qty,amount\n"
COLUMNS = {
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}, {"name": "qty", "type": "int"}, {"name": "amount", "type": "decimal(10,2)"}],
}


def _csv(*ids: int, qty_offset: int = 0) -> str:
    return HEADER + "".join(f"{i},n{i},{i + qty_offset},{i}.50\n" for i in ids)


def _stored(spark, warehouse: Path) -> dict[tuple[str, str], list[tuple]]:
    """Every stored date of every asset of the table, as sorted rows."""
    storage = WarehouseStorage(str(warehouse))
    return {
        (asset, day): sorted_rows(spark, partition_dir(warehouse, TABLE, asset, day))
        for asset in storage.stored_assets(TABLE)
        for day in storage.stored_dates(TABLE, asset)
    }


def _current_snapshots(warehouse: Path) -> dict[str, int]:
    storage = WarehouseStorage(str(warehouse))
    return {asset: storage.tables.load(TABLE, asset).current_snapshot().snapshot_id for asset in storage.stored_assets(TABLE)}


def _rows_by_snapshot(storage: WarehouseStorage) -> dict[str, dict[int, dict[str, int]]]:
    """Per asset, per snapshot of its history: rows per date, read with pyiceberg (another reader than Spark)."""
    found = {}
    for asset in storage.stored_assets(TABLE):
        loaded = storage.tables.load(TABLE, asset)
        found[asset] = {}
        for snapshot in loaded.snapshots():
            counts: dict[str, int] = {}
            for value in loaded.scan(snapshot_id=snapshot.snapshot_id, selected_fields=("business_date",)).to_arrow().column("business_date").to_pylist():
                counts[str(value)] = counts.get(str(value), 0) + 1
            found[asset][snapshot.snapshot_id] = counts
    return found


def _alive(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for process in processes:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


@pytest.mark.slow
def test_kill_9_inside_a_commit_leaves_every_table_at_a_whole_snapshot_and_a_rerun_writes_what_an_uninterrupted_run_does(
    spark, warehouse, tmp_path
):
    """A real run of a date (its own process and JVM) is paused inside current_table's commit (every file
    of the commit written, waiting at the catalog's UPDATE behind the test's ``BEGIN IMMEDIATE``) and
    killed with ``kill -9``. Every table stays readable at a whole snapshot throughout; the killed
    commit's files are in no snapshot and the purge removes them; a re-run of the date writes, row for
    row, what an uninterrupted run wrote."""
    original_day2 = _csv(1, 2, 3, 4, 6).replace("2,n2,2,", "2,n2,20,")  # 5 deleted, 6 new, 2 updated
    changed_day2 = _csv(1, 2, 3, 4, 7, qty_offset=100)  # other values: the killed run would write other outputs
    landing = tmp_path / "landing" / TABLE
    landing.mkdir(parents=True)
    (landing / f"{DAY1}.csv").write_text(_csv(1, 2, 3, 4, 5))
    (landing / f"{DAY2}.csv").write_text(original_day2)
    config = write_table_config(tmp_path / "configs", TABLE, f"{landing}/{{date}}.csv", start_date=DAY1, **COLUMNS)
    defs = definitions_for(config)
    instance = DagsterInstance.ephemeral()
    assert all(result.success for result in run_dates(defs, [DAY1, DAY2], instance))
    uninterrupted = _stored(spark, warehouse)  # what an uninterrupted run of both dates wrote
    assert len(uninterrupted) == 2 * len(ALL_ASSETS)
    committed = _current_snapshots(warehouse)
    storage = WarehouseStorage(str(warehouse))
    history_before = _rows_by_snapshot(storage)
    files_before = {asset: _data_files(warehouse, TABLE, asset, DAY2) for asset in ALL_ASSETS}

    (landing / f"{DAY2}.csv").write_text(changed_day2)
    marker, release, log = tmp_path / "paused.marker", tmp_path / "paused.release", tmp_path / "killed_run.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "CDC_WAREHOUSE": str(warehouse),
        # Only to know when current_table's write begins; the pause is the catalog lock.
        "CDC_PAUSE_BEFORE_COMMIT": f"{TABLE}/current_table",
        "CDC_PAUSE_MARKER": str(marker),
        "CDC_PAUSE_RELEASE": str(release),
        "CDC_SPARK_CONF": json.dumps(SPARK_CONF),
    }
    with log.open("w") as output:
        run = subprocess.Popen(
            [sys.executable, "-c", RUN_ONE_DATE, str(tmp_path / "configs" / f"{TABLE}.yaml"), DAY2],
            env=env, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )
    lock = CatalogLock(warehouse)
    try:
        _wait_until(marker.exists, 300, "the run reached current_table's write", [run], [log])
        before_commit = _metadata_files(warehouse, TABLE, "current_table")
        lock.__enter__()
        release.touch()
        # current_table's commit wrote every file and waits at the catalog's UPDATE.
        _wait_until(lambda: _metadata_files(warehouse, TABLE, "current_table") - before_commit, 45,
                    "current_table's commit in flight", [run], [log])
        time.sleep(1)
        assert run.poll() is None
        run_processes = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
        assert any("java" in process.name() for process in run_processes), [p.name() for p in run_processes]
        # Readers are not blocked meanwhile: every table reads at a whole snapshot, current_table at its old one.
        during = _current_snapshots(warehouse)
        assert during["current_table"] == committed["current_table"]
        for asset in ALL_ASSETS:
            counts = storage.row_counts(TABLE, asset, [DAY1, DAY2])
            rows = storage.tables.load(TABLE, asset).scan().to_arrow().num_rows
            assert rows == sum(counts.values()), asset
        # The paused run holds the table's writer lock: another writer waits, then gives up naming it.
        second = WarehouseStorage(str(warehouse), run_id="second-writer", lock_timeout=1.0)
        with pytest.raises(WriterLockTimeout, match=str(run.pid)):
            second.hold_writer_lock(TABLE)
        second.release()
        os.killpg(run.pid, signal.SIGKILL)  # start_new_session: the group id is the run's pid
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=60)
        lock.release()
    assert run.returncode == -signal.SIGKILL
    assert _alive(run_processes, timeout=30) == [], "a process of the killed run (its JVM?) survived"

    # Nothing of the killed run is published (docs/publishing.md): every table's main is where it was and reads
    # what the uninterrupted run wrote. The outputs it committed before the pause are on its staging branch,
    # each a whole snapshot holding the date whole; the snapshots before are unchanged.
    now = _current_snapshots(warehouse)
    assert now == committed
    [branch] = storage.staging_branches(TABLE)
    staged_by = WarehouseStorage(str(warehouse), run_id=branch[len(STAGING_PREFIX):])
    heads = {asset: storage.tables.load(TABLE, asset).metadata.refs.get(branch) for asset in ALL_ASSETS}
    staged = {asset for asset, ref in heads.items() if ref is not None and ref.snapshot_id != committed[asset]}
    assert "current_table" not in staged  # its branch at main's snapshot, if made
    # The intake step's output was committed before the CDC step began. The CDC step's other outputs are
    # written side by side with current_table: each committed whole on the branch, or not at all (below).
    assert HASHED_INCOMING in staged
    history_after = _rows_by_snapshot(storage)
    after_kill = _stored(spark, warehouse)
    for asset in ALL_ASSETS:
        assert {k: v for k, v in history_after[asset].items() if k in history_before[asset]} == history_before[asset], asset
        new = set(history_after[asset]) - set(history_before[asset])
        if asset in staged:
            head = storage.tables.load(TABLE, asset).snapshot_by_name(branch).snapshot_id
            assert head in new and history_after[asset][head].get(DAY1) == history_before[asset][committed[asset]].get(DAY1)
        else:
            assert not new, asset
        for day in (DAY1, DAY2):
            assert after_kill[(asset, day)] == uninterrupted[(asset, day)], (asset, day)
    def hashes(reader: WarehouseStorage) -> set[str]:
        return {row["non_key_hash"] for row in reader.read_one(spark, TABLE, HASHED_INCOMING, DAY2).collect()}

    assert hashes(staged_by) != hashes(storage)  # the changed extract's rows: on the branch only

    # The killed commit's data files are on disk, in no snapshot, never read.
    referenced = _referenced_files(storage.tables.load(TABLE, "current_table"))
    leftovers = _data_files(warehouse, TABLE, "current_table", DAY2) - files_before["current_table"]
    assert leftovers and not leftovers & referenced
    # The killed commit wrote its manifests and its new metadata file too, none of which the table
    # names: maintenance finds them all, beside the data files.
    unreferenced = set(storage.tables.unreferenced_files(TABLE, "current_table"))
    assert leftovers <= unreferenced
    kinds = {("manifest list" if name.startswith("snap-") else "metadata file" if name.endswith(".metadata.json") else "manifest")
             for name in (os.path.basename(path) for path in unreferenced - leftovers) if not name.endswith(".crc")}
    assert kinds == {"manifest", "manifest list", "metadata file"}, unreferenced - leftovers
    # The purge removes them (and every other file no current snapshot reads), once the dead run's branch is
    # dropped (an erase does both; otherwise the next publication after publish.keep_failed_days drops it).
    assert storage.drop_staging_branches(TABLE) == [branch]
    storage.purge_unreferenced_files(TABLE)
    storage.release()
    assert not any(os.path.exists(path) for path in unreferenced)
    assert all(live for _, _, _, live in storage.data_files(TABLE))
    assert all(not storage.tables.unreferenced_files(TABLE, asset) for asset in ALL_ASSETS)

    # The re-run of the date with the original extract: every asset, row for row, as the uninterrupted run.
    (landing / f"{DAY2}.csv").write_text(original_day2)
    [rerun] = run_dates(defs, [DAY2], instance)
    assert rerun.success
    assert _stored(spark, warehouse) == uninterrupted
