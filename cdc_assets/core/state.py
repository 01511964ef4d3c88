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


def state_sql(columns: Sequence[str], full: str, changes: str | None, untouched: str) -> str:
    """A Spark SQL query of every stored date's state, with a ``business_date`` column: what a snapshot
    table's partitions hold, for a state stored as full copies (relation ``full``) and changes (relation
    ``changes``, None when none are stored); ``columns`` are the state's columns in order.

    Each date's state is its newest full copy's rows, each key replaced by its newest change up to the
    date, D keys removed (:func:`state_from_parts`). Filter on ``business_date`` to read one date.
    """
    quoted = {name: f"`{name.replace('`', '``')}`" for name in columns}
    listed = ", ".join(quoted.values())
    operation = f"CASE WHEN __cdc_part = __cdc_as_of THEN {quoted[OPERATION]} ELSE '{untouched}' END AS {quoted[OPERATION]}"
    output = ", ".join(operation if name == OPERATION else quoted[name] for name in columns)
    changed = f"SELECT {listed}, business_date AS __cdc_part FROM {changes}" if changes else "SELECT * FROM fulls WHERE false"
    return (
        f"WITH fulls AS (SELECT {listed}, business_date AS __cdc_part FROM {full}), "
        f"changes AS ({changed}), "
        "full_dates AS (SELECT DISTINCT __cdc_part FROM fulls), "
        "dates AS (SELECT __cdc_part AS __cdc_as_of FROM full_dates UNION SELECT __cdc_part FROM changes), "
        "anchors AS (SELECT d.__cdc_as_of, max(f.__cdc_part) AS __cdc_full FROM dates d "
        "JOIN full_dates f ON f.__cdc_part <= d.__cdc_as_of GROUP BY d.__cdc_as_of), "
        "parts AS (SELECT a.__cdc_as_of, p.* FROM anchors a JOIN fulls p ON p.__cdc_part = a.__cdc_full "
        "UNION ALL SELECT a.__cdc_as_of, p.* FROM anchors a JOIN changes p "
        "ON p.__cdc_part > a.__cdc_full AND p.__cdc_part <= a.__cdc_as_of), "
        f"newest AS (SELECT *, row_number() OVER (PARTITION BY __cdc_as_of, {quoted[KEY_HASH]} "
        "ORDER BY __cdc_part DESC) AS __cdc_rank FROM parts) "
        f"SELECT {output}, __cdc_as_of AS business_date FROM newest "
        f"WHERE __cdc_rank = 1 AND {quoted[OPERATION]} <> '{DELETE}'"
    )


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
