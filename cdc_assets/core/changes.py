"""Classifying a day's rows against the previous state, and building current state and history.

Only hash columns decide an operation. A single date (and each date of a delta range) is one full
outer join that carries the payload, as the shuffle has to move the rows anyway; a range of full
loads is classified over hash columns in one window and its payload joined afterwards. Every
function here is a plain DataFrame transformation: nothing runs until it is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, timedelta

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc_assets.config import LoadType
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH
from cdc_assets.core.columns import BUSINESS_DATE

OPERATION = "operation"
EFF_START_DATE = "eff_start_date"

INSERT, UPDATE, DELETE, NOT_SUPPLIED, UNCHANGED = "I", "U", "D", "X", "N"
OPERATIONS = (INSERT, UPDATE, DELETE, NOT_SUPPLIED, UNCHANGED)
# Which operations each output holds.
CURRENT_OPERATIONS = (INSERT, UPDATE, UNCHANGED, NOT_SUPPLIED)
HISTORY_OPERATIONS = (INSERT, UPDATE, DELETE)
REMOVED_OPERATIONS = (DELETE, NOT_SUPPLIED)  # keys missing from the day's input
_FROM_INCOMING = (INSERT, UPDATE, UNCHANGED)

CLASSIFICATION_COLUMNS = (KEY_HASH, NON_KEY_HASH, OPERATION, EFF_START_DATE)


def _operation(incoming_hash: F.Column, previous_hash: F.Column, load_type: LoadType) -> F.Column:
    """I/U/N/D/X from the two sides' non-key hashes of one key (NULL: the side has no row)."""
    missing = DELETE if load_type is LoadType.full else NOT_SUPPLIED
    return (
        F.when(previous_hash.isNull(), F.lit(INSERT))
        .when(incoming_hash.isNull(), F.lit(missing))
        .when(incoming_hash == previous_hash, F.lit(UNCHANGED))
        .otherwise(F.lit(UPDATE))
    )


def classify_changes(
    incoming: DataFrame,
    previous_current: DataFrame | None,
    business_date: date,
    load_type: LoadType,
    payload_columns: Sequence[str] = (),
) -> DataFrame:
    """One row per key_hash: ``payload_columns``, ``key_hash``, ``non_key_hash``, ``operation``, ``eff_start_date``.

    ``incoming`` FULL OUTER JOIN ``previous_current`` ON key_hash, in one join that carries the payload.
    The operation is decided by the hash columns only: a key only in the incoming rows is an insert;
    only in the previous state a delete (full load) or not supplied (delta load); in both, an update
    when the non-key hashes differ, else unchanged. I/U/N rows take the incoming payload and
    ``non_key_hash``, D/X rows the stored ones; unchanged and not-supplied rows keep the previous
    ``eff_start_date``. With no previous state every row is an insert.
    """
    day = F.lit(business_date).cast("date")
    if previous_current is None:
        return incoming.select(
            *payload_columns, KEY_HASH, NON_KEY_HASH, F.lit(INSERT).alias(OPERATION), day.alias(EFF_START_DATE)
        )
    incoming_side = incoming.select(
        *(F.col(name).alias(f"{_IN}{index}") for index, name in enumerate(payload_columns)),
        KEY_HASH,
        F.col(NON_KEY_HASH).alias(f"{_IN}hash"),
    )
    previous_side = previous_current.select(
        *(F.col(name).alias(f"{_PREVIOUS}{index}") for index, name in enumerate(payload_columns)),
        KEY_HASH,
        F.col(NON_KEY_HASH).alias(f"{_PREVIOUS}hash"),
        F.col(EFF_START_DATE).alias(f"{_PREVIOUS}eff"),
    )
    joined = incoming_side.join(previous_side, on=KEY_HASH, how="full_outer")
    incoming_hash, previous_hash = F.col(f"{_IN}hash"), F.col(f"{_PREVIOUS}hash")
    # A row's hash is never NULL, so a NULL hash means the side has no row for the key.
    from_incoming = incoming_hash.isNotNull()
    operation = _operation(incoming_hash, previous_hash, load_type)
    return joined.select(
        *(
            F.when(from_incoming, F.col(f"{_IN}{index}")).otherwise(F.col(f"{_PREVIOUS}{index}")).alias(name)
            for index, name in enumerate(payload_columns)
        ),
        KEY_HASH,
        F.coalesce(incoming_hash, previous_hash).alias(NON_KEY_HASH),
        operation.alias(OPERATION),
        F.when(operation.isin(UNCHANGED, NOT_SUPPLIED), F.col(f"{_PREVIOUS}eff")).otherwise(day).alias(EFF_START_DATE),
    )


