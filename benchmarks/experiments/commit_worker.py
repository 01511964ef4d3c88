"""A Spark process that commits on command, for q3 (kill -9 mid-commit) and q4 (a date over several tables).

    python -m benchmarks.experiments.commit_worker ROOT FOLDER [PATIENT_CACHE]

It opens two sessions on the catalog: ``default`` (the catalog's properties as ``lake.py`` sets them)
and ``patient`` (plus ``jdbc.busy_timeout``: a commit that finds the SQLite file locked waits for it
instead of failing; its catalog cache on unless PATIENT_CACHE is ``false``). Then it writes FOLDER/ready and runs commands: for each N from 1 it waits for
FOLDER/cmd-N.json, runs it, and writes FOLDER/result-N.json. A command is
``{"session": "default"|"patient", "writes": [{"table": ..., "date": ..., "run": ..., "rows": ...}, ...],
"publish": {...} | null}``: each write is one ``overwrite(business_date = date)`` commit of its table; after
each one it writes FOLDER/committed-N-K (K from 1), so that a test can act between two tables' commits.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.experiments.lake_env import CATALOG_PREFIX, describe_error, spark_session

PATIENT_BUSY_TIMEOUT_MS = "600000"


def overwrite_date(spark, table: str, date: str, run: str, rows: int, write: dict | None = None) -> None:
    """One commit of ``date`` to ``table``. ``write`` may say ``"op": "merge"`` (SQL MERGE of the date's
    rows on (business_date, id), setting ``run``), ``"options"`` (write options of an overwrite) and
    ``"validate_from_current": true`` (``validate-from-snapshot-id`` = main's snapshot before computing)."""
    from pyspark.sql import functions as F

    write = write or {}
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {table} (business_date DATE, id BIGINT, run STRING) "
        "USING iceberg PARTITIONED BY (business_date) TBLPROPERTIES ('format-version'='2')"
    )
    df = spark.range(rows).select(F.lit(date).cast("date").alias("business_date"), F.col("id"), F.lit(run).alias("run"))
    if write.get("op") == "merge":
        view = f"changes_{run.replace('-', '_')}"
        df.createOrReplaceTempView(view)
        spark.conf.set("spark.sql.iceberg.snapshot-property.cdc.run-id", run)
        try:
            spark.sql(
                f"MERGE INTO {table} t USING {view} s ON t.business_date = s.business_date AND t.id = s.id "
                "WHEN MATCHED THEN UPDATE SET run = s.run WHEN NOT MATCHED THEN INSERT *"
            )
        finally:
            spark.conf.unset("spark.sql.iceberg.snapshot-property.cdc.run-id")
        return
    options = dict(write.get("options", {}))
    if write.get("validate_from_current"):
        options["validate-from-snapshot-id"] = str(
            spark.sql(f"SELECT snapshot_id FROM {table}.refs WHERE name = 'main'").collect()[0][0]
        )
    writer = df.writeTo(table).option("snapshot-property.cdc.run-id", run).option("snapshot-property.cdc.business-date", date)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.overwrite(F.col("business_date") == F.lit(date).cast("date"))


def publish(spark, marker_table: str, date: str, run: str, tables: list[str]) -> None:
    """Publish ``date`` as a whole: one commit of the marker table naming each table's snapshot now."""
    from pyspark.sql import functions as F

    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {marker_table} (business_date DATE, table_name STRING, snapshot_id BIGINT, run STRING) "
        "USING iceberg PARTITIONED BY (business_date) TBLPROPERTIES ('format-version'='2')"
    )
    rows = []
    for table in tables:
        snapshot = spark.sql(f"SELECT snapshot_id FROM {table}.refs WHERE name = 'main'").collect()[0][0]
        rows.append((date, table, snapshot, run))
    df = spark.createDataFrame(rows, "business_date STRING, table_name STRING, snapshot_id BIGINT, run STRING")
    df = df.withColumn("business_date", F.col("business_date").cast("date"))
    df.writeTo(marker_table).option("snapshot-property.cdc.run-id", run).overwrite(
        F.col("business_date") == F.lit(date).cast("date")
    )


def main(root: str, folder: str, patient_cache: str = "true") -> None:
    out = Path(folder)
    # Uncached: every table load reads the catalog (so the default busy timeout shows where it fails).
    default = spark_session(root, {"cache-enabled": "false"}, app="commit-worker")
    patient = default.newSession()
    # A new session of the same JVM: the builder's catalog conf, its own catalog instance, plus the busy wait.
    patient.conf.set(f"{CATALOG_PREFIX}.jdbc.busy_timeout", PATIENT_BUSY_TIMEOUT_MS)
    # Cached (the catalog's default): a write's table load does not touch SQLite, so the first catalog
    # access of a write is inside its commit (the refresh before the new snapshot is applied). Uncached
    # (the recommended conf): the load reads the catalog too, which only an EXCLUSIVE lock blocks.
    patient.conf.set(f"{CATALOG_PREFIX}.cache-enabled", patient_cache)
    sessions = {"default": default, "patient": patient}
    default.sql("CREATE NAMESPACE IF NOT EXISTS lake.exp")
    (out / "ready").touch()
    number = 0
    while True:
        number += 1
        command_file = out / f"cmd-{number}.json"
        while not command_file.exists():
            time.sleep(0.05)
        command = json.loads(command_file.read_text())
        if command.get("stop"):
            break
        spark = sessions[command["session"]]
        result = {"command": number, "ok": True, "started": time.time()}
        try:
            for index, write in enumerate(command["writes"], start=1):
                overwrite_date(spark, write["table"], write["date"], write["run"], write["rows"], write)
                (out / f"committed-{number}-{index}").touch()
                gate = out / f"continue-{number}-{index}"
                if command.get("gated"):
                    while not gate.exists():
                        time.sleep(0.05)
            if command.get("publish"):
                p = command["publish"]
                publish(spark, p["marker"], p["date"], p["run"], [w["table"] for w in command["writes"]])
        except Exception as error:  # noqa: BLE001 - the experiment records what the writer sees
            result.update(ok=False, error=describe_error(error))
        result["seconds"] = round(time.time() - result.pop("started"), 2)
        (out / f"result-{number}.json").write_text(json.dumps(result))
    default.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
