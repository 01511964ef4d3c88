"""A state as one Iceberg table changed by each date's MERGE, with a tag per date
(``resources/storage/merged.py``), on tiny frames through real Spark and Iceberg: each date's state and
labels as of its tag, a MERGE that writes what changed (merge-on-read), a re-run of the newest date, a
run killed between its MERGE and its tag, and pyiceberg reading a tag as Spark does."""

from __future__ import annotations

import time
from datetime import date
from pathlib import Path

import pytest

from resources.storage import WarehouseStorage
from resources.storage.merged import OPERATION_DATE, MergedStates, StateOrderError

D1, D2, D3 = "2024-03-01", "2024-03-02", "2024-03-03"
COLUMNS = "id int, name string, key_hash string, operation string, eff_start_date date"


@pytest.fixture()
def states(tmp_path) -> MergedStates:
    return MergedStates(WarehouseStorage(str(tmp_path / "warehouse")).tables, buckets=4)


def _rows(frame) -> list[tuple]:
    return sorted((row.id, row.name, row.operation) for row in frame.collect())


def _frame(spark, rows):
    return spark.createDataFrame([(key, name, f"h{key}", op, date.fromisoformat(on)) for key, name, op, on in rows], COLUMNS)


def _three_dates(spark, states: MergedStates) -> None:
    states.replace_state(_frame(spark, [(1, "a", "I", D1), (2, "b", "I", D1), (3, "c", "I", D1)]), "t", "current_table", D1, {"cdc.run-id": "r1"})
    # D2, a delta: 1 updated, 2 deleted, 4 inserted, 3 supplied again unchanged (N).
    states.apply_changes(
        _frame(spark, [(1, "A", "U", D2), (2, "b", "D", D1), (4, "d", "I", D2), (3, "c", "N", D1)]), "t", "current_table", D2, {"cdc.run-id": "r2"}
    )
    # D3: 4 updated; 1 and 3 untouched (X).
    states.apply_changes(_frame(spark, [(4, "D", "U", D3)]), "t", "current_table", D3, {"cdc.run-id": "r3"})


def test_each_dates_state_and_labels_are_read_at_its_tag(spark, states):
    _three_dates(spark, states)
    assert states.dates("t", "current_table") == [D1, D2, D3]
    assert _rows(states.state(spark, "t", "current_table", D1, "X")) == [(1, "a", "I"), (2, "b", "I"), (3, "c", "I")]
    assert _rows(states.state(spark, "t", "current_table", D2, "X")) == [(1, "A", "U"), (3, "c", "N"), (4, "d", "I")]
    assert _rows(states.state(spark, "t", "current_table", D3, "X")) == [(1, "A", "X"), (3, "c", "X"), (4, "D", "U")]
    assert OPERATION_DATE not in states.state(spark, "t", "current_table", D3, "X").columns
    # Each state's rows, from its tag's summary alone, equal a count of the state.
    for day in (D1, D2, D3):
        assert states.rows("t", "current_table", day) == states.state(spark, "t", "current_table", day, "X").count(), day


def test_a_merge_writes_the_changed_rows_and_position_deletes_not_the_table(spark, states):
    _three_dates(spark, states)
    loaded = states.tables.load("t", "current_table")
    summary = loaded.snapshot_by_id(states.tag_snapshot("t", "current_table", D3)).summary.additional_properties
    assert summary["cdc.run-id"] == "r3"
    assert int(summary["added-records"]) == 1  # key 4's new row
    assert int(summary.get("added-position-deletes", 0)) == 1  # key 4's old row, masked
    assert int(summary.get("deleted-data-files", 0)) == 0  # nothing rewritten


def test_a_rerun_of_the_newest_date_replaces_its_state_and_leaves_the_others(spark, states):
    _three_dates(spark, states)
    before = states.tag_snapshot("t", "current_table", D2)
    states.apply_changes(_frame(spark, [(1, "Z", "U", D3)]), "t", "current_table", D3, {"cdc.run-id": "r3b"})
    assert states.dates("t", "current_table") == [D1, D2, D3]
    assert states.tag_snapshot("t", "current_table", D2) == before
    assert _rows(states.state(spark, "t", "current_table", D3, "X")) == [(1, "Z", "U"), (3, "c", "X"), (4, "d", "X")]
    assert _rows(states.state(spark, "t", "current_table", D2, "X")) == [(1, "A", "U"), (3, "c", "N"), (4, "d", "I")]
    # A date whose later dates are stored is refused: their states were computed from it.
    with pytest.raises(StateOrderError, match=f"dates after {D2} are stored \\({D3}\\)"):
        states.apply_changes(_frame(spark, [(1, "Y", "U", D2)]), "t", "current_table", D2, {})


