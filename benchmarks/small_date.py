"""A small date's steps, in process: where a date's fixed cost goes (issue 50).

``python -m benchmarks.small_date [--rows N] [--later-dates N]`` runs, in this process on
``local[2]`` with the test suite's settings (interpreted expressions, C1 only: ``tests/codegen.py``), a table
of the demo's shape: date 1, then ``--later-dates`` later dates, each one run of the table's job through
the project's IO manager into a fresh warehouse. It prints each run's wall seconds and each step's
seconds from the run's events, then the mean of the later dates. Not a harness scenario: no
yardstick, no fresh process per run; it measures what a test's run costs, and what a small date's
steps cost once the JVM is warm. Compare two commits by running it in each, alternately.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

# What the suite's JVMs get (tests/conftest.py), set before the JVM starts.
SUITE_JVM_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN"
)
FIRST_DAY = "2019-06-18"
STEPS = ("hashed_incoming", "intake_checks", "cdc", "cdc_checks", "publish")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.small_date", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000, help="rows a date (default 1000)")
    parser.add_argument("--later-dates", type=int, default=3, help="dates after the first (default 3)")
    args = parser.parse_args(argv)
    os.environ["JDK_JAVA_OPTIONS"] = SUITE_JVM_OPTIONS
    workdir = Path(tempfile.mkdtemp(prefix="small_date_"))
    os.environ["CDC_WAREHOUSE"] = str(workdir / "warehouse")
    try:
        later = _run(workdir, args.rows, args.later_dates)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("later dates, mean: " + "  ".join(f"{name} {statistics.mean(values):.2f}s" for name, values in later.items()))
    return 0


def _run(workdir: Path, rows: int, later_dates: int) -> dict[str, list[float]]:
    from datetime import date, timedelta

    from dagster import DagsterEventType, DagsterInstance

    from cdc_assets.cli.generate import generate
    from cdc_assets.defs.component import build_definitions
    from cdc_assets.defs.factory import build_table_definitions
    from cdc_assets.model.config import load_table_config
    from resources.session.spark_session import build_spark_session

    spark = build_spark_session(master="local[2]", conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"},
                                app_name="small_date")
    spark.sparkContext.setLogLevel("ERROR")
    days = [(date.fromisoformat(FIRST_DAY) + timedelta(days=n)).isoformat() for n in range(later_dates + 1)]
    extracts = workdir / "extracts"
    # Date 2 is 20% deleted, 40% updated, 20% new; the dates after it land the same extract (no change).
    generate(rows, rows, 5, 10, 0.2, 0.4, 0.4, extracts / days[0], extracts / days[1], seed=42)
    for day in days[2:]:
        shutil.copytree(extracts / days[1], extracts / day)
    document = {
        "name": "synthetic", "start_date": FIRST_DAY, "load_type": "full",
        "source": {"path": f"{extracts}/{{date}}/", "format": "csv", "options": {"header": True}},
        "keys": [{"name": f"key_{i}", "type": "string"} for i in range(1, 6)],
        "non_keys": [{"name": f"nonkey_{i}", "type": "double"} for i in range(1, 11)],
    }
    config_file = workdir / "synthetic.yaml"
    config_file.write_text(yaml.safe_dump(document, sort_keys=False))
    job = build_definitions([build_table_definitions(load_table_config(config_file))]).resolve_implicit_global_asset_job_def()
    instance = DagsterInstance.ephemeral()
    later: dict[str, list[float]] = {name: [] for name in ("wall", *STEPS)}
    for day in days:
        started = time.perf_counter()
        result = job.execute_in_process(partition_key=day, instance=instance)
        wall = time.perf_counter() - started
        steps = {
            event.step_key.split("__", 1)[1]: event.event_specific_data.duration_ms / 1000
            for event in result.all_events if event.event_type == DagsterEventType.STEP_SUCCESS
        }
        print(f"{day}: wall {wall:.2f}s  " + "  ".join(f"{name} {seconds:.2f}s" for name, seconds in steps.items()), flush=True)
        if day != days[0]:
            later["wall"].append(wall)
            for name in STEPS:
                later[name].append(steps.get(name, 0.0))
    spark.stop()
    return later


if __name__ == "__main__":
    sys.exit(main())
