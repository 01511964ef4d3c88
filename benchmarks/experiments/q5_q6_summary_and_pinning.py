"""Questions 5 and 6 of docs/design/iceberg-commits.md: snapshot summary properties from every kind of
Spark write, and what a reader pinned to a snapshot, or holding the catalog's table cache, sees.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.experiments.q5_q6_summary_and_pinning [--keep DIR]

One JVM (this process). The "other process" that commits is pyiceberg (its own SQLite connection, no
JVM): for the JVM's catalog cache it is a writer it does not know of, as another run would be.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import date
from pathlib import Path

from benchmarks.experiments.lake_env import CATALOG_PREFIX, describe_error, pyiceberg_catalog, spark_session

TABLE = "lake.exp.props"


def show(label: str, value) -> None:
    print(f"{label}: {value}", flush=True)


def count(spark, sql_or_table: str) -> int:
    return spark.sql(f"SELECT count(*) FROM {sql_or_table}").collect()[0][0]


def try_(label: str, action):
    try:
        value = action()
        show(label, value)
        return value
    except Exception as error:  # noqa: BLE001 - what the reader sees is the finding
        show(label, describe_error(error))
        return None


def pyiceberg_append(catalog, rows: int, run: str) -> int:
    import pyarrow as pa

    table = catalog.load_table("exp.props")
    schema = pa.schema([("business_date", pa.date32()), ("id", pa.int64()), ("run", pa.string())])
    data = pa.table({"business_date": [date(2024, 1, 3)] * rows, "id": list(range(rows)), "run": [run] * rows}, schema=schema)
    table.append(data, snapshot_properties={"cdc.run-id": run})
    return catalog.load_table("exp.props").metadata.current_snapshot_id


def summary_properties(spark, catalog) -> None:
    from pyspark.sql import functions as F

    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.exp")
    spark.sql(
        f"CREATE TABLE {TABLE} (business_date DATE, id BIGINT, run STRING) USING iceberg "
        "PARTITIONED BY (business_date) TBLPROPERTIES ('format-version'='2')"
    )

    def frame(day: str, rows: int, run: str):
        return spark.range(rows).select(F.lit(day).cast("date").alias("business_date"), F.col("id"), F.lit(run).alias("run"))

    counts = json.dumps({"I": 10, "U": 0, "D": 0, "X": 0, "N": 0})
    (
        frame("2024-01-01", 10, "r-append").writeTo(TABLE)
        .option("snapshot-property.cdc.run-id", "r-append").option("snapshot-property.cdc.business-date", "2024-01-01")
        .option("snapshot-property.cdc.counts", counts).append()
    )
    frame("2024-01-01", 10, "r-overwrite").writeTo(TABLE).option("snapshot-property.cdc.run-id", "r-overwrite").overwrite(
        F.col("business_date") == F.lit("2024-01-01").cast("date")
    )
    frame("2024-01-02", 10, "r-dynamic").writeTo(TABLE).option("snapshot-property.cdc.run-id", "r-dynamic").overwritePartitions()
    # SQL MERGE, DELETE, UPDATE take no write options: the session conf's prefix carries the properties.
    frame("2024-01-01", 5, "r-merge").createOrReplaceTempView("changes")
    spark.conf.set("spark.sql.iceberg.snapshot-property.cdc.run-id", "r-merge")
    spark.sql(
        f"MERGE INTO {TABLE} t USING changes s ON t.business_date = s.business_date AND t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET run = s.run WHEN NOT MATCHED THEN INSERT *"
    )
    spark.conf.set("spark.sql.iceberg.snapshot-property.cdc.run-id", "r-delete")
    spark.sql(f"DELETE FROM {TABLE} WHERE business_date = DATE'2024-01-01' AND id = 9")
    spark.conf.set("spark.sql.iceberg.snapshot-property.cdc.run-id", "r-update")
    spark.sql(f"UPDATE {TABLE} SET run = 'r-update' WHERE business_date = DATE'2024-01-01' AND id = 8")
    # The DataFrame API's MERGE (Spark 4.0, Connect-clean) with the same session conf.
    spark.conf.set("spark.sql.iceberg.snapshot-property.cdc.run-id", "r-merge-df")
    source = frame("2024-01-02", 3, "r-merge-df").alias("s")
    try_("mergeInto (DataFrame API)", lambda: (
        source.mergeInto(TABLE, (F.col(f"{TABLE}.id") == F.col("s.id")) & (F.col(f"{TABLE}.business_date") == F.col("s.business_date")))
        .whenMatched().updateAll().whenNotMatched().insertAll().merge()
    ))
    # Both a write option and the session conf: which wins?
    spark.conf.set("spark.sql.iceberg.snapshot-property.cdc.run-id", "from-session-conf")
    frame("2024-01-04", 2, "r-both").writeTo(TABLE).option("snapshot-property.cdc.run-id", "from-write-option").append()
    spark.conf.unset("spark.sql.iceberg.snapshot-property.cdc.run-id")
    frame("2024-01-05", 2, "r-none").writeTo(TABLE).append()

    rows = spark.sql(
        f"SELECT snapshot_id, operation, summary['cdc.run-id'] AS run_id, summary['cdc.business-date'] AS d, "
        f"summary['cdc.counts'] AS counts FROM {TABLE}.snapshots ORDER BY committed_at"
    ).collect()
    show("Spark: SELECT operation, summary['cdc.run-id'] FROM lake.exp.props.snapshots", "")
    for row in rows:
        print(f"   {row.operation:10} run-id={row.run_id!s:18} business-date={row.d} counts={row.counts}")
    table = catalog.load_table("exp.props")
    show("pyiceberg: snapshot.summary['cdc.run-id'] in order", [
        (s.summary.operation.value, s.summary.get("cdc.run-id")) for s in sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    ])

    # Size: a large value goes into the table's metadata JSON, copied into every later metadata file
    # for as long as the snapshot is retained.
    metadata_size = Path(table.metadata_location.removeprefix("file:")).stat().st_size
    big = "x" * 1_000_000
    try_("1 MB property value: append", lambda: frame("2024-01-06", 1, "r-big").writeTo(TABLE)
         .option("snapshot-property.cdc.big", big).append() or "ok")
    frame("2024-01-07", 1, "r-after-big").writeTo(TABLE).append()
    table = catalog.load_table("exp.props")
    show("  metadata.json bytes before / after the 1 MB property and one more commit", (
        metadata_size, Path(table.metadata_location.removeprefix("file:")).stat().st_size))
    show("  pyiceberg reads it back, length", len(next(s.summary.get("cdc.big") for s in table.snapshots() if s.summary.get("cdc.big"))))


def pinning_and_cache(spark, catalog) -> None:
    cached = spark  # the catalog's default: cache-enabled=true, cache.expiration-interval-ms=30000
    uncached = spark.newSession()
    uncached.conf.set(f"{CATALOG_PREFIX}.cache-enabled", "false")
    other_session = spark.newSession()  # same JVM, its own catalog instance (and cache)
    short = spark.newSession()
    short.conf.set(f"{CATALOG_PREFIX}.cache.expiration-interval-ms", "3000")
    for session in (cached, uncached, other_session, short):
        count(session, TABLE)  # each opens its catalog and caches the table
    before = count(cached, TABLE)

    # A commit the JVM does not know of (pyiceberg: another process's writer).
    new_snapshot = pyiceberg_append(catalog, 100, "r-pyiceberg")
    show("6a after another process's commit (+100 rows): cached / uncached / other session / 3 s-expiry cache", (
        count(cached, TABLE) - before, count(uncached, TABLE) - before, count(other_session, TABLE) - before,
        count(short, TABLE) - before))
    try_("  cached session: VERSION AS OF the new snapshot id", lambda: count(cached, f"{TABLE} VERSION AS OF {new_snapshot}") - before)
    try_("  cached session: spark.read.option('snapshot-id', new)", lambda: cached.read.option("snapshot-id", new_snapshot).table(TABLE).count() - before)
    seen = []
    for _ in range(8):  # read every 5 s for 40 s: the cache expires after access, or after write?
        time.sleep(5)
        seen.append(count(cached, TABLE) - before)
    show("  cached session re-read every 5 s for 40 s (rows seen of the +100)", seen)
    seen = []
    for _ in range(6):
        time.sleep(1)
        seen.append(count(short, TABLE) - before)
    show("  3 s-expiry session re-read every 1 s for 6 s", seen)
    cached.sql(f"REFRESH TABLE {TABLE}")
    show("  cached session after REFRESH TABLE", count(cached, TABLE) - before)

    # A commit by another session of the same JVM.
    before = count(uncached, TABLE)
    count(cached, TABLE)
    other_session.sql(f"INSERT INTO {TABLE} VALUES (DATE'2024-01-08', 1, 'r-other-session')")
    show("6b after another session of the same JVM commits (+1 row): cached / uncached", (
        count(cached, TABLE) - before, count(uncached, TABLE) - before))

    # Pinning: snapshot id and tag, through the DataFrame reader and through SQL.
    table = catalog.load_table("exp.props")
    pinned = table.metadata.current_snapshot_id
    expected = table.scan(snapshot_id=pinned).to_arrow().num_rows
    uncached.sql(f"ALTER TABLE {TABLE} CREATE TAG `d2024-01-08` AS OF VERSION {pinned}")
    uncached.sql(f"INSERT INTO {TABLE} VALUES (DATE'2024-01-09', 1, 'r-later')")
    show("6c pinned snapshot read after a later commit: pyiceberg / option snapshot-id / VERSION AS OF id / "
         "option tag / VERSION AS OF tag / latest", (
        expected,
        uncached.read.option("snapshot-id", pinned).table(TABLE).count(),
        count(uncached, f"{TABLE} VERSION AS OF {pinned}"),
        uncached.read.option("tag", "d2024-01-08").table(TABLE).count(),
        count(uncached, f"{TABLE} VERSION AS OF 'd2024-01-08'"),
        count(uncached, TABLE),
    ))
    show("  pyiceberg by tag", catalog.load_table("exp.props").scan(
        snapshot_id=catalog.load_table("exp.props").snapshot_by_name("d2024-01-08").snapshot_id).to_arrow().num_rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this folder and keep it")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="ice-q5-"))
    root = folder / "warehouse"
    root.mkdir(parents=True, exist_ok=True)
    spark = spark_session(str(root), app="q5-q6")
    catalog = pyiceberg_catalog(str(root))
    summary_properties(spark, catalog)
    pinning_and_cache(spark, catalog)
    spark.stop()
    if not args.keep:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
