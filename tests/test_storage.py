"""The warehouse storage on its own: reads, writes as Iceberg commits, a killed writer, the writer lock,
row counts from the manifests.

Real Spark writes Iceberg tables into real temp folders; a second "run" is a second WarehouseStorage (in
this process or in a child process), as two Dagster runs would be.
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

from resources.parquet_io_manager import PartitionedParquetIOManager
from resources.spark import PipelineSparkResource
from resources.storage.lake import CatalogSettingError
from cdc_assets.defs.component import build_definitions
from resources.storage import (
    LOCK_FILE,
    as_stored,
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


def test_a_date_reads_back_with_the_schema_it_was_written_with_without_a_spark_job(spark, storage):
    frame = spark.sql("SELECT 'a' AS key_hash, CAST(1.5 AS DECIMAL(10, 2)) AS amount, DATE'2024-01-01' AS day")
    storage.write(frame, "t", "asset", [D1])

    reader = WarehouseStorage(storage.root, run_id="reader")  # another run: nothing remembered in memory
    stored = _jobs_run_by(spark, "stored", lambda: reader.read_one(spark, "t", "asset", D1))
    assert stored.schema == as_stored(frame.schema)  # types and column order; every stored column is nullable
    assert reader.stored_schema("t", "asset", D1) == as_stored(frame.schema)
    # The schema comes from the table's metadata: no schema-inference job, not even for another run.
    assert _job_count(spark, "stored") == 0
    assert stored.collect() == frame.collect()


def _jobs_run_by(spark, group: str, read):
    # The test (not the pipeline) counts jobs through the classic session's status tracker.
    spark.sparkContext.setJobGroup(group, group)
    try:
        return read()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


def _job_count(spark, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_a_date_rewritten_by_another_run_is_read_as_it_now_is(spark, storage):
    storage.write(_plain(spark, [("a", 1)]), "t", "asset", [D1])
    assert storage.read_one(spark, "t", "asset", D1).columns == ["key_hash", "amount"]
    # Another run replaces the date, with another schema: what this run read before must not be used.
    other = WarehouseStorage(storage.root, run_id="other", lock_timeout=1.0)
    storage.release()
    other.write(spark.createDataFrame([("b", "x")], "key_hash string, note string"), "t", "asset", [D1])
    other.release()

    assert storage.read_one(spark, "t", "asset", D1).columns == ["key_hash", "note"]
    assert storage.read(spark, "t", "asset", [D1]).columns == ["key_hash", "note", "business_date"]
    assert [tuple(row) for row in storage.read_one(spark, "t", "asset", D1).collect()] == [("b", "x")]


def test_each_date_a_write_publishes_is_tagged_and_a_date_dropped_or_rewritten_untagged(spark, storage):
    """A write to main (not staged) publishes its dates: each gets a tag of its name at the commit, kept
    ``tag_days`` days; a rewrite moves it, a drop removes it, a write with no tag_days leaves none."""
    day_ms = 24 * 3600 * 1000
    storage.write(_dated(spark, [("a", 1, D1), ("b", 2, D2)]), "t", "asset", [D1, D2], tag_days=3)
    first = storage.tables.load("t", "asset").current_snapshot().snapshot_id
    assert storage.tables.date_tags("t", "asset") == {D1: first, D2: first}
    assert storage.tables.load("t", "asset").metadata.refs[D1].max_ref_age_ms == 3 * day_ms
    read = storage.tables.session_for(spark).sql
    storage.write(_plain(spark, [("a", 5)]), "t", "asset", [D2], tag_days=3)
    second = storage.tables.load("t", "asset").current_snapshot().snapshot_id
    assert storage.tables.date_tags("t", "asset") == {D1: first, D2: second}
    # Time travel by date: D2 as first published, and as now.
    assert read(f"SELECT amount FROM lake.t.asset VERSION AS OF '{first}' WHERE business_date = '{D2}'").collect()[0][0] == 2
    assert read(f"SELECT amount FROM lake.t.asset VERSION AS OF '{D2}' WHERE business_date = '{D2}'").collect()[0][0] == 5
    # Retention drops D1 (and its tag); a write without tag_days drops D3's older tag and makes none.
    storage.write(_plain(spark, [("c", 3)]), "t", "asset", [D3], tag_days=3)
    storage.release()
    later = WarehouseStorage(storage.root, run_id="run-two", lock_timeout=1.0)  # the next run: D1 is not in its use
    try:
        assert later.drop_outside_retention("t", "asset", 2) == [D1]
        assert set(later.tables.date_tags("t", "asset")) == {D2, D3}
        later.write(_plain(spark, [("c", 4)]), "t", "asset", [D3])
        assert set(later.tables.date_tags("t", "asset")) == {D2}
        # An erase's drop: every date tag in one metadata commit.
        assert later.drop_date_tags("t") == [f"asset@{D2}"] and later.tables.date_tags("t", "asset") == {}
    finally:
        later.release()


def test_a_range_write_commits_every_date_including_one_without_rows(spark, storage):
    assert storage.write(_dated(spark, [("a", 1, D1), ("b", 2, D1), ("c", 3, D3)]), "t", "asset", [D1, D2, D3]) == {
        D1: 2, D2: 0, D3: 1,
    }
    empty = storage.read_one(spark, "t", "asset", D2)
    assert empty.count() == 0 and empty.columns == ["key_hash", "amount"]
    rows = sorted((str(r["business_date"]), r["key_hash"]) for r in storage.read(spark, "t", "asset", [D1, D2, D3]).collect())
    assert rows == [(D1, "a"), (D1, "b"), (D3, "c")]
    assert storage.row_counts("t", "asset", [D1, D2, D3]) == {D1: 2, D2: 0, D3: 1}  # from the manifests
    assert storage.stored_dates("t", "asset") == [D1, D2, D3]  # the date without rows is stored too
    assert _snapshot_ids(storage, "t", "asset") == 1, "one Iceberg commit for the whole range"


def test_a_rewrite_replaces_whole_dates_and_rows_of_other_dates_are_refused(spark, storage):
    storage.write(_dated(spark, [("a", 1, D1), ("b", 2, D2)]), "t", "asset", [D1, D2])
    storage.write(_dated(spark, [("x", 9, D1), ("y", 8, D2)]), "t", "asset", [D1, D2])
    assert [r["key_hash"] for r in storage.read_one(spark, "t", "asset", D2).collect()] == ["y"]
    committed = _snapshot_ids(storage, "t", "asset")

    outside = "dated outside the write's partition"
    with pytest.raises(Exception, match=outside):
        storage.write(_dated(spark, [("z", 7, D1), ("w", 6, D3)]), "t", "asset", [D1, D2])
    with pytest.raises(Exception, match=outside):  # one date: the same rule
        storage.write(_dated(spark, [("z", 7, D1), ("w", 6, D3)]), "t", "asset", [D1])
    with pytest.raises(Exception, match=outside):  # a NULL date is outside every write
        storage.write(_dated(spark, [("z", 7, D1), ("w", 6, None)]), "t", "asset", [D1])
    # Nothing of the refused writes was committed.
    assert _snapshot_ids(storage, "t", "asset") == committed
    assert [r["key_hash"] for r in storage.read_one(spark, "t", "asset", D1).collect()] == ["x"]
    assert storage.stored_dates("t", "asset") == [D1, D2]


def _snapshot_ids(storage: WarehouseStorage, table: str, asset: str) -> int:
    """How many snapshots (commits) the asset's Iceberg table has."""
    return len(storage.tables.load(table, asset).snapshots())


