"""Reconciliation rules: the equations a date's stored outputs must satisfy. Plain PySpark, no Dagster.

Two halves. The ``*_by_date`` functions measure stored outputs where the Parquet footers cannot (distinct
keys, NULL keys, operations): each takes every date of a range as one DataFrame with a date column and
returns small per-date figures from one aggregation, so checking a ten-date backfill costs one job per
dataset rather than ten. Plain row counts come from the footers (``WarehouseStorage.row_counts``). The ``reconcile_*`` functions apply the
rules to one date's figures and return a :class:`Reconciliation` with both sides of each equation, so
a failure says by how much and where. Nothing here collects data, only one row of figures per date.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.capture.changes import DELETE, INSERT, NOT_SUPPLIED, OPERATION, UNCHANGED, UPDATE, no_operations
from cdc_assets.core.hashing import KEY_HASH


@dataclass(frozen=True)
class Reconciliation:
    asset: str  # the asset the rule is about
    name: str  # the check's name
    passed: bool
    equation: str  # the rule with the figures filled in, e.g. "10000 = 2000 + 4000 + 4000 + 0"
    metadata: dict[str, int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class KeyedFigures:
    """Rows of a stored dataset, its distinct ``key_hash`` values, and rows with a NULL key column."""

    rows: int = 0
    distinct_keys: int = 0
    null_key_rows: int = 0


# -- measuring: figures by the date column's values (``datetime.date`` for a date column) -------------
def keyed_figures_by_date(frame: DataFrame, date_column: str, key_columns: list[str] | None = None) -> dict[date, KeyedFigures]:
    """Rows, distinct key_hash and (when ``key_columns`` are given) NULL-key rows per date, in one pass."""
    null_key = (
        F.count(F.when(F.expr(" OR ".join(f"`{name}` IS NULL" for name in key_columns)), F.lit(1)))
        if key_columns
        else F.lit(0)
    )
    rows = frame.groupBy(date_column).agg(
        F.count(F.lit(1)).alias("rows"), F.count_distinct(KEY_HASH).alias("keys"), null_key.alias("null_keys")
    )
    return {row[0]: KeyedFigures(row["rows"], row["keys"], row["null_keys"]) for row in rows.collect()}


def operations_by_date(classification: DataFrame, date_column: str) -> dict[date, dict[str, int]]:
    """Rows per operation per date, all five operations present for every date that has rows."""
    counts: dict[date, dict[str, int]] = {}
    for row in classification.groupBy(date_column, OPERATION).count().collect():
        counts.setdefault(row[0], no_operations())[row[OPERATION]] = row["count"]
    return counts


UPDATES_ASSET = "updates"


# -- the rules -----------------------------------------------------------------------------------------
def _rule(asset: str, name: str, left_label: str, left: int, right_label: str, right: int, **extra) -> Reconciliation:
    passed = left == right
    relation = "=" if passed else "≠"
    return Reconciliation(
        asset=asset,
        name=name,
        passed=passed,
        equation=f"{left_label} ({left}) {relation} {right_label} ({right})",
        metadata={"left": left, "right": right, "difference": left - right, **extra},
    )


def reconcile_incoming(rows_read: int, accepted: KeyedFigures, rejected_rows: int, set_aside: int = 0) -> list[Reconciliation]:
    """Nothing lost at intake (rows read = accepted + rejected + records of erased keys set aside), and no
    key twice in hashed_incoming."""
    rows = _rule("hashed_incoming", "rows_read_reconcile", "rows read", rows_read, "accepted + rejected",
                 accepted.rows + rejected_rows, rows_read=rows_read, rows_accepted=accepted.rows, rows_rejected=rejected_rows)
    if set_aside:
        rows = _rule("hashed_incoming", "rows_read_reconcile", "rows read", rows_read,
                     "accepted + rejected + records of erased keys set aside", accepted.rows + rejected_rows + set_aside,
                     rows_read=rows_read, rows_accepted=accepted.rows, rows_rejected=rejected_rows, erased_records_set_aside=set_aside)
    return [
        rows,
        _rule("hashed_incoming", "keys_unique", "hashed_incoming rows", accepted.rows, "distinct key_hash", accepted.distinct_keys),
    ]


def reconcile_changes(
    operations: Mapping[str, int],
    incoming_rows: int,
    previous_rows: int,
    current: KeyedFigures,
    history_rows: int,
) -> list[Reconciliation]:
    """Every rule for one date's stored CDC outputs (``previous_rows`` is 0 on the first date)."""
    i, u, d, x, n = (operations[op] for op in (INSERT, UPDATE, DELETE, NOT_SUPPLIED, UNCHANGED))
    counts = {"inserts": i, "updates": u, "deletes": d, "not_supplied": x, "unchanged": n}
    return [
        # A full snapshot accounts for every incoming key as I, U or N; so does a delta (its keys are
        # the changed ones), so this rule holds for both load types.
        _rule("hash_join_classification", "incoming_reconciles", "I + U + N", i + u + n,
              "hashed_incoming rows", incoming_rows, **counts),
        _rule("hash_join_classification", "previous_state_reconciles", "D + U + N + X", d + u + n + x,
              "previous current_table rows", previous_rows, **counts),
        _rule("current_table", "row_count_reconciles", "current_table rows", current.rows, "I + U + N + X",
              i + u + n + x, **counts),
        _rule("current_table", "key_hash_unique", "current_table rows", current.rows, "distinct key_hash", current.distinct_keys),
        _rule("current_table", "keys_not_null", "rows with a NULL key column", current.null_key_rows, "zero", 0),
        _rule("history_partition", "row_count_reconciles", "history_partition rows", history_rows, "I + U + D",
              i + u + d, **counts),
    ]