def test_a_merge_committed_but_never_tagged_is_undone_by_the_next_run_of_its_date(spark, states):
    _three_dates(spark, states)
    # A run of a fourth date killed after its MERGE committed, before its tag: main is ahead of every tag.
    lake = states.tables.session_for(spark)
    lake.sql("DELETE FROM lake.t.current_table WHERE id = 1").collect()
    assert states.dates("t", "current_table") == [D1, D2, D3]
    assert _rows(states.state(spark, "t", "current_table", D3, "X")) == [(1, "A", "X"), (3, "c", "X"), (4, "D", "U")]
    d4 = "2024-03-04"
    states.apply_changes(_frame(spark, [(5, "e", "I", d4)]), "t", "current_table", d4, {})
    assert _rows(states.state(spark, "t", "current_table", d4, "X")) == [(1, "A", "X"), (3, "c", "X"), (4, "D", "X"), (5, "e", "I")]


def test_pyiceberg_reads_each_tag_as_spark_does(spark, states):
    _three_dates(spark, states)
    table = states.tables.load("t", "current_table")
    for day in (D1, D2, D3):
        by_spark = sorted((row.id, row.name) for row in states.state(spark, "t", "current_table", day, "X").collect())
        scanned = table.scan(snapshot_id=table.snapshot_by_name(day).snapshot_id).to_arrow()
        assert sorted(zip(scanned.column("id").to_pylist(), scanned.column("name").to_pylist())) == by_spark, day


def test_an_erase_removes_keys_present_on_every_date_from_every_tag_and_every_file(spark, tmp_path):
    import hashlib

    import pyarrow.parquet as pq

    def key_hash(key: int) -> str:
        return hashlib.md5(f"key-{key}".encode()).hexdigest()

    def frame(rows):
        return spark.createDataFrame(
            [(key, name, key_hash(key), op, date.fromisoformat(on)) for key, name, op, on in rows], COLUMNS
        )

    states = MergedStates(WarehouseStorage(str(tmp_path / "warehouse")).tables, buckets=4)
    everyone = [(key, f"person{key}", "I", D1) for key in range(1, 41)]
    states.replace_state(frame(everyone), "t", "current_table", D1, {})
    # Key 7 is updated on D2 (merge-on-read masks its D1 row) and untouched on D3; key 9 on every date.
    states.apply_changes(frame([(7, "Zelda Erasmus", "U", D2), (9, "Yorick Erasmus", "U", D2), (12, "x", "D", D1)]), "t", "current_table", D2, {})
    states.apply_changes(frame([(9, "Yorick Erasmus II", "U", D3), (41, "new", "I", D3)]), "t", "current_table", D3, {})
    before = {day: _rows(states.state(spark, "t", "current_table", day, "X")) for day in (D1, D2, D3)}

    removed = states.erase(spark, "t", "current_table", [key_hash(7), key_hash(9)], {"cdc.erase": "test"})
    assert removed == {D1: 2, D2: 2, D3: 2, "main": 2}
    for day in (D1, D2, D3):
        assert _rows(states.state(spark, "t", "current_table", day, "X")) == [row for row in before[day] if row[0] not in (7, 9)], day
    # No file under the table holds the keys' hashes or names: decoded Parquet, and every file's bytes.
    location = Path(states.tables.location("t", "current_table"))
    files = [path for path in location.rglob("*") if path.is_file()]
    for path in files:
        if path.suffix == ".parquet" and not path.name.startswith("."):
            decoded = pq.read_table(path).to_pylist()
            assert not [row for row in decoded if row.get("key_hash") in (key_hash(7), key_hash(9))], path
            assert not [row for row in decoded if "Erasmus" in str(row.get("name"))], path
        raw = path.read_bytes()
        assert b"Erasmus" not in raw and key_hash(7).encode() not in raw and key_hash(9).encode() not in raw, path
    assert not states.tables.unreferenced_files("t", "current_table")


def test_duckdb_reads_each_tag_with_its_labels_as_spark_does(spark, states):
    from cdc_assets.engines.duckdb_iceberg import duckdb_connection

    _three_dates(spark, states)
    with duckdb_connection() as duck:
        for day in (D1, D2, D3):
            found = duck.sql(f"SELECT id, name, operation FROM ({states.duckdb_sql('t', 'current_table', day, 'X')})").fetchall()
            assert sorted(found) == _rows(states.state(spark, "t", "current_table", day, "X")), day


def test_snapshot_expiry_keeps_and_does_not_count_the_tagged_snapshots(spark, states):
    # Every date's snapshot is tagged: nothing to expire, so an ordinary run's expiry reports 0 and does not
    # go on to sweep the table's files; once a tag is dropped its snapshot is expired and counted.
    _three_dates(spark, states)
    tables = states.tables
    snapshots = len(tables.load("t", "current_table").snapshots())
    assert tables.expire_snapshots_before(spark, "t", "current_table", int(time.time() * 1000) + 1) == 0
    assert len(tables.load("t", "current_table").snapshots()) == snapshots
    states.drop_dates(spark, "t", "current_table", [D1])
    assert tables.expire_snapshots_before(spark, "t", "current_table", int(time.time() * 1000) + 1) == 1
    assert len(tables.load("t", "current_table").snapshots()) == snapshots - 1
    assert _rows(states.state(spark, "t", "current_table", D2, "X")) == [(1, "A", "U"), (3, "c", "N"), (4, "d", "I")]


