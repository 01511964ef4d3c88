"""The Parquet IO manager's reads: several partitions as one DataFrame, and schemas it remembers from its writes."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from resources import PartitionedParquetIOManager, SparkResource
from resources.parquet_io_manager import MissingPartitionError

D1, D2, D3 = "2024-01-01", "2024-01-02", "2024-01-03"


@pytest.fixture()
def manager(spark, tmp_path) -> PartitionedParquetIOManager:
    return PartitionedParquetIOManager(pyspark=SparkResource(), warehouse=str(tmp_path / "warehouse"))


def test_read_partitions_returns_every_date_with_its_business_date(spark, manager):
    frame = spark.createDataFrame([("a", 1), ("b", 2)], "key_hash string, amount int")
    assert manager.write_partition(spark, frame, "t", "asset", D1) == 2
    assert manager.write_partition(spark, frame.limit(1), "t", "asset", D2) == 1

    both = manager.read_partitions("t", "asset", [D1, D2])
    assert both.columns == ["key_hash", "amount", "business_date"]
    rows = sorted((row["business_date"], row["key_hash"], row["amount"]) for row in both.collect())
    assert rows == [(date(2024, 1, 1), "a", 1), (date(2024, 1, 1), "b", 2), (date(2024, 1, 2), "a", 1)]
    with pytest.raises(MissingPartitionError, match=D3):
        manager.read_partitions("t", "asset", [D1, D3])


def test_a_partition_written_by_this_run_reads_back_as_spark_would_infer_it(spark, manager):
    frame = spark.sql("SELECT 'a' AS key_hash, CAST(1.5 AS DECIMAL(10, 2)) AS amount, DATE'2024-01-01' AS day")
    manager.write_partition(spark, frame, "t", "asset", D1)
    path = manager.partition_path("t", "asset", D1)

    remembered = _jobs_run_by(spark, "remembered", lambda: manager.read_partition("t", "asset", D1))
    inferred = _jobs_run_by(spark, "inferred", lambda: spark.read.parquet(path))
    assert remembered.schema == inferred.schema  # nullability included
    assert remembered.collect() == inferred.collect()
    # The point of remembering: no schema-inference job for a partition this run wrote.
    assert _job_count(spark, "remembered") == 0
    assert _job_count(spark, "inferred") >= 1


def _jobs_run_by(spark, group: str, read):
    spark.sparkContext.setJobGroup(group, group)
    try:
        return read()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


def _job_count(spark, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_a_partition_changed_outside_the_manager_is_read_as_it_now_is(spark, manager, tmp_path):
    manager.write_partition(spark, spark.createDataFrame([("a", 1)], "key_hash string, amount int"), "t", "asset", D1)
    path = manager.partition_path("t", "asset", D1)
    # Another writer replaces the files, with another schema: the remembered one must not be used.
    spark.createDataFrame([("b", "x")], "key_hash string, note string").write.mode("overwrite").parquet(path)

    assert manager.read_partition("t", "asset", D1).columns == ["key_hash", "note"]
    assert manager.read_partitions("t", "asset", [D1]).columns == ["key_hash", "note", "business_date"]


def _dated(spark, rows):
    return spark.createDataFrame(rows, "key_hash string, amount int, business_date string").withColumn(
        "business_date", F.col("business_date").cast("date")
    )


def test_write_dates_commits_every_date_including_one_without_rows(spark, manager):
    frame = _dated(spark, [("a", 1, D1), ("b", 2, D1), ("c", 3, D3)])
    assert manager.write_dates(spark, frame, "t", "asset", [D1, D2, D3]) == {D1: 2, D2: 0, D3: 1}

    empty = manager.read_partition("t", "asset", D2)
    assert empty.count() == 0 and empty.columns == ["key_hash", "amount"]
    rows = sorted((str(r["business_date"]), r["key_hash"]) for r in manager.read_partitions("t", "asset", [D1, D2, D3]).collect())
    assert rows == [(D1, "a"), (D1, "b"), (D3, "c")]
    staging = Path(manager.root) / "t" / "_staging"
    assert not list(staging.rglob("*.parquet")), "nothing left in staging after the commits"


def test_write_dates_rewrites_a_range_and_refuses_rows_of_other_dates(spark, manager):
    manager.write_dates(spark, _dated(spark, [("a", 1, D1), ("b", 2, D2)]), "t", "asset", [D1, D2])
    manager.write_dates(spark, _dated(spark, [("x", 9, D1), ("y", 8, D2)]), "t", "asset", [D1, D2])
    assert [r["key_hash"] for r in manager.read_partition("t", "asset", D2).collect()] == ["y"]

    with pytest.raises(ValueError, match="1 row"):
        manager.write_dates(spark, _dated(spark, [("z", 7, D1), ("w", 6, D3)]), "t", "asset", [D1, D2])
    with pytest.raises(ValueError, match="1 row"):  # one date: written without partitionBy, same rule
        manager.write_dates(spark, _dated(spark, [("z", 7, D1), ("w", 6, D3)]), "t", "asset", [D1])
    # Nothing of the refused writes was committed.
    assert [r["key_hash"] for r in manager.read_partition("t", "asset", D1).collect()] == ["x"]
    assert not list((Path(manager.root) / "t" / "_staging").rglob("*.parquet"))


def test_range_previews_show_each_dates_own_first_rows_across_several_files(spark, manager):
    # D1 has 12 rows spread over 3 files (3 write tasks), D2 has 2 rows, D3 none.
    rows = [(f"k{index}", index, D1) for index in range(12)] + [("m0", 100, D2), ("m1", 101, D2)]
    frame = _dated(spark, rows).repartition(3)
    written = manager.write_dates(spark, frame, "t", "asset", [D1, D2, D3])
    assert written == {D1: 12, D2: 2, D3: 0}
    assert len(list((Path(manager.root) / "t" / "asset" / f"business_date={D1}").glob("*.parquet"))) > 1

    previews = manager._previews(spark, "t", "asset", written)
    assert len(previews[D1]) == 5 and {amount for _, amount in previews[D1]} <= set(range(12))
    assert sorted(previews[D2]) == [("m0", 100), ("m1", 101)]
    assert previews[D3] == []