def reconcile_held_by_reject(held_by_reject: int, not_supplied: int) -> Reconciliation:
    """A full load's keys kept as they were, neither updated nor deleted, because a record of theirs is
    in the date's rejects (its X): a warning naming their count; none is the norm."""
    return _rule("hash_join_classification", "no_key_held_by_reject", "keys held as they were for a rejected record",
                 held_by_reject, "zero", 0, held_by_reject=held_by_reject, not_supplied=not_supplied)


def reconcile_stored_state(
    operations: Mapping[str, int], full_copy: bool, stored_rows: int, untouched: str, stored_untouched: int = 0
) -> Reconciliation:
    """What a merged state stored for the date: a full copy holds I + U + N + X rows; the date's MERGE
    wrote a row for each I and U and, but for ``untouched``'s (N after a full load, X otherwise), each
    N and X (its D keys left the table), plus the ``stored_untouched`` N rows of a full load whose untracked
    values changed (at most N of them: more stored fails the check)."""
    counts = {op: operations[op] for op in (INSERT, UPDATE, DELETE, UNCHANGED, NOT_SUPPLIED)}
    extra = {}
    if full_copy:
        expected, label = sum(counts[op] for op in (INSERT, UPDATE, UNCHANGED, NOT_SUPPLIED)), "I + U + N + X"
    else:
        # A full load's X (a key held for a rejected record) is stored like its I and U.
        kept = [op for op in (INSERT, UPDATE, UNCHANGED, NOT_SUPPLIED) if op != untouched and (op != NOT_SUPPLIED or counts[op])]
        expected, label = sum(counts[op] for op in kept), " + ".join(kept)
        if stored_untouched:
            expected += min(stored_untouched, counts[untouched])
            label += f" + {untouched} rows whose untracked values changed"
            extra = {"untracked_values_changed": stored_untouched}
    stored_as = "full copy" if full_copy else "changes"
    return _rule("current_table", "stored_state_reconciles", f"rows stored ({stored_as})", stored_rows, label, expected,
                 stored_as=stored_as, **extra)


def reconcile_change_set_intake(
    rows_read: int, accepted_rows: int, rejected_rows: int, tombstone_lines: int, set_aside: int = 0
) -> Reconciliation:
    """Nothing lost at a change set's intake: records read = accepted + rejected + tombstone lines (+ records
    of erased keys set aside)."""
    label = "accepted + rejected + tombstone lines" + (" + records of erased keys set aside" if set_aside else "")
    extra = {"erased_records_set_aside": set_aside} if set_aside else {}
    return _rule("hashed_incoming", "rows_read_reconcile", "records read", rows_read,
                 label, accepted_rows + rejected_rows + tombstone_lines + set_aside,
                 rows_read=rows_read, rows_accepted=accepted_rows, rows_rejected=rejected_rows, tombstone_lines=tombstone_lines,
                 **extra)


def reconcile_erased_keys(erased_records: int, policy: str) -> Reconciliation:
    """No record of an erased key in the extract: one there means the source still holds a key erased here."""
    return _rule("hashed_incoming", "no_erased_keys_in_extract", "records of erased keys in the extract", erased_records,
                 "zero", 0, erased_keys_policy=policy)


def reconcile_change_set(
    operations: Mapping[str, int],
    incoming_rows: int,
    winners: int,
    superseded: int,
    late_rows: int,
    duplicate_events: int,
    previous_rows: int,
    current: KeyedFigures,
    history_rows: int,
) -> list[Reconciliation]:
    """Every rule for one date of a change set's stored CDC outputs (``previous_rows`` is 0 on the first date)."""
    i, d = operations[INSERT], operations[DELETE]
    rules = [
        _rule("hash_join_classification", "records_reconcile", "hashed_incoming rows", incoming_rows,
              "winners + superseded + late + duplicate events", winners + superseded + late_rows + duplicate_events,
              winners=winners, superseded=superseded, late=late_rows, duplicate_events=duplicate_events),
        _rule("current_table", "previous_plus_changes", "current_table rows", current.rows,
              "previous current_table rows + I - D", previous_rows + i - d, inserts=i, deletes=d, previous_rows=previous_rows),
    ]
    # The rules shared with full and delta loads, but the one that takes one incoming row per key.
    shared = reconcile_changes(operations, incoming_rows, previous_rows, current, history_rows)
    return rules + [rule for rule in shared if rule.name != "incoming_reconciles"]


def reconcile_updates(naming_no_column: int, equal_on_shared_columns: int | None = None, schema_change: str = "") -> Reconciliation:
    """No update without a change: none names no changed column, and (on a date whose columns changed,
    ``equal_on_shared_columns`` measured) none holds its previous version's values in every shared column."""
    without_change = naming_no_column + (equal_on_shared_columns or 0)
    label = "updates naming no changed column"
    extra: dict = {"updates_naming_no_column": naming_no_column}
    if equal_on_shared_columns is not None:
        label += " + updates equal to their previous version in every shared column"
        extra.update(updates_equal_on_shared_columns=equal_on_shared_columns, schema_change=schema_change)
    return _rule(UPDATES_ASSET, "no_update_without_change", label, without_change, "zero", 0, **extra)

