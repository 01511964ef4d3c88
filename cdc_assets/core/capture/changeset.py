"""Applying one day's change set (flagged records with a sequence) to the previous state.

Reference semantics: seed 003's Table 1 and its ``RANK() OVER (PARTITION BY key ORDER BY sequence
DESC)``. A record is first told *late* or not: late when it is not newer than the sequence already
applied to its key on an earlier date (a deleted key's last sequence is kept as a tombstone for
``tombstone_retention_days``, so a late update cannot resurrect it). Late records are set aside.
Of the rest, per key, the record with the greatest sequence wins. Two different records sharing
it are a *tie* (only records that would be applied can tie): ``ChangeSetRules.quarantine_ties``
sets all of the key's remaining records of the day aside (reason ``tied``, the key is left as it
was), else the date fails with :class:`DuplicateKeysError`: their count and a ``key_hash``, and in
the detail, for the run's own log only, the keys and the sequence.

The winner is compared with the previous ``current_table`` on the hashes only:

- delete: a key in current is D (history carries its last payload from current); a key not in
  current leaves no trace but its tombstone (counted as a delete of an unknown key);
- insert or update (an upsert): I for a key not in current, U for another non-key hash, else N;
- a truncate (Debezium op ``t``) at sequence T supersedes the day's records below T and deletes
  every key current holds whose applied sequence is below T; a key's record at or after T is
  applied after it (an upsert compared with current, as any). T then stays in the state as the
  table's *floor*, for good: on every later date a record below T is late, whatever its key. A
  record whose sequence equals T is taken to come after the truncate, on its date and later;
- a key current holds that the day does not touch is X: kept as it was;
- a Debezium upsert that left a column out as unchanged (``unavailable_columns``) gets the column's
  value from the key's latest earlier record of the day that has it, else from current, and is
  hashed again; with neither it is set aside (reason ``no previous value``).

Besides the usual CDC columns (``classify_changes``'s, so ``build_current``/``build_history``
apply unchanged) a day yields the records it set aside (late or tied, for ``late_changes``) and the
new ``applied_sequences`` state: one row per key in current, the tombstones still retained, and the
floor (the greatest truncate's sequence, in a row whose ``key_hash`` is NULL); a key's entry below
the floor says nothing the floor does not, so it is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, Row, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from cdc_assets.core.caching import persist
from cdc_assets.core.capture.changes import (
    CLASSIFICATION_COLUMNS,
    DELETE,
    EFF_START_DATE,
    INSERT,
    NOT_SUPPLIED,
    OPERATION,
    OPERATIONS,
    UNCHANGED,
    UPDATE,
    RunAudit,
    changed_columns_of_update,
    extra_columns,
    stored_audit,
)
from cdc_assets.core.compare import CHANGED_COLUMNS, no_changed_columns
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH, canonical_text, framed
from cdc_assets.core.intake.incoming import SAMPLE_SIZE, DuplicateKeysError
from cdc_assets.core.intake.columns import CHANGE_FLAG, CHANGE_SEQUENCE, TRUNCATE, UNAVAILABLE_COLUMNS
from cdc_assets.model.masking import ValueMask

# applied_sequences: the last sequence applied to each key, and whether that change deleted it.
SEQUENCE, DELETED, APPLIED_ON = "sequence", "deleted", "applied_on"
STATE_COLUMNS = (KEY_HASH, SEQUENCE, DELETED, APPLIED_ON)
# late_changes: a record set aside as it came in, why it was not applied, and what had been applied.
REASON, APPLIED_SEQUENCE = "reason", "applied_sequence"
LATE, TIED = "late", "tied"
NO_PREVIOUS_VALUE = "no previous value"
# The operation of a delete whose key current does not hold: it changes nothing but its tombstone.
_DELETE_OF_UNKNOWN_KEY = "-"
# The operation of an upsert that left a column out as unchanged (Debezium's placeholder) when no
# earlier record of the day and no row of current holds that column's value: it is set aside.
_UPSERT_UNFILLABLE = "?"
_COPIES, _APPLIED, _TRUNCATED_AT, _RANK = "__cdc_copies", "__cdc_applied", "__cdc_truncated_at", "__cdc_rank"
_TOP, _TIED, _FLOOR, _FILLED = "__cdc_top", "__cdc_tied", "__cdc_floor", "__cdc_filled"

FIGURES = (
    "winners", "superseded", "late", "tied_keys", "tied_records", "duplicate_events", "deletes_of_unknown_keys",
    "truncates", "unavailable_filled", "unavailable_set_aside",
)


@dataclass(frozen=True)
class ChangeSetRules:
    """A table's change-set settings as :func:`apply_change_set` needs them."""

    table: str
    key_columns: tuple[str, ...]
    tombstone_retention_days: int = 30
    quarantine_ties: bool = False  # duplicate_keys: quarantine; else a tie fails the date
    # The tracked non-keys with their types: a record whose left-out columns are filled in is hashed again.
    hashed_non_keys: tuple[tuple[str, str], ...] = ()
    # Which values an error may show (model/masking.py); None: the keys are masked.
    mask: ValueMask | None = None


