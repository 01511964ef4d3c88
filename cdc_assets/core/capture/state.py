"""What an incremental current_table stores for each date: the date's changes, applied to one table.

With ``storage: {current: incremental}`` a date does not store the whole state. It stores its
*changes*: the rows of keys the date touched (I, U, D, and for delta and change-set loads N: a key
supplied again unchanged), each with the ``operation`` of that date and the payload, ``eff_start_date``
and audit columns the key has from then on. The storage applies them to the table with one MERGE and
tags the result with the date (``resources/storage/merged.py``). Now and then a date stores the whole
state instead (the first date, a compaction: :func:`compaction_due`).

As of date X a row carries the stored ``operation`` if X touched it, else the operation of a key the
date did not touch (N after a full load, which supplies every key; X, not supplied, otherwise): row
for row what a snapshot of X holds. Plain DataFrame functions and figures; the caller writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc_assets.model.config import LoadType, StateStorage
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.capture.changes import DELETE, NOT_SUPPLIED, OPERATION, UNCHANGED
from cdc_assets.core.compare import CHANGED_COLUMNS
from cdc_assets.core.hashing import KEY_HASH

_NEWEST = "__cdc_newest"


def untouched_operation(load_type: LoadType) -> str:
    """The operation of a key a date did not touch: N after a full load (it supplies every key), else X."""
    return UNCHANGED if load_type is LoadType.full else NOT_SUPPLIED


def stored_changes(
    changes: DataFrame,
    load_type: LoadType,
    previous: DataFrame | None = None,
    dates: Sequence[date] = (),
    untracked_columns: Sequence[str] = (),
) -> DataFrame:
    """The rows of ``changes`` (the range's classified rows, dated) that an incremental state stores for
    each date: all but the untouched operation's (N for a full load, X otherwise), without
    ``changed_columns``.

    A full load's N row carries the key's latest supplied untracked values: with ``untracked_columns``,
    the N rows whose untracked values differ from the key's row the date before are stored too (the
    date before is ``previous`` for the first of ``dates``, else the previous date's rows), so the state
    as of the date shows them. A full load whose untracked column changes every day (a batch id) so
    stores every key every date.
    """
    untouched = F.lit(untouched_operation(load_type))
    kept = changes.filter(F.col(OPERATION) != untouched)
    if load_type is not LoadType.full or not untracked_columns or not dates:
        return kept.drop(CHANGED_COLUMNS)
    return kept.unionByName(_refreshed_untracked(changes, previous, sorted(dates), untracked_columns)).drop(CHANGED_COLUMNS)


_BEFORE = "__cdc_before_"


def _refreshed_untracked(changes: DataFrame, previous: DataFrame | None, dates: Sequence[date], untracked: Sequence[str]) -> DataFrame:
    """The N rows of ``changes`` (full loads of ``dates``, consecutive) whose ``untracked`` columns differ
    from the same key's row on the date before: after a full load the state is the date's rows, so the
    row before is the previous date's I/U/N row, or ``previous``'s for the first date."""
    following = {day: after for day, after in zip(dates, dates[1:])}
    rows_before = changes.filter(F.col(OPERATION) != F.lit(DELETE))
    if following:
        pairs = [F.lit(value) for day, after in following.items() for value in (day, after)]
        moved = rows_before.withColumn(BUSINESS_DATE, F.element_at(F.create_map(*pairs), F.col(BUSINESS_DATE)))
        befores = [moved.filter(F.col(BUSINESS_DATE).isNotNull())]
    else:
        befores = []
    if previous is not None:
        befores.append(previous.withColumn(BUSINESS_DATE, F.lit(dates[0]).cast("date")))
    if not befores:
        return changes.filter(F.lit(False))
    types = {field.name: field.dataType for field in changes.schema.fields}

    def untracked_of(part: DataFrame) -> list[F.Column]:
        # A column added on the date is NULL the date before (as the readers show it).
        return [F.col(name) if name in part.columns else F.lit(None).cast(types[name]).alias(name) for name in untracked]

    before = reduce(DataFrame.unionByName, [part.select(KEY_HASH, BUSINESS_DATE, *untracked_of(part)) for part in befores]).select(
        KEY_HASH, BUSINESS_DATE, *(F.col(name).alias(f"{_BEFORE}{name}") for name in untracked)
    )
    same = reduce(lambda both, name: both & F.col(name).eqNullSafe(F.col(f"{_BEFORE}{name}")), untracked, F.lit(True))
    unchanged = changes.filter(F.col(OPERATION) == F.lit(UNCHANGED))
    return unchanged.join(before, on=[KEY_HASH, BUSINESS_DATE], how="left").filter(~same).select(*changes.columns)


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


def state_difference(before: DataFrame | None, after: DataFrame) -> DataFrame:
    """What changed from state ``before`` to state ``after`` (same columns, one row per ``key_hash``), as
    an incremental state stores it: each row of ``after`` that is new or differs from ``before`` with
    ``operation`` U, and each key of ``before`` that ``after`` lacks as its last row with ``operation`` D.

    For a state without an ``operation`` of its own (a change set's ``applied_sequences``), whose
    changes are not the classification's. Compares every column, so it reads both states whole.
    """
    columns = after.columns
    if before is None:
        return after.withColumn(OPERATION, F.lit("U"))
    old = before.select(*(F.col(name).alias(f"__cdc_old_{name}") for name in columns))
    joined = after.join(old, F.col(KEY_HASH).eqNullSafe(F.col(f"__cdc_old_{KEY_HASH}")), how="full_outer")
    present = F.lit(False)
    for name in columns:
        present = present | F.col(name).isNotNull()
    existed = F.lit(False)
    for name in columns:
        existed = existed | F.col(f"__cdc_old_{name}").isNotNull()
    same = F.lit(True)
    for name in columns:
        same = same & F.col(name).eqNullSafe(F.col(f"__cdc_old_{name}"))
    changed = joined.filter(present & ~(existed & same)).select(*columns, F.lit("U").alias(OPERATION))
    removed = joined.filter(~present & existed).select(
        *(F.col(f"__cdc_old_{name}").alias(name) for name in columns), F.lit(DELETE).alias(OPERATION)
    )
    return changed.unionByName(removed)
