"""Classification (I/U/D/X/N), payload join, current state and history on small hand-built frames."""

from __future__ import annotations

import hashlib
from datetime import date

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from cdc_assets.model.config import LoadType
from cdc_assets.core.capture.changes import (
    CLASSIFICATION_COLUMNS,
    EFF_START_DATE,
    OPERATION,
    OPERATIONS,
    build_current,
    build_history,
    classify_changes,
    count_operations,
)
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH, add_hashes

KEYS = [("id", "int")]
NON_KEYS = [("val", "string")]
PAYLOAD = ["id", "val", "note"]  # configured columns: key, tracked non-key, untracked
DAY = date(2024, 1, 5)

_ARROW = {"int": pa.int32(), "string": pa.string(), "date": pa.date32()}


def local_frame(spark, rows, columns):
    """A small typed DataFrame built through Arrow (quick: no Python worker round trip)."""
    table = pa.table({name: pa.array([row[i] for row in rows], type=_ARROW[t]) for i, (name, t) in enumerate(columns)})
    return spark.createDataFrame(table)


def incoming_frame(spark, rows):
    """Accepted incoming rows as the intake produces them: configured columns + hashes."""
    frame = local_frame(spark, rows, [("id", "int"), ("val", "string"), ("note", "string")])
    return add_hashes(frame, KEYS, NON_KEYS)


def previous_frame(spark, rows):
    """A previous current_table: configured columns, key_hash, non_key_hash, operation, eff_start_date."""
    frame = local_frame(
        spark, rows, [("id", "int"), ("val", "string"), ("note", "string"), (OPERATION, "string"), (EFF_START_DATE, "date")]
    )
    return add_hashes(frame, KEYS, NON_KEYS).select(*PAYLOAD, *CLASSIFICATION_COLUMNS)


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


PREVIOUS = [
    (1, "a", "n1", "I", date(2024, 1, 1)),  # same value today -> N, keeps 2024-01-01
    (2, "b", "n2", "U", date(2024, 1, 2)),  # new value today -> U
    (3, "c", "n3", "N", date(2024, 1, 3)),  # missing today -> D (full) / X (delta)
    (5, "e", "old", "I", date(2024, 1, 4)),  # only the untracked note changes -> N
    (6, None, "n6", "X", date(2024, 1, 2)),  # NULL value, supplied again as NULL -> N
]
INCOMING = [
    (1, "a", "n1"),
    (2, "b2", "n2"),
    (4, "d", "n4"),  # new key -> I
    (5, "e", "new"),
    (6, None, "n6"),
]


def run(spark, load_type, previous_rows=PREVIOUS, incoming_rows=INCOMING):
    """classify_changes with and without the payload, both cached: a test reads them several times and they are tiny."""
    incoming = incoming_frame(spark, incoming_rows)
    previous = previous_frame(spark, previous_rows) if previous_rows is not None else None
    classification = classify_changes(incoming, previous, DAY, load_type).cache()
    changes = classify_changes(incoming, previous, DAY, load_type, PAYLOAD).cache()
    return classification, changes


@pytest.fixture()
def run_cached(spark):
    frames = []

    def _run(*args, **kwargs):
        classification, changes = run(spark, *args, **kwargs)
        frames.extend([classification, changes])
        return classification, changes

    yield _run
    for frame in frames:
        frame.unpersist()


@pytest.fixture(scope="module")
def full_run(spark):
    classification, changes = run(spark, LoadType.full)
    yield classification, changes
    classification.unpersist()
    changes.unpersist()


@pytest.fixture(scope="module")
def delta_run(spark):
    classification, changes = run(spark, LoadType.delta)
    yield classification, changes
    classification.unpersist()
    changes.unpersist()


def rows_by_id(frame):
    rows = frame.collect()
    by_id = {row["id"]: row for row in rows}
    assert len(by_id) == len(rows), "one row per key"
    return by_id


def test_classification_output_columns(full_run):
    classification, changes = full_run
    assert classification.columns == list(CLASSIFICATION_COLUMNS)
    assert changes.columns == [*PAYLOAD, *CLASSIFICATION_COLUMNS]
    assert dict(classification.dtypes)[EFF_START_DATE] == "date"


