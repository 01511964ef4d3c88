"""What an incremental state stores for a date (``core/capture/state.py``: :func:`stored_changes`), on tiny frames:
the touched keys, and a full load's N rows whose untracked values changed (issue 34: without them the
state as of the date showed the previous date's untracked values). And the check's equation for it."""

from __future__ import annotations

from datetime import date

import pytest

from cdc_assets.model.config import LoadType
from cdc_assets.core.capture.reconcile import reconcile_stored_state
from cdc_assets.core.capture.state import stored_changes

D1, D2, D3 = date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3)
CHANGES = "id int, val string, batch int, key_hash string, operation string, business_date date"


def _changes(spark, rows):
    return spark.createDataFrame(rows, CHANGES)


def _stored(frame) -> list[tuple]:
    return sorted((row.id, row.operation, row.batch, row.business_date) for row in frame.collect())


def test_a_full_load_stores_its_n_rows_whose_untracked_values_changed_and_only_those(spark):
    previous = spark.createDataFrame([(1, "a", 7, "k1"), (2, "b", 7, "k2"), (3, "c", 7, "k3")], "id int, val string, batch int, key_hash string")
    changes = _changes(spark, [
        # D2: key 1 unchanged with a new batch, key 2 unchanged with the same batch, key 3 updated, key 4 new
        (1, "a", 8, "k1", "N", D2), (2, "b", 7, "k2", "N", D2), (3, "C", 8, "k3", "U", D2), (4, "d", 8, "k4", "I", D2),
        # D3: every key unchanged; keys 1 and 3 keep D2's batch, keys 2 and 4 get a new one
        (1, "a", 8, "k1", "N", D3), (2, "b", 9, "k2", "N", D3), (3, "C", 8, "k3", "N", D3), (4, "d", 9, "k4", "N", D3),
    ])
    stored = stored_changes(changes, LoadType.full, previous, [D2, D3], ["batch"])
    assert _stored(stored) == [
        (1, "N", 8, D2), (2, "N", 9, D3), (3, "U", 8, D2), (4, "I", 8, D2), (4, "N", 9, D3),
    ]
    # Without untracked columns only the touched keys are stored, as before.
    assert _stored(stored_changes(changes, LoadType.full, previous, [D2, D3])) == [(3, "U", 8, D2), (4, "I", 8, D2)]


def test_a_column_added_on_the_date_counts_as_null_the_date_before(spark):
    previous = spark.createDataFrame([(1, "a", "k1"), (2, "b", "k2")], "id int, val string, key_hash string")
    changes = _changes(spark, [(1, "a", None, "k1", "N", D2), (2, "b", 5, "k2", "N", D2)])
    assert _stored(stored_changes(changes, LoadType.full, previous, [D2], ["batch"])) == [(2, "N", 5, D2)]


def test_a_delta_stores_every_row_but_x_whatever_its_untracked_values(spark):
    changes = _changes(spark, [(1, "a", 8, "k1", "N", D2), (2, "b", 7, "k2", "X", D2), (3, "c", 8, "k3", "U", D2)])
    assert _stored(stored_changes(changes, LoadType.delta, None, [D2], ["batch"])) == [(1, "N", 8, D2), (3, "U", 8, D2)]


# The MERGE writes a row per I and U and per stored N; a D key leaves the table (no row).
@pytest.mark.parametrize(("stored_rows", "stored_n", "passed"), [(4, 2, True), (5, 2, False), (6, 4, False)])
def test_the_stored_state_check_counts_n_rows_whose_untracked_values_changed(stored_rows, stored_n, passed):
    operations = {"I": 1, "U": 1, "D": 1, "N": 3, "X": 0}
    outcome = reconcile_stored_state(operations, False, stored_rows, "N", stored_n)
    assert outcome.passed is passed, outcome.equation
    assert "N rows whose untracked values changed" in outcome.equation