@dataclass
class ChangeSetDay:
    """One date's results: ``changes`` as :func:`changes.classify_changes` gives them, and the rest."""

    changes: DataFrame  # payload + key_hash, non_key_hash, operation, eff_start_date (cached)
    late: DataFrame  # the day's records set aside (late or tied) + reason, applied_sequence
    state: DataFrame  # applied_sequences as of the date
    counts: dict[str, int]  # the five operations
    figures: dict[str, int]  # FIGURES
    cached: list[DataFrame]


def apply_change_set(
    records: DataFrame,
    previous_current: DataFrame | None,
    previous_state: DataFrame | None,
    business_date: date,
    payload_columns: Sequence[str],
    rules: ChangeSetRules,
    audit: RunAudit | None = None,
    non_key_columns: Sequence[str] | None = None,
) -> ChangeSetDay:
    """Apply the date's accepted records (hashed_incoming: payload, hashes, change_flag, change_sequence).

    ``audit`` and ``non_key_columns`` add the columns they add to :func:`changes.classify_changes`.
    Runs small jobs (the figures, and the outcome's counts); nothing is written. Raises
    :class:`DuplicateKeysError` for a tie unless ``rules.quarantine_ties``.
    """
    sequence_type = records.schema[CHANGE_SEQUENCE].dataType
    fills = UNAVAILABLE_COLUMNS in records.columns  # Debezium
    record_columns = [*payload_columns, KEY_HASH, NON_KEY_HASH, CHANGE_FLAG, CHANGE_SEQUENCE]
    if fills:
        record_columns.append(UNAVAILABLE_COLUMNS)
    distinct, bounds = _against_previous(records, previous_state, record_columns, sequence_type)
    fillable = [name for name in payload_columns if name not in rules.key_columns] if fills else []
    ranked = persist(_ranked_candidates(distinct, fillable))
    figures_row = distinct.agg(
        F.sum(F.col(_COPIES) - 1).alias("duplicate_events"),
        F.count(F.when(_is_late(), F.lit(1))).alias("late"),
        F.count(F.when(_is_truncate(), F.lit(1))).alias("truncates"),
        F.count(F.when(_before_truncate(), F.lit(1))).alias("before_truncate"),
        F.max(F.col(_TRUNCATED_AT).isNotNull() & (F.col(_FLOOR).isNull() | (F.col(_TRUNCATED_AT) > F.col(_FLOOR)))).alias("raises_floor"),
    ).collect()[0]
    tied = F.col(_TIED)
    keyed_counts = ranked.agg(
        F.count(F.when(~tied & (F.col(_RANK) == 1), F.lit(1))).alias("winners"),
        F.count(F.when(~tied, F.lit(1))).alias("candidates"),
        F.count(F.when(tied & (F.col(_RANK) == 1), F.lit(1))).alias("tied_keys"),
        F.count(F.when(tied, F.lit(1))).alias("tied_records"),
    ).collect()[0]
    if keyed_counts["tied_keys"] and not rules.quarantine_ties:
        error = _tie_error(ranked, rules, business_date, keyed_counts["tied_keys"])
        ranked.unpersist()
        raise error
    figures = _ranking_figures(figures_row, keyed_counts)
    truncated = figures_row["truncates"] > 0

    winners = ranked.filter(~tied & (F.col(_RANK) == 1)).drop(_RANK, _TOP, _TIED, _COPIES, _TRUNCATED_AT, _FLOOR)
    last_truncate = bounds.select(_TRUNCATED_AT) if truncated else None
    resolved = _resolve(
        winners, previous_current, previous_state, last_truncate, F.lit(business_date).cast("date"), payload_columns,
        audit, non_key_columns, fillable, rules.hashed_non_keys,
    )
    resolved = persist(resolved)
    counts = _outcome_counts(resolved, figures)
    changes = resolved.filter(~F.col(OPERATION).isin(_DELETE_OF_UNKNOWN_KEY, _UPSERT_UNFILLABLE)).select(
        *payload_columns, *CLASSIFICATION_COLUMNS, *extra_columns(audit, non_key_columns)
    )
    state = _next_state(
        resolved, previous_state, last_truncate if figures_row["raises_floor"] else None, business_date,
        rules.tombstone_retention_days,
    )
    return ChangeSetDay(
        changes=changes, late=_set_aside(distinct, ranked, resolved, record_columns, fills, sequence_type), state=state,
        counts=counts, figures=figures, cached=[ranked, resolved],
    )


