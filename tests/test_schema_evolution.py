"""Schema changes between dates through real Dagster runs: six dates, one change of columns a day.

Date 3 adds ``c`` (and key 3 changes ``b`` the same day), date 4 renames ``b`` to ``b2``
(``renamed_from``), date 5 widens ``qty`` from int to bigint, date 6 drops ``a``. Each date's config is
written before its run, as a user would edit the YAML. Every date's operations, current_table and
history_partition must equal what is written out by hand below: a key whose shared columns are equal
is never re-versioned (no false U). A change set runs the add and the drop.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from dagster import DagsterInstance
from pyiceberg.expressions import EqualTo

from cdc_assets.usecases.readers import current_state, scd2_view
from cdc_assets.core.capture.schema import HASH_SPEC_METADATA, HashSpec
from cdc_assets.model.names import CURRENT, HISTORY, UPDATES
from resources.storage.state import read_state, stored_fields
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates, run_range, write_table_config

# Slow, but in-process runs on the session's Spark: `make test` runs them in its first session (balance).
pytestmark = [pytest.mark.slow, pytest.mark.in_process]

DAYS = ["2024-05-01", "2024-05-02", "2024-05-03", "2024-05-04", "2024-05-05", "2024-05-06"]
KEYS = [{"name": "id", "type": "int"}]
# The non-key columns each date's config declares (the extract's header follows them).
COLUMNS = {
    "2024-05-01": [("a", "string"), ("b", "int"), ("qty", "int")],
    "2024-05-02": [("a", "string"), ("b", "int"), ("qty", "int")],
    "2024-05-03": [("a", "string"), ("b", "int"), ("c", "string"), ("qty", "int")],
    "2024-05-04": [("a", "string"), ("b2", "int"), ("c", "string"), ("qty", "int")],
    "2024-05-05": [("a", "string"), ("b2", "int"), ("c", "string"), ("qty", "bigint")],
    "2024-05-06": [("b2", "int"), ("c", "string"), ("qty", "bigint")],
}
RENAMED_FROM = {"b2": "b"}
# A date-partitioned table's column renamed by Iceberg (by field id): every date reads under its new name.
RENAMED_TO = {former: name for name, former in RENAMED_FROM.items()}
# ... and a column the config dropped is dropped from such a table: no date shows it any more.
DROPPED = {"a"}
BIG = 600_000_000_000  # needs the bigint

# Full loads: each date's extract (id -> values in that date's column order), and the operations by hand.
FULL_EXTRACTS = {
    "2024-05-01": {1: ("x", 10, 1), 2: ("y", 20, 2), 3: ("z", 30, 3), 4: ("w", 40, 4), 5: ("v", 50, 5)},
    "2024-05-02": {1: ("x", 10, 1), 2: ("y", 21, 2), 3: ("z", 30, 3), 5: ("v", 50, 5), 6: ("u", 60, 6)},
    # c added: equal on a, b, qty -> N (the new value goes straight to current); key 3's b changed -> U.
    "2024-05-03": {1: ("x", 10, "c1", 1), 2: ("y", 21, "c2", 2), 3: ("z", 31, "c3", 3), 5: ("v", 50, None, 5), 6: ("u", 60, "c6", 6)},
    # b renamed b2: values carried, N; key 5 changes b2 and c -> U; key 7 new.
    "2024-05-04": {
        1: ("x", 10, "c1", 1), 2: ("y", 21, "c2", 2), 3: ("z", 31, "c3", 3), 5: ("v", 55, "c5", 5), 6: ("u", 60, "c6", 6),
        7: ("t", 70, "c7", 7),
    },
    # qty widened: equal values N; key 6 takes a value only a bigint holds -> U.
    "2024-05-05": {
        1: ("x", 10, "c1", 1), 2: ("y", 21, "c2", 2), 3: ("z", 31, "c3", 3), 5: ("v", 55, "c5", 5), 6: ("u", 60, "c6", BIG),
        7: ("t", 70, "c7", 7),
    },
    # a dropped: key 7 differed only in a (now gone) -> N; key 1 changes b2 -> U; key 2 deleted.
    "2024-05-06": {1: (11, "c1", 1), 3: (31, "c3", 3), 5: (55, "c5", 5), 6: (60, "c6", BIG), 7: (70, "c7", 7)},
}
FULL_OPERATIONS = {
    "2024-05-01": {"I": {1, 2, 3, 4, 5}},
    "2024-05-02": {"I": {6}, "U": {2}, "D": {4}, "N": {1, 3, 5}},
    "2024-05-03": {"U": {3}, "N": {1, 2, 5, 6}},
    "2024-05-04": {"I": {7}, "U": {5}, "N": {1, 2, 3, 6}},
    "2024-05-05": {"U": {6}, "N": {1, 2, 3, 5, 7}},
    "2024-05-06": {"U": {1}, "D": {2}, "N": {3, 5, 6, 7}},
}
# Deltas: the changed and some unchanged rows; a key left out is X and keeps its row.
DELTA_EXTRACTS = {
    "2024-05-01": FULL_EXTRACTS["2024-05-01"],
    "2024-05-02": {1: ("x", 10, 1), 2: ("y", 21, 2), 6: ("u", 60, 6)},
    # Keys 2, 4, 5 not supplied: current holds NULL in c for them (c was not sent for them yet).
    "2024-05-03": {1: ("x", 10, "c1", 1), 3: ("z", 31, "c3", 3), 6: ("u", 60, "c6", 6)},
    # Key 2 arrives with c for the first time: current's row changes from NULL to c2 in c, an update naming
    # c alone (what current showed did change). Key 1 renamed only: N.
    "2024-05-04": {1: ("x", 10, "c1", 1), 2: ("y", 21, "c2", 2), 5: ("v", 55, "c5", 5), 7: ("t", 70, "c7", 7)},
    "2024-05-05": {3: ("z", 31, "c3", 3), 6: ("u", 60, "c6", BIG)},
    "2024-05-06": {1: (11, "c1", 1), 7: (70, "c7", 7)},
}
DELTA_OPERATIONS = {
    "2024-05-01": {"I": {1, 2, 3, 4, 5}},
    "2024-05-02": {"I": {6}, "U": {2}, "N": {1}},
    "2024-05-03": {"U": {3}, "N": {1, 6}},
    "2024-05-04": {"I": {7}, "U": {2, 5}, "N": {1}},
    "2024-05-05": {"U": {6}, "N": {3}},
    "2024-05-06": {"U": {1}, "N": {7}},
}
# The updates' changed_columns, by date and key: a U names the shared columns that differ, never none.
CHANGED = {
    "full": {"2024-05-02": {2: ["b"]}, "2024-05-03": {3: ["b"]}, "2024-05-04": {5: ["b2", "c"]}, "2024-05-05": {6: ["qty"]},
             "2024-05-06": {1: ["b2"]}},
    "delta": {"2024-05-02": {2: ["b"]}, "2024-05-03": {3: ["b"]}, "2024-05-04": {2: ["c"], 5: ["b2", "c"]},
              "2024-05-05": {6: ["qty"]}, "2024-05-06": {1: ["b2"]}},
}  # fmt: skip


def _names(day: str) -> list[str]:
    return ["id", *(name for name, _ in COLUMNS[day])]


def _renamed(names: list[str]) -> list[str]:
    """A date's columns as a date-partitioned table shows them once the chain's rename and drop are done."""
    return [RENAMED_TO.get(name, name) for name in names if name not in DROPPED]


def _kept(names: list[str]) -> list[str]:
    return [name for name in names if name not in DROPPED]


def _values(rows: dict[int, dict], shown: list[str]) -> dict[int, list]:
    return {key: [row[name] for name in shown] for key, row in rows.items()}


def _config(folder: Path, source: Path, day: str, load_type: str, **fields):
    non_keys = [
        {"name": name, "type": kind, **({"renamed_from": RENAMED_FROM[name]} if name in RENAMED_FROM else {})}
        for name, kind in COLUMNS[day]
    ]
    return write_table_config(
        folder, "evolving", str(source / "{date}.csv"), start_date=DAYS[0], load_type=load_type, keys=KEYS, non_keys=non_keys,
        **fields,
    )  # fmt: skip


def _write_extract(source: Path, day: str, header: list[str], rows: list[tuple]) -> None:
    source.mkdir(parents=True, exist_ok=True)
    with open(source / f"{day}.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(["" if value is None else value for value in row] for row in rows)


def _expected_states(extracts: dict, operations: dict, load_type: str) -> dict[str, dict[int, dict]]:
    """Each date's state by hand-listed operations: I/U/N rows as extracted, X rows as held (a column the
    date added: NULL; renamed: carried), D rows gone. Also each key's eff_start_date."""
    states, state = {}, {}
    for day in DAYS:
        names = _names(day)
        carried = {}
        for key, row in state.items():
            values = {name: row.get(RENAMED_FROM.get(name, name), row.get(name)) for name in names}
            carried[key] = {**values, "eff_start_date": row["eff_start_date"]}
        ops = operations[day]
        new_state = {} if load_type == "full" else dict(carried)
        for key, values in extracts[day].items():
            row = dict(zip(names, (key, *values)))
            started = day if key in ops.get("I", set()) | ops.get("U", set()) else carried[key]["eff_start_date"]
            new_state[key] = {**row, "eff_start_date": started}
        for key in ops.get("D", set()):
            new_state.pop(key, None)
        states[day] = state = new_state
    return states


