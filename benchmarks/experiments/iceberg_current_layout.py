"""Experiment for issue 34 point 3: how should ``current_table`` be laid out on Apache Iceberg?

Standalone script, not part of the test suite nor of ``make benchmark``. It builds a ``--rows``-row current
state (5 string keys, 10 double non-keys, one untracked column, ``key_hash``/``row_hash`` MD5s, the stored
``operation`` with the date it was set and the date of the last change) in several layouts of one Iceberg
table in a JDBC catalog on SQLite (catalog ``lake``), applies a 1,000-row change (500 U, 300 I, 200 D) with
MERGE INTO, and prints a table of wall times and bytes. Then, on the merge-on-read table: tags per date,
reading a tag with the date's labels, compaction, snapshot expiry, orphan removal, the cost of keeping
tags, and erasing keys from every tag with a search of every file under the table's folder.

    .venv/bin/python benchmarks/experiments/iceberg_current_layout.py --rows 10000000 --workdir /tmp/ice-layout

Findings: docs/design/iceberg-current-table.md. Needs the Iceberg Spark runtime and sqlite-jdbc jars
(``--jars``); one Spark, ``local[2]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import re
import shutil
import sys
import time
import traceback
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from resources.storage.lake import spark_catalog_conf  # noqa: E402  (the project's own catalog conf)

DEFAULT_JARS = "/tmp/mvnchk/j2/iceberg-spark-runtime-4.0_2.13-1.11.0.jar,/tmp/mvnchk/jars/sqlite-jdbc-3.51.1.0.jar"
KEYS = [f"key_{i}" for i in range(1, 6)]
NON_KEYS = [f"nonkey_{i}" for i in range(1, 11)]
UNTRACKED = ["batch_id"]
COLUMNS = [*KEYS, *NON_KEYS, *UNTRACKED, "key_hash", "row_hash", "operation", "operation_date", "eff_start_date"]
DATES = ["2019-06-18", "2019-06-19", "2019-06-20"]
NS = "exp"
MiB = 1024 * 1024

# Each date after the first: 500 updates, 200 deletes of existing ids, 300 inserts of new ids. Existing ids are
# spread over the whole id range (a stride coprime with the row count), so over every file of the table.
STRIDE = 9973
PER_DATE = {"U": 500, "D": 200, "I": 300}

results: list[dict] = []
pitfalls: list[str] = []


def log(message: str) -> None:
    print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {message}", flush=True)


def record(step: str, **figures) -> None:
    results.append({"step": step, **figures})
    log(f"{step}: {figures}")


def attempt(step: str, fn):
    """Run one measurement; a failure is recorded as a pitfall and the experiment goes on."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001  (an experiment reports every failure and carries on)
        message = str(error).strip().splitlines()[0][:400]
        pitfalls.append(f"{step}: {type(error).__name__}: {message}")
        log(f"FAILED {step}: {message}")
        traceback.print_exc(limit=2)
        return None


def session(warehouse: Path, jars: str) -> SparkSession:
    builder = (SparkSession.builder.master("local[2]").appName("iceberg-current-layout")
               .config("spark.jars", jars)
               .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
               .config("spark.driver.memory", "4g")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1"))
    for key, value in spark_catalog_conf(str(warehouse)).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn()
    return round(time.perf_counter() - started, 2), value


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.name.endswith(".crc"))


# ---------------------------------------------------------------------------------------------- the data

def state_rows(ids: DataFrame, date: str, version: int, operation) -> DataFrame:
    """The stored columns for ``ids`` (column ``id``): keys are fixed-width texts (so a key's text is never a
    substring of another's), non-keys depend on ``version`` (a new version changes every non-key)."""
    keys = [F.concat(F.lit(f"k{i}-"), F.lpad(F.col("id").cast("string"), 10, "0")).alias(k)
            for i, k in enumerate(KEYS, 1)]
    non_keys = [((F.col("id") * (j + 7) + version * 13) % 1000 / 10.0).alias(c) for j, c in enumerate(NON_KEYS, 1)]
    frame = ids.select("*", *keys, *non_keys, F.lit(f"batch-{date}").alias("batch_id"))
    return frame.select(
        "*",
        F.md5(F.concat_ws("\u001f", *KEYS)).alias("key_hash"),
        F.md5(F.concat_ws("\u001f", *[F.col(c).cast("string") for c in NON_KEYS])).alias("row_hash"),
        (operation if not isinstance(operation, str) else F.lit(operation)).alias("operation"),
        F.lit(date).cast("date").alias("operation_date"),
        F.lit(date).cast("date").alias("eff_start_date"),
    )