# What a record is, once _against_previous has put beside it its key's applied sequence (_APPLIED),
# the day's last truncate (_TRUNCATED_AT) and the floor the earlier truncates left (_FLOOR).
def _is_truncate() -> SparkColumn:
    return F.col(CHANGE_FLAG) == TRUNCATE


def _behind_key() -> SparkColumn:
    """At or below the sequence its key's current entry was applied at."""
    return F.col(_APPLIED).isNotNull() & (F.col(CHANGE_SEQUENCE) <= F.col(_APPLIED))


def _is_late() -> SparkColumn:
    return ~_is_truncate() & (_behind_key() | (F.col(_FLOOR).isNotNull() & (F.col(CHANGE_SEQUENCE) < F.col(_FLOOR))))


def _before_truncate() -> SparkColumn:
    """Superseded by the day's truncate (and not late)."""
    truncated_at = F.col(_TRUNCATED_AT)
    return ~_is_truncate() & ~_is_late() & truncated_at.isNotNull() & (F.col(CHANGE_SEQUENCE) < truncated_at)


def _against_previous(
    records: DataFrame, previous_state: DataFrame | None, record_columns: list[str], sequence_type: DataType
) -> tuple[DataFrame, DataFrame]:
    """The day's distinct records (an exactly repeated one, at-least-once delivery, counts once: _COPIES),
    each with its key's applied sequence and the day's bounds; and the bounds, one row: the day's last
    truncate and the floor the earlier truncates left."""
    distinct = records.groupBy(*record_columns).agg(F.count(F.lit(1)).alias(_COPIES))
    bounds = records.agg(F.max(F.when(_is_truncate(), F.col(CHANGE_SEQUENCE))).alias(_TRUNCATED_AT))
    if previous_state is not None:
        applied = previous_state.filter(F.col(KEY_HASH).isNotNull()).select(KEY_HASH, F.col(SEQUENCE).alias(_APPLIED))
        distinct = distinct.join(applied, on=KEY_HASH, how="left")
        stored_floor = previous_state.filter(F.col(KEY_HASH).isNull()).agg(F.max(SEQUENCE).alias(_FLOOR))
        bounds = bounds.crossJoin(stored_floor)
    else:
        distinct = distinct.withColumn(_APPLIED, F.lit(None).cast(sequence_type))
        bounds = bounds.withColumn(_FLOOR, F.lit(None).cast(sequence_type))
    return distinct.crossJoin(F.broadcast(bounds)), bounds


def _ranked_candidates(distinct: DataFrame, fillable: list[str]) -> DataFrame:
    """The records that may win their key (not a truncate, not late, not before the day's truncate),
    ranked by sequence, newest first; ``_TIED`` when the key's second record still ranks first (lateness
    is decided before, so a late record never ties, nor one the day's truncate supersedes). With
    ``fillable`` columns, each one's value in the key's latest earlier record of the day that has it."""
    by_key = Window.partitionBy(KEY_HASH).orderBy(F.col(CHANGE_SEQUENCE).desc())
    return (
        distinct.filter(~_is_truncate() & ~_is_late() & ~_before_truncate())
        .withColumns(
            {
                _RANK: F.row_number().over(by_key),
                _TOP: F.rank().over(by_key),
                **{_earlier(name): _earlier_value(name, by_key) for name in fillable},
            }
        )
        .withColumn(
            _TIED, F.max((F.col(_RANK) == 2) & (F.col(_TOP) == 1)).over(Window.partitionBy(KEY_HASH))
        )
    )