def test_compaction_applies_the_deletes_and_a_dropped_tags_files_go_at_expiry(spark, states):
    _three_dates(spark, states)
    states.compact(spark, "t", "current_table")
    loaded = states.tables.load("t", "current_table")
    summary = loaded.current_snapshot().summary.additional_properties
    assert int(summary["total-position-deletes"]) == 0 and int(summary["total-records"]) == 3  # keys 1, 3, 4
    # Every date still reads as before (each tag keeps the files it read).
    assert _rows(states.state(spark, "t", "current_table", D2, "X")) == [(1, "A", "U"), (3, "c", "N"), (4, "d", "I")]
    assert states.drop_dates(spark, "t", "current_table", [D1, "2024-01-01"]) == [D1]
    assert states.dates("t", "current_table") == [D2, D3]
    states.tables.expire_all_but_current(spark, "t", "current_table")
    # D1's own snapshot, and the files only it read, are gone; D2, D3 and main still read.
    assert len(states.tables.load("t", "current_table").snapshots()) == 3
    assert _rows(states.state(spark, "t", "current_table", D3, "X")) == [(1, "A", "X"), (3, "c", "X"), (4, "D", "U")]


def test_a_date_with_a_new_column_adds_it_and_earlier_rows_read_it_as_null(spark, states):
    _three_dates(spark, states)
    d4 = "2024-03-04"
    with_city = spark.createDataFrame(
        [(5, "e", "h5", "I", date(2024, 3, 4), "Oslo")], f"{COLUMNS}, city string"
    )
    states.apply_changes(with_city, "t", "current_table", d4, {})
    state = states.state(spark, "t", "current_table", d4, "X")
    assert sorted((row.id, row.city) for row in state.collect()) == [(1, None), (3, None), (4, None), (5, "Oslo")]
    # The earlier tags still read as they were written.
    assert _rows(states.state(spark, "t", "current_table", D3, "X")) == [(1, "A", "X"), (3, "c", "X"), (4, "D", "U")]


def test_the_stored_column_is_each_keys_last_operation_and_only_the_labelled_state_says_operation(spark, states):
    """A reader of the raw table at a tag (Trino, DuckDB, pyiceberg) gets ``last_operation``, a name that
    does not pass for the date's label; the labelled state has ``operation`` in its place."""
    _three_dates(spark, states)
    table = states.tables.load("t", "current_table")
    raw = table.scan(snapshot_id=table.snapshot_by_name(D3).snapshot_id).to_arrow()
    assert "operation" not in raw.column_names and {"last_operation", "operation_date"} <= set(raw.column_names)
    # As of D3, keys 1 and 3 keep D2's U and N: their last change, not what D3 did (X).
    assert sorted(zip(raw["id"].to_pylist(), raw["last_operation"].to_pylist())) == [(1, "U"), (3, "N"), (4, "U")]
    state = states.state(spark, "t", "current_table", D3, "X")
    assert state.columns == ["id", "name", "key_hash", "operation", "eff_start_date"]  # in the stored column's place
    assert states.touched(spark, "t", "current_table", D3).select("id", "operation").collect() == [(4, "U")]
    untouched = states.untouched("t", "current_table")  # the table property (none set here: "")
    assert sorted(states.operations("t", "current_table", D3).to_pylist()) == sorted(["U", untouched, untouched])


def test_a_table_written_while_the_column_was_named_operation_keeps_the_name_and_reads_the_same(spark, states, monkeypatch):
    from resources.storage import merged

    with monkeypatch.context() as before:  # the previous layout: the stored column named operation
        before.setattr(merged, "LAST_OPERATION", "operation")
        states.replace_state(_frame(spark, [(1, "a", "I", D1), (2, "b", "I", D1), (3, "c", "I", D1)]), "t", "current_table", D1, {})
    assert "operation" in states.tables.load("t", "current_table").schema().column_names
    assert states.operation_column("t", "current_table") == "operation"
    states.apply_changes(
        _frame(spark, [(1, "A", "U", D2), (2, "b", "D", D1), (4, "d", "I", D2), (3, "c", "N", D1)]), "t", "current_table", D2, {}
    )
    states.apply_changes(_frame(spark, [(4, "D", "U", D3)]), "t", "current_table", D3, {})
    columns = states.tables.load("t", "current_table").schema().column_names
    assert "operation" in columns and "last_operation" not in columns  # never renamed: the tags read the same name
    assert _rows(states.state(spark, "t", "current_table", D2, "X")) == [(1, "A", "U"), (3, "c", "N"), (4, "d", "I")]
    assert _rows(states.state(spark, "t", "current_table", D3, "X")) == [(1, "A", "X"), (3, "c", "X"), (4, "D", "U")]
    untouched = states.untouched("t", "current_table")  # the table property (none set here: "")
    assert sorted(states.operations("t", "current_table", D3).to_pylist()) == sorted(["U", untouched, untouched])
    from cdc_assets.engines.duckdb_iceberg import duckdb_connection

    with duckdb_connection() as duck:
        found = duck.sql(f"SELECT id, name, operation FROM ({states.duckdb_sql('t', 'current_table', D3, 'X')})").fetchall()
    assert sorted(found) == [(1, "A", "X"), (3, "c", "X"), (4, "D", "U")]
