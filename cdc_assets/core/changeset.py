"""Applying one day's change set (flagged records with a sequence) to the previous state.

Reference semantics: seed 003's Table 1 and its ``RANK() OVER (PARTITION BY key ORDER BY sequence
DESC)``. A record is first told *late* or not: late when it is not newer than the sequence already
applied to its key on an earlier date (a deleted key's last sequence is kept as a tombstone for
``tombstone_retention_days``, so a late update cannot resurrect it). Late records are set aside.
Of the rest, per key, the record with the greatest sequence wins. Two different records sharing
it are a *tie* (only records that would be applied can tie): ``ChangeSetRules.quarantine_ties``
sets all of the key's remaining records of the day aside (reason ``tied``, the key is left as it
was), else the date fails with :class:`DuplicateKeysError` naming the key and the sequence.

The winner is compared with the previous ``current_table`` on the hashes only:

- delete: a key in current is D (history carries its last payload from current); a key not in
  current leaves no trace but its tombstone (counted as a delete of an unknown key);
- insert or update (an upsert): I for a key not in current, U for another non-key hash, else N;
- a truncate (Debezium op ``t``) deletes every key from its sequence on; a key's later record of
  the day re-inserts it, compared with current like any upsert;
- a key current holds that the day does not touch is X: kept as it was.

Besides the usual CDC columns (``classify_changes``'s, so ``build_current``/``build_history``
apply unchanged) a day yields the records it set aside (late or tied, for ``late_changes``) and the
new ``applied_sequences`` state: one row per key in current, plus the tombstones still retained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc_assets.core.caching import CACHE_LEVEL
from cdc_assets.core.changes import (
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
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH
from cdc_assets.core.incoming import SAMPLE_SIZE, DuplicateKeysError
from cdc_assets.core.source import CHANGE_FLAG, CHANGE_SEQUENCE, TRUNCATE

# applied_sequences: the last sequence applied to each key, and whether that change deleted it.
SEQUENCE, DELETED, APPLIED_ON = "sequence", "deleted", "applied_on"
STATE_COLUMNS = (KEY_HASH, SEQUENCE, DELETED, APPLIED_ON)
# late_changes: a record set aside as it came in, why it was not applied, and what had been applied.
REASON, APPLIED_SEQUENCE = "reason", "applied_sequence"
LATE, TIED = "late", "tied"
# The operation of a delete whose key current does not hold: it changes nothing but its tombstone.
_UNKNOWN_DELETE = "-"
_COPIES, _APPLIED, _TRUNCATED_AT, _RANK = "__cdc_copies", "__cdc_applied", "__cdc_truncated_at", "__cdc_rank"
_TOP, _TIED = "__cdc_top", "__cdc_tied"

FIGURES = (
    "winners", "superseded", "late", "tied_keys", "tied_records", "duplicate_events", "deletes_of_unknown_keys",
    "truncates",
)


@dataclass(frozen=True)
class ChangeSetRules:
    """A table's change-set settings as :func:`apply_change_set` needs them."""

    table: str
    key_columns: tuple[str, ...]
    tombstone_retention_days: int = 30
    quarantine_ties: bool = False  # duplicate_keys: quarantine; else a tie fails the date


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
    day = F.lit(business_date).cast("date")
    record_columns = [*payload_columns, KEY_HASH, NON_KEY_HASH, CHANGE_FLAG, CHANGE_SEQUENCE]
    # An exactly repeated record (at-least-once delivery) counts once.
    distinct = records.groupBy(*record_columns).agg(F.count(F.lit(1)).alias(_COPIES))
    if previous_state is not None:
        applied = previous_state.select(KEY_HASH, F.col(SEQUENCE).alias(_APPLIED))
        distinct = distinct.join(applied, on=KEY_HASH, how="left")
    else:
        distinct = distinct.withColumn(_APPLIED, F.lit(None).cast(records.schema[CHANGE_SEQUENCE].dataType))
    is_truncate = F.col(CHANGE_FLAG) == TRUNCATE
    is_late = ~is_truncate & F.col(_APPLIED).isNotNull() & (F.col(CHANGE_SEQUENCE) <= F.col(_APPLIED))
    by_key = Window.partitionBy(KEY_HASH).orderBy(F.col(CHANGE_SEQUENCE).desc())
    # A tie: the key's second record by sequence still ranks first. Lateness is decided before,
    # so a late record never ties.
    ranked = (
        distinct.filter(~is_truncate & ~is_late)
        .withColumns({_RANK: F.row_number().over(by_key), _TOP: F.rank().over(by_key)})
        .withColumn(
            _TIED, F.max((F.col(_RANK) == 2) & (F.col(_TOP) == 1)).over(Window.partitionBy(KEY_HASH))
        )
        .persist(CACHE_LEVEL)
    )
    truncates = distinct.filter(is_truncate)
    late = distinct.filter(is_late)

    figures_row = (
        distinct.agg(
            F.sum(F.col(_COPIES) - 1).alias("duplicate_events"),
            F.count(F.when(is_late, F.lit(1))).alias("late"),
            F.count(F.when(is_truncate, F.lit(1))).alias("truncates"),
            F.max(F.when(is_truncate, F.col(CHANGE_SEQUENCE))).alias("last_truncate"),
        ).collect()[0]
    )
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
    truncated = figures_row["truncates"] > 0
    figures = {
        "winners": keyed_counts["winners"] + (1 if truncated else 0),
        "superseded": keyed_counts["candidates"] - keyed_counts["winners"] + max(0, figures_row["truncates"] - 1),
        "late": figures_row["late"],
        "tied_keys": keyed_counts["tied_keys"],
        "tied_records": keyed_counts["tied_records"],
        "duplicate_events": figures_row["duplicate_events"] or 0,
        "truncates": figures_row["truncates"],
    }

    winners = ranked.filter(~tied & (F.col(_RANK) == 1)).drop(_RANK, _TOP, _TIED, _COPIES)
    last_truncate = truncates.agg(F.max(CHANGE_SEQUENCE).alias(_TRUNCATED_AT))
    if truncated:
        winners = winners.crossJoin(F.broadcast(last_truncate))
    else:
        winners = winners.withColumn(_TRUNCATED_AT, F.lit(None).cast(records.schema[CHANGE_SEQUENCE].dataType))
    resolved = _resolve(
        winners, previous_current, previous_state, last_truncate if truncated else None, day, payload_columns, audit, non_key_columns
    )
    resolved = resolved.persist(CACHE_LEVEL)
    counts = {operation: 0 for operation in OPERATIONS}
    unknown_deletes = 0
    for row in resolved.groupBy(OPERATION).count().collect():
        if row[OPERATION] == _UNKNOWN_DELETE:
            unknown_deletes = row["count"]
        else:
            counts[row[OPERATION]] = row["count"]
    figures["deletes_of_unknown_keys"] = unknown_deletes

    changes = resolved.filter(F.col(OPERATION) != _UNKNOWN_DELETE).select(
        *payload_columns, *CLASSIFICATION_COLUMNS, *extra_columns(audit, non_key_columns)
    )
    late_records = late.select(
        *record_columns, F.lit(LATE).alias(REASON), F.col(_APPLIED).alias(APPLIED_SEQUENCE)
    ).unionByName(
        ranked.filter(tied).select(*record_columns, F.lit(TIED).alias(REASON), F.col(_APPLIED).alias(APPLIED_SEQUENCE))
    )
    state = _next_state(resolved, previous_state, business_date, rules.tombstone_retention_days)
    return ChangeSetDay(
        changes=changes, late=late_records, state=state, counts=counts, figures=figures, cached=[ranked, resolved]
    )


