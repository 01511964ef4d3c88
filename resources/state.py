"""Reading a table's state as of a date from what the warehouse stores, in either form.

A snapshot table stores the whole state per date; an incremental one (``storage: {current:
incremental}``) a full copy now and then and each date's changes (``cdc_assets/core/state.py``). Both
read the same way here: the newest full copy on or before the date, and the changes after it. The IO
manager hands the CDC step the previous state through :func:`read_state`, and ``cdc-current``, the
consumers and the checks read through it too. Nothing here writes or takes a lock.
"""

from __future__ import annotations

from datetime import date

import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from cdc_assets.config import LoadType
from cdc_assets.core.changes import DELETE, INSERT, OPERATION
from cdc_assets.core.state import StateSince, state_from_parts
from resources.storage import WarehouseStorage, state_changes_asset

# Up to this many change rows are broadcast against the full copy (as the CDC step's payload join does).
BROADCAST_MAX_CHANGE_ROWS = 2_000_000


def read_state(storage: WarehouseStorage, spark: SparkSession, table: str, asset: str, as_of: str, load_type: LoadType) -> DataFrame:
    """The state as of ``as_of`` with the columns of a full copy, lazily (nothing is scanned yet)."""
    layout = storage.state_layout(table, asset, as_of)
    full = storage.read_one(spark, table, asset, layout.full_date)
    if not layout.change_dates:
        return full
    changes_asset = state_changes_asset(asset)
    schema = full.schema
    if OPERATION not in full.columns:  # a state without an operation of its own (applied_sequences)
        schema = StructType([*schema.fields, StructField(OPERATION, StringType())])
    changes = storage.read(spark, table, changes_asset, layout.change_dates, schema=schema)
    rows = sum(storage.row_counts(table, changes_asset, layout.change_dates).values())
    return state_from_parts(
        full,
        date.fromisoformat(layout.full_date),
        changes,
        date.fromisoformat(as_of),
        load_type,
        broadcast_changes=rows <= BROADCAST_MAX_CHANGE_ROWS,
    )


def state_rows(storage: WarehouseStorage, table: str, asset: str, as_of: str) -> int:
    """Rows of the state as of ``as_of`` without reading it: the full copy's rows (the table's manifests) plus,
    for each date of changes after it, its I rows less its D rows (the ``operation`` column only)."""
    layout = storage.state_layout(table, asset, as_of)
    rows = storage.row_counts(table, asset, [layout.full_date])[layout.full_date]
    changes_asset = state_changes_asset(asset)
    if layout.change_dates:
        operations = storage.tables.column(table, changes_asset, layout.change_dates, OPERATION)
        rows += pc.sum(pc.equal(operations, INSERT)).as_py() or 0
        rows -= pc.sum(pc.equal(operations, DELETE)).as_py() or 0
    return rows


def untouched_rows(storage: WarehouseStorage, table: str, asset: str, day: str, untouched: str) -> int:
    """Rows of the date's stored changes with the ``untouched`` operation (a full load's N rows whose
    untracked values changed), from the ``operation`` column only; 0 when the date stored no changes."""
    changes_asset = state_changes_asset(asset)
    if day not in storage.stored_dates(table, changes_asset):
        return 0
    operations = storage.tables.column(table, changes_asset, [day], OPERATION)
    return pc.sum(pc.equal(operations, untouched)).as_py() or 0


def state_since_full(storage: WarehouseStorage, table: str, asset: str, as_of: str) -> StateSince:
    """What the state as of ``as_of`` is stored as: its full copy's rows and the changes after it."""
    layout = storage.state_layout(table, asset, as_of)
    changes = storage.row_counts(table, state_changes_asset(asset), layout.change_dates) if layout.change_dates else {}
    return StateSince(
        full_rows=storage.row_counts(table, asset, [layout.full_date])[layout.full_date],
        change_dates=len(layout.change_dates),
        change_rows=sum(changes.values()),
    )


def stored_fields(storage: WarehouseStorage, table: str, asset: str, as_of: str) -> list[dict] | None:
    """The Spark schema fields (name, type, metadata) the state as of ``as_of`` was written with, from its
    newest part (the date's full copy, or its changes); None when nothing is stored.

    A date whose columns changed is always stored as a full copy, so the newest part speaks for the state.
    """
    try:
        layout = storage.state_layout(table, asset, as_of)
    except RuntimeError:  # MissingPartitionError, DroppedPartitionError: the CDC step reports them
        return None
    newest = (state_changes_asset(asset), layout.change_dates[-1]) if layout.change_dates else (asset, layout.full_date)
    return storage.stored_schema(table, *newest).jsonValue()["fields"]