def _ranking_figures(figures_row: Row, keyed_counts: Row) -> dict[str, int]:
    """The day's figures before its records are applied: winners (a truncate is one), superseded, late,
    tied and duplicate records, truncates."""
    truncates = figures_row["truncates"]
    return {
        "winners": keyed_counts["winners"] + (1 if truncates > 0 else 0),
        "superseded": keyed_counts["candidates"] - keyed_counts["winners"] + figures_row["before_truncate"] + max(0, truncates - 1),
        "late": figures_row["late"],
        "tied_keys": keyed_counts["tied_keys"],
        "tied_records": keyed_counts["tied_records"],
        "duplicate_events": figures_row["duplicate_events"] or 0,
        "truncates": truncates,
    }


def _outcome_counts(resolved: DataFrame, figures: dict[str, int]) -> dict[str, int]:
    """The day's counts by operation (one job); adds to ``figures`` the deletes of unknown keys and the
    unavailable values filled or set aside (a record set aside is no winner: it goes to late_changes)."""
    counts = {operation: 0 for operation in OPERATIONS}
    by_operation = resolved.groupBy(OPERATION).agg(
        F.count(F.lit(1)).alias("count"), F.count(F.when(F.col(_FILLED), F.lit(1))).alias("filled")
    )
    others = {_DELETE_OF_UNKNOWN_KEY: 0, _UPSERT_UNFILLABLE: 0}
    filled = 0
    for row in by_operation.collect():
        (counts if row[OPERATION] in counts else others)[row[OPERATION]] = row["count"]
        filled += row["filled"]
    figures["deletes_of_unknown_keys"] = others[_DELETE_OF_UNKNOWN_KEY]
    figures["winners"] -= others[_UPSERT_UNFILLABLE]
    figures["unavailable_filled"], figures["unavailable_set_aside"] = filled, others[_UPSERT_UNFILLABLE]
    return counts


def _set_aside(
    distinct: DataFrame, ranked: DataFrame, resolved: DataFrame, record_columns: list[str], fills: bool, sequence_type: DataType
) -> DataFrame:
    """The day's late_changes: late records (with the sequence they lost to: the key's entry, never below
    the floor, or else the floor), tied ones, and, for Debezium, upserts whose left-out values nothing holds."""
    lost_to = F.when(_behind_key(), F.col(_APPLIED)).otherwise(F.col(_FLOOR))
    late_records = distinct.filter(_is_late()).select(*record_columns, F.lit(LATE).alias(REASON), lost_to.alias(APPLIED_SEQUENCE)).unionByName(
        ranked.filter(F.col(_TIED)).select(*record_columns, F.lit(TIED).alias(REASON), F.col(_APPLIED).alias(APPLIED_SEQUENCE))
    )
    if not fills:
        return late_records
    return late_records.unionByName(
        resolved.filter(F.col(OPERATION) == _UPSERT_UNFILLABLE).select(
            *(F.col(_as_came(name)).alias(name) for name in record_columns),
            F.concat(
                F.lit(f"{NO_PREVIOUS_VALUE}: "),
                F.array_join(F.col(UNAVAILABLE_COLUMNS), ", "),
                F.lit(" left out as unchanged (Debezium's placeholder), and neither an earlier record of the day "
                      "nor current_table holds the key"),
            ).alias(REASON),
            F.lit(None).cast(sequence_type).alias(APPLIED_SEQUENCE),
        )
    )


def _tie_error(ranked: DataFrame, rules: ChangeSetRules, business_date: date, tied_keys: int) -> DuplicateKeysError:
    samples = (
        ranked.filter(F.col(_TIED) & (F.col(_RANK) == 1))
        .select(KEY_HASH, *rules.key_columns, F.col(CHANGE_SEQUENCE).cast("string").alias("_sequence"))
        .orderBy(KEY_HASH)
        .limit(SAMPLE_SIZE)
        .collect()
    )
    mask = rules.mask or ValueMask.for_columns(())
    shown = "; ".join(
        mask.key(rules.key_columns, [row[name] for name in rules.key_columns]) + f" at sequence {row['_sequence']}" for row in samples
    )
    example = f", e.g. key_hash {samples[0][KEY_HASH]}" if samples else ""
    return DuplicateKeysError(
        f"table {rules.table}, {business_date}: {tied_keys} key(s) have different records with the same greatest "
        f"sequence, so their last change is unknown{example}. No CDC output was written (hashed_incoming "
        "holds the records as read); fix the change set, or set duplicate_keys: quarantine to set such keys' "
        "records of the day aside (to late_changes, reason tied).",
        f"The keys, e.g. {shown}.",
    )