def full_state(spark: SparkSession, rows: int) -> DataFrame:
    return state_rows(spark.range(0, rows, 1, 16), DATES[0], 0, "I").select(*COLUMNS)


def change_ids(rows: int, date_index: int) -> dict[str, list[int]]:
    """The ids updated, deleted and inserted on DATES[date_index] (1 or 2): disjoint across dates."""
    start = (date_index - 1) * (PER_DATE["U"] + PER_DATE["D"])
    existing = [(k * STRIDE) % rows for k in range(start, start + PER_DATE["U"] + PER_DATE["D"])]
    first_new = rows + (date_index - 1) * PER_DATE["I"]
    return {"U": existing[:PER_DATE["U"]], "D": existing[PER_DATE["U"]:],
            "I": list(range(first_new, first_new + PER_DATE["I"]))}


def delta_frame(spark: SparkSession, rows: int, date_index: int) -> DataFrame:
    """One date's changes: every column of the new version, plus ``change`` (I, U or D)."""
    ids = change_ids(rows, date_index)
    pairs = [(i, c) for c, values in ids.items() for i in values]
    frame = spark.createDataFrame(pairs, "id long, change string")
    date = DATES[date_index]
    return state_rows(frame, date, date_index, F.when(F.col("change") == "D", F.lit("D")).otherwise(F.col("change"))) \
        .select(*COLUMNS, "change")


MERGE_SQL = """
MERGE INTO {table} t USING {source} s ON t.key_hash = s.key_hash
WHEN MATCHED AND s.change = 'D' THEN DELETE
WHEN MATCHED THEN UPDATE SET {assignments}
WHEN NOT MATCHED AND s.change <> 'D' THEN INSERT ({columns}) VALUES ({values})
"""


def merge(spark: SparkSession, table: str, rows: int, date_index: int) -> None:
    delta_frame(spark, rows, date_index).createOrReplaceTempView("day_changes")
    spark.sql(MERGE_SQL.format(table=table, source="day_changes",
                               assignments=", ".join(f"t.{c} = s.{c}" for c in COLUMNS),
                               columns=", ".join(COLUMNS), values=", ".join(f"s.{c}" for c in COLUMNS)))


# ------------------------------------------------------------------------------------------- the catalog

def ref_snapshot(spark: SparkSession, table: str, ref: str = "main") -> int:
    return spark.sql(f"SELECT snapshot_id FROM {table}.refs WHERE name = '{ref}'").first()[0]


def summary(spark: SparkSession, table: str, ref: str = "main") -> dict[str, str]:
    row = spark.sql(f"SELECT summary FROM {table}.snapshots WHERE snapshot_id = {ref_snapshot(spark, table, ref)}").first()
    return dict(row[0])


def write_figures(s: dict[str, str]) -> dict:
    """What a commit wrote, from its snapshot summary."""
    def n(key):
        return int(s.get(key, 0))
    return {"added_MiB": round(n("added-files-size") / MiB, 2), "removed_MiB": round(n("removed-files-size") / MiB, 2),
            "added_data_files": n("added-data-files"), "deleted_data_files": n("deleted-data-files"),
            "added_delete_files": n("added-delete-files"), "added_pos_deletes": n("added-position-deletes"),
            "total_data_files": n("total-data-files"), "total_delete_files": n("total-delete-files"),
            "total_MiB": round(n("total-files-size") / MiB, 1)}