def test_full_load_classification(full_run):
    classification, changes = full_run
    by_hash = {row[KEY_HASH]: row for row in classification.collect()}
    assert len(by_hash) == 6
    changed = rows_by_id(changes)
    operations = {key: row[OPERATION] for key, row in changed.items()}
    assert operations == {1: "N", 2: "U", 3: "D", 4: "I", 5: "N", 6: "N"}
    eff = {key: row[EFF_START_DATE] for key, row in changed.items()}
    assert eff == {
        1: date(2024, 1, 1),
        2: DAY,
        3: DAY,
        4: DAY,
        5: date(2024, 1, 4),
        6: date(2024, 1, 2),
    }
    # Hashes follow the documented encoding: key "1:<id>", non-key "<len>:<val>" or "~".
    assert changed[4][KEY_HASH] == md5("1:4")
    assert changed[2][NON_KEY_HASH] == md5("2:b2")  # U carries the incoming hash
    assert changed[3][NON_KEY_HASH] == md5("1:c")  # D carries the stored hash
    assert changed[6][NON_KEY_HASH] == md5("~")
    # The classification rows agree with the joined changes.
    for row in changed.values():
        assert by_hash[row[KEY_HASH]][OPERATION] == row[OPERATION]
        assert by_hash[row[KEY_HASH]][NON_KEY_HASH] == row[NON_KEY_HASH]
        assert by_hash[row[KEY_HASH]][EFF_START_DATE] == row[EFF_START_DATE]


def test_full_load_payloads_current_and_history(full_run):
    classification, changes = full_run
    changed = rows_by_id(changes)
    assert (changed[2]["val"], changed[2]["note"]) == ("b2", "n2")
    assert (changed[3]["val"], changed[3]["note"]) == ("c", "n3")  # D keeps its last payload
    assert (changed[4]["val"], changed[4]["note"]) == ("d", "n4")

    current = rows_by_id(build_current(changes))
    assert set(current) == {1, 2, 4, 5, 6}
    assert current[5]["note"] == "new"  # the untracked value is refreshed although the row is N
    assert current[5][OPERATION] == "N" and current[5][EFF_START_DATE] == date(2024, 1, 4)
    assert current[6]["val"] is None
    assert build_current(changes).columns == [*PAYLOAD, *CLASSIFICATION_COLUMNS]

    history = rows_by_id(build_history(changes))
    assert {key: row[OPERATION] for key, row in history.items()} == {2: "U", 3: "D", 4: "I"}
    assert all(row[EFF_START_DATE] == DAY for row in history.values())
    assert history[3]["val"] == "c"

    assert count_operations(classification) == {"I": 1, "U": 1, "D": 1, "X": 0, "N": 3}


def test_delta_load_marks_missing_keys_not_supplied(delta_run):
    classification, changes = delta_run
    changed = rows_by_id(changes)
    assert {key: row[OPERATION] for key, row in changed.items()} == {1: "N", 2: "U", 3: "X", 4: "I", 5: "N", 6: "N"}
    assert "D" not in {row[OPERATION] for row in changed.values()}

    current = rows_by_id(build_current(changes))
    assert set(current) == {1, 2, 3, 4, 5, 6}
    # X keeps the previous payload, hash and eff_start_date.
    assert (current[3]["val"], current[3]["note"]) == ("c", "n3")
    assert current[3][OPERATION] == "X"
    assert current[3][EFF_START_DATE] == date(2024, 1, 3)
    assert current[3][NON_KEY_HASH] == md5("1:c")

    history = rows_by_id(build_history(changes))
    assert {key: row[OPERATION] for key, row in history.items()} == {2: "U", 4: "I"}
    assert count_operations(classification) == {"I": 1, "U": 1, "D": 0, "X": 1, "N": 3}


def test_delta_load_then_key_supplied_again(spark):
    # Day 1 (delta): key 3 missing -> X. Day 2: key 3 comes back unchanged -> N with its old date,
    # and key 2 comes back changed -> U.
    incoming = incoming_frame(spark, [(1, "a", "n1"), (2, "b", "n2")])
    previous = previous_frame(spark, [(1, "a", "n1", "I", date(2024, 1, 1)), (2, "b", "n2", "I", date(2024, 1, 1)), (3, "c", "n3", "I", date(2024, 1, 1))])
    day1 = date(2024, 1, 2)
    changes1 = classify_changes(incoming, previous, day1, LoadType.delta, PAYLOAD)
    current1 = build_current(changes1).localCheckpoint()
    assert {r["id"]: r[OPERATION] for r in current1.collect()} == {1: "N", 2: "N", 3: "X"}

    day2 = date(2024, 1, 3)
    incoming2 = incoming_frame(spark, [(3, "c", "n3"), (2, "B", "n2")])
    current2 = rows_by_id(build_current(classify_changes(incoming2, current1, day2, LoadType.delta, PAYLOAD)))
    assert {key: (row[OPERATION], row[EFF_START_DATE]) for key, row in current2.items()} == {
        1: ("X", date(2024, 1, 1)),
        2: ("U", day2),
        3: ("N", date(2024, 1, 1)),
    }