def _earlier(name: str) -> str:
    return f"__cdc_earlier_{name}"


def _as_came(name: str) -> str:
    return f"__cdc_as_came_{name}"


def _earlier_value(name: str, by_key_newest_first: WindowSpec) -> SparkColumn:
    """The column's value in the key's latest earlier record of the day that has it (a struct, NULL if none)."""
    present = (F.col(CHANGE_FLAG) != DELETE) & ~_left_out(name)
    return F.first(F.when(present, F.struct(F.col(name).alias("value"))), ignorenulls=True).over(
        by_key_newest_first.rowsBetween(1, Window.unboundedFollowing)
    )


def _left_out(name: str) -> SparkColumn:
    return F.coalesce(F.array_contains(F.col(UNAVAILABLE_COLUMNS), F.lit(name)), F.lit(False))


def _non_key_hash(hashed_non_keys: Sequence[tuple[str, str]], value_of) -> SparkColumn:
    """hashing.add_hashes' non_key_hash over the given values."""
    texts = [framed(canonical_text(value_of(name), spark_type)) for name, spark_type in hashed_non_keys]
    return F.md5(F.concat(*texts)) if texts else F.md5(F.lit(""))


def _incoming_side(winners: DataFrame, payload_columns: Sequence[str], fillable: Sequence[str]) -> DataFrame:
    """The winners as _resolve's join takes them: the payload as ``_in_<i>``, the hash, whether it deletes
    and its sequence; with ``fillable`` columns, its flag, its left-out columns and their earlier values."""
    index_of = {name: index for index, name in enumerate(payload_columns)}
    return winners.select(
        *(F.col(name).alias(f"_in_{index}") for index, name in enumerate(payload_columns)),
        KEY_HASH,
        F.col(NON_KEY_HASH).alias("_in_hash"),
        (F.col(CHANGE_FLAG) == DELETE).alias("_in_deletes"),
        F.col(CHANGE_SEQUENCE).alias("_in_sequence"),
        *(
            [F.col(CHANGE_FLAG).alias("_in_flag"), F.col(UNAVAILABLE_COLUMNS).alias("_in_unavailable")]
            + [F.col(_earlier(name)).alias(f"_earlier_{index_of[name]}") for name in fillable]
            if fillable
            else []
        ),
    )


def _held_side(
    previous_current: DataFrame, previous_state: DataFrame | None, last_truncate: DataFrame | None,
    payload_columns: Sequence[str], audit: RunAudit | None,
) -> DataFrame:
    """The previous current as _resolve's join takes it: the payload as ``_held_<i>``, the hash, the
    version's start and audit columns; after a truncate, ``_held_truncated``: a held key the day does not
    touch is deleted by the truncate unless its applied sequence is newer (the truncate is late for it)."""
    held = previous_current.select(
        *(F.col(name).alias(f"_held_{index}") for index, name in enumerate(payload_columns)),
        KEY_HASH,
        F.col(NON_KEY_HASH).alias("_held_hash"),
        F.col(EFF_START_DATE).alias("_held_eff"),
        *(stored_audit(previous_current, lambda name: f"_held_{name}") if audit else ()),
    )
    if last_truncate is None:
        return held
    if previous_state is not None:
        applied = previous_state.filter(F.col(KEY_HASH).isNotNull()).select(KEY_HASH, F.col(SEQUENCE).alias("_held_applied"))
        held = held.join(applied, on=KEY_HASH, how="left")
    else:
        held = held.withColumn("_held_applied", F.lit(None))
    truncated_at = F.col(_TRUNCATED_AT)
    return held.crossJoin(F.broadcast(last_truncate)).select(
        *held.columns,
        (F.col("_held_applied").isNull() | (F.col("_held_applied") < truncated_at)).alias("_held_truncated"),
    )


