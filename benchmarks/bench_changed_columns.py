"""Benchmark: what ``changed_columns`` costs the CDC step, day 2 of the synthetic data (issue 12).

    .venv/bin/python benchmarks/bench_changed_columns.py [--rows 1000000] [--workdir DIR] [--runs 3]

Day 1 and day 2 are read, validated and hashed once and stored as Parquet, and day 1's state is
built (untimed). Then the CDC step's work for day 2 runs ``--runs`` times with ``changed_columns`` and
as many times without, alternating: ``classify_changes`` (the one full outer join, with the audit
columns either way), cached and counted as the step does, then ``history_partition`` and ``updates``
written to Parquet. Prints every run, the median of each variant and their ratio. One JVM, so both
variants run equally warm; alternating spreads machine noise over both.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date, datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DAY1, DAY2 = "2019-06-18", "2019-06-19"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp dir, deleted at the end")
    parser.add_argument("--runs", type=int, default=3, help="runs per variant, alternating")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdc_changed_columns_"))
    data = workdir / "data" / "synthetic"
    os.environ["CDC_DATA_ROOT"] = str(workdir)

    from pyspark import StorageLevel

    from cdc_assets.config import LoadType, load_table_config
    from cdc_assets.core import changes as cdc
    from cdc_assets.core.hashing import add_hashes
    from cdc_assets.core.source import read_source, validate_records
    from cdc_assets.generator import generate
    from resources.spark import build_spark_session

    if not (data / DAY2).exists():
        generate(args.rows, args.rows, 5, 10, 0.2, 0.4, 0.4, data / DAY1, data / DAY2, seed=42)
    spark = build_spark_session(app_name="bench_changed_columns")
    config = load_table_config(REPO / "table_configs" / "synthetic.yaml")
    keys = [(column.name, column.type) for column in config.keys]
    non_keys = [(column.name, column.type) for column in config.non_keys]
    payload = [column.name for column in config.columns]
    non_key_names = [column.name for column in config.non_keys]
    stored = workdir / "stored"
    audit = cdc.RunAudit("bench", datetime.now(timezone.utc))

    started = time.perf_counter()
    for day in (DAY1, DAY2):
        hashed = add_hashes(validate_records(read_source(spark, config, day), config), keys, non_keys)
        hashed.filter("_reject_reason IS NULL").select(*payload, "key_hash", "non_key_hash").write.mode("overwrite").parquet(
            str(stored / f"incoming_{day}")
        )
    day1 = spark.read.parquet(str(stored / f"incoming_{DAY1}"))
    first = cdc.classify_changes(day1, None, date.fromisoformat(DAY1), LoadType.full, payload, audit, non_key_names)
    cdc.build_current(first).write.mode("overwrite").parquet(str(stored / "current_day1"))
    print(f"prepared day 1 and day 2 ({args.rows:,} rows each) in {time.perf_counter() - started:.1f}s", flush=True)

    def day2(with_changed_columns: bool) -> float:
        began = time.perf_counter()
        changes = cdc.classify_changes(
            spark.read.parquet(str(stored / f"incoming_{DAY2}")),
            spark.read.parquet(str(stored / "current_day1")),
            date.fromisoformat(DAY2),
            LoadType.full,
            payload,
            audit,
            non_key_names if with_changed_columns else None,
        ).persist(StorageLevel.MEMORY_AND_DISK)
        counts = cdc.count_operations(changes)
        cdc.build_history(changes).write.mode("overwrite").parquet(str(workdir / "out" / "history"))
        cdc.with_operations(changes, [cdc.UPDATE]).write.mode("overwrite").parquet(str(workdir / "out" / "updates"))
        changes.unpersist()
        assert counts[cdc.UPDATE] > 0
        return time.perf_counter() - began

    day2(True)  # warm-up, not counted: the first run compiles and loads what both variants use
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for run in range(args.runs):
        for variant in ((True, False) if run % 2 == 0 else (False, True)):
            seconds[variant].append(day2(variant))
            print(f"run {run + 1}: {'with' if variant else 'without'} changed_columns {seconds[variant][-1]:.2f}s", flush=True)
    with_median, without_median = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(
        f"\nday 2 CDC work at {args.rows:,} rows (classify + count + write history and updates), median of {args.runs}:\n"
        f"  with changed_columns    {with_median:.2f}s  {sorted(round(s, 2) for s in seconds[True])}\n"
        f"  without changed_columns {without_median:.2f}s  {sorted(round(s, 2) for s in seconds[False])}\n"
        f"  ratio {with_median / without_median:.3f}"
    )
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