def test_readers_see_the_old_version_or_the_new_one_while_a_writer_commits_the_date_many_times(spark, storage):
    rows, commits = 40, 12
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
                failures.append(f"read {reads}: {type(error).__name__}: {error}"[:1500])
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


def test_data_files_no_commit_names_are_never_read_and_purging_deletes_them_and_the_replaced_ones(spark, tmp_path):
    root = tmp_path / "warehouse"
    storage = WarehouseStorage(str(root), run_id="first")
    storage.write(_plain(spark, [("a", 1)]), "t", "asset", [D1])
    storage.release()
    # What a write killed before its commit leaves: data files in the date's folder that no snapshot names.
    folder = Path(storage.partition_path("t", "asset", D1))
    _plain(spark, [("z", 9)]).coalesce(1).write.parquet(str(tmp_path / "killed"))
    [written] = (tmp_path / "killed").glob("*.parquet")
    orphan = folder / "00000-0-killed-write.parquet"
    written.rename(orphan)
    reader = WarehouseStorage(str(root), run_id="reader")
    assert [r["key_hash"] for r in reader.read_one(spark, "t", "asset", D1).collect()] == ["a"]
    assert reader.row_counts("t", "asset", [D1]) == {D1: 1}
    assert ("asset", D1, str(orphan), False) in reader.data_files("t")

    writer = WarehouseStorage(str(root), run_id="writer")
    writer.write(_plain(spark, [("b", 2)]), "t", "asset", [D1])  # the replaced snapshot's file stays for now
    assert len([found for found in writer.data_files("t") if not found[3]]) == 2
    writer.purge_unreferenced_files("t")
    writer.release()
    assert not orphan.exists()
    assert [found[3] for found in writer.data_files("t")] == [True], "only the current snapshot's file is left"
    assert len(writer.tables.load("t", "asset").snapshots()) == 1
    assert [r["key_hash"] for r in writer.read_one(spark, "t", "asset", D1).collect()] == ["b"]


