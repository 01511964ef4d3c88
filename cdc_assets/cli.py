"""``cdc-current``, ``cdc-scd2`` and ``cdc-changes``: the consumer views of :mod:`cdc_assets.consumers` from the command line.

Tables are found by name in the table config folder (``CDC_TABLE_CONFIGS``), the warehouse in
``CDC_WAREHOUSE``, and Spark as for a run (``SPARK_REMOTE``, ``CDC_SPARK_MASTER``, ``CDC_SPARK_CONF``).
Output is written with Spark (``mode("overwrite")``): a folder of Parquet or CSV files.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType

from cdc_assets.config import TableConfig
from cdc_assets.consumers import (
    changes_between,
    changes_dates,
    current_as_of,
    current_state,
    scd2_as_of,
    scd2_view,
    table_config,
)
from cdc_assets.core.between import CHANGE_TYPE, UPDATE_POSTIMAGE
from resources.spark import NO_UI, build_spark_session

# Without --out, cdc-changes prints at most this many rows.
PRINTED_ROWS = 1000
FORMATS = ("parquet", "csv")


def current_main(argv: Sequence[str] | None = None) -> int:
    """``cdc-current TABLE [--as-of D] --out PATH [--format parquet|csv]``; returns the exit code."""
    parser = _as_of_parser(
        "cdc-current",
        "Write a table's state as of a business date (the columns of a current_table snapshot), whether the "
        "table stores a snapshot per date or a full copy and each date's changes.",
        "the newest stored date",
    )
    return _run(
        parser,
        argv,
        check=lambda config, args: current_as_of(config, args.as_of),
        build=lambda spark, config, args: current_state(spark, config, args.as_of),
    )


def scd2_main(argv: Sequence[str] | None = None) -> int:
    """``cdc-scd2 TABLE [--as-of D] --out PATH [--format parquet|csv]``; returns the exit code."""
    parser = _as_of_parser(
        "cdc-scd2",
        "Write a table's SCD type 2 view (one row per version of a key, valid_from / valid_to) computed from "
        "its stored history_partition.",
        "the newest stored history date",
    )
    return _run(
        parser,
        argv,
        check=lambda config, args: scd2_as_of(config, args.as_of),
        build=lambda spark, config, args: scd2_view(spark, config, args.as_of),
    )


def _as_of_parser(prog: str, description: str, default_date: str) -> argparse.ArgumentParser:
    """``PROG TABLE [--as-of D] --out PATH [--format parquet|csv]``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("table", help="table name, as in its config's name field")
    parser.add_argument("--as-of", help=f"business date YYYY-MM-DD (default: {default_date})")
    parser.add_argument("--out", required=True, help="output folder (replaced if it exists)")
    parser.add_argument("--format", choices=FORMATS, default="parquet")
    return parser


def changes_main(argv: Sequence[str] | None = None) -> int:
    """``cdc-changes TABLE --from D1 --to D2 [--out PATH] [--format parquet|csv]``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="cdc-changes",
        description="The net changes of a table between two business dates (insert, delete, update_preimage, "
        "update_postimage), from its stored history_partition. Without --out the rows are printed.",
    )
    parser.add_argument("table", help="table name, as in its config's name field")
    parser.add_argument("--from", dest="from_date", required=True, help="business date YYYY-MM-DD")
    parser.add_argument("--to", dest="to_date", required=True, help="a later business date YYYY-MM-DD")
    parser.add_argument("--out", help=f"output folder (replaced if it exists); without it at most {PRINTED_ROWS} rows are printed")
    parser.add_argument("--format", choices=FORMATS, default="parquet")
    return _run(
        parser,
        argv,
        check=lambda config, args: changes_dates(config, args.from_date, args.to_date),
        build=lambda spark, config, args: changes_between(spark, config, args.from_date, args.to_date),
    )


def _run(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    check: Callable[[TableConfig, argparse.Namespace], object],
    build: Callable[[SparkSession, TableConfig, argparse.Namespace], DataFrame],
) -> int:
    """Parse ``argv``, check the table and dates, build the frame, then write it to ``--out`` or print it.

    Usage errors and ValueErrors (an unknown table, dates without stored data) exit 2 with one line.
    """
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error argparse has already printed
        return int(stop.code or 0)
    try:
        config = table_config(args.table)
        check(config, args)  # a wrong table or date fails before a JVM starts
        # getOrCreate: in a process that already has a session (tests, notebooks) that one is used,
        # and it is left running for its owner.
        spark = build_spark_session(conf=NO_UI, app_name=parser.prog)
        frame = build(spark, config, args)
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    if args.out is None:  # cdc-changes only: cdc-scd2 requires --out
        image_order = F.when(F.col(CHANGE_TYPE) == UPDATE_POSTIMAGE, 1).otherwise(0)  # an update's preimage first
        frame.orderBy(*config.key_names, image_order).show(PRINTED_ROWS, truncate=False)
        return 0
    write_output(frame, args.out, args.format)
    print(f"{parser.prog}: wrote {args.format} to {_absolute(args.out)}")
    return 0


def write_output(frame: DataFrame, out: str, output_format: str) -> None:
    """``frame`` to the folder ``out``, replacing it. CSV has a header, RFC 4180 quoting (``escape='"'``)
    and each array column (``changed_columns``) as one comma-separated string."""
    writer = frame.write.mode("overwrite")
    if output_format == "csv":
        arrays = [field.name for field in frame.schema.fields if isinstance(field.dataType, ArrayType)]
        writer = frame.withColumns({name: F.array_join(name, ",") for name in arrays}).write.mode("overwrite")
        writer.option("header", True).option("escape", '"').csv(_absolute(out))
    else:
        writer.parquet(_absolute(out))


def _absolute(path: str) -> str:
    # A Spark Connect server resolves a relative path in its own working directory.
    return path if "://" in path else os.path.abspath(path)