def test_no_previous_state_everything_is_an_insert(run_cached):
    classification, changes = run_cached(LoadType.full, previous_rows=None)
    changed = rows_by_id(changes)
    assert set(changed) == {1, 2, 4, 5, 6}
    assert {row[OPERATION] for row in changed.values()} == {"I"}
    assert {row[EFF_START_DATE] for row in changed.values()} == {DAY}
    assert changed[2]["val"] == "b2" and changed[5]["note"] == "new"
    assert changes.columns == [*PAYLOAD, *CLASSIFICATION_COLUMNS]
    assert set(rows_by_id(build_current(changes))) == set(changed)
    assert set(rows_by_id(build_history(changes))) == set(changed)
    assert count_operations(classification) == {"I": 5, "U": 0, "D": 0, "X": 0, "N": 0}


@pytest.mark.parametrize("load_type", [LoadType.full, LoadType.delta])
def test_empty_incoming(run_cached, load_type):
    classification, changes = run_cached(load_type, incoming_rows=[])
    missing = "D" if load_type is LoadType.full else "X"
    assert {row["id"]: row[OPERATION] for row in changes.collect()} == {key: missing for key in (1, 2, 3, 5, 6)}
    counts = count_operations(classification)
    assert counts[missing] == 5 and sum(counts.values()) == 5
    assert build_current(changes).count() == (0 if missing == "D" else 5)


def test_history_excludes_unchanged_and_not_supplied(full_run, delta_run):
    for _, changes in (full_run, delta_run):
        operations = {row[OPERATION] for row in build_history(changes).collect()}
        assert operations <= {"I", "U", "D"}
        assert "N" not in operations and "X" not in operations
        assert build_current(changes).filter(F.col(OPERATION) == "D").count() == 0


def test_count_operations_returns_all_five_keys(spark):
    incoming = incoming_frame(spark, [(1, "a", "n1")])
    previous = previous_frame(spark, [(1, "a", "n1", "I", date(2024, 1, 1))])
    counts = count_operations(classify_changes(incoming, previous, DAY, LoadType.full))
    assert counts == {"I": 0, "U": 0, "D": 0, "X": 0, "N": 1}
    assert tuple(counts) == OPERATIONS


@pytest.mark.parametrize("load_type", [LoadType.full, LoadType.delta])
def test_the_payload_join_classifies_as_the_hash_only_join(full_run, delta_run, load_type):
    # The join that carries the payload must decide every key exactly as the hash columns alone do.
    classification, changes = full_run if load_type is LoadType.full else delta_run
    assert sorted(changes.select(*CLASSIFICATION_COLUMNS).collect()) == sorted(classification.collect())
    by_id = rows_by_id(changes)
    missing = "D" if load_type is LoadType.full else "X"
    # I/U/N take today's payload, D/X the stored one (a NULL today is not replaced by yesterday's value).
    assert (by_id[2]["val"], by_id[5]["note"], by_id[3]["val"], by_id[3][OPERATION]) == ("b2", "new", "c", missing)
    assert by_id[6]["val"] is None and by_id[6][OPERATION] == "N"


def test_a_full_loads_key_held_by_a_reject_is_kept_as_it_was(spark):
    incoming = incoming_frame(spark, INCOMING)
    previous = previous_frame(spark, PREVIOUS)
    held = add_hashes(local_frame(spark, [(3,), (4,), (9,)], [("id", "int")]), KEYS, []).select(KEY_HASH)

    changes = classify_changes(incoming, previous, DAY, LoadType.full, PAYLOAD, held=held)

    rows = {row["id"]: (row["val"], row[OPERATION], row[EFF_START_DATE]) for row in changes.collect()}
    # Key 3, missing today but with a rejected record, is X with its stored values instead of D; a held
    # key the incoming rows supply (4) or the state lacks (9) is classified as without the hold.
    assert rows[3] == ("c", "X", date(2024, 1, 3))
    assert rows[4] == ("d", "I", DAY)
    assert 9 not in rows
    assert count_operations(changes) == {"I": 1, "U": 1, "D": 0, "X": 1, "N": 3}
    assert {row["id"] for row in build_current(changes).collect()} == {1, 2, 3, 4, 5, 6}
    # A delta's absent key is X already: the hold changes nothing.
    delta = classify_changes(incoming, previous, DAY, LoadType.delta, PAYLOAD, held=held)
    assert count_operations(delta) == count_operations(classify_changes(incoming, previous, DAY, LoadType.delta, PAYLOAD))
