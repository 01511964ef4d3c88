"""Classifying a day's rows against the previous state, and building current state and history.

Only hash columns decide an operation. A single date (and each date of a delta range) is one full
outer join that carries the payload, as the shuffle has to move the rows anyway; a range of full
loads is classified over hash columns in one window and its payload joined afterwards. Every
function here is a plain DataFrame transformation: nothing runs until it is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc_assets.model.config import LoadType
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.compare import CHANGED_COLUMNS, changed_columns, no_changed_columns
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH

OPERATION = "operation"
EFF_START_DATE = "eff_start_date"

INSERT, UPDATE, DELETE, NOT_SUPPLIED, UNCHANGED = "I", "U", "D", "X", "N"
OPERATIONS = (INSERT, UPDATE, DELETE, NOT_SUPPLIED, UNCHANGED)
# Which operations each output holds.
CURRENT_OPERATIONS = (INSERT, UPDATE, UNCHANGED, NOT_SUPPLIED)
HISTORY_OPERATIONS = (INSERT, UPDATE, DELETE)
_FROM_INCOMING = (INSERT, UPDATE, UNCHANGED)

CLASSIFICATION_COLUMNS = (KEY_HASH, NON_KEY_HASH, OPERATION, EFF_START_DATE)
# Who wrote a row: the run that started its current version (current_table), or that wrote the date
# (history). Kept with N and X rows exactly as eff_start_date is.
PROCESS_ID, PROCESSED_AT = "process_id", "processed_at"
AUDIT_COLUMNS = (PROCESS_ID, PROCESSED_AT)


@dataclass(frozen=True)
class RunAudit:
    """The run writing the outputs: its id and its start (UTC), stamped on the rows it writes."""

    process_id: str
    processed_at: datetime  # timezone-aware, UTC

    def columns(self, keeps_previous: F.Column, previous: Callable[[str], F.Column]) -> list[F.Column]:
        """``process_id``, ``processed_at``: ``previous(name)`` where ``keeps_previous``, else this run's."""
        return [
            F.when(keeps_previous, previous(PROCESS_ID)).otherwise(F.lit(self.process_id)).alias(PROCESS_ID),
            F.when(keeps_previous, previous(PROCESSED_AT))
            .otherwise(F.lit(self.processed_at).cast("timestamp"))
            .alias(PROCESSED_AT),
        ]

    def own_columns(self) -> list[F.Column]:
        """``process_id``, ``processed_at`` of this run, for rows it writes whatever they held before."""
        return [F.lit(self.process_id).alias(PROCESS_ID), F.lit(self.processed_at).cast("timestamp").alias(PROCESSED_AT)]


def stored_audit(frame: DataFrame, alias: Callable[[str], str] = lambda name: name) -> list[F.Column]:
    """A stored state's audit columns aliased by ``alias``; NULL for a state written before they existed."""
    present = set(frame.columns)
    types = {PROCESS_ID: "string", PROCESSED_AT: "timestamp"}
    return [
        (F.col(name) if name in present else F.lit(None).cast(types[name])).alias(alias(name)) for name in AUDIT_COLUMNS
    ]


def extra_columns(audit: RunAudit | None, non_key_columns: Sequence[str] | None) -> tuple[str, ...]:
    """The columns a changes frame has after the classification's: audit, then changed_columns."""
    return (AUDIT_COLUMNS if audit else ()) + ((CHANGED_COLUMNS,) if non_key_columns is not None else ())


def changed_columns_of_update(
    operation: F.Column, non_key_columns: Sequence[str], before: Callable[[str], F.Column], after: Callable[[str], F.Column]
) -> F.Column:
    """``changed_columns``: for a U row the non-key columns whose values differ, else an empty list."""
    return (
        F.when(operation == F.lit(UPDATE), changed_columns(non_key_columns, before, after))
        .otherwise(no_changed_columns())
        .alias(CHANGED_COLUMNS)
    )