def _tie_error(ranked: DataFrame, rules: ChangeSetRules, business_date: date, tied_keys: int) -> DuplicateKeysError:
    samples = (
        ranked.filter(F.col(_TIED) & (F.col(_RANK) == 1))
        .select(*rules.key_columns, F.col(CHANGE_SEQUENCE).cast("string").alias("_sequence"))
        .limit(SAMPLE_SIZE)
        .collect()
    )
    shown = "; ".join(
        "{" + ", ".join(f"{name}={row[name]!r}" for name in rules.key_columns) + f"}} at sequence {row['_sequence']}"
        for row in samples
    )
    return DuplicateKeysError(
        f"table {rules.table}, {business_date}: {tied_keys} key(s) have different records with the same greatest "
        f"sequence, so their last change is unknown, e.g. {shown}. No CDC output was written (hashed_incoming "
        "holds the records as read); fix the change set, or set duplicate_keys: quarantine to set such keys' "
        "records of the day aside (to late_changes, reason tied)."
    )


def _resolve(winners, previous_current, previous_state, last_truncate, day, payload_columns, audit, non_key_columns) -> DataFrame:
    """Each touched or held key's operation (``_UNKNOWN_DELETE`` included), payload and applied sequence.

    One full outer join of the winners with the previous current, carrying the payload; the
    operation is decided from the flags and hashes only.
    """
    truncated = F.col(_TRUNCATED_AT).isNotNull() & (F.col(CHANGE_SEQUENCE) < F.col(_TRUNCATED_AT))
    incoming = winners.select(
        *(F.col(name).alias(f"_in_{index}") for index, name in enumerate(payload_columns)),
        KEY_HASH,
        F.col(NON_KEY_HASH).alias("_in_hash"),
        ((F.col(CHANGE_FLAG) == DELETE) | truncated).alias("_in_deletes"),
        F.when(truncated, F.col(_TRUNCATED_AT)).otherwise(F.col(CHANGE_SEQUENCE)).alias("_in_sequence"),
    )
    if previous_current is None:
        return incoming.select(
            *(F.col(f"_in_{index}").alias(name) for index, name in enumerate(payload_columns)),
            KEY_HASH,
            F.col("_in_hash").alias(NON_KEY_HASH),
            F.when(F.col("_in_deletes"), F.lit(_UNKNOWN_DELETE)).otherwise(F.lit(INSERT)).alias(OPERATION),
            day.alias(EFF_START_DATE),
            *(audit.own_columns() if audit else ()),
            *([no_changed_columns().alias(CHANGED_COLUMNS)] if non_key_columns is not None else ()),
            F.col("_in_sequence").alias(SEQUENCE),
        )
    held = previous_current.select(
        *(F.col(name).alias(f"_held_{index}") for index, name in enumerate(payload_columns)),
        KEY_HASH,
        F.col(NON_KEY_HASH).alias("_held_hash"),
        F.col(EFF_START_DATE).alias("_held_eff"),
        *(stored_audit(previous_current, lambda name: f"_held_{name}") if audit else ()),
    )
    held_truncated = F.lit(False)
    if last_truncate is not None:
        # A held key the day does not touch is deleted by the truncate unless its applied sequence
        # is newer (the truncate is late for that key).
        if previous_state is not None:
            held = held.join(previous_state.select(KEY_HASH, F.col(SEQUENCE).alias("_held_applied")), on=KEY_HASH, how="left")
        else:
            held = held.withColumn("_held_applied", F.lit(None))
        truncated_at = F.col(_TRUNCATED_AT)
        held = held.crossJoin(F.broadcast(last_truncate)).select(
            *held.columns,
            F.when(F.col("_held_applied").isNull() | (F.col("_held_applied") < truncated_at), truncated_at).alias("_held_deleted_at"),
        )
        held_truncated = F.col("_held_deleted_at").isNotNull()
    joined = incoming.join(held, on=KEY_HASH, how="full_outer")
    in_hash, held_hash = F.col("_in_hash"), F.col("_held_hash")
    touched, is_held = F.col("_in_sequence").isNotNull(), held_hash.isNotNull()
    operation = (
        F.when(touched & ~is_held, F.when(F.col("_in_deletes"), F.lit(_UNKNOWN_DELETE)).otherwise(F.lit(INSERT)))
        .when(~touched, F.when(held_truncated, F.lit(DELETE)).otherwise(F.lit(NOT_SUPPLIED)))
        .when(F.col("_in_deletes"), F.lit(DELETE))
        .when(in_hash == held_hash, F.lit(UNCHANGED))
        .otherwise(F.lit(UPDATE))
    )
    takes_incoming = operation.isin(INSERT, UPDATE, UNCHANGED, _UNKNOWN_DELETE)
    kept = operation.isin(UNCHANGED, NOT_SUPPLIED)
    sequence = F.col("_in_sequence")
    if last_truncate is not None:
        sequence = F.coalesce(sequence, F.col("_held_deleted_at"))
    index_of = {name: index for index, name in enumerate(payload_columns)}
    extras = [*(audit.columns(kept, lambda name: F.col(f"_held_{name}")) if audit else ())]
    if non_key_columns is not None:
        extras.append(
            changed_columns_of_update(
                operation,
                non_key_columns,
                before=lambda name: F.col(f"_held_{index_of[name]}"),
                after=lambda name: F.col(f"_in_{index_of[name]}"),
            )
        )
    return joined.select(
        *(
            F.when(takes_incoming, F.col(f"_in_{index}")).otherwise(F.col(f"_held_{index}")).alias(name)
            for index, name in enumerate(payload_columns)
        ),
        KEY_HASH,
        F.when(takes_incoming, in_hash).otherwise(held_hash).alias(NON_KEY_HASH),
        operation.alias(OPERATION),
        F.when(kept, F.col("_held_eff")).otherwise(day).alias(EFF_START_DATE),
        *extras,
        sequence.alias(SEQUENCE),  # NULL: X, the key's applied sequence is unchanged
    )


def _next_state(resolved: DataFrame, previous_state: DataFrame | None, business_date: date, retention_days: int) -> DataFrame:
    """applied_sequences as of the date: the day's applied sequences over the earlier ones.

    A tombstone (a deleted key's last sequence) is dropped ``retention_days`` business days after
    its delete; a key current holds keeps its entry as long as it is held.
    """
    day = F.lit(business_date).cast("date")
    today = resolved.filter(F.col(SEQUENCE).isNotNull()).select(
        KEY_HASH,
        F.col(SEQUENCE),
        F.col(OPERATION).isin(DELETE, _UNKNOWN_DELETE).alias(DELETED),
        day.alias(APPLIED_ON),
    )
    if previous_state is None:
        return today
    kept = previous_state.select(*STATE_COLUMNS).join(today.select(KEY_HASH), on=KEY_HASH, how="left_anti")
    retained = ~F.col(DELETED) | (F.date_diff(day, F.col(APPLIED_ON)) < F.lit(retention_days))
    return kept.filter(retained).unionByName(today)
