"""``cdc-current``, ``cdc-scd2`` and ``cdc-changes``: the consumer views of :mod:`cdc_assets.usecases.readers` from the command line.

Tables are found by name in the table config folder (``CDC_TABLE_CONFIGS``), the warehouse in
``CDC_WAREHOUSE``, and Spark as for a run (``SPARK_REMOTE``, ``CDC_SPARK_MASTER``, ``CDC_SPARK_CONF``).
Output is written with Spark: a folder of Parquet or CSV files, marked as an export (``_cdc_export.json``,
written after the data). ``--out`` replaces only an empty folder or an earlier export of the same command
and table; anything else needs ``--overwrite``, and folders whose loss would take more than an export
with them (the current or home directory, the warehouse, ...) are refused even then (:func:`check_out`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType

from cdc_assets.model.file_modes import apply_umask
from cdc_assets.model import settings
from cdc_assets.model.config import TableConfig, table_configs_dir
from cdc_assets.usecases.readers import (
    changes_between,
    changes_dates,
    current_as_of,
    current_state,
    scd2_as_of,
    scd2_view,
    table_config,
)
from cdc_assets.core.views.between import CHANGE_TYPE, UPDATE_POSTIMAGE
from cdc_assets.engines.spark_conf import NO_UI
from resources.session.spark_session import build_spark_session
from resources.session.spark_target import ServerCannotServeRunError
from resources.storage import warehouse_root

# Without --out, cdc-changes prints at most this many rows.
PRINTED_ROWS = 1000
FORMATS = ("parquet", "csv")
# Written into --out after the data: what makes the folder "an earlier export" the next run may replace.
# Its leading underscore keeps Spark's (and Hadoop's) readers of the folder from taking it for data.
EXPORT_MARKER = "_cdc_export.json"
OVERWRITE_HELP = (
    "replace --out even if it is a file, or a folder that is not an earlier export of this command and table "
    "(everything in it is deleted); the current or home directory, the warehouse or a folder in it, the table "
    "config folder, the data root and a folder holding any of them are refused even so"
)
OUT_HELP = "output folder; an earlier export of the same command and table there is replaced, anything else needs --overwrite"


class OutRefused(ValueError):
    """--out names something the command will not replace (exit 2, nothing written)."""


def current_main(argv: Sequence[str] | None = None) -> int:
    """``cdc-current TABLE [--as-of D] --out PATH [--format parquet|csv]``; returns the exit code."""
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
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
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
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
    parser.add_argument("--out", required=True, help=OUT_HELP)
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    parser.add_argument("--format", choices=FORMATS, default="parquet")
    return parser


def changes_main(argv: Sequence[str] | None = None) -> int:
    """``cdc-changes TABLE --from D1 --to D2 [--out PATH] [--format parquet|csv]``; returns the exit code."""
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
    parser = argparse.ArgumentParser(
        prog="cdc-changes",
        description="The net changes of a table between two business dates (insert, delete, update_preimage, "
        "update_postimage), from its stored history_partition. Without --out the rows are printed.",
    )
    parser.add_argument("table", help="table name, as in its config's name field")
    parser.add_argument("--from", dest="from_date", required=True, help="business date YYYY-MM-DD")
    parser.add_argument("--to", dest="to_date", required=True, help="a later business date YYYY-MM-DD")
    parser.add_argument("--out", help=f"{OUT_HELP}; without it at most {PRINTED_ROWS} rows are printed")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
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

    Usage errors, ValueErrors (an unknown table, dates without stored data) and a warm server named by
    ``SPARK_REMOTE`` that cannot serve the command exit 2 with one line.
    """
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error argparse has already printed
        return int(stop.code or 0)
    try:
        config = table_config(args.table)
        check(config, args)  # a wrong table or date fails before a JVM starts
        if args.out is not None:
            check_out(args.out, parser.prog, config.name, args.overwrite)
        # getOrCreate: in a process that already has a session (tests, notebooks) that one is used,
        # and it is left running for its owner.
        spark = build_spark_session(conf=NO_UI, app_name=parser.prog)
        frame = build(spark, config, args)
    except (ValueError, ServerCannotServeRunError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    if args.out is None:  # cdc-changes only: cdc-scd2 requires --out
        image_order = F.when(F.col(CHANGE_TYPE) == UPDATE_POSTIMAGE, 1).otherwise(0)  # an update's preimage first
        frame.orderBy(*config.key_names, image_order).show(PRINTED_ROWS, truncate=False)
        return 0
    local = _local_path(args.out)
    try:
        # Not on this machine's file system (s3a://, ...), --out could not be looked at: Spark then
        # refuses a folder that exists, unless --overwrite.
        write_output(frame, args.out, args.format, replace=local is not None or args.overwrite)
    except AnalysisException as error:
        if local is not None or "already exists" not in str(error).lower():
            raise
        print(f"{parser.prog}: error: --out {args.out} exists, and a URI is not looked into: pass --overwrite to replace it "
              f"({str(error).splitlines()[0]})", file=sys.stderr)
        return 2
    if local is not None:
        mark_export(local, parser.prog, config.name, args.format)
    print(f"{parser.prog}: wrote {args.format} to {_absolute(args.out)}")
    return 0


def write_output(frame: DataFrame, out: str, output_format: str, replace: bool = True) -> None:
    """``frame`` to the folder ``out``, replacing it (``replace``) or failing if it exists. CSV has a
    header, RFC 4180 quoting (``escape='"'``) and each array column (``changed_columns``) as one
    comma-separated string."""
    mode = "overwrite" if replace else "errorifexists"
    if output_format == "csv":
        arrays = [field.name for field in frame.schema.fields if isinstance(field.dataType, ArrayType)]
        writer = frame.withColumns({name: F.array_join(name, ",") for name in arrays}).write.mode(mode)
        writer.option("header", True).option("escape", '"').csv(_absolute(out))
    else:
        frame.write.mode(mode).parquet(_absolute(out))


def check_out(out: str, command: str, table: str, overwrite: bool) -> None:
    """Raise :class:`OutRefused` unless writing ``out`` can only replace an export.

    Without ``overwrite``: ``out`` must not exist, be an empty folder, or be an earlier export of
    ``command`` for ``table`` (its marker says so) holding only what that export wrote. With it,
    anything but the protected folders (:func:`protected_folder`). A URI other than ``file://`` is not
    looked at here (see ``_run``).
    """
    path = _local_path(out)
    if path is None:
        return
    protected = protected_folder(path)
    if protected is not None:
        raise OutRefused(
            f"--out {path} is {protected}: an export replaces its folder and everything in it, so this one is "
            "refused, even with --overwrite; name a folder of the export's own, e.g. a new one inside it"
        )
    if overwrite or not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise OutRefused(f"--out {path} is a file, not a folder: nothing was written; pass --overwrite to replace it")
    names = set(os.listdir(path))
    if not names:
        return
    marker = read_export_marker(path)
    if marker is None:
        why = f"it has no {EXPORT_MARKER}"
    elif (marker.get("command"), marker.get("table")) != (command, table):
        why = f"it holds an export of {marker.get('command')} {marker.get('table')}"
    else:
        others = sorted(names - {EXPORT_MARKER} - set(marker.get("files", [])))
        if not others:
            return
        why = "it holds files the export did not write: " + ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
    raise OutRefused(
        f"--out {path} is a folder that is not empty and is not an earlier {command} export of {table} ({why}): "
        "nothing was written; pass --overwrite to replace the folder and everything in it"
    )


def protected_folder(path: str) -> str | None:
    """What ``path`` is, when an export must never replace it (with everything in it); None otherwise.

    The root, the current directory, the home directory, the warehouse, the table config folder and
    the data root (``CDC_DATA_ROOT``), or a folder holding one of them; and any folder inside the
    warehouse, which is the pipeline's."""
    target = os.path.realpath(path)
    if os.path.dirname(target) == target:
        return "the root of the file system"
    warehouse = os.path.realpath(warehouse_root())
    if target == warehouse or target.startswith(warehouse + os.sep):
        return f"the warehouse ({warehouse}) or inside it"
    folders = {
        "the current directory": os.getcwd(),
        "the home directory": os.path.expanduser("~"),
        "the warehouse": warehouse,
        "the table config folder": str(table_configs_dir()),
        "the data root (CDC_DATA_ROOT)": settings.DATA_ROOT.value(),
    }
    for name, folder in folders.items():
        folder = os.path.realpath(folder)
        if folder == target or folder.startswith(target + os.sep):
            return f"{name} ({folder})" if folder == target else f"a folder holding {name} ({folder})"
    return None


def mark_export(path: str, command: str, table: str, output_format: str) -> None:
    """Write ``path``'s export marker: the command, the table, and the files the export wrote."""
    record = {
        "command": command,
        "table": table,
        "format": output_format,
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": sorted(name for name in os.listdir(path) if name != EXPORT_MARKER),
    }
    hidden = Path(path) / f".{EXPORT_MARKER}.tmp"  # renamed into place: a reader never sees half of it
    hidden.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(hidden, Path(path) / EXPORT_MARKER)


def read_export_marker(path: str) -> dict | None:
    """The export marker of the folder ``path``, or None if it has none (or not a readable one)."""
    try:
        record = json.loads((Path(path) / EXPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _local_path(out: str) -> str | None:
    """``out`` as an absolute local path (a ``file://`` URI as its path); None for any other URI."""
    if "://" not in out:
        return os.path.abspath(out)
    parsed = urlparse(out)
    return parsed.path if parsed.scheme == "file" and parsed.netloc in ("", "localhost") else None


def _absolute(path: str) -> str:
    # A Spark Connect server resolves a relative path in its own working directory.
    return path if "://" in path else os.path.abspath(path)
