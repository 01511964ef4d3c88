"""A table's state as a full copy plus the changes after it: what an incremental current_table stores.

With ``storage: {current: incremental}`` a date does not store the whole state. It stores its
*changes*: the rows of keys the date touched (I, U, D, and for delta and change-set loads N: a key
supplied again unchanged), each with the ``operation`` of that date and the payload, ``eff_start_date``
and audit columns the key has from then on (a D row its last payload). Now and then a date stores
the whole state instead (a *full* copy: the first date, a compaction). The state as of date X is then

    the newest full copy dated F <= X, each key replaced by its row in the latest changes of
    (F, X] that touched it, D keys removed,

and its ``operation`` is what X did to the key: the stored one for rows of X itself, else the
operation of a key the date did not touch (N after a full load, which supplies every key; X, not
supplied, otherwise). That is row for row what a snapshot of X holds. Plain DataFrame functions: the
caller reads the parts (``resources/state.py``) and writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc_assets.config import LoadType, StateStorage
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.changes import DELETE, NOT_SUPPLIED, OPERATION, UNCHANGED
from cdc_assets.core.compare import CHANGED_COLUMNS
from cdc_assets.core.hashing import KEY_HASH

_NEWEST = "__cdc_newest"


def untouched_operation(load_type: LoadType) -> str:
    """The operation of a key a date did not touch: N after a full load (it supplies every key), else X."""
    return UNCHANGED if load_type is LoadType.full else NOT_SUPPLIED


def stored_changes(changes: DataFrame, load_type: LoadType) -> DataFrame:
    """The rows of ``changes`` (a date's classified rows) that an incremental state stores for the date:
    all but the untouched operation's (N for a full load, X otherwise), without ``changed_columns``."""
    return changes.filter(F.col(OPERATION) != F.lit(untouched_operation(load_type))).drop(CHANGED_COLUMNS)


def state_from_parts(
    full: DataFrame,
    full_date: date,
    changes: DataFrame | None,
    as_of: date,
    load_type: LoadType,
    broadcast_changes: bool = True,
) -> DataFrame:
    """The state as of ``as_of``: ``full`` (the state of ``full_date``) with ``changes`` applied in date
    order; the columns of ``full``.

    ``changes`` holds the stored changes of the dates in (``full_date``, ``as_of``] with a
    ``business_date`` column, or is None when there are none. The full copy is not shuffled: keys the
    changes touched leave it by an anti join with the changes' keys (broadcast with
    ``broadcast_changes``, for changes small enough to hold in memory), and each such key takes its
    newest change row, unless that row is a D.
    """
    untouched = F.lit(untouched_operation(load_type))
    columns = full.columns
    if changes is None:
        if full_date == as_of:
            return full
        return full.withColumn(OPERATION, untouched).select(*columns)
    newest_first = Window.partitionBy(KEY_HASH).orderBy(F.col(BUSINESS_DATE).desc())
    newest = changes.withColumn(_NEWEST, F.row_number().over(newest_first)).filter(F.col(_NEWEST) == 1)
    touched = newest.select(KEY_HASH)
    kept = full.join(F.broadcast(touched) if broadcast_changes else touched, on=KEY_HASH, how="left_anti")
    if full_date != as_of:
        kept = kept.withColumn(OPERATION, untouched)
    today = F.col(BUSINESS_DATE) == F.lit(as_of).cast("date")
    latest = newest.filter(F.col(OPERATION) != F.lit(DELETE)).withColumn(
        OPERATION, F.when(today, F.col(OPERATION)).otherwise(untouched)
    )
    return kept.select(*columns).unionByName(latest.select(*columns))


def latest_rows(parts: Sequence[DataFrame], order_column: str) -> DataFrame:
    """Each key's row with the greatest ``order_column`` over ``parts`` (same columns), D rows removed."""
    combined = reduce(DataFrame.unionByName, parts)
    newest_first = Window.partitionBy(KEY_HASH).orderBy(F.col(order_column).desc())
    newest = combined.withColumn(_NEWEST, F.row_number().over(newest_first))
    return newest.filter((F.col(_NEWEST) == 1) & (F.col(OPERATION) != F.lit(DELETE))).drop(_NEWEST)


@dataclass(frozen=True)
class StateSince:
    """What is stored since the newest full copy before a date: its rows, and the dates and rows of changes."""

    full_rows: int
    change_dates: int
    change_rows: int


def compaction_due(since: StateSince | None, policy: StateStorage) -> bool:
    """Whether a date should store a full copy: there is no earlier state to store changes against
    (``since`` is None), or the changes since the last full copy reached ``policy``'s share of its rows
    or its number of dates (this date's changes included)."""
    if since is None:
        return True
    if since.change_dates >= policy.compact_after_dates:
        return True
    return since.change_rows >= policy.compact_after_share * max(since.full_rows, 1)
