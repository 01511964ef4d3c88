"""The net changes between two stored states of a table, as a change feed.

Two ``current_table`` partitions are compared the way the pipeline compares a day with the previous
state: by ``key_hash`` and ``non_key_hash`` only, so a change to untracked columns alone is no change,
and a key changed and changed back in between is no change either. The rows follow the change data
feed convention of Delta Lake (``_change_type`` with pre- and post-images of an update).
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.config import INTERNAL_PREFIX, TableConfig
from cdc_assets.core.compare import CHANGED_COLUMNS, changed_columns, no_changed_columns
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH

CHANGE_TYPE, FROM_DATE, TO_DATE = "_change_type", "_from_date", "_to_date"
INSERT, DELETE = "insert", "delete"
UPDATE_PREIMAGE, UPDATE_POSTIMAGE = "update_preimage", "update_postimage"
CHANGE_TYPES = (INSERT, DELETE, UPDATE_PREIMAGE, UPDATE_POSTIMAGE)
# Each side's columns get a prefix for the join; configured names may not start with INTERNAL_PREFIX.
_BEFORE, _AFTER = f"{INTERNAL_PREFIX}before_", f"{INTERNAL_PREFIX}after_"


def changes_between_states(
    before: DataFrame, after: DataFrame, config: TableConfig, from_date: date | str, to_date: date | str
) -> DataFrame:
    """The changes that lead from state ``before`` (as of ``from_date``) to state ``after`` (as of ``to_date``).

    ``before`` and ``after`` are ``current_table`` partitions of the table (the configured columns,
    ``key_hash``, ``non_key_hash``). One row per changed key, two for an update:

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
    # A stored non_key_hash is never NULL (no non-keys: the MD5 of ""), so NULL means "not on that side".
    in_before, in_after = F.col(f"{_BEFORE}{NON_KEY_HASH}").isNotNull(), F.col(f"{_AFTER}{NON_KEY_HASH}").isNotNull()
    joined = _side(before, names, _BEFORE).join(_side(after, names, _AFTER), on=KEY_HASH, how="full_outer")

    # An update gives two rows: exploding a one- or two-element array keeps it to the one join; an
    # unchanged key's empty array gives no row at all.
    change_types = (
        F.when(~in_before, F.array(F.lit(INSERT)))
        .when(~in_after, F.array(F.lit(DELETE)))
        .when(
            ~F.col(f"{_BEFORE}{NON_KEY_HASH}").eqNullSafe(F.col(f"{_AFTER}{NON_KEY_HASH}")),
            F.array(F.lit(UPDATE_PREIMAGE), F.lit(UPDATE_POSTIMAGE)),
        )
        .otherwise(F.array().cast("array<string>"))
    )
    exploded = joined.select("*", F.explode(change_types).alias(CHANGE_TYPE))
    from_before = F.col(CHANGE_TYPE).isin(DELETE, UPDATE_PREIMAGE)
    non_key_names = [column.name for column in config.non_keys]
    return exploded.select(
        *(F.when(from_before, F.col(f"{_BEFORE}{name}")).otherwise(F.col(f"{_AFTER}{name}")).alias(name) for name in names),
        F.col(CHANGE_TYPE),
        F.lit(_as_date(from_date)).alias(FROM_DATE),
        F.lit(_as_date(to_date)).alias(TO_DATE),
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
