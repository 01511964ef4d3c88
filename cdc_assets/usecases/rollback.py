"""Undo for a table: ``cdc-rollback TABLE --to D`` and ``--undo``, and the table's rollback job (no Dagster here).

The mechanics are Iceberg's, in resources/storage/rollback.py; this checks what is asked against what the
table stores, and says what was done in words a user reads.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import SparkSession

from cdc_assets.core.dates import date_runs
from cdc_assets.model.config import TableConfig
from cdc_assets.model.names import CURRENT
from resources.storage import WarehouseStorage
from resources.storage.rollback import Rollback, RollbackError, roll_back, undo_last_rollback


def roll_back_table(
    spark: SparkSession, storage: WarehouseStorage, config: TableConfig, to: str, reason: str, requested_by: str
) -> Rollback | None:
    """Put every output of the table back to its state as of ``to``: the dates after it leave every output
    (kept restorable for ``publish.keep_rolled_back_days``); the next run continues from ``to``. Returns the
    record, or None when no output stores a date after ``to``. Raises :class:`RollbackError`, changing
    nothing, when ``to`` is no stored date of current_table."""
    table = config.name
    try:
        date.fromisoformat(to)
    except ValueError:
        raise RollbackError(f"{table}: --to {to!r} is not a date (YYYY-MM-DD)") from None
    storage.hold_writer_lock(table)  # waits for a run that writes the table, or fails naming it
    stored = storage.stored_dates(table, CURRENT)
    if to not in stored:
        held = f"it stores {date_runs(stored)}" if stored else "it stores no date"
        raise RollbackError(
            f"{table}: cannot roll back to {to}: current_table does not store it ({held}); a rollback goes back to a "
            "stored date, whose state the next run builds on"
        )
    return roll_back(spark, storage, table, to, storage.stored_assets(table), config.publish.keep_rolled_back_days, reason, requested_by)


def undo_rollback(spark: SparkSession, storage: WarehouseStorage, config: TableConfig) -> Rollback:
    """Undo the table's newest rollback (see :func:`resources.storage.rollback.undo_last_rollback`)."""
    return undo_last_rollback(spark, storage, config.name)


def rolled_back_dates(record: Rollback) -> list[str]:
    """Every date the rollback removed from any output, oldest first."""
    return sorted({day for days in record.removed().values() for day in days})


def describe_rollback(record: Rollback, undone: bool = False) -> str:
    """One line for the command and the job's log."""
    days = date_runs(rolled_back_dates(record))
    if undone:
        return (
            f"{record.table}: the rollback to {record.to} (id {record.id}) is undone: {days} published again in every "
            f"output ({', '.join(sorted(record.assets))})"
        )
    return (
        f"{record.table}: rolled back to {record.to} (id {record.id}): {days} removed from {len(record.assets)} output(s) "
        f"({', '.join(sorted(record.assets))}); the next run continues from {record.to}. Undo within "
        f"{record.keep_days} day(s): cdc-rollback {record.table} --undo"
    )