@pytest.mark.parametrize("uri", ["gs://bucket/cdc", "hdfs://namenode/cdc", "abfs://container@account/cdc"])
def test_a_warehouse_that_is_neither_a_folder_nor_a_bucket_is_refused_at_start_up(uri, monkeypatch):
    with pytest.raises(UnsupportedWarehouseError, match="S3 bucket") as raised:
        WarehouseStorage(uri)
    assert uri in str(raised.value)
    monkeypatch.setenv("CDC_WAREHOUSE", uri)
    with pytest.raises(UnsupportedWarehouseError, match=uri.split("://")[0]):
        build_definitions([])  # what loading the code location (the UI, the daemon, the CLI) does first
    assert warehouse_root("file:///tmp/cdc-warehouse") == "/tmp/cdc-warehouse"


@pytest.mark.parametrize("uri", ["s3a://bucket/cdc/", "s3://bucket/cdc"])
def test_a_warehouse_in_a_bucket_needs_a_rest_catalog_and_says_which_variables(uri, monkeypatch):
    for name in ("CDC_CATALOG_URI", "CDC_CATALOG_WAREHOUSE"):
        monkeypatch.delenv(name, raising=False)
    assert warehouse_root(uri) == "s3://bucket/cdc"
    with pytest.raises(CatalogSettingError, match="CDC_CATALOG_URI") as raised:
        WarehouseStorage(uri)
    assert "s3://bucket/cdc" in str(raised.value)
    monkeypatch.setenv("CDC_WAREHOUSE", uri)
    with pytest.raises(CatalogSettingError, match="REST catalog"):
        build_definitions([])
    monkeypatch.setenv("CDC_CATALOG_URI", "http://127.0.0.1:1")
    with pytest.raises(CatalogSettingError, match="CDC_CATALOG_WAREHOUSE"):
        build_definitions([])


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


HOLD = """
import sys, time
from resources.storage import WarehouseStorage
store = WarehouseStorage(sys.argv[1], run_id="killed-run")
store.hold_writer_lock("t")
print("holding", flush=True)
time.sleep(600)
"""


def test_a_killed_holders_lock_is_stale_at_once(spark, storage):
    storage.release()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, storage.root], cwd=REPO, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        waiting = WarehouseStorage(storage.root, run_id="waiting", lock_timeout=0.5)
        with pytest.raises(WriterLockTimeout, match="killed-run"):
            waiting.hold_writer_lock("t")
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # The kernel let go of the dead holder's flock: the next writer takes the lock at once (0.5 s to wait).
    after = WarehouseStorage(storage.root, run_id="after-kill", lock_timeout=0.5)
    assert after.write(_plain(spark, [("c", 3)]), "t", "asset", [D1]) == {D1: 1}
    assert json.loads((Path(storage.root) / "t" / LOCK_FILE).read_text())["run_id"] == "after-kill"
    after.release()


