"""The warehouse storage on its own: reads, the one commit path, crash recovery, the writer lock, footers.

Real Spark writes into real temp folders; a second "run" is a second WarehouseStorage (in this process
or in a child process), as two Dagster runs would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from resources import PartitionedParquetIOManager, PipelineSparkResource
from cdc_assets.definitions import build_definitions
from resources.storage import (
    LOCK_FILE,
    MissingPartitionError,
    UnsupportedWarehouseError,
    WarehouseStorage,
    WriterLockTimeout,
    warehouse_root,
)

D1, D2, D3 = "2024-01-01", "2024-01-02", "2024-01-03"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def storage(tmp_path) -> WarehouseStorage:
    store = WarehouseStorage(str(tmp_path / "warehouse"), run_id="run-one", lock_timeout=1.0)
    yield store
    store.release()


def _dated(spark, rows):
    return spark.createDataFrame(rows, "key_hash string, amount int, business_date string").withColumn(
        "business_date", F.col("business_date").cast("date")
    )


def _plain(spark, rows):
    return spark.createDataFrame(rows, "key_hash string, amount int")


def test_read_returns_every_date_with_its_business_date(spark, storage):
    assert storage.write(_plain(spark, [("a", 1), ("b", 2)]), "t", "asset", [D1]) == {D1: 2}
    assert storage.write(_plain(spark, [("a", 1)]), "t", "asset", [D2]) == {D2: 1}

    both = storage.read(spark, "t", "asset", [D1, D2])
    assert both.columns == ["key_hash", "amount", "business_date"]
    rows = sorted((row["business_date"], row["key_hash"], row["amount"]) for row in both.collect())
    assert rows == [(date(2024, 1, 1), "a", 1), (date(2024, 1, 1), "b", 2), (date(2024, 1, 2), "a", 1)]
    with pytest.raises(MissingPartitionError, match=D3):
        storage.read(spark, "t", "asset", [D1, D3])


def test_a_partition_written_by_this_run_reads_back_as_spark_would_infer_it(spark, storage):
    frame = spark.sql("SELECT 'a' AS key_hash, CAST(1.5 AS DECIMAL(10, 2)) AS amount, DATE'2024-01-01' AS day")
    storage.write(frame, "t", "asset", [D1])
    path = storage.partition_path("t", "asset", D1)

    remembered = _jobs_run_by(spark, "remembered", lambda: storage.read_one(spark, "t", "asset", D1))
    inferred = _jobs_run_by(spark, "inferred", lambda: spark.read.parquet(path))
    assert remembered.schema == inferred.schema  # nullability included
    assert remembered.collect() == inferred.collect()
    # The point of remembering: no schema-inference job for a partition this run wrote.
    assert _job_count(spark, "remembered") == 0
    assert _job_count(spark, "inferred") >= 1


def _jobs_run_by(spark, group: str, read):
    # The test (not the pipeline) counts jobs through the classic session's status tracker.
    spark.sparkContext.setJobGroup(group, group)
    try:
        return read()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


def _job_count(spark, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_a_partition_changed_outside_the_storage_is_read_as_it_now_is(spark, storage):
    storage.write(_plain(spark, [("a", 1)]), "t", "asset", [D1])
    path = storage.partition_path("t", "asset", D1)
    # Another writer replaces the files, with another schema: the remembered one must not be used.
    spark.createDataFrame([("b", "x")], "key_hash string, note string").write.mode("overwrite").parquet(path)

    assert storage.read_one(spark, "t", "asset", D1).columns == ["key_hash", "note"]
    assert storage.read(spark, "t", "asset", [D1]).columns == ["key_hash", "note", "business_date"]


def test_a_range_write_commits_every_date_including_one_without_rows(spark, storage):
    assert storage.write(_dated(spark, [("a", 1, D1), ("b", 2, D1), ("c", 3, D3)]), "t", "asset", [D1, D2, D3]) == {
        D1: 2, D2: 0, D3: 1,
    }
    empty = storage.read_one(spark, "t", "asset", D2)
    assert empty.count() == 0 and empty.columns == ["key_hash", "amount"]
    rows = sorted((str(r["business_date"]), r["key_hash"]) for r in storage.read(spark, "t", "asset", [D1, D2, D3]).collect())
    assert rows == [(D1, "a"), (D1, "b"), (D3, "c")]
    assert storage.row_counts("t", "asset", [D1, D2, D3]) == {D1: 2, D2: 0, D3: 1}  # from the footers
    assert not list((Path(storage.root) / "t" / "_staging").rglob("*.parquet")), "nothing left in staging"


def test_a_write_whose_observed_counts_come_back_empty_counts_the_staged_files(spark, storage, monkeypatch):
    """Spark 4.0's Connect server may return a write's observed metrics empty on a busy server (SPARK-54279)."""
    from resources.storage import commit as commit_module

    monkeypatch.setattr(commit_module.Observation, "get", property(lambda self: {}))
    assert storage.write(_dated(spark, [("a", 1, D1), ("b", 2, D1), ("c", 3, D3)]), "t", "asset", [D1, D2, D3]) == {D1: 2, D2: 0, D3: 1}
    assert storage.write(_dated(spark, [("d", 4, D2)]), "t", "asset", [D2]) == {D2: 1}
    assert storage.write(spark.createDataFrame([("e", 5)], "key_hash string, amount int"), "t", "other", [D1]) == {D1: 1}
    assert storage.row_counts("t", "asset", [D1, D2, D3]) == {D1: 2, D2: 1, D3: 1}
    # Rows dated outside the write are still refused, for a range and for one date.
    with pytest.raises(ValueError, match="1 row"):
        storage.write(_dated(spark, [("z", 7, D1), ("w", 6, D3)]), "t", "asset", [D1, D2])
    with pytest.raises(ValueError, match="1 row"):
        storage.write(_dated(spark, [("z", 7, D1), ("w", 6, None)]), "t", "asset", [D1])
    assert storage.row_counts("t", "asset", [D1, D2, D3]) == {D1: 2, D2: 1, D3: 1}


def test_a_rewrite_replaces_whole_dates_and_rows_of_other_dates_are_refused(spark, storage):
    storage.write(_dated(spark, [("a", 1, D1), ("b", 2, D2)]), "t", "asset", [D1, D2])
    storage.write(_dated(spark, [("x", 9, D1), ("y", 8, D2)]), "t", "asset", [D1, D2])
    assert [r["key_hash"] for r in storage.read_one(spark, "t", "asset", D2).collect()] == ["y"]

    with pytest.raises(ValueError, match="1 row"):
        storage.write(_dated(spark, [("z", 7, D1), ("w", 6, D3)]), "t", "asset", [D1, D2])
    with pytest.raises(ValueError, match="1 row"):  # one date: the same rule
        storage.write(_dated(spark, [("z", 7, D1), ("w", 6, D3)]), "t", "asset", [D1])
    # Nothing of the refused writes was committed, and their staging is gone.
    assert [r["key_hash"] for r in storage.read_one(spark, "t", "asset", D1).collect()] == ["x"]
    assert not list((Path(storage.root) / "t" / "_staging").rglob("*.parquet"))


def test_a_commit_of_an_earlier_release_killed_between_its_renames_is_read_in_place_then_put_back_by_a_writer(
    spark, storage
):
    # Releases before versioned commits stored a date as a real folder and replaced it by two renames; a
    # kill between them left the date missing and the stored folder under _staging/{asset}/....old.
    root = Path(storage.root) / "t"
    for asset in ("asset", "other"):
        retired = root / "_staging" / asset / f"business_date={D1}.dead-run.old"
        _plain(spark, [("a", 1)]).write.parquet(str(retired))
    before = _tree(root)
    reader = WarehouseStorage(str(storage.root), run_id="reader")
    assert [r["key_hash"] for r in reader.read_one(spark, "t", "asset", D1).collect()] == ["a"]
    assert reader.row_counts("t", "other", [D1]) == {D1: 1}
    assert _tree(root) == before, "a reader changed nothing"
    writer = WarehouseStorage(str(storage.root), run_id="writer")
    writer.hold_writer_lock("t")  # taking the lock puts every asset's folder back, then sweeps staging
    writer.release()
    assert (root / "other" / f"business_date={D1}").is_dir()
    assert not any(p.is_file() for p in (root / "_staging").rglob("*"))
    # The put-back real folder is replaced by a versioned commit like any other date.
    storage.write(_plain(spark, [("b", 2)]), "t", "asset", [D1])
    assert (root / "asset" / f"business_date={D1}").is_symlink()
    assert [r["key_hash"] for r in storage.read_one(spark, "t", "asset", D1).collect()] == ["b"]


def _tree(root: Path) -> list[tuple[str, float]]:
    """Every path under ``root`` with its modification time: what a reader must leave exactly as it was."""
    return sorted((str(p), p.lstat().st_mtime_ns) for p in root.rglob("*"))


def test_readers_see_the_old_version_or_the_new_one_while_a_writer_commits_the_date_many_times(spark, storage):
    rows, commits = 40, 25
    storage.write(_version_rows(spark, 0, rows), "t", "asset", [D1])
    storage.release()
    writer = WarehouseStorage(storage.root, run_id="writer")
    done, failures = threading.Event(), []

    def commit_again_and_again():
        try:
            for version in range(1, commits + 1):
                writer.write(_version_rows(spark, version, rows), "t", "asset", [D1])
        except BaseException as error:  # a failed writer must fail the test, not hang it
            failures.append(f"writer: {error!r}")
        finally:
            done.set()

    thread = threading.Thread(target=commit_again_and_again)
    thread.start()
    reader, seen, reads = WarehouseStorage(storage.root, run_id="reader"), set(), 0
    try:
        while not done.is_set() or reads < 3:
            try:
                if reads % 2:
                    values = [r["amount"] for r in reader.read_one(spark, "t", "asset", D1).collect()]
                else:
                    values = [r["amount"] for r in reader.read(spark, "t", "asset", [D1]).collect()]
            except Exception as error:  # noqa: BLE001 - any failed read is what the test counts
                failures.append(f"read {reads}: {error!r}"[:400])
                values = None
            if values is not None and (len(values) != rows or len(set(values)) != 1):
                failures.append(f"read {reads}: mixed or partial version: {len(values)} rows, values {sorted(set(values))}")
            elif values:
                seen.add(values[0])
            reads += 1
    finally:
        thread.join(timeout=600)
        writer.release()
    assert failures == []
    assert reads >= 10 and len(seen) >= 3, (reads, seen)  # the reads did overlap many commits
    assert [r["amount"] for r in reader.read_one(spark, "t", "asset", D1).limit(1).collect()] == [commits]


def _version_rows(spark, version: int, rows: int):
    """``rows`` rows, every one carrying ``version``, spread over several files (several write tasks)."""
    return spark.range(rows).select(F.concat(F.lit("k"), F.col("id")).alias("key_hash"), F.lit(version).alias("amount")).repartition(4)


def test_replaced_versions_stay_for_readers_until_the_grace_period_then_the_next_writer_deletes_them(spark, tmp_path):
    root = tmp_path / "warehouse"
    first = WarehouseStorage(str(root), run_id="first", retired_grace=3600)
    first.write(_plain(spark, [("a", 1)]), "t", "asset", [D1])
    resolved = first.stored_path("t", "asset", D1)  # what a reader in flight holds
    first.write(_plain(spark, [("b", 2)]), "t", "asset", [D1])
    first.release()
    later = WarehouseStorage(str(root), run_id="later", retired_grace=3600)
    later.hold_writer_lock("t")
    later.release()
    # Within the grace period the replaced version is still whole for the reader that resolved it.
    assert [r["key_hash"] for r in spark.read.parquet(resolved).collect()] == ["a"]
    assert [r["key_hash"] for r in later.read_one(spark, "t", "asset", D1).collect()] == ["b"]
    no_grace = WarehouseStorage(str(root), run_id="no-grace", retired_grace=0)
    no_grace.hold_writer_lock("t")
    no_grace.release()
    assert not Path(resolved).exists()
    versions = sorted(p.name for p in (root / "t" / "_versions" / "asset" / f"business_date={D1}").iterdir())
    assert versions == [Path(no_grace.stored_path("t", "asset", D1)).name], "only the current version is left"


def test_a_version_a_killed_commit_never_pointed_to_is_deleted_by_the_next_writer(spark, tmp_path):
    root = tmp_path / "warehouse"
    storage = WarehouseStorage(str(root), run_id="first")
    storage.write(_plain(spark, [("a", 1)]), "t", "asset", [D1])
    storage.release()
    orphan = root / "t" / "_versions" / "asset" / f"business_date={D1}" / "_cdc_version=killed-1"
    _plain(spark, [("z", 9)]).write.parquet(str(orphan))  # placed, but the pointer was never switched
    assert [r["key_hash"] for r in WarehouseStorage(str(root)).read_one(spark, "t", "asset", D1).collect()] == ["a"]
    writer = WarehouseStorage(str(root), run_id="writer")  # the default grace period: it does not apply here
    writer.hold_writer_lock("t")
    writer.release()
    assert not orphan.exists()
    assert [r["key_hash"] for r in writer.read_one(spark, "t", "asset", D1).collect()] == ["a"]


def test_a_commit_syncs_the_new_files_before_the_pointer_moves_and_the_folder_after(spark, storage, monkeypatch):
    storage.write(_plain(spark, [("a", 1)]), "t", "asset", [D1])
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def recording_fsync(descriptor):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        return real_fsync(descriptor)

    def recording_rename(source, target):
        events.append(("rename", os.fspath(target)))
        return real_rename(source, target)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "rename", recording_rename)
    storage.write(_plain(spark, [("b", 2)]).repartition(2), "t", "asset", [D1])
    monkeypatch.undo()

    pointer = storage.partition_path("t", "asset", D1)
    version = storage.stored_path("t", "asset", D1)
    switch = events.index(("rename", pointer))
    synced_before = {path for kind, path in events[:switch] if kind == "fsync"}
    # Synced while staged (the same files, renamed with their folder), then the folder they moved into.
    data_files = {name for name in os.listdir(version) if name.endswith(".parquet")}
    synced_files = {os.path.basename(path) for path in synced_before if "/_staging/" in path}
    assert len(data_files) == 2 and data_files <= synced_files, "the new version's files are durable first"
    assert os.path.dirname(version) in synced_before
    assert ("fsync", storage.asset_path("t", "asset")) in events[switch + 1 :], "the pointer switch is made durable"


@pytest.mark.parametrize("uri", ["s3a://bucket/cdc", "s3://bucket/cdc", "gs://bucket/cdc", "hdfs://namenode/cdc"])
def test_a_warehouse_that_is_not_a_local_folder_is_refused_at_start_up(uri, monkeypatch):
    with pytest.raises(UnsupportedWarehouseError, match="atomic rename") as raised:
        WarehouseStorage(uri)
    assert uri in str(raised.value)
    monkeypatch.setenv("CDC_WAREHOUSE", uri)
    with pytest.raises(UnsupportedWarehouseError, match=uri.split("://")[0]):
        build_definitions([])  # what loading the code location (the UI, the daemon, the CLI) does first
    assert warehouse_root("file:///tmp/cdc-warehouse") == "/tmp/cdc-warehouse"


def test_one_writer_per_table_a_second_one_waits_then_fails_naming_the_holder(spark, storage, tmp_path):
    storage.hold_writer_lock("t")
    second = WarehouseStorage(str(storage.root), run_id="run-two", lock_timeout=1.5)
    started = time.monotonic()
    with pytest.raises(WriterLockTimeout, match="run-one") as raised:
        second.write(_plain(spark, [("b", 2)]), "t", "asset", [D1])
    assert time.monotonic() - started >= 1.4  # it waited, it did not fail at once
    assert str(os.getpid()) in str(raised.value) and "CDC_WRITER_LOCK_TIMEOUT" in str(raised.value)
    assert not (Path(storage.root) / "t" / "asset").exists(), "the waiting writer wrote nothing"
    second.release()  # lets go of nothing: it never took the lock, so the holder still has it
    with pytest.raises(WriterLockTimeout, match="run-one"):
        WarehouseStorage(str(storage.root), run_id="run-three", lock_timeout=0.5).hold_writer_lock("t")
    # Another table is not held up.
    assert second.write(_plain(spark, [("b", 2)]), "u", "asset", [D1]) == {D1: 1}
    # Once the holder lets go, the second writer proceeds.
    storage.release()
    assert second.write(_plain(spark, [("b", 2)]), "t", "asset", [D1]) == {D1: 1}
    holder = json.loads((Path(storage.root) / "t" / LOCK_FILE).read_text())
    assert holder["run_id"] == "run-two" and holder["pid"] == os.getpid()
    second.release()


HOLD_AND_STAGE = """
import sys, time
from pathlib import Path
from resources.storage import WarehouseStorage
store = WarehouseStorage(sys.argv[1], run_id="killed-run")
store.hold_writer_lock("t")
leftover = Path(sys.argv[1]) / "t" / "_staging" / "asset" / "killed-run-1"
leftover.mkdir(parents=True)
(leftover / "part-0.parquet").write_bytes(b"half-written")
print("holding", flush=True)
time.sleep(600)
"""


def test_a_killed_holders_lock_is_stale_at_once_and_its_leftovers_are_swept(spark, storage):
    storage.release()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_STAGE, storage.root], cwd=REPO, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        waiting = WarehouseStorage(storage.root, run_id="waiting", lock_timeout=0.5)
        with pytest.raises(WriterLockTimeout, match="killed-run"):
            waiting.hold_writer_lock("t")
        leftover = Path(storage.root) / "t" / "_staging" / "asset" / "killed-run-1"
        assert leftover.exists(), "a live holder's staging is never swept"
    finally:
        holder.kill()
        holder.wait(timeout=30)
    after = WarehouseStorage(storage.root, run_id="after-kill", lock_timeout=0.5)
    assert after.write(_plain(spark, [("c", 3)]), "t", "asset", [D1]) == {D1: 1}
    assert not leftover.exists(), "the dead holder's leftovers are swept by the next writer"
    after.release()


def test_the_io_manager_previews_each_dates_own_first_rows_across_several_files(spark, tmp_path):
    manager = PartitionedParquetIOManager(pyspark=PipelineSparkResource(spark_config={}), warehouse_root=str(tmp_path / "wh"))
    # D1 has 12 rows spread over 3 files (3 write tasks), D2 has 2 rows, D3 none.
    rows = [(f"k{index}", index, D1) for index in range(12)] + [("m0", 100, D2), ("m1", 101, D2)]
    written = manager.storage.write(_dated(spark, rows).repartition(3), "t", "asset", [D1, D2, D3])
    assert written == {D1: 12, D2: 2, D3: 0}
    assert len(list((tmp_path / "wh" / "t" / "asset" / f"business_date={D1}").glob("*.parquet"))) > 1

    previews = manager._previews("t", "asset", written)
    assert len(previews[D1]) == 5 and {amount for _, amount in previews[D1]} <= set(range(12))
    assert sorted(previews[D2]) == [("m0", 100), ("m1", 101)]
    assert previews[D3] == []
    manager.storage.release()