def _stored_rows(spark, storage: WarehouseStorage, asset: str, day: str, columns: list[str]) -> dict[int, dict]:
    frame = storage.read_one(spark, "evolving", asset, day)
    assert frame.columns[: len(columns)] == columns, f"{asset} {day}: columns {frame.columns}"
    return {row["id"]: row.asDict() for row in frame.collect()}


def _run_chain(spark, tmp_path: Path, load_type: str, extracts: dict, operations: dict, days=DAYS, **fields):
    warehouse, source, configs = tmp_path / "warehouse", tmp_path / "source", tmp_path / "configs"
    storage = WarehouseStorage(str(warehouse))
    instance = DagsterInstance.ephemeral()
    results = {}
    for day in days:
        _write_extract(source, day, _names(day), [(key, *values) for key, values in sorted(extracts[day].items())])
        config = _config(configs, source, day, load_type, **fields)
        (result,) = run_dates(definitions_for(config), [day], instance=instance)
        assert result.success, day
        checks = [evaluation for evaluation in result.get_asset_check_evaluations()]
        assert checks and all(evaluation.passed for evaluation in checks), [e.check_name for e in checks if not e.passed]
        results[day] = result
    return storage, instance, results


@pytest.mark.parametrize("load_type,state", [("full", "snapshot"), ("delta", "snapshot"), ("delta", "incremental")])
def test_six_dates_of_schema_changes_re_version_no_key(spark, tmp_path, monkeypatch, load_type, state):
    """In ``incremental`` storage a change date stores a full copy, and the dates between store changes."""
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    extracts, operations = (FULL_EXTRACTS, FULL_OPERATIONS) if load_type == "full" else (DELTA_EXTRACTS, DELTA_OPERATIONS)
    storage, instance, results = _run_chain(spark, tmp_path, load_type, extracts, operations, storage={"current": state, "compact_after_share": 100.0})
    expected_states = _expected_states(extracts, operations, load_type)
    for day in DAYS:
        names = _names(day)
        # A merged state's tag keeps its date's names (Iceberg time travel shows them); every other
        # table is read through its current schema, where the rename of date 4 is done.
        shown = names if state == "incremental" else _renamed(names)
        if state == "incremental":
            # A date whose columns changed is a full copy; the state as read is what a snapshot would hold.
            assert (storage.stored_as("evolving", CURRENT, day) == "full") == (day in (DAYS[0], *DAYS[2:])), day
            frame = read_state(storage, spark, "evolving", CURRENT, day)
            assert frame.columns[: len(names)] == names
            current = {row["id"]: row.asDict() for row in frame.collect()}
        else:
            current = _stored_rows(spark, storage, CURRENT, day, shown)
        # The state records the columns its hashes cover, for the next date to compare with.
        fields = {field["name"]: field for field in stored_fields(storage, "evolving", CURRENT, day)}
        recorded = HashSpec.from_json(fields["non_key_hash"]["metadata"][HASH_SPEC_METADATA])
        # The spec keeps naming a dropped column: the date's hashes were computed over it.
        spec_names = names if state == "incremental" else [RENAMED_TO.get(name, name) for name in names]
        assert [name for name, _ in recorded.non_keys] == spec_names[1:], day
        assert _values(current, shown) == _values(expected_states[day], names if state == "incremental" else _kept(names)), f"current_table {day}"
        assert {key: str(row["eff_start_date"]) for key, row in current.items()} == {
            key: row["eff_start_date"] for key, row in expected_states[day].items()
        }, f"eff_start_date {day}"
        history = _stored_rows(spark, storage, HISTORY, day, _renamed(names))
        expected_history = {key: op for op, keys in operations[day].items() if op in "IUD" for key in keys}
        assert {key: row["operation"] for key, row in history.items()} == expected_history, f"history {day}"
        for key, row in history.items():
            if row["operation"] != "D":
                assert [row[name] for name in _renamed(names)] == [expected_states[day][key][name] for name in _kept(names)]
        updates = _stored_rows(spark, storage, UPDATES, day, _renamed(names))
        assert {key: sorted(row["changed_columns"]) for key, row in updates.items()} == CHANGED[load_type].get(day, {})
        touched = {op: set(keys) for op, keys in operations[day].items()}
        counted = results[day].asset_materializations_for_node("evolving__cdc")
        current_metadata = next(m.metadata for m in counted if m.asset_key.path[-1] == CURRENT)
        for op, name in (("I", "inserts"), ("U", "updates"), ("D", "deletes"), ("N", "unchanged")):
            assert current_metadata[name].value == len(touched.get(op, set())), f"{name} {day}"
    # What each change date says it changed, in its metadata (and nothing on the other dates).
    described = {}
    for day in DAYS:
        materialized = results[day].asset_materializations_for_node("evolving__cdc")
        metadata = next(m.metadata for m in materialized if m.asset_key.path[-1] == CURRENT)
        if "schema_change" in metadata:
            described[day] = {k: v for k, v in metadata["schema_change"].value.items() if k != "rebaseline"}
    assert described == {
        "2024-05-03": {"added": ["c"]},
        "2024-05-04": {"renamed": {"b2": "b"}},
        "2024-05-05": {"widened": {"qty": "int -> bigint"}},
        "2024-05-06": {"dropped": ["a"]},
    }
    # The rename and the drop are Iceberg's: b2 is b's field (same id), no table has a column a or b any
    # more, and a reader without the project (pyiceberg) reads date 1's values under b2, without a.
    for asset in (HISTORY, UPDATES, "hashed_incoming", *([CURRENT] if state == "snapshot" else [])):
        loaded = storage.tables.load("evolving", asset)
        first_schema = loaded.schemas()[min(loaded.schemas())]
        assert [f.name for f in loaded.schema().fields if f.name in ("a", "b", "b2")] == ["b2"], asset
        assert loaded.schema().find_field("b2").field_id == first_schema.find_field("b").field_id, asset
    history_rows = storage.tables.load("evolving", HISTORY).scan(row_filter=EqualTo("business_date", DAYS[0])).to_arrow().to_pylist()
    assert {row["id"]: row["b2"] for row in history_rows} == {key: values[1] for key, values in extracts[DAYS[0]].items()}
    assert "a" not in history_rows[0]
    # Readers show every date in today's columns, and the changes of columns opened no SCD2 version.
    final = _config(tmp_path / "configs", tmp_path / "source", DAYS[-1], load_type, storage={"current": state, "compact_after_share": 100.0})
    warehouse = str(tmp_path / "warehouse")
    first = {row["id"]: row.asDict() for row in current_state(spark, final, DAYS[0], warehouse).collect()}
    assert {key: (row["b2"], row["c"], row["qty"]) for key, row in first.items()} == {
        key: (values[1], None, values[2]) for key, values in extracts[DAYS[0]].items()
    }
    assert "a" not in current_state(spark, final, DAYS[0], warehouse).columns
    versions = {}
    for row in scd2_view(spark, final, DAYS[-1], warehouse).collect():
        versions.setdefault(row["id"], []).append((str(row["valid_from"]), str(row["valid_to"]) if row["valid_to"] else None))
    starts = {key: sorted({start for start, _ in spans}) for key, spans in versions.items()}
    expected_starts = {}
    for day in DAYS:
        for key in operations[day].get("I", set()) | operations[day].get("U", set()):
            expected_starts.setdefault(key, []).append(day)
    assert starts == expected_starts
    runs_log = spark.read.parquet(str(tmp_path / "warehouse" / "_runs")).filter("status = 'succeeded'")
    logged = {str(row["business_date"]): row["schema_change"] for row in runs_log.collect()}
    assert {day for day, change in logged.items() if change} == set(described)
    assert '"added": ["c"]' in logged["2024-05-03"]


