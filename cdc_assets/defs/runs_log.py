"""The runs log: one row per run, table and business date, for every run that wrote a date or failed to.

The CDC step appends its rows when it ends, however it ends (the intake step does when it fails, or
when the run does not include the CDC step). Each append is one small Parquet file under
``<warehouse>/_runs/``, so the log reads as one dataset (``read_runs_log``, or DuckDB's
``read_parquet('<warehouse>/_runs/*.parquet')``) and concurrent runs never write the same file. A
process killed outright (kill -9) appends nothing: Dagster's own run record is then the only trace.

The log outlives the run and an erase does not rewrite it, so a failure's ``error`` holds no row
values: only the summary a :class:`~cdc_assets.core.errors.SummarizedError` gives (counts, a
``key_hash``, names, paths), else the error's type; the full message is in the run's own log.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import cache
from importlib import metadata
from pathlib import Path

import pyarrow as pa
from dagster import AssetExecutionContext

from cdc_assets.model import settings
from cdc_assets.model.config import TableConfig
from cdc_assets.core.errors import SummarizedError, error_summary
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import CURRENT
from resources.storage import WarehouseStorage

SUCCEEDED, FAILED = "succeeded", "failed"
# The operations' counts, by their names in the materialization metadata.
COUNT_COLUMNS = {"I": "inserts", "U": "updates", "D": "deletes", "X": "not_supplied", "N": "unchanged"}

RUNS_LOG_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("table", pa.string(), nullable=False),
        pa.field("business_date", pa.date32(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # succeeded | failed
        pa.field("step", pa.string(), nullable=False),  # the step that wrote the row: cdc | intake | checks | rollback | rollback-undo
        pa.field("run_first_date", pa.date32(), nullable=False),  # the run's dates (a backfill: several)
        pa.field("run_last_date", pa.date32(), nullable=False),
        pa.field("started_at", pa.timestamp("us", tz="UTC"), nullable=False),  # = processed_at in the outputs
        pa.field("finished_at", pa.timestamp("us", tz="UTC"), nullable=False),
        *(pa.field(name, pa.int64()) for name in COUNT_COLUMNS.values()),  # NULL: failed before counting
        pa.field("error", pa.string()),  # the error's type and key-free summary (error_summary), never its message
        pa.field("code_version", pa.string(), nullable=False),
        pa.field("git_commit", pa.string()),
        pa.field("config_hash", pa.string(), nullable=False),
        # What changed in the table's columns on the date (JSON, as the date's schema_change metadata); NULL: nothing.
        pa.field("schema_change", pa.string()),
    ]
)


@cache
def code_version() -> str:
    """The installed package's version."""
    try:
        return metadata.version("cdc-assets")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


@cache
def git_commit() -> str | None:
    """``CDC_GIT_COMMIT`` if set (a deployment built from a commit), else the source tree's HEAD, else None."""
    configured = settings.GIT_COMMIT.value()
    if configured:
        return configured
    try:
        found = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None if found.returncode == 0 else None


def config_hash(config: TableConfig) -> str:
    """SHA-256 of the validated config (defaults filled in), so an equivalent YAML edit hashes the same."""
    return hashlib.sha256(config.model_dump_json().encode("utf-8")).hexdigest()


def runs_log_rows(
    config: TableConfig,
    run_id: str,
    started_at: datetime,
    business_dates: Sequence[str],
    status: str,
    step: str,
    counts: Mapping[str, Mapping[str, int]] | None = None,
    error: BaseException | None = None,
    schema_change: Mapping[str, str] | None = None,
) -> pa.Table:
    """One row per date of the run; ``counts`` by date and operation (I/U/D/X/N), when known; of
    ``error``, what :func:`logged_error` says (never its message)."""
    dates = [date.fromisoformat(day) for day in business_dates]
    finished_at = datetime.now(timezone.utc)
    rows = []
    for day in dates:
        by_operation = (counts or {}).get(day.isoformat())
        rows.append(
            {
                "run_id": run_id,
                "table": config.name,
                "business_date": day,
                "status": status,
                "step": step,
                "run_first_date": min(dates),
                "run_last_date": max(dates),
                "started_at": started_at,
                "finished_at": finished_at,
                **{name: (by_operation[op] if by_operation else None) for op, name in COUNT_COLUMNS.items()},
                "error": logged_error(error) if error is not None else None,
                "code_version": code_version(),
                "git_commit": git_commit(),
                "config_hash": config_hash(config),
                "schema_change": (schema_change or {}).get(day.isoformat()),
            }
        )
    return pa.Table.from_pylist(rows, schema=RUNS_LOG_SCHEMA)