_IN, _PREVIOUS = "__cdc_in_", "__cdc_previous_"


def classify_full_loads(incoming: DataFrame, previous_current: DataFrame | None, business_dates: Sequence[date]) -> DataFrame:
    """Consecutive dates of full loads classified in one query, each against the state the date before left.

    ``incoming`` holds every date's accepted rows with a ``business_date`` column; ``previous_current``
    is the state as of the day before the first date (None: no earlier state). Returns one row per date
    and key: ``business_date`` plus the columns of :func:`classify_changes`, with the same values that
    :func:`classify_changes` gives date by date (the tests compare them).

    After a full load the state holds exactly that date's rows, so the previous state of date d is
    date d-1's rows. Over each key's rows in date order (hash columns only): a row with no row the day
    before is an insert, one whose non-key hash differs from the day before an update, else unchanged;
    a row with no row the day after is deleted that day (within the range). An unchanged row keeps the
    eff_start_date of the last insert or update before it, or the stored one.
    """
    first, last = min(business_dates), max(business_dates)
    day = F.col(BUSINESS_DATE)
    events = incoming.select(KEY_HASH, NON_KEY_HASH, BUSINESS_DATE, F.lit(None).cast("date").alias("_stored_eff"))
    if previous_current is not None:
        events = events.unionByName(
            previous_current.select(
                KEY_HASH,
                NON_KEY_HASH,
                F.lit(first - timedelta(days=1)).cast("date").alias(BUSINESS_DATE),
                F.col(EFF_START_DATE).alias("_stored_eff"),
            )
        )
    by_key = Window.partitionBy(KEY_HASH).orderBy(BUSINESS_DATE)
    neighbours = events.select(
        "*",
        F.lag(BUSINESS_DATE).over(by_key).alias("_day_before"),
        F.lag(NON_KEY_HASH).over(by_key).alias("_hash_before"),
        F.lead(BUSINESS_DATE).over(by_key).alias("_day_after"),
    )
    follows_day_before = F.col("_day_before").isNotNull() & (F.date_diff(day, F.col("_day_before")) == 1)
    operation = (
        F.when(~follows_day_before, F.lit(INSERT))
        .when(F.col("_hash_before") != F.col(NON_KEY_HASH), F.lit(UPDATE))
        .otherwise(F.lit(UNCHANGED))
    )
    classified = neighbours.withColumn(OPERATION, F.when(day >= F.lit(first), operation))  # NULL: the stored state
    version_start = F.when(F.col(OPERATION).isin(INSERT, UPDATE), day).otherwise(F.col("_stored_eff"))
    since_first = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    dated = classified.withColumn(EFF_START_DATE, F.last(version_start, ignorenulls=True).over(since_first))
    present = dated.filter(F.col(OPERATION).isNotNull()).select(BUSINESS_DATE, *CLASSIFICATION_COLUMNS)
    next_day = F.date_add(day, 1)
    ends = F.col("_day_after").isNull() | (F.date_diff(F.col("_day_after"), day) != 1)
    deleted = dated.filter(ends & (day < F.lit(last))).select(
        next_day.alias(BUSINESS_DATE), KEY_HASH, NON_KEY_HASH, F.lit(DELETE).alias(OPERATION), next_day.alias(EFF_START_DATE)
    )
    return present.unionByName(deleted)