CHANGESET_DAYS = DAYS[:3] + ["2024-05-04"]


def test_change_set_add_and_drop(spark, tmp_path, monkeypatch):
    """A change set: c added on date 3 (I/U records for some keys), a dropped on date 4."""
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    columns = {
        "2024-05-01": [("a", "string"), ("b", "int")],
        "2024-05-02": [("a", "string"), ("b", "int")],
        "2024-05-03": [("a", "string"), ("b", "int"), ("c", "string")],
        "2024-05-04": [("b", "int"), ("c", "string")],
    }
    records = {  # (flag, id, values..., seq)
        "2024-05-01": [("I", 1, "x", 10, 1), ("I", 2, "y", 20, 2), ("I", 3, "z", 30, 3)],
        "2024-05-02": [("U", 2, "y", 21, 4)],
        # Key 1: the same a and b with a value of c -> N; key 3: b changes -> U; key 4 new.
        "2024-05-03": [("U", 1, "x", 10, "c1", 5), ("U", 3, "z", 31, "c3", 6), ("I", 4, "w", 40, "c4", 7)],
        # a dropped: key 1 sent again with another a only would be N; key 4 changes b -> U; key 2 deleted.
        "2024-05-04": [("U", 1, 10, "c1", 8), ("U", 4, 41, "c4", 9), ("D", 2, None, None, 10)],
    }
    expected_operations = {
        "2024-05-01": {"I": {1, 2, 3}},
        "2024-05-02": {"U": {2}},
        "2024-05-03": {"N": {1}, "U": {3}, "I": {4}},
        "2024-05-04": {"N": {1}, "U": {4}, "D": {2}},
    }
    expected_current = {
        "2024-05-03": {1: ("x", 10, "c1"), 2: ("y", 21, None), 3: ("z", 31, "c3"), 4: ("w", 40, "c4")},
        "2024-05-04": {1: (10, "c1"), 3: (31, "c3"), 4: (41, "c4")},
    }
    warehouse, source, configs = tmp_path / "warehouse", tmp_path / "source", tmp_path / "configs"
    storage = WarehouseStorage(str(warehouse))
    instance = DagsterInstance.ephemeral()
    for day in CHANGESET_DAYS:
        names = [name for name, _ in columns[day]]
        _write_extract(source, day, ["flag", "id", *names, "seq"], records[day])
        config = write_table_config(
            configs, "evolving", str(source / "{date}.csv"), start_date=DAYS[0], load_type="changeset", keys=KEYS,
            non_keys=[{"name": name, "type": kind} for name, kind in columns[day]],
            untracked_columns=[{"name": "seq", "type": "int"}],
            changes={"operation_column": "flag", "sequence_columns": ["seq"]},
        )  # fmt: skip
        (result,) = run_dates(definitions_for(config), [day], instance=instance)
        assert result.success, day
        assert all(evaluation.passed for evaluation in result.get_asset_check_evaluations())
        history = {row["id"]: row["operation"] for row in storage.read_one(spark, "evolving", HISTORY, day).collect()}
        assert history == {key: op for op, keys in expected_operations[day].items() if op != "N" for key in keys}, day
        materialized = result.asset_materializations_for_node("evolving__cdc")
        metadata = next(m.metadata for m in materialized if m.asset_key.path[-1] == CURRENT)
        assert metadata["unchanged"].value == len(expected_operations[day].get("N", ())), day
        if day in expected_current:
            current = storage.read_one(spark, "evolving", CURRENT, day)
            assert {row["id"]: tuple(row[name] for name in names) for row in current.collect()} == expected_current[day]