def logged_error(error: BaseException) -> str:
    """What a runs-log row says of a failure: the error's type and key-free summary (see
    :func:`~cdc_assets.core.errors.error_summary`); of a step Dagster stopped, that it stopped."""
    if isinstance(error, GeneratorExit):
        return "the step stopped while its outputs were stored (see the run's log)"
    return error_summary(error)


@dataclass
class RunsLogEntry:
    """What a step knows for its runs-log rows so far: the counts by date, once it has classified."""

    counts: dict[str, dict[str, int]] | None = None
    schema_change: dict[str, str] | None = None  # by date, the change of columns the date applied
    carried: list[str] | None = None  # later dates a correction recomputed and wrote beside the run's own


@contextmanager
def runs_logged(
    context: AssetExecutionContext,
    table: TableConfig,
    storage: WarehouseStorage,
    days: list[str],
    step: str,
    only_if_last: bool = True,
) -> Iterator[RunsLogEntry]:
    """Append the step's rows when it ends: ``failed`` whatever fails, ``succeeded`` if the step is the run's last for the table.

    Wrapped around a step's body (a generator of outputs). A step that Dagster stops half-way (an
    output failed to store, or the run was interrupted) is told by the GeneratorExit its closing raises.
    """
    entry = RunsLogEntry()
    try:
        yield entry
    except BaseException as error:
        try:
            _append(context, table, storage, days, FAILED, step, entry, error)
        except Exception as log_error:  # noqa: BLE001 - the run's own failure is what must surface
            context.log.warning(f"{table.name}: the runs log could not be written: {log_error}")
        raise
    if only_if_last:
        _append(context, table, storage, days, SUCCEEDED, step, entry, None)


def _append(context, table, storage, days, status, step, entry: RunsLogEntry, error: BaseException | None) -> None:
    days = [*days, *(entry.carried or [])]
    rows = runs_log_rows(table, context.run_id, run_started_at(context), days, status, step, entry.counts, error, entry.schema_change)
    storage.append_to_runs_log(rows, table.name)


class NotPublished(SummarizedError):
    """What the runs log says of a run's dates that a failed blocking check kept on the run's branch."""


def log_not_published(context, table: TableConfig, storage: WarehouseStorage, days: list[str], unpassed: list[str]) -> None:
    """The runs log's rows of a run whose dates a failed blocking check kept on the run's branch
    (docs/publishing.md): ``failed``, step ``checks``, the branch and the checks (names and dates, no
    values) in ``error``. They follow the CDC step's ``succeeded`` rows of the same run: the CDC step
    logs when it ends, before the checks judge what it staged."""
    why = NotPublished(f"not published, kept on branch {storage.branch}: blocking check(s) did not pass: {', '.join(unpassed)}")
    storage.append_to_runs_log(runs_log_rows(table, context.run_id, run_started_at(context), days, FAILED, "checks", error=why), table.name)


def run_started_at(context: AssetExecutionContext) -> datetime:
    """The run's start (UTC) as Dagster recorded it; now, if it has no record yet."""
    record = context.instance.get_run_record_by_id(context.run_id)
    started = record.start_time if record is not None and record.start_time else time.time()
    return datetime.fromtimestamp(started, tz=timezone.utc)


def cdc_left_out(context: AssetExecutionContext, table: TableConfig) -> bool:
    """Whether the run materializes the table's intake without its CDC step (which logs the run otherwise)."""
    selection = context.dagster_run.asset_selection  # None or empty: the job's every asset
    return bool(selection) and asset_key(table, CURRENT) not in selection