def test_the_io_manager_previews_each_dates_own_first_rows(spark, tmp_path):
    manager = PartitionedParquetIOManager(pyspark=PipelineSparkResource(spark_config={}), warehouse_root=str(tmp_path / "wh"))
    # D1 has 12 rows, D2 has 2 rows, D3 none, all in one Iceberg table (Iceberg clusters a write's rows by
    # date: one data file per date here).
    rows = [(f"k{index}", index, D1) for index in range(12)] + [("m0", 100, D2), ("m1", 101, D2)]
    written = manager.storage.write(_dated(spark, rows).repartition(3), "t", "asset", [D1, D2, D3])
    assert written == {D1: 12, D2: 2, D3: 0}

    previews = manager._previews("t", "asset", written)
    assert len(previews[D1]) == 5 and {amount for _, amount in previews[D1]} <= set(range(12))
    assert sorted(previews[D2]) == [("m0", 100), ("m1", 101)]
    assert previews[D3] == []
    manager.storage.release()


def test_sessions_opening_a_new_warehouse_at_once_all_open_it(spark, tmp_path):
    """Two tables' first runs on one Spark Connect server are two sessions of one JVM opening the same new
    catalog at once. Iceberg's JDBC catalog creates its SQLite tables, then adds a column, on first open,
    checking first and not in one transaction; unserialised, one session failed ("Cannot check and
    eventually update SQL schema"). Each round is a new warehouse, opened by four sessions started
    together; every round all of them open it, and a table written through one is listed by all."""
    sessions = [spark.newSession() for _ in range(4)]
    for round_ in range(12):
        root = str(tmp_path / f"warehouse-{round_}")
        start = threading.Barrier(len(sessions))
        errors: list[BaseException] = []

        def first_open(session) -> None:
            try:
                start.wait()
                WarehouseStorage(root).tables.session_for(session).sql("SHOW NAMESPACES IN lake").collect()
            except BaseException as error:  # noqa: BLE001 - reported below with the round
                errors.append(error)

        threads = [threading.Thread(target=first_open, args=(session,)) for session in sessions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, f"round {round_}: {errors[0]!r}"
    storage = WarehouseStorage(root)
    storage.tables.write(spark.range(3).withColumn("business_date", F.lit(date(2024, 1, 1))), "orders", "hashed_incoming", [D1], {})
    assert WarehouseStorage(root).tables.assets("orders") == ["hashed_incoming"]


def test_a_renamed_column_is_renamed_by_field_id_and_every_date_reads_under_its_new_name(spark, storage):
    # The write that first has the new name renames the former one (issue 34, point 6): no data file is
    # rewritten, the field keeps its id, and a date recorded before the rename, hash spec included, reads
    # under the new name. A re-run of that write renames nothing more.
    spec = '{"version":1,"keys":[["k","string"]],"non_keys":[["amount","int"]],"untracked":[]}'
    old = _plain(spark, [("a", 1), ("b", 2)]).withColumn("non_key_hash", F.lit("h").alias("non_key_hash", metadata={"cdc.hash_spec": spec}))
    storage.write(old, "t", "asset", [D1])
    files_before = {path for _, day, path, _ in storage.data_files("t") if day == D1}
    field_id = storage.tables.load("t", "asset").schema().find_field("amount").field_id
    new = spark.createDataFrame([("a", 5)], "key_hash string, amount_eur int")
    for _ in range(2):  # the date, then its re-run
        storage.write(new, "t", "asset", [D2], renamed_from={"amount_eur": ["amount"]})
        loaded = storage.tables.load("t", "asset")
        assert [f.name for f in loaded.schema().fields if f.name.startswith("amount")] == ["amount_eur"]
        assert loaded.schema().find_field("amount_eur").field_id == field_id
    assert storage.tables.renamed("t", "asset") == {"amount": "amount_eur"}
    recorded = storage.stored_schema("t", "asset", D1)
    assert recorded.names == ["key_hash", "amount_eur", "non_key_hash"]
    assert '"non_keys":[["amount_eur","int"]]' in recorded["non_key_hash"].metadata["cdc.hash_spec"]
    assert sorted(tuple(row) for row in storage.read(spark, "t", "asset", [D1]).select("key_hash", "amount_eur").collect()) == [("a", 1), ("b", 2)]
    # A reader without the project (pyiceberg) reads date 1 under the new name too.
    from pyiceberg.expressions import EqualTo

    scanned = storage.tables.load("t", "asset").scan(row_filter=EqualTo("business_date", D1)).to_arrow().to_pylist()
    assert sorted((row["key_hash"], row["amount_eur"]) for row in scanned) == [("a", 1), ("b", 2)]
    assert {path for _, day, path, _ in storage.data_files("t") if day == D1} == files_before