def _resolve(
    winners, previous_current, previous_state, last_truncate, day, payload_columns, audit, non_key_columns,
    fillable: Sequence[str] = (), hashed_non_keys: Sequence[tuple[str, str]] = (),
) -> DataFrame:
    """Each touched or held key's operation (``_DELETE_OF_UNKNOWN_KEY`` and ``_UPSERT_UNFILLABLE`` included), payload
    and applied sequence.

    One full outer join of the winners (none below the day's truncate) with the previous current,
    carrying the payload; the operation is decided from the flags and hashes only. A key the
    truncate deletes gets no sequence: the floor stands in for it.

    A column a winning upsert left out as unchanged (``fillable``, named in ``unavailable_columns``)
    takes its value from the key's latest earlier record of the day that has it, else from current;
    the record is then hashed again. With neither, the record is ``_UPSERT_UNFILLABLE`` (set aside as it
    came in, in the ``_as_came`` columns).
    """
    index_of = {name: index for index, name in enumerate(payload_columns)}
    incoming = _incoming_side(winners, payload_columns, fillable)
    held = None
    held_truncated = F.lit(False)
    if previous_current is not None:
        held = _held_side(previous_current, previous_state, last_truncate, payload_columns, audit)
        if last_truncate is not None:
            held_truncated = F.col("_held_truncated")
        joined = incoming.join(held, on=KEY_HASH, how="full_outer")
        is_held = F.col("_held_hash").isNotNull()
    else:
        joined = incoming
        is_held = F.lit(False)
    touched = F.col("_in_sequence").isNotNull()

    joined, in_hash = _with_left_out_filled(joined, payload_columns, fillable, hashed_non_keys, held is not None, is_held, touched)
    held_hash = F.col("_held_hash") if held is not None else F.lit(None).cast("string")
    unfillable = F.col("_unfillable")

    operation = (
        F.when(unfillable, F.lit(_UPSERT_UNFILLABLE))
        .when(touched & ~is_held, F.when(F.col("_in_deletes"), F.lit(_DELETE_OF_UNKNOWN_KEY)).otherwise(F.lit(INSERT)))
        .when(~touched, F.when(held_truncated, F.lit(DELETE)).otherwise(F.lit(NOT_SUPPLIED)))
        .when(F.col("_in_deletes"), F.lit(DELETE))
        .when(in_hash == held_hash, F.lit(UNCHANGED))
        .otherwise(F.lit(UPDATE))
    )
    takes_incoming = operation.isin(INSERT, UPDATE, UNCHANGED, _DELETE_OF_UNKNOWN_KEY, _UPSERT_UNFILLABLE)
    kept = operation.isin(UNCHANGED, NOT_SUPPLIED)
    if held is None:
        extras = [*(audit.own_columns() if audit else ())]
        if non_key_columns is not None:
            extras.append(no_changed_columns().alias(CHANGED_COLUMNS))
    else:
        extras = [*(audit.columns(kept, lambda name: F.col(f"_held_{name}")) if audit else ())]
        if non_key_columns is not None:
            extras.append(
                changed_columns_of_update(
                    operation,
                    non_key_columns,
                    before=lambda name: F.col(f"_held_{index_of[name]}"),
                    after=lambda name: F.col(f"_val_{index_of[name]}"),
                )
            )
    as_came = _as_came_columns(payload_columns, unfillable) if fillable else []

    def held_or(index: int) -> SparkColumn:
        return F.col(f"_held_{index}") if held is not None else F.lit(None)

    return joined.select(
        *(
            F.when(takes_incoming, F.col(f"_val_{index}")).otherwise(held_or(index)).alias(name)
            for index, name in enumerate(payload_columns)
        ),
        KEY_HASH,
        F.when(takes_incoming, in_hash).otherwise(held_hash).alias(NON_KEY_HASH),
        operation.alias(OPERATION),
        F.when(kept, F.col("_held_eff") if held is not None else F.lit(None)).otherwise(day).alias(EFF_START_DATE),
        *extras,
        # NULL: X (the key's applied sequence is unchanged), deleted by the truncate, or set aside
        F.when(~unfillable, F.col("_in_sequence")).alias(SEQUENCE),
        (F.col("_filled") & ~unfillable & touched).alias(_FILLED),
        *as_came,
    )


