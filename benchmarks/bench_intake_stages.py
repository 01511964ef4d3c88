"""Benchmark: the intake stage by stage, on day 2 of the synthetic data, each stage written to Parquet.

    .venv/bin/python benchmarks/bench_intake_stages.py [--rows 1000000] [--workdir DIR] [--runs 2]

Prints the best wall seconds of each stage, so one can see what validation, hashing and the cache
add on top of the plain read-cast-write that the I/O floor does:

- ``floor``: read the CSV (every column a string), ``try_cast`` to the configured types, write;
- ``validated``: ``validate_records`` (typed values, reject reason, raw record), write;
- ``hashed``: the same plus ``add_hashes``, write;
- ``prepare_incoming``: the whole intake (cache, counts, duplicate keys), then write the accepted rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DAY1, DAY2 = "2019-06-18", "2019-06-19"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp dir, deleted at the end")
    parser.add_argument("--runs", type=int, default=2, help="runs per stage; the best counts")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdc_intake_"))
    data = workdir / "data" / "synthetic"
    os.environ["CDC_DATA_ROOT"] = str(workdir)

    from pyspark.sql import functions as F

    from cdc_assets.config import load_table_config
    from cdc_assets.core.hashing import add_hashes
    from cdc_assets.core.incoming import prepare_incoming
    from cdc_assets.core.source import read_source, validate_records
    from cdc_assets.generator import generate
    from resources.spark import build_spark_session

    if not (data / DAY2).exists():
        generate(args.rows, args.rows, 5, 10, 0.2, 0.4, 0.4, data / DAY1, data / DAY2, seed=42)
    spark = build_spark_session()
    config = load_table_config(REPO / "table_configs" / "synthetic.yaml")
    keys = [(column.name, column.type) for column in config.keys]
    non_keys = [(column.name, column.type) for column in config.non_keys]
    out = str(workdir / "out")

    def floor() -> None:
        raw = read_source(spark, config, DAY2)
        typed = raw.select(*(F.expr(f"try_cast(`{c.name}` AS {c.type})").alias(c.name) for c in config.columns))
        typed.write.parquet(out)

    def validated() -> None:
        validate_records(read_source(spark, config, DAY2), config).write.parquet(out)

    def hashed() -> None:
        add_hashes(validate_records(read_source(spark, config, DAY2), config), keys, non_keys).write.parquet(out)

    def whole_intake() -> None:
        batch = prepare_incoming(spark, config, date.fromisoformat(DAY2))
        batch.accepted.write.parquet(out)
        batch.release()

    print(f"rows={args.rows} workdir={workdir}")
    try:
        for name, stage in [("floor", floor), ("validated", validated), ("hashed", hashed), ("prepare_incoming", whole_intake)]:
            timings = []
            for _ in range(args.runs):
                shutil.rmtree(out, ignore_errors=True)
                started = time.perf_counter()
                stage()
                timings.append(time.perf_counter() - started)
            print(f"{name:18s} best {min(timings):7.2f} s   runs {', '.join(f'{t:.2f}' for t in timings)}", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