# Up to this many classified keys on one side of the payload re-join, that side is broadcast, so the
# wide payload rows are joined where they lie instead of being shuffled. A broadcast key costs about
# 100 bytes of memory in the driver and each executor (2M keys: ~200 MB). On the 1M-row benchmark it
# halved the re-join (12-14 s -> 6-7 s).
BROADCAST_MAX_KEYS = 2_000_000


def _keys_with(
    ops: DataFrame, operations: Sequence[str], counts: Mapping[str, int] | None, broadcast_max_keys: int
) -> DataFrame:
    """The classified keys with these operations; broadcast when ``counts`` show they are few enough."""
    selected = ops.filter(F.col(OPERATION).isin(*operations))
    if counts is not None and sum(counts[op] for op in operations) <= broadcast_max_keys:
        return F.broadcast(selected)
    return selected


def join_payload_by_date(
    classification: DataFrame,
    incoming: DataFrame,
    previous_current: DataFrame | None,
    business_dates: Sequence[date],
    payload_columns: Sequence[str],
    counts: Mapping[str, int] | None = None,
    broadcast_max_keys: int = BROADCAST_MAX_KEYS,
) -> DataFrame:
    """:func:`join_payload` for the dated output of :func:`classify_full_loads`, every date at once.

    I/U/N rows take the payload of the same date's incoming row; a D row takes the payload its key had
    the day before (that date's incoming row, or ``previous_current`` on the first date). Output
    columns: those of :func:`join_payload`, then ``business_date``.
    """
    output = [*payload_columns, *CLASSIFICATION_COLUMNS, BUSINESS_DATE]
    ops = classification.select(BUSINESS_DATE, KEY_HASH, OPERATION, EFF_START_DATE)

    def keys_with(operations: Sequence[str]) -> DataFrame:
        return _keys_with(ops, operations, counts, broadcast_max_keys)

    from_incoming = incoming.join(keys_with(_FROM_INCOMING), on=[BUSINESS_DATE, KEY_HASH], how="inner")
    payload = [*payload_columns, KEY_HASH, NON_KEY_HASH]
    held = incoming.select(*payload, F.col(BUSINESS_DATE).alias("_held_on"))
    if previous_current is not None:
        held = held.unionByName(
            previous_current.select(*payload, F.lit(min(business_dates) - timedelta(days=1)).cast("date").alias("_held_on"))
        )
    deleted = keys_with([DELETE]).withColumn("_held_on", F.date_sub(F.col(BUSINESS_DATE), 1))
    from_day_before = held.join(deleted, on=["_held_on", KEY_HASH], how="inner")
    return from_incoming.select(*output).unionByName(from_day_before.select(*output))


def with_operations(changes: DataFrame, operations: Sequence[str]) -> DataFrame:
    return changes.filter(F.col(OPERATION).isin(*operations))


def build_current(changes: DataFrame) -> DataFrame:
    """State as of the date: I + U + N (incoming payload) + X (previous payload); deleted keys leave."""
    return with_operations(changes, CURRENT_OPERATIONS)


def build_history(changes: DataFrame) -> DataFrame:
    """The date's net changes: I + U + D, each with eff_start_date = the date (D carries its last payload)."""
    return with_operations(changes, HISTORY_OPERATIONS)


def no_operations() -> dict[str, int]:
    """Every operation with a count of zero: the figures of a date without rows."""
    return {operation: 0 for operation in OPERATIONS}


def count_operations(classification: DataFrame) -> dict[str, int]:
    """Rows per operation (all five, zeros included); collects at most five rows."""
    counts = no_operations()
    for row in classification.groupBy(OPERATION).count().collect():
        counts[row[OPERATION]] = row["count"]
    return counts