def create_table(spark: SparkSession, table: str, partitioned_by: str, properties: dict[str, str], ordered: bool,
                 extra_columns: tuple[str, ...] = ()) -> None:
    columns = ", ".join(f"{c} {'double' if c in NON_KEYS else 'date' if c.endswith('date') else 'string'}"
                        for c in (*COLUMNS, *extra_columns))
    props = ", ".join(f"'{k}' = '{v}'" for k, v in {"format-version": "2", **properties}.items())
    spark.sql(f"DROP TABLE IF EXISTS {table} PURGE")
    spark.sql(f"CREATE TABLE {table} ({columns}) USING iceberg {partitioned_by} TBLPROPERTIES ({props})")
    if ordered:
        spark.sql(f"ALTER TABLE {table} WRITE ORDERED BY key_hash")


def table_folder(spark: SparkSession, table: str) -> Path:
    """The JDBC catalog's default location: {warehouse}/{namespace}/{table}."""
    warehouse = spark.conf.get("spark.sql.catalog.lake.warehouse").removeprefix("file://")
    return Path(warehouse) / table.split(".")[1] / table.split(".")[2]


def mode_properties(mode: str) -> dict[str, str]:
    return {"write.merge.mode": mode, "write.update.mode": mode, "write.delete.mode": mode}


# --------------------------------------------------------------------------------------------- measures

def baselines(spark: SparkSession, rows: int, work: Path) -> dict:
    """Point 2 and 6: a full copy of the state, as today's plain Parquet and as a business_date partition."""
    out = {}
    target = work / "plain_parquet"
    seconds, _ = timed(lambda: full_state(spark, rows).write.mode("overwrite").parquet(str(target)))
    out["plain"] = seconds
    record("baseline: full copy as plain Parquet (today's snapshot layout)", wall_s=seconds,
           added_MiB=round(folder_bytes(target) / MiB, 1))
    shutil.rmtree(target, ignore_errors=True)

    table = f"lake.{NS}.per_date"
    create_table(spark, table, "PARTITIONED BY (business_date)", {}, ordered=False, extra_columns=("business_date",))
    for index in (0, 1):
        frame = full_state(spark, rows).withColumn("business_date", F.lit(DATES[index]).cast("date"))
        seconds, _ = timed(lambda: frame.writeTo(table).overwritePartitions())
        record(f"baseline: Iceberg partitioned by business_date, full copy of date {index + 1}", wall_s=seconds,
               **write_figures(summary(spark, table)))
        out[f"per_date_{index + 1}"] = seconds
    spark.sql(f"DROP TABLE {table} PURGE")
    return out


VARIANTS = {
    # name: (PARTITIONED BY clause, ordered by key_hash, merge mode)
    "unpartitioned-cow": ("", False, "copy-on-write"),
    "unpartitioned-mor": ("", False, "merge-on-read"),
    "bucket16-cow": ("PARTITIONED BY (bucket(16, key_hash))", False, "copy-on-write"),
    "bucket16-mor": ("PARTITIONED BY (bucket(16, key_hash))", False, "merge-on-read"),
    "bucket16-sorted-cow": ("PARTITIONED BY (bucket(16, key_hash))", True, "copy-on-write"),
    "bucket16-sorted-mor": ("PARTITIONED BY (bucket(16, key_hash))", True, "merge-on-read"),
}


def variant(spark: SparkSession, name: str, rows: int, keep: bool, extra: dict[str, str] | None = None) -> str:
    """Point 1: the full load in this layout, then one date's MERGE."""
    partitioned_by, ordered, mode = VARIANTS[name]
    table = f"lake.{NS}.{name.replace('-', '_')}"
    create_table(spark, table, partitioned_by, {**mode_properties(mode), **(extra or {})}, ordered)
    seconds, _ = timed(lambda: full_state(spark, rows).writeTo(table).append())
    load = write_figures(summary(spark, table))
    record(f"{name}: full load ({rows:,} rows)", wall_s=seconds, **load)
    spark.sql(f"ALTER TABLE {table} CREATE TAG `{DATES[0]}`")
    location = table_folder(spark, table)
    before = folder_bytes(location)
    merge_seconds, _ = timed(lambda: merge(spark, table, rows, 1))
    figures = write_figures(summary(spark, table))
    record(f"{name}: MERGE of 1,000 changes", wall_s=merge_seconds, ratio_to_full_load=round(merge_seconds / seconds, 3),
           folder_growth_MiB=round((folder_bytes(location) - before) / MiB, 2), **figures)
    spark.sql(f"ALTER TABLE {table} CREATE TAG `{DATES[1]}`")
    if not keep:
        spark.sql(f"DROP TABLE {table} PURGE")
    return table