def test_a_range_run_that_starts_on_a_schema_change(spark, tmp_path, monkeypatch):
    """A single-run backfill whose first date adds a column: the range of full loads is classified in one
    query against the previous state brought into the new schema, and its second date against the first."""
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    warehouse, source, configs = tmp_path / "warehouse", tmp_path / "source", tmp_path / "configs"
    instance = DagsterInstance.ephemeral()
    _write_extract(source, DAYS[0], ["id", "a"], [(1, "x"), (2, "y"), (3, "z")])
    config = write_table_config(configs, "evolving", str(source / "{date}.csv"), start_date=DAYS[0], keys=KEYS,
                                non_keys=[{"name": "a", "type": "string"}])  # fmt: skip
    assert run_dates(definitions_for(config), [DAYS[0]], instance=instance)[0].success
    _write_extract(source, DAYS[1], ["id", "a", "c"], [(1, "x", "c1"), (2, "Y", "c2"), (3, "z", "")])
    _write_extract(source, DAYS[2], ["id", "a", "c"], [(1, "x", "c1"), (2, "Y", "c2-new"), (3, "z", ""), (4, "w", "c4")])
    config = write_table_config(configs, "evolving", str(source / "{date}.csv"), start_date=DAYS[0], keys=KEYS,
                                non_keys=[{"name": "a", "type": "string"}, {"name": "c", "type": "string"}])  # fmt: skip
    result = run_range(definitions_for(config), DAYS[1], DAYS[2], instance=instance)
    assert result.success
    assert all(evaluation.passed for evaluation in result.get_asset_check_evaluations())
    storage = WarehouseStorage(str(warehouse))
    history = {day: sorted((row["id"], row["operation"]) for row in storage.read_one(spark, "evolving", HISTORY, day).collect())
               for day in DAYS[1:3]}  # fmt: skip
    assert history == {DAYS[1]: [(2, "U")], DAYS[2]: [(2, "U"), (4, "I")]}
    current = {row["id"]: (row["a"], row["c"], str(row["eff_start_date"])) for row in storage.read_one(spark, "evolving", CURRENT, DAYS[2]).collect()}
    assert current == {1: ("x", "c1", DAYS[0]), 2: ("Y", "c2-new", DAYS[2]), 3: ("z", None, DAYS[0]), 4: ("w", "c4", DAYS[2])}
