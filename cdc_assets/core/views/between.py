"""The net changes of a table between two business dates, as a change feed.

Keys are compared the way the pipeline compares a day with the previous state: by ``key_hash`` and
``non_key_hash`` only, so a change to untracked columns alone is no change, and a key changed and
changed back in between is no change either. The rows follow the change data feed convention of
Delta Lake (``_change_type`` with pre- and post-images of an update).

:func:`changes_from_history` computes them from ``history_partition``, which every date keeps (what
``cdc-changes`` uses); :func:`changes_between_states` from two full states, such as two
``current_table`` partitions. Both give the same rows, except that history holds untracked columns
as of the change that started a version (a change to them alone is not in history).
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_assets.model.config import INTERNAL_PREFIX, TableConfig
from cdc_assets.core.capture.changes import INSERT as HISTORY_INSERT
from cdc_assets.core.capture.changes import OPERATION
from cdc_assets.core.capture.changes import UPDATE as HISTORY_UPDATE
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.compare import CHANGED_COLUMNS, changed_columns, no_changed_columns
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH

CHANGE_TYPE, FROM_DATE, TO_DATE = "_change_type", "_from_date", "_to_date"
INSERT, DELETE = "insert", "delete"
UPDATE_PREIMAGE, UPDATE_POSTIMAGE = "update_preimage", "update_postimage"
# Each side's columns get a prefix; configured names may not start with INTERNAL_PREFIX.
_BEFORE, _AFTER = f"{INTERNAL_PREFIX}before_", f"{INTERNAL_PREFIX}after_"
_LAST_CHANGE = f"{INTERNAL_PREFIX}last_change"


def changes_from_history(history: DataFrame, config: TableConfig, from_date: date | str, to_date: date | str) -> DataFrame:
    """The changes that lead from the table as of ``from_date`` to the table as of ``to_date``.

    ``history`` is the table's ``history_partition`` for every stored date up to ``to_date`` at
    least (the configured columns, ``key_hash``, ``non_key_hash``, ``operation``, ``business_date``);
    later dates are left out. A key's version as of a date is its last history row on or before that
    date when that row is an I or a U (a D, or no row, means the key was not in the table), which is
    the version the SCD type 2 view shows open on that date. Only keys with a history row after
    ``from_date`` can differ, so the rows are those of :func:`changes_between_states` applied to the
    two versions of each such key: inserts, deletes, and pre- and post-images of updates.

    The payload is the version's, so untracked columns are as of the I or U that started it: a change
    to untracked columns alone is not in history. One aggregation by ``key_hash`` over ``history``;
    nothing runs until the result is used.
    """
    start, end = _as_date(from_date), _as_date(to_date)
    names = [column.name for column in config.columns]
    day = F.col(BUSINESS_DATE).cast("date")
    version = F.struct(*(F.col(name) for name in [*names, NON_KEY_HASH, OPERATION]))
    # max_by skips rows whose ordering value is NULL, so the first one only sees rows up to from_date.
    versions = (
        history.where(day <= F.lit(end))
        .groupBy(KEY_HASH)
        .agg(
            F.max(day).alias(_LAST_CHANGE),
            F.max_by(version, F.when(day <= F.lit(start), day)).alias(_BEFORE),
            F.max_by(version, day).alias(_AFTER),
        )
        .where(F.col(_LAST_CHANGE) > F.lit(start))
    )

    def side(prefix: str) -> list[Column]:
        row = F.col(prefix)
        # A side without a version gets a NULL non_key_hash, which is how _net_changes tells absence.
        present = row.getField(OPERATION).isin(HISTORY_INSERT, HISTORY_UPDATE)
        return [
            F.when(present, row.getField(NON_KEY_HASH)).alias(f"{prefix}{NON_KEY_HASH}"),
            *(row.getField(name).alias(f"{prefix}{name}") for name in names),
        ]

    paired = versions.select(F.col(KEY_HASH), *side(_BEFORE), *side(_AFTER))
    return _net_changes(paired, config, start, end)


def changes_between_states(
    before: DataFrame, after: DataFrame, config: TableConfig, from_date: date | str, to_date: date | str
) -> DataFrame:
    """The changes that lead from state ``before`` (as of ``from_date``) to state ``after`` (as of ``to_date``).

    ``before`` and ``after`` are full states of the table, such as ``current_table`` partitions (the
    configured columns, ``key_hash``, ``non_key_hash``). One row per changed key, two for an update:

    - ``insert``: the key is only in ``after``; its payload from ``after``;
    - ``delete``: the key is only in ``before``; its payload from ``before``;
    - ``update_preimage`` and ``update_postimage``: the key is in both with a different
      ``non_key_hash``; the payload from ``before`` and from ``after`` respectively.

    Columns: the configured columns, ``_change_type``, ``_from_date``, ``_to_date`` (dates) and
    ``changed_columns``: on both rows of an update, the sorted non-key columns whose typed values
    differ (NULL against a value differs); an empty array on inserts and deletes. One full outer join
    of the two states on ``key_hash``; nothing runs until the result is used.
    """
    names = [column.name for column in config.columns]
    paired = _side(before, names, _BEFORE).join(_side(after, names, _AFTER), on=KEY_HASH, how="full_outer")
    return _net_changes(paired, config, _as_date(from_date), _as_date(to_date))


def _net_changes(paired: DataFrame, config: TableConfig, from_date: date, to_date: date) -> DataFrame:
    """The change rows of ``paired``: one row per key with each side's ``non_key_hash`` (NULL: the key
    is not on that side) and payload, prefixed ``_BEFORE`` and ``_AFTER``."""
    names = [column.name for column in config.columns]
    in_before, in_after = F.col(f"{_BEFORE}{NON_KEY_HASH}").isNotNull(), F.col(f"{_AFTER}{NON_KEY_HASH}").isNotNull()
    # An update gives two rows: exploding a one- or two-element array keeps it to one pass; an
    # unchanged key's empty array gives no row at all.
    change_types = (
        F.when(~in_before & ~in_after, F.array().cast("array<string>"))
        .when(~in_before, F.array(F.lit(INSERT)))
        .when(~in_after, F.array(F.lit(DELETE)))
        .when(
            ~F.col(f"{_BEFORE}{NON_KEY_HASH}").eqNullSafe(F.col(f"{_AFTER}{NON_KEY_HASH}")),
            F.array(F.lit(UPDATE_PREIMAGE), F.lit(UPDATE_POSTIMAGE)),
        )
        .otherwise(F.array().cast("array<string>"))
    )
    exploded = paired.select("*", F.explode(change_types).alias(CHANGE_TYPE))
    from_before = F.col(CHANGE_TYPE).isin(DELETE, UPDATE_PREIMAGE)
    non_key_names = [column.name for column in config.non_keys]
    return exploded.select(
        *(F.when(from_before, F.col(f"{_BEFORE}{name}")).otherwise(F.col(f"{_AFTER}{name}")).alias(name) for name in names),
        F.col(CHANGE_TYPE),
        F.lit(from_date).alias(FROM_DATE),
        F.lit(to_date).alias(TO_DATE),
        F.when(
            in_before & in_after,
            changed_columns(non_key_names, lambda name: F.col(f"{_BEFORE}{name}"), lambda name: F.col(f"{_AFTER}{name}")),
        )
        .otherwise(no_changed_columns())
        .alias(CHANGED_COLUMNS),
    )


def _side(state: DataFrame, names: list[str], prefix: str) -> DataFrame:
    """``key_hash`` and the state's other columns prefixed, so both sides of the join can be told apart."""
    return state.select(
        F.col(KEY_HASH),
        F.col(NON_KEY_HASH).alias(f"{prefix}{NON_KEY_HASH}"),
        *(F.col(name).alias(f"{prefix}{name}") for name in names),
    )


def _as_date(value: date | str) -> date:
    return value if isinstance(value, date) else date.fromisoformat(value)