def label_read(spark: SparkSession, table: str, date: str, unsupplied: str = "N") -> DataFrame:
    """Date D's state with D's labels: the stored operation if it was set on D, else N (full load) or X (delta)."""
    return spark.sql(f"""
        SELECT {', '.join(c for c in COLUMNS if c not in ('operation', 'operation_date'))},
               CASE WHEN operation_date = DATE'{date}' THEN operation ELSE '{unsupplied}' END AS operation
        FROM {table} VERSION AS OF '{date}'""")


def reads(spark: SparkSession, table: str, label: str) -> None:
    for date in DATES:
        seconds, counts = timed(lambda: {r[0]: r[1] for r in label_read(spark, table, date).groupBy("operation").count().collect()})
        record(f"{label}: labels as of tag {date} (groupBy operation)", wall_s=seconds, counts=counts)
    seconds, value = timed(lambda: label_read(spark, table, DATES[-1]).select(F.count("*"), F.sum(F.hash(*COLUMNS[:-2]))).first())
    record(f"{label}: full-row read as of tag {DATES[-1]} (hash of every column)", wall_s=seconds, rows=value[0])
    seconds, value = timed(lambda: spark.table(table).select(F.count("*"), F.sum(F.hash(*COLUMNS))).first())
    record(f"{label}: full-row read of main", wall_s=seconds, rows=value[0])


def call(spark: SparkSession, sql: str) -> dict:
    row = spark.sql(sql).first()
    return row.asDict() if row else {}


def maintenance(spark: SparkSession, table: str, location: Path) -> None:
    short = table.removeprefix("lake.")
    seconds, out = timed(lambda: call(spark, f"CALL lake.system.rewrite_position_delete_files(table => '{short}', "
                                             f"options => map('rewrite-all', 'true'))"))
    record("maintenance: rewrite_position_delete_files (rewrite-all)", wall_s=seconds, result=out,
           **write_figures(summary(spark, table)))
    seconds, out = timed(lambda: call(spark, f"CALL lake.system.rewrite_data_files(table => '{short}', "
                                             f"options => map('delete-file-threshold', '1'))"))
    record("maintenance: rewrite_data_files (files with >= 1 delete)", wall_s=seconds, result=out,
           **write_figures(summary(spark, table)))
    tags_bytes(spark, table, location, "after compaction, before expiry")
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    time.sleep(1)
    seconds, out = timed(lambda: call(spark, f"CALL lake.system.expire_snapshots(table => '{short}', "
                                             f"older_than => TIMESTAMP '{now}', retain_last => 1)"))
    record("maintenance: expire_snapshots (all but main's head; tags keep theirs)", wall_s=seconds, result=out)
    orphan = location / "data" / "orphan-from-a-killed-write.parquet"
    orphan.write_bytes(b"PAR1 not a real file PAR1")
    old = time.time() - 3 * 86400
    os.utime(orphan, (old, old))
    attempt("remove_orphan_files younger than 24 hours", lambda: spark.sql(
        f"CALL lake.system.remove_orphan_files(table => '{short}', older_than => TIMESTAMP '{now}')").count())
    day_ago = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=25)).strftime("%Y-%m-%d %H:%M:%S")
    seconds, found = timed(lambda: spark.sql(f"CALL lake.system.remove_orphan_files(table => '{short}', "
                                             f"older_than => TIMESTAMP '{day_ago}')").count())
    record("maintenance: remove_orphan_files (older than 25 h)", wall_s=seconds, orphans_removed=found,
           planted_orphan_gone=not orphan.exists())
    tags_bytes(spark, table, location, "after compaction and expiry")