def _with_left_out_filled(
    joined: DataFrame, payload_columns, fillable: Sequence[str], hashed_non_keys, has_held: bool, is_held: SparkColumn, touched: SparkColumn
) -> tuple[DataFrame, SparkColumn]:
    """The joined rows with the values each key takes from its winner (``_val_<i>``), a left-out column filled
    from the key's latest earlier record of the day, else from current; ``_filled``, ``_unfillable`` (a left-out
    column with neither); and the winner's non-key hash, computed again for a filled record."""
    index_of = {name: index for index, name in enumerate(payload_columns)}
    # Two projections, so that each filled value is computed once.
    values = {f"_val_{index}": F.col(f"_in_{index}") for index in range(len(payload_columns))}
    needs_current = F.lit(False)
    for name in fillable:
        index = index_of[name]
        earlier = F.col(f"_earlier_{index}")
        previous = F.col(f"_held_{index}") if has_held else F.lit(None)
        left_out = F.coalesce(F.array_contains(F.col("_in_unavailable"), F.lit(name)), F.lit(False))
        values[f"_val_{index}"] = F.when(
            left_out, F.when(earlier.isNotNull(), earlier.getField("value")).otherwise(previous)
        ).otherwise(F.col(f"_in_{index}"))
        needs_current = needs_current | (left_out & earlier.isNull())
    filled = (F.col("_in_unavailable").isNotNull() & ~F.col("_in_deletes")) if fillable else F.lit(False)
    joined = joined.withColumns({**values, "_filled": filled, "_unfillable": touched & filled & needs_current & ~is_held})
    if not fillable:
        return joined, F.col("_in_hash")
    rehashed = _non_key_hash(hashed_non_keys, lambda name: F.col(f"_val_{index_of[name]}"))
    return joined.withColumn("_val_hash", F.when(F.col("_filled"), rehashed).otherwise(F.col("_in_hash"))), F.col("_val_hash")


def _as_came_columns(payload_columns, unfillable: SparkColumn) -> list[SparkColumn]:
    """An ``_UPSERT_UNFILLABLE`` record's columns as it came in (``_as_came_<name>``), for late_changes."""
    raw = {
        **{name: F.col(f"_in_{index}") for index, name in enumerate(payload_columns)},
        KEY_HASH: F.col(KEY_HASH),
        NON_KEY_HASH: F.col("_in_hash"),
        CHANGE_FLAG: F.col("_in_flag"),
        CHANGE_SEQUENCE: F.col("_in_sequence"),
        UNAVAILABLE_COLUMNS: F.col("_in_unavailable"),
    }
    return [F.when(unfillable, value).alias(_as_came(name)) for name, value in raw.items()]


def _next_state(
    resolved: DataFrame, previous_state: DataFrame | None, new_floor: DataFrame | None, business_date: date, retention_days: int
) -> DataFrame:
    """applied_sequences as of the date: the day's applied sequences over the earlier ones.

    A tombstone (a deleted key's last sequence) is dropped ``retention_days`` business days after
    its delete; a key current holds keeps its entry as long as it is held. ``new_floor`` (one row,
    the day's truncate, when it is above the floor so far) replaces the floor and drops every key's
    entry below it. The floor is never dropped.
    """
    day = F.lit(business_date).cast("date")
    today = resolved.filter(F.col(SEQUENCE).isNotNull()).select(
        KEY_HASH,
        F.col(SEQUENCE),
        F.col(OPERATION).isin(DELETE, _DELETE_OF_UNKNOWN_KEY).alias(DELETED),
        day.alias(APPLIED_ON),
    )
    state = today
    if previous_state is not None:
        # A left anti join on key_hash never matches the floor's NULL: the floor is kept here.
        kept = previous_state.select(*STATE_COLUMNS).join(today.select(KEY_HASH), on=KEY_HASH, how="left_anti")
        is_floor = F.col(KEY_HASH).isNull()
        retained = is_floor | ~F.col(DELETED) | (F.date_diff(day, F.col(APPLIED_ON)) < F.lit(retention_days))
        state = kept.filter(retained).unionByName(today)
    if new_floor is None:
        return state
    keys_at_or_above = (
        state.filter(F.col(KEY_HASH).isNotNull())
        .crossJoin(F.broadcast(new_floor))
        .filter(F.col(SEQUENCE) >= F.col(_TRUNCATED_AT))
        .select(*STATE_COLUMNS)
    )
    floor_row = new_floor.select(
        F.lit(None).cast(resolved.schema[KEY_HASH].dataType).alias(KEY_HASH),
        F.col(_TRUNCATED_AT).alias(SEQUENCE),
        F.lit(True).alias(DELETED),
        day.alias(APPLIED_ON),
    )
    return keys_at_or_above.unionByName(floor_row)
