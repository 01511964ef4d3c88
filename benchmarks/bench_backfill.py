"""Benchmark: a 10-day backfill as ONE run versus ten one-day runs, through the real Dagster CLI.

    .venv/bin/python benchmarks/bench_backfill.py [--days 10] [--rows 10000] [--workdir DIR] [--keep]

Each day is a full snapshot of `--rows` rows derived from the day before (5% deleted, 10% updated,
the deleted rows replaced by new keys). Both modes run `dagster asset materialize` as a separate
process, as a user would; the one-run mode uses `--partition-range`, which is what a UI backfill of
the range does with the project's single-run backfill policy. Prints the figures and checks that both
modes wrote identical counts. Target: the one-run backfill costs at most 2x a single day's run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.csv  # noqa: F401 - registers pa.csv

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cdc_assets.generator import generate, write_part  # noqa: E402

START = date(2024, 1, 1)
TABLE = "backfill_bench"


def make_days(root: Path, days: int, rows: int, seed: int) -> list[str]:
    """Day 1 from the generator; each later day derived from the previous one."""
    dates = [(START + timedelta(days=i)).isoformat() for i in range(days)]
    scratch = root / "scratch"
    generate(rows, rows, 5, 10, 0.05, 0.10, 0.85, root / dates[0], scratch, seed=seed)
    shutil.rmtree(scratch)
    rng = np.random.default_rng(seed)
    table = pa.csv.read_csv(root / dates[0] / "part-00000.csv")
    for index, day in enumerate(dates[1:], start=1):
        order = rng.permutation(table.num_rows)
        deleted, updated = int(rows * 0.05), int(rows * 0.10)
        kept = table.take(order[deleted:])
        columns = {name: kept[name].to_numpy(zero_copy_only=False) for name in kept.column_names}
        for name in [n for n in kept.column_names if n.startswith("nonkey_")]:
            values = columns[name].copy()
            values[:updated] = np.round(values[:updated] + 1.0, 6)
            columns[name] = values
        new_keys = {
            name: np.array([f"{day}-{index}-{i}-{name}" for i in range(deleted)], dtype=object)
            for name in kept.column_names
            if name.startswith("key_")
        }
        new_values = {
            name: np.round(rng.uniform(0, 1000, deleted), 6) for name in kept.column_names if name.startswith("nonkey_")
        }
        table = pa.table({name: np.concatenate([columns[name], {**new_keys, **new_values}[name]]) for name in kept.column_names})
        write_part(table, root / day)
    return dates


def write_config(folder: Path, data_root: Path, table: str = TABLE, start: str = START.isoformat()) -> None:
    """``<folder>/<table>.yaml``: the synthetic columns (key_1..key_5 string, nonkey_1..nonkey_10 double),
    full load, source ``<data_root>/{date}/`` (CSV)."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = "\n".join(f"  - {{name: key_{i}, type: string}}" for i in range(1, 6))
    non_keys = "\n".join(f"  - {{name: nonkey_{i}, type: double}}" for i in range(1, 11))
    (folder / f"{table}.yaml").write_text(
        f"name: {table}\nstart_date: '{start}'\nload_type: full\n"
        f"source:\n  path: {data_root}/{{date}}/\n  format: csv\n"
        f"keys:\n{keys}\nnon_keys:\n{non_keys}\n"
    )


def materialize(env: dict, *partition_args: str) -> float:
    command = [
        str(REPO / ".venv" / "bin" / "dagster"), "asset", "materialize", "-m", "cdc_assets.definitions",
        "--select", f"group:{TABLE}", *partition_args,
    ]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        sys.exit(f"materialize {partition_args} failed:\n{completed.stderr[-4000:]}")
    return elapsed


def counts(warehouse: Path, table: str = TABLE) -> list[tuple]:
    """(business date, operation, rows) of history_partition, then of current_table: equal lists = same outputs."""
    return duckdb.sql(
        f"select cast(business_date as varchar), operation, count(*) from "
        f"read_parquet('{warehouse}/{table}/history_partition/*/*.parquet', hive_partitioning=true) group by all order by all"
    ).fetchall() + duckdb.sql(
        f"select cast(business_date as varchar), operation, count(*) from "
        f"read_parquet('{warehouse}/{table}/current_table/*/*.parquet', hive_partitioning=true) group by all order by all"
    ).fetchall()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdc_backfill_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        dates = make_days(workdir / "data", args.days, args.rows, args.seed)
        write_config(workdir / "configs", workdir / "data")
        base_env = {**os.environ, "CDC_TABLE_CONFIGS": str(workdir / "configs")}

        def env_for(mode: str) -> dict:
            home = workdir / mode / "dagster_home"
            home.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
            return {**base_env, "DAGSTER_HOME": str(home), "CDC_WAREHOUSE": str(workdir / mode / "warehouse")}

        day_env = env_for("day_by_day")
        per_day = [materialize(day_env, "--partition", day) for day in dates]
        range_env = env_for("one_run")
        one_run = materialize(range_env, "--partition-range", f"{dates[0]}...{dates[-1]}")

        identical = counts(workdir / "day_by_day" / "warehouse") == counts(workdir / "one_run" / "warehouse")
        single_day = sum(per_day[1:]) / max(1, len(per_day) - 1)  # day 1 has no previous state to join
        results = {
            "days": args.days,
            "rows_per_day": args.rows,
            "day_by_day_seconds": [round(s, 1) for s in per_day],
            "day_by_day_total_seconds": round(sum(per_day), 1),
            "single_day_run_seconds": round(single_day, 1),
            "one_run_backfill_seconds": round(one_run, 1),
            "one_run_over_single_day": round(one_run / single_day, 2),
            "target": "one_run_over_single_day <= 2.0",
            "outputs_identical": identical,
        }
        print(json.dumps(results, indent=2))
        (workdir / "results.json").write_text(json.dumps(results, indent=2))
        if not identical:
            sys.exit("day-by-day and one-run outputs differ")
        return 0
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
