"""Reconciliation rules: the equations a date's stored outputs must satisfy. Plain PySpark, no Dagster.

Each rule returns a :class:`Reconciliation` with both sides of its equation, so a failure says by how
much and where. The counts come from the Parquet footers or small aggregations, never a collect of data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.changes import DELETE, INSERT, NOT_SUPPLIED, UNCHANGED, UPDATE, count_operations
from cdc_assets.core.hashing import KEY_HASH


@dataclass(frozen=True)
class Reconciliation:
    asset: str  # the asset the rule is about
    name: str  # the check's name
    passed: bool
    equation: str  # the rule with the figures filled in, e.g. "10000 = 2000 + 4000 + 4000 + 0"
    metadata: dict[str, int | str] = field(default_factory=dict)


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


def reconcile_incoming(rows_read: int, accepted: DataFrame, rejected_rows: int) -> list[Reconciliation]:
    """Nothing lost at intake (rows read = accepted + rejected), and no key twice in hashed_incoming."""
    totals = accepted.agg(F.count(F.lit(1)).alias("rows"), F.count_distinct(KEY_HASH).alias("keys")).first()
    accepted_rows, accepted_keys = totals["rows"], totals["keys"]
    return [
        _rule("hashed_incoming", "rows_read_reconcile", "rows read", rows_read, "accepted + rejected",
              accepted_rows + rejected_rows, rows_read=rows_read, rows_accepted=accepted_rows, rows_rejected=rejected_rows),
        _rule("hashed_incoming", "keys_unique", "hashed_incoming rows", accepted_rows, "distinct key_hash", accepted_keys),
    ]


def reconcile_changes(
    classification: DataFrame,
    incoming: DataFrame,
    previous_current: DataFrame | None,
    current: DataFrame,
    history: DataFrame,
    key_columns: list[str],
) -> list[Reconciliation]:
    """Every rule for one date's stored CDC outputs (``previous_current`` is None on the first date)."""
    ops = count_operations(classification)
    i, u, d, x, n = (ops[op] for op in (INSERT, UPDATE, DELETE, NOT_SUPPLIED, UNCHANGED))
    counts = {"inserts": i, "updates": u, "deletes": d, "not_supplied": x, "unchanged": n}
    incoming_rows = incoming.count()
    previous_rows = previous_current.count() if previous_current is not None else 0
    any_key_null = F.expr(" OR ".join(f"`{name}` IS NULL" for name in key_columns))
    # One pass over current_table for its three figures.
    totals = current.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count_distinct(KEY_HASH).alias("keys"),
        F.count(F.when(any_key_null, F.lit(1))).alias("null_key_rows"),
    ).first()
    current_rows, current_keys, null_key_rows = totals["rows"], totals["keys"], totals["null_key_rows"]
    return [
        # A full snapshot accounts for every incoming key as I, U or N; so does a delta (its keys are
        # the changed ones), so this rule holds for both load types.
        _rule("hash_join_classification", "incoming_reconciles", "I + U + N", i + u + n,
              "hashed_incoming rows", incoming_rows, **counts),
        _rule("hash_join_classification", "previous_state_reconciles", "D + U + N + X", d + u + n + x,
              "previous current_table rows", previous_rows, **counts),
        _rule("current_table", "row_count_reconciles", "current_table rows", current_rows, "I + U + N + X",
              i + u + n + x, **counts),
        _rule("current_table", "key_hash_unique", "current_table rows", current_rows, "distinct key_hash", current_keys),
        _rule("current_table", "keys_not_null", "rows with a NULL key column", null_key_rows, "zero", 0),
        _rule("history_partition", "row_count_reconciles", "history_partition rows", history.count(), "I + U + D",
              i + u + d, **counts),
    ]
