"""Reading a table's state as of a date from what the warehouse stores, in either form.

A snapshot table stores the whole state per date, as the date's partition. A merged one (``storage:
{current: incremental}``, ``resources/storage/merged.py``) is one Iceberg table changed by each date's
MERGE, with a tag per date: the state as of D is the table at tag D, each row labelled with D's
operation. The storage reads both the same way; this module adds what a state's readers need beside
its rows. Nothing here writes or takes a lock.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from cdc_assets.core.capture.state import StateSince
from resources.storage import WarehouseStorage

# What a merged state's date records in its snapshot summary for the compaction policy (core/capture/state.py).
FULL_COPY_ROWS = "cdc.full-copy-rows"
CHANGE_DATES_SINCE_FULL_COPY = "cdc.change-dates-since-full-copy"
CHANGE_ROWS_SINCE_FULL_COPY = "cdc.change-rows-since-full-copy"


def read_state(storage: WarehouseStorage, spark: SparkSession, table: str, asset: str, as_of: str) -> DataFrame:
    """The state as of ``as_of`` with its operations as of that date, lazily (nothing is scanned yet)."""
    return storage.read_one(spark, table, asset, as_of)


def state_rows(storage: WarehouseStorage, table: str, asset: str, as_of: str) -> int:
    """Rows of the state as of ``as_of`` without reading it (the table's manifests, or the tag's summary)."""
    storage.require(table, asset, as_of)
    return storage.row_counts(table, asset, [as_of])[as_of]


def state_since_full(storage: WarehouseStorage, table: str, asset: str, as_of: str) -> StateSince:
    """What the merged state as of ``as_of`` holds since its last full copy: the copy's rows, and the
    dates and rows of changes applied since, as the date's commit recorded them. A date whose tag an
    erase moved lost that record: counted as a full copy of its rows (compaction waits a little longer)."""
    summary = storage.merged.summary(table, asset, as_of)
    if FULL_COPY_ROWS not in summary:
        return StateSince(state_rows(storage, table, asset, as_of), 0, 0)
    return StateSince(
        full_rows=int(summary[FULL_COPY_ROWS]),
        change_dates=int(summary.get(CHANGE_DATES_SINCE_FULL_COPY, 0)),
        change_rows=int(summary.get(CHANGE_ROWS_SINCE_FULL_COPY, 0)),
    )


def stored_fields(storage: WarehouseStorage, table: str, asset: str, as_of: str) -> list[dict] | None:
    """The Spark schema fields (name, type, metadata) the state as of ``as_of`` was written with; None
    when nothing is stored. A date whose columns changed is always stored whole, so a merged state's
    date has the columns of its last full copy."""
    if not storage.has_partition(table, asset, as_of):  # missing or dropped: the CDC step reports it
        return None
    return storage.stored_schema(table, asset, as_of).jsonValue()["fields"]