def _operation(incoming_hash: F.Column, previous_hash: F.Column, load_type: LoadType, held: F.Column | None = None) -> F.Column:
    """I/U/N/D/X from the two sides' non-key hashes of one key (NULL: the side has no row); a full load's
    key that ``held`` marks (a rejected record of it) is X, not D: kept as it was."""
    missing = DELETE if load_type is LoadType.full else NOT_SUPPLIED
    if held is not None and load_type is LoadType.full:
        return (
            F.when(previous_hash.isNull(), F.lit(INSERT))
            .when(incoming_hash.isNull() & held, F.lit(NOT_SUPPLIED))
            .when(incoming_hash.isNull(), F.lit(DELETE))
            .when(incoming_hash == previous_hash, F.lit(UNCHANGED))
            .otherwise(F.lit(UPDATE))
        )
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
    audit: RunAudit | None = None,
    non_key_columns: Sequence[str] | None = None,
    held: DataFrame | None = None,
) -> DataFrame:
    """One row per key_hash: ``payload_columns``, ``key_hash``, ``non_key_hash``, ``operation``, ``eff_start_date``.

    ``held`` (a full load's ``key_hash`` values with a rejected record that date): such a key absent from
    ``incoming`` is X (held as it was, counted as held_by_reject), not D.

    With ``audit``, also ``process_id`` and ``processed_at`` (this run's on I/U/D rows, the stored ones
    on N/X rows); with ``non_key_columns`` (a subset of ``payload_columns``), also ``changed_columns``.

    ``incoming`` FULL OUTER JOIN ``previous_current`` ON key_hash, in one join that carries the payload.
    The operation is decided by the hash columns only: a key only in the incoming rows is an insert;
    only in the previous state a delete (full load) or not supplied (delta load); in both, an update
    when the non-key hashes differ, else unchanged. I/U/N rows take the incoming payload and
    ``non_key_hash``, D/X rows the stored ones; unchanged and not-supplied rows keep the previous
    ``eff_start_date``. With no previous state every row is an insert.
    """
    day = F.lit(business_date).cast("date")
    if previous_current is None:
        inserted = F.lit(INSERT)
        return incoming.select(
            *payload_columns,
            KEY_HASH,
            NON_KEY_HASH,
            inserted.alias(OPERATION),
            day.alias(EFF_START_DATE),
            *(audit.own_columns() if audit else ()),
            *([no_changed_columns().alias(CHANGED_COLUMNS)] if non_key_columns is not None else ()),
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
        *(stored_audit(previous_current, lambda name: f"{_PREVIOUS}{name}") if audit else ()),
    )
    held_flag = None
    if held is not None and load_type is LoadType.full:
        # The day's rejected keys are few: broadcast, joined to the previous state where it lies.
        marks = F.broadcast(held.select(KEY_HASH).distinct().withColumn(f"{_PREVIOUS}held", F.lit(True)))
        previous_side = previous_side.join(marks, on=KEY_HASH, how="left")
        held_flag = F.coalesce(F.col(f"{_PREVIOUS}held"), F.lit(False))
    joined = incoming_side.join(previous_side, on=KEY_HASH, how="full_outer")
    incoming_hash, previous_hash = F.col(f"{_IN}hash"), F.col(f"{_PREVIOUS}hash")
    # A row's hash is never NULL, so a NULL hash means the side has no row for the key.
    from_incoming = incoming_hash.isNotNull()
    operation = _operation(incoming_hash, previous_hash, load_type, held_flag)
    kept = operation.isin(UNCHANGED, NOT_SUPPLIED)
    index_of = {name: index for index, name in enumerate(payload_columns)}
    return joined.select(
        *(
            F.when(from_incoming, F.col(f"{_IN}{index}")).otherwise(F.col(f"{_PREVIOUS}{index}")).alias(name)
            for index, name in enumerate(payload_columns)
        ),
        KEY_HASH,
        F.coalesce(incoming_hash, previous_hash).alias(NON_KEY_HASH),
        operation.alias(OPERATION),
        F.when(kept, F.col(f"{_PREVIOUS}eff")).otherwise(day).alias(EFF_START_DATE),
        *(audit.columns(kept, lambda name: F.col(f"{_PREVIOUS}{name}")) if audit else ()),
        *(
            [
                changed_columns_of_update(
                    operation,
                    non_key_columns,
                    before=lambda name: F.col(f"{_PREVIOUS}{index_of[name]}"),
                    after=lambda name: F.col(f"{_IN}{index_of[name]}"),
                )
            ]
            if non_key_columns is not None
            else ()
        ),
    )


_IN, _PREVIOUS = "__cdc_in_", "__cdc_previous_"


