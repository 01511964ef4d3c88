"""A Spark writer process for q1/q2: runs a plan of phases, each a loop of overwrites of one
``business_date`` of one table, in step with the other writer through files in a shared folder.

    python -m benchmarks.experiments.writer_loop ROOT NAME PLAN.json RESULTS.jsonl

Writer ``A`` creates each phase's table and seeds its dates; then both say ready and wait for each
other; then each writes ``iterations`` times and records every attempt (success, or the error's
classes and message) in RESULTS.jsonl. Every commit carries ``cdc.writer`` and ``cdc.iteration`` in its
snapshot summary so that the checker matches commits to attempts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.experiments.lake_env import append_jsonl, describe_error, spark_session, wait_for_file


def table_ddl(table: str, properties: dict[str, str]) -> str:
    props = {"format-version": "2", **properties}
    listed = ", ".join(f"'{key}'='{value}'" for key, value in props.items())
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (business_date DATE, id BIGINT, writer STRING, iteration INT) "
        f"USING iceberg PARTITIONED BY (business_date) TBLPROPERTIES ({listed})"
    )


def frame(spark, date: str, rows: int, writer: str, iteration: int):
    from pyspark.sql import functions as F

    return spark.range(rows).select(
        F.lit(date).cast("date").alias("business_date"),
        F.col("id"),
        F.lit(writer).alias("writer"),
        F.lit(iteration).alias("iteration"),
    )


def current_snapshot(spark, table: str) -> int | None:
    rows = spark.sql(f"SELECT snapshot_id FROM {table}.refs WHERE name = 'main'").collect()
    return rows[0][0] if rows else None


def write(spark, phase: dict, writer: str, iteration: int, date: str) -> None:
    from pyspark.sql import functions as F

    options = dict(phase.get("write_options", {}))
    if phase.get("validate_from_current"):
        base = current_snapshot(spark, phase["table"])
        if base is not None:
            options["validate-from-snapshot-id"] = str(base)
    # The time a real run computes between reading its base and committing: lets the two writers overlap.
    time.sleep(phase.get("think_seconds", 0.3))
    df = frame(spark, date, phase["rows"], writer, iteration)
    builder = df.writeTo(phase["table"])
    for key, value in options.items():
        builder = builder.option(key, value)
    builder = builder.option("snapshot-property.cdc.writer", writer).option("snapshot-property.cdc.iteration", str(iteration))
    if phase["op"] == "overwrite":
        builder.overwrite(F.col("business_date") == F.lit(date).cast("date"))
    elif phase["op"] == "overwritePartitions":
        builder.overwritePartitions()
    elif phase["op"] == "append":
        builder.append()
    else:
        raise ValueError(f"unknown op {phase['op']!r}")


def barrier(folder: Path, phase: str, step: str, name: str, other: str | None) -> None:
    (folder / f"{phase}.{step}.{name}").touch()
    if other:
        wait_for_file(folder / f"{phase}.{step}.{other}", timeout=600)


def main(root: str, name: str, plan_path: str, results_path: str) -> None:
    from pyspark.sql import functions as F

    plan = json.loads(Path(plan_path).read_text())
    folder = Path(plan_path).parent
    other = {"A": "B", "B": "A"}.get(name) if plan.get("writers", 2) == 2 else None
    spark = spark_session(root, plan.get("catalog_props"), app=f"writer-{name}")
    results = Path(results_path)
    for phase in plan["phases"]:
        if name == "A":
            spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.exp")
            spark.sql(table_ddl(phase["table"], phase.get("table_props", {})))
            for date in sorted(set(phase["dates"].values())):
                seed = frame(spark, date, phase["rows"], "seed", 0).writeTo(phase["table"])
                seed = seed.option("snapshot-property.cdc.writer", "seed").option("snapshot-property.cdc.iteration", "0")
                seed.overwrite(F.col("business_date") == F.lit(date).cast("date"))
        barrier(folder, phase["name"], "ready", name, other)
        date = phase["dates"].get(name)
        if date is not None:
            for iteration in range(1, phase["iterations"] + 1):
                started = time.time()
                record = {"phase": phase["name"], "writer": name, "iteration": iteration, "date": date}
                try:
                    write(spark, phase, name, iteration, date)
                    record["ok"] = True
                except Exception as error:  # noqa: BLE001 - the experiment records whatever the loser sees
                    record["ok"] = False
                    record["error"] = describe_error(error)
                record["seconds"] = round(time.time() - started, 2)
                append_jsonl(results, record)
        barrier(folder, phase["name"], "done", name, other)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
