"""The reconciliation core on its own: per-date figures from one aggregation, and the rules applied to them."""

from __future__ import annotations

from datetime import date

from cdc_assets.core.capture.reconcile import (
    KeyedFigures,
    keyed_figures_by_date,
    operations_by_date,
    reconcile_changes,
    reconcile_held_by_reject,
    reconcile_incoming,
    reconcile_stored_state,
)

D1, D2 = date(2024, 1, 1), date(2024, 1, 2)


def test_keyed_figures_are_per_date(spark):
    frame = spark.createDataFrame(
        [(D1, "a", "k1"), (D1, "a", "k1"), (D1, "b", None), (D2, "c", "k3")],
        "business_date date, key_hash string, order_id string",
    )
    figures = keyed_figures_by_date(frame, "business_date", ["order_id"])
    assert figures == {
        D1: KeyedFigures(rows=3, distinct_keys=2, null_key_rows=1),
        D2: KeyedFigures(rows=1, distinct_keys=1, null_key_rows=0),
    }


def test_operations_by_date_lists_all_five_operations(spark):
    frame = spark.createDataFrame([(D1, "I"), (D1, "I"), (D2, "D")], "business_date date, operation string")
    assert operations_by_date(frame, "business_date") == {
        D1: {"I": 2, "U": 0, "D": 0, "X": 0, "N": 0},
        D2: {"I": 0, "U": 0, "D": 1, "X": 0, "N": 0},
    }


def test_rules_pass_on_consistent_figures_and_show_both_sides_when_not():
    operations = {"I": 2, "U": 3, "D": 1, "X": 0, "N": 4}
    good = reconcile_changes(operations, incoming_rows=9, previous_rows=8, current=KeyedFigures(9, 9, 0), history_rows=6)
    assert all(outcome.passed for outcome in good)
    bad = reconcile_changes(operations, incoming_rows=9, previous_rows=8, current=KeyedFigures(10, 9, 1), history_rows=6)
    failed = {(outcome.asset, outcome.name): outcome for outcome in bad if not outcome.passed}
    assert set(failed) == {
        ("current_table", "row_count_reconciles"),
        ("current_table", "key_hash_unique"),
        ("current_table", "keys_not_null"),
    }
    row_count = failed[("current_table", "row_count_reconciles")]
    assert row_count.equation == "current_table rows (10) ≠ I + U + N + X (9)"
    assert row_count.metadata["difference"] == 1


def test_intake_rules_count_every_row_read():
    passed, unique = reconcile_incoming(rows_read=10, accepted=KeyedFigures(7, 7), rejected_rows=3)
    assert passed.passed and unique.passed
    lost, _ = reconcile_incoming(rows_read=10, accepted=KeyedFigures(7, 7), rejected_rows=2)
    assert not lost.passed and lost.metadata["difference"] == 1


def test_a_full_loads_held_keys_are_counted_as_x_and_warned_of():
    # 3 keys before: key 1 unchanged, key 2 updated, key 3 held for a rejected record (X, not D).
    operations = {"I": 0, "U": 1, "D": 0, "X": 1, "N": 1}
    outcomes = reconcile_changes(operations, incoming_rows=2, previous_rows=3, current=KeyedFigures(3, 3, 0), history_rows=1)
    assert all(outcome.passed for outcome in outcomes), [outcome.equation for outcome in outcomes]
    held = reconcile_held_by_reject(1, operations["X"])
    assert not held.passed and held.metadata["held_by_reject"] == 1
    assert held.equation == "keys held as they were for a rejected record (1) ≠ zero (0)"
    assert reconcile_held_by_reject(0, 0).passed
    # A merged state's date stores the held row like an I or U: I + U + X rows.
    assert reconcile_stored_state(operations, False, 2, "N").passed
    assert not reconcile_stored_state(operations, False, 1, "N").passed