def classify_full_loads(
    incoming: DataFrame,
    previous_current: DataFrame | None,
    business_dates: Sequence[date],
    audit: RunAudit | None = None,
) -> DataFrame:
    """Consecutive dates of full loads classified in one query, each against the state the date before left.

    ``incoming`` holds every date's accepted rows with a ``business_date`` column; ``previous_current``
    is the state as of the day before the first date (None: no earlier state). Returns one row per date
    and key: ``business_date`` plus the columns of :func:`classify_changes`, with the same values that
    :func:`classify_changes` gives date by date (the tests compare them).

    After a full load the state holds exactly that date's rows, so the previous state of date d is
    date d-1's rows. Over each key's rows in date order (hash columns only): a row with no row the day
    before is an insert, one whose non-key hash differs from the day before an update, else unchanged;
    a row with no row the day after is deleted that day (within the range). An unchanged row keeps the
    eff_start_date of the last insert or update before it, or the stored one. With ``audit``, a row
    whose version started before the range keeps the stored process_id and processed_at.
    """
    first, last = min(business_dates), max(business_dates)
    day = F.col(BUSINESS_DATE)
    stored = lambda name: f"_stored_{name}"  # noqa: E731
    no_audit = [F.lit(None).cast(kind).alias(stored(name)) for name, kind in ((PROCESS_ID, "string"), (PROCESSED_AT, "timestamp"))]
    events = incoming.select(
        KEY_HASH, NON_KEY_HASH, BUSINESS_DATE, F.lit(None).cast("date").alias("_stored_eff"), *(no_audit if audit else ())
    )
    if previous_current is not None:
        events = events.unionByName(
            previous_current.select(
                KEY_HASH,
                NON_KEY_HASH,
                F.lit(first - timedelta(days=1)).cast("date").alias(BUSINESS_DATE),
                F.col(EFF_START_DATE).alias("_stored_eff"),
                *(stored_audit(previous_current, stored) if audit else ()),
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
    audit_names: tuple[str, ...] = ()
    if audit:
        # Only the stored row carries stored values, so the last one seen is the key's stored version's.
        # Computed before the stored rows are filtered out: the window must see them.
        from_store = F.col(EFF_START_DATE) < F.lit(first)
        dated = dated.select(
            "*", *audit.columns(from_store, lambda name: F.last(F.col(stored(name)), ignorenulls=True).over(since_first))
        )
        audit_names = AUDIT_COLUMNS
    present = dated.filter(F.col(OPERATION).isNotNull()).select(BUSINESS_DATE, *CLASSIFICATION_COLUMNS, *audit_names)
    next_day = F.date_add(day, 1)
    ends = F.col("_day_after").isNull() | (F.date_diff(F.col("_day_after"), day) != 1)
    deleted = dated.filter(ends & (day < F.lit(last))).select(
        next_day.alias(BUSINESS_DATE),
        KEY_HASH,
        NON_KEY_HASH,
        F.lit(DELETE).alias(OPERATION),
        next_day.alias(EFF_START_DATE),
        *(audit.own_columns() if audit else ()),
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
    non_key_columns: Sequence[str] | None = None,
) -> DataFrame:
    """The payload for the dated output of :func:`classify_full_loads`, every date at once.

    I/U/N rows take the payload of the same date's incoming row; a D row takes the payload its key had
    the day before (that date's incoming row, or ``previous_current`` on the first date). Output
    columns: those of :func:`classify_changes` (the classification's audit columns carried, and
    ``changed_columns`` with ``non_key_columns``, which U rows compare with the day before), then
    ``business_date``.
    """
    audit = [name for name in AUDIT_COLUMNS if name in classification.columns]
    ops = classification.select(BUSINESS_DATE, KEY_HASH, OPERATION, EFF_START_DATE, *audit)

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
    output = [*payload_columns, *CLASSIFICATION_COLUMNS, *audit]
    if non_key_columns is None:
        return from_incoming.select(*output, BUSINESS_DATE).unionByName(from_day_before.select(*output, BUSINESS_DATE))
    # An update's previous version is its key's row of the day before.
    before = lambda name: f"_before_{name}"  # noqa: E731
    updated = keys_with([UPDATE]).select(BUSINESS_DATE, KEY_HASH, F.date_sub(F.col(BUSINESS_DATE), 1).alias("_held_on"))
    previous_versions = held.join(updated, on=["_held_on", KEY_HASH], how="inner").select(
        BUSINESS_DATE, KEY_HASH, *(F.col(name).alias(before(name)) for name in non_key_columns)
    )
    from_incoming = from_incoming.join(previous_versions, on=[BUSINESS_DATE, KEY_HASH], how="left")
    changed = changed_columns_of_update(F.col(OPERATION), non_key_columns, lambda name: F.col(before(name)), F.col)
    return from_incoming.select(*output, changed, BUSINESS_DATE).unionByName(
        from_day_before.select(*output, no_changed_columns().alias(CHANGED_COLUMNS), BUSINESS_DATE)
    )


def with_operations(changes: DataFrame, operations: Sequence[str]) -> DataFrame:
    return changes.filter(F.col(OPERATION).isin(*operations))


def build_current(changes: DataFrame) -> DataFrame:
    """State as of the date: I + U + N (incoming payload) + X (previous payload); deleted keys leave.

    A state holds versions, not changes: ``changed_columns`` stays with the changes.
    """
    return with_operations(changes, CURRENT_OPERATIONS).drop(CHANGED_COLUMNS)  # no-op when it is absent


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