def tags_bytes(spark: SparkSession, table: str, location: Path, when: str) -> None:
    """What tags cost: the bytes only a tag still reaches, against main's."""
    live = spark.sql(f"SELECT sum(file_size_in_bytes) FROM {table}.files").first()[0]
    reachable = spark.sql(f"SELECT sum(file_size_in_bytes) FROM (SELECT DISTINCT file_path, file_size_in_bytes "
                          f"FROM {table}.all_files)").first()[0]
    record(f"tags: bytes {when}", main_files_MiB=round(live / MiB, 1), reachable_by_any_snapshot_MiB=round(reachable / MiB, 1),
           folder_MiB=round(folder_bytes(location) / MiB, 1),
           snapshots=spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0],
           refs=[r[0] for r in spark.sql(f"SELECT name FROM {table}.refs ORDER BY name").collect()])


# ---------------------------------------------------------------------------------------------- erasure

def avro_blocks(raw: bytes) -> bytes:
    """The decompressed contents of an Avro container file (Iceberg's manifests and manifest lists)."""
    pos = 4

    def read_long() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            b = raw[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return (result >> 1) ^ -(result & 1)

    def read_bytes() -> bytes:
        nonlocal pos
        size = read_long()
        value = raw[pos:pos + size]
        pos += size
        return value

    meta = {}
    while True:
        count = read_long()
        if count == 0:
            break
        if count < 0:
            count = -count
            read_long()
        for _ in range(count):
            name = read_bytes().decode()  # before the value: `meta[a()] = b()` calls b() first
            meta[name] = read_bytes()
    pos += 16
    codec = meta.get("avro.codec", b"null").decode()
    out = [raw[:pos]]
    while pos < len(raw):
        read_long()
        block = read_bytes()
        pos += 16
        if codec == "deflate":
            block = zlib.decompress(block, -15)
        elif codec == "zstandard":
            import zstandard
            block = zstandard.ZstdDecompressor().decompress(block, max_output_size=1 << 30)
        elif codec != "null":
            raise ValueError(f"avro codec {codec} not handled")
        out.append(block)
    return b"".join(out)


def search_folder(location: Path, needles: dict[str, str], key_hashes: list[str]) -> dict[str, list[str]]:
    """Every file under the table's folder: raw bytes (footers, page indexes, metadata JSON), decompressed Avro
    blocks (manifests: column bounds) and decoded Parquet values (pages are compressed, so a raw search of
    them proves nothing). Returns needle -> files holding it."""
    hits: dict[str, list[str]] = {name: [] for name in needles}
    hits["decoded parquet key_hash or key_1"] = []
    key_texts = [v for k, v in needles.items() if k.endswith("key_1 text")]
    for path in sorted(p for p in location.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        texts = [raw]
        if path.suffix == ".avro":
            texts.append(avro_blocks(raw))
        if path.name.endswith(".gz.metadata.json"):
            texts.append(gzip.decompress(raw))
        for name, needle in needles.items():
            if any(needle.encode() in t for t in texts):
                hits[name].append(str(path.relative_to(location)))
        if path.suffix == ".parquet" and raw[:4] == b"PAR1":
            columns = pq.read_schema(path).names
            if "key_hash" in columns:
                frame = pq.read_table(path, columns=["key_hash", "key_1"])
                if (pc.any(pc.is_in(frame.column("key_hash"), value_set=pa.array(key_hashes))).as_py()
                        or pc.any(pc.is_in(frame.column("key_1"), value_set=pa.array(key_texts))).as_py()):
                    hits["decoded parquet key_hash or key_1"].append(str(path.relative_to(location)))
    return {k: v for k, v in hits.items()}


def erase(spark: SparkSession, table: str, location: Path, ids: list[int], rewrite_on_branch: bool, label: str) -> None:
    """Point 5: remove ``ids`` from main and from every tag, then expire and remove orphans, then search."""
    short = table.removeprefix("lake.")
    keys = spark.createDataFrame([(i,) for i in ids], "id long")
    hashes = [r[0] for r in state_rows(keys, DATES[0], 0, "I").select("key_hash").collect()]
    in_list = ", ".join(f"'{h}'" for h in hashes)
    present = {d: label_read(spark, table, d).where(f"key_hash IN ({in_list})").count() for d in DATES}
    record(f"{label}: keys present before the erase", per_tag=present)
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('write.delete.mode' = 'copy-on-write')")
    started = time.perf_counter()
    spark.sql(f"DELETE FROM {table} WHERE key_hash IN ({in_list})")
    main_figures = write_figures(summary(spark, table))
    per_tag = {}
    for date in DATES:
        branch = f"erase_{date.replace('-', '_')}"
        snapshot = ref_snapshot(spark, table, date)
        spark.sql(f"ALTER TABLE {table} CREATE BRANCH {branch} AS OF VERSION {snapshot}")
        spark.sql(f"DELETE FROM {table}.branch_{branch} WHERE key_hash IN ({in_list})")
        figures = write_figures(summary(spark, table, branch))
        if rewrite_on_branch:
            # Rows an earlier merge-on-read update masked with a position delete are not seen by the DELETE, so
            # their file is not rewritten: compact every file that may hold the keys (partition/bounds), deletes applied.
            out = call(spark, f"CALL lake.system.rewrite_data_files(table => '{short}', branch => '{branch}', "
                              f"where => \"key_hash IN ({in_list})\", options => map('rewrite-all', 'true'))")
            figures["rewrite"] = out
        head = ref_snapshot(spark, table, branch)
        spark.sql(f"ALTER TABLE {table} CREATE OR REPLACE TAG `{date}` AS OF VERSION {head}")
        spark.sql(f"ALTER TABLE {table} DROP BRANCH {branch}")
        per_tag[date] = figures
    erase_seconds = round(time.perf_counter() - started, 2)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    time.sleep(1)
    seconds_expire, expired = timed(lambda: call(spark, f"CALL lake.system.expire_snapshots(table => '{short}', "
                                                        f"older_than => TIMESTAMP '{now}', retain_last => 1)"))
    seconds_orphans, orphans = timed(lambda: sweep_unreachable(spark, table, location))
    after = {d: label_read(spark, table, d).where(f"key_hash IN ({in_list})").count() for d in DATES}
    record(f"{label}: erase from main and {len(DATES)} tags", wall_s=erase_seconds, expire_s=seconds_expire,
           orphans_s=seconds_orphans, orphans_removed=orphans, main=main_figures, per_tag=per_tag, expired=expired, present_after=after)
    needles = {}
    for i, (id_, h) in enumerate(zip(ids, hashes)):
        needles[f"key {id_} hash"] = h
        needles[f"key {id_} hash[:16] (manifest bound)"] = h[:16]
        needles[f"key {id_} key_1 text"] = f"k1-{id_:010d}"
    seconds, hits = timed(lambda: search_folder(location, needles, hashes))
    record(f"{label}: search of every file under the table", wall_s=seconds,
           files=sum(1 for p in location.rglob('*') if p.is_file()), hits=hits)


def sweep_unreachable(spark: SparkSession, table: str, location: Path) -> list[str]:
    """Delete every file under the table's folder that no snapshot or metadata log entry reaches. The procedure
    ``remove_orphan_files`` refuses ``older_than`` within the last 24 hours, and an erase cannot wait a day; this
    is only safe while no other writer commits to the table (the project's writer lock)."""
    def normal(path: str) -> str:
        return "/" + re.sub(r"^file:/*", "", path).lstrip("/")
    reachable = set()
    for query in (f"SELECT file_path FROM {table}.all_files", f"SELECT path FROM {table}.all_manifests",
                  f"SELECT manifest_list FROM {table}.snapshots", f"SELECT file FROM {table}.metadata_log_entries"):
        reachable.update(normal(r[0]) for r in spark.sql(query).collect())
    removed = []
    for path in sorted(p for p in location.rglob("*") if p.is_file()):
        owner = path.with_name(path.name[1:-4]) if path.name.startswith(".") and path.name.endswith(".crc") else path
        if str(owner) not in reachable:
            path.unlink()
            removed.append(str(path.relative_to(location)))
    return removed


def pick_bound_key(spark: SparkSession, table: str) -> int:
    """An id whose key_hash is a data file's lower bound in main (so manifests hold it as a column bound)."""
    row = spark.sql(f"SELECT key_1, key_hash FROM {table} ORDER BY key_hash LIMIT 1").first()
    return int(row[0].split("-")[1])


TABLE_COLUMNS = ("wall_s", "ratio_to_full_load", "added_MiB", "removed_MiB", "added_data_files", "deleted_data_files",
                 "added_delete_files", "added_pos_deletes", "total_MiB")


def print_table(rows: list[dict]) -> None:
    """The figures as one table: a row per step, the write figures where the step committed."""
    width = max(len(r["step"]) for r in rows) if rows else 10
    print("\n=== figures ===")
    print(f"{'step':<{width}} " + " ".join(f"{c:>18}" for c in TABLE_COLUMNS))
    for r in rows:
        print(f"{r['step']:<{width}} " + " ".join(f"{'' if r.get(c) is None else r[c]!s:>18}" for c in TABLE_COLUMNS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--workdir", default="/tmp/ice-layout")
    parser.add_argument("--jars", default=DEFAULT_JARS)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--study", default="bucket16-mor", help="the variant kept for reads, tags, maintenance, erasure")
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument("--study-properties", default="",
                        help="extra table properties of the study variant, k=v,k=v (e.g. write.metadata.metrics.default=counts)")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    args = parser.parse_args()

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    warehouse = work / "warehouse"
    warehouse.mkdir(parents=True)
    spark = session(warehouse, args.jars)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    log(f"rows={args.rows:,} Spark {spark.version}")
    started = time.perf_counter()

    if not args.skip_baselines:
        attempt("baselines", lambda: baselines(spark, args.rows, work))
    for name in args.variants.split(","):
        if name != args.study:
            attempt(name, lambda: variant(spark, name, args.rows, keep=False))

    extra = dict(kv.split("=", 1) for kv in args.study_properties.split(",") if kv)
    table = attempt(args.study, lambda: variant(spark, args.study, args.rows, keep=True, extra=extra))
    if table:
        location = table_folder(spark, table)
        seconds, _ = timed(lambda: merge(spark, table, args.rows, 2))
        record(f"{args.study}: MERGE of date 3", wall_s=seconds, **write_figures(summary(spark, table)))
        spark.sql(f"ALTER TABLE {table} CREATE TAG `{DATES[2]}`")
        tags_bytes(spark, table, location, "3 tags, before maintenance")
        attempt("reads before compaction", lambda: reads(spark, table, "read (MOR, 2 dates of deletes)"))
        attempt("maintenance", lambda: maintenance(spark, table, location))
        attempt("reads after compaction", lambda: reads(spark, table, "read (after compaction of main)"))
        # Erase A: only a key updated on date 2 (its old version is masked by a position delete in every later
        # tag: does a DELETE rewrite that file?). Erase B: a key never changed (in date 1's files only), another
        # updated key, and the key whose hash is a data file's lower bound (manifests hold it as a column bound).
        updated = change_ids(args.rows, 1)["U"]
        attempt("erase (DELETE per tag)", lambda: erase(spark, table, location, [updated[1]],
                                                        rewrite_on_branch=False, label="erase A (DELETE on a branch per tag)"))
        bound_key = pick_bound_key(spark, table)
        log(f"bound key {bound_key}")
        attempt("erase (rewrite on branch)", lambda: erase(
            spark, table, location, [6, updated[2], bound_key], rewrite_on_branch=True,
            label="erase B (DELETE + rewrite_data_files on a branch per tag)"))

    log(f"total {time.perf_counter() - started:.0f}s")
    print_table(results)
    print("\n=== every figure ===")
    for r in results:
        print(json.dumps(r, default=str))
    print("\n=== pitfalls ===")
    for p in pitfalls:
        print(p)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": args.rows, "results": results, "pitfalls": pitfalls},
                                              indent=1, default=str))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
