"""The rules of a schema change between dates (cdc_assets/core/capture/schema.py) on real Spark frames, and the
refusals through real Dagster runs: a key change and a narrowing fail the date before anything is written."""

from __future__ import annotations

import csv
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
from dagster import DagsterInstance

from cdc_assets.model.config import LoadType
from cdc_assets.core.capture.changes import classify_changes
from cdc_assets.core.hashing import NON_KEY_HASH, add_hashes
from cdc_assets.core.capture.schema import (
    HashSpec,
    migrate_state,
    schema_change,
    shared_tracked_columns,
    stored_spec,
    updates_equal_on_shared_columns,
    values_for_added_columns,
    widens,
)
from cdc_assets.model.names import CURRENT, HASHED_INCOMING, HISTORY
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates, write_table_config

DAY = date(2024, 5, 2)
KEYS = (("id", "int"),)


def _spec(non_keys, untracked=()) -> HashSpec:
    return HashSpec(KEYS, tuple(non_keys), tuple(untracked))


def _hashed(spark, rows, spec: HashSpec, ddl: str):
    return add_hashes(spark.createDataFrame(rows, ddl), spec.keys, spec.non_keys)


def _previous(spark, rows, spec: HashSpec, ddl: str):
    """A stored state: rows hashed under ``spec``, with an eff_start_date."""
    from pyspark.sql import functions as F

    return _hashed(spark, rows, spec, ddl).withColumn("eff_start_date", F.lit(date(2024, 5, 1)))


def _classify(spark, previous, stored: HashSpec, configured: HashSpec, incoming, renamed_from=None, load_type=LoadType.full):
    change = schema_change(stored, configured, renamed_from or {}, "t", "t.yaml", "2024-05-01")
    values = values_for_added_columns(incoming, change, configured)
    migrated = migrate_state(previous, stored, configured, change, values)
    names = [name for name, _ in configured.payload]
    changes = classify_changes(incoming, migrated, DAY, load_type, names, non_key_columns=[n for n, _ in configured.non_keys])
    return change, {row["id"]: (row["operation"], sorted(row["changed_columns"])) for row in changes.collect()}, changes


@pytest.mark.parametrize(
    "old_type,new_type,old_value,new_value",
    [
        ("tinyint", "smallint", 7, 7),
        ("smallint", "int", 300, 300),
        ("int", "bigint", 2_000_000_000, 2_000_000_000),
        ("decimal(5,2)", "decimal(12,2)", Decimal("123.45"), Decimal("123.45")),
        ("float", "double", 0.1, 0.1),
        ("float", "double", 1.5, 1.5),
    ],
)
def test_a_widened_value_that_reads_equal_is_unchanged(spark, old_type, new_type, old_value, new_value):
    stored, configured = _spec([("v", old_type), ("w", "string")]), _spec([("v", new_type), ("w", "string")])
    previous = _previous(spark, [(1, old_value, "a"), (2, old_value, "b")], stored, f"id int, v {old_type}, w string")
    incoming = _hashed(spark, [(1, new_value, "a"), (2, new_value, "changed")], configured, f"id int, v {new_type}, w string")
    change, operations, _ = _classify(spark, previous, stored, configured, incoming)
    assert change.widened == {"v": (old_type, new_type)}
    assert operations == {1: ("N", []), 2: ("U", ["w"])}


def test_which_widenings_keep_the_stored_hash():
    """Integers and decimals keep their canonical text, so their hashes; float -> double compares through
    the float's shortest text. Narrowing, other type changes and date -> timestamp are refused."""
    assert all(widens(old, new) for old, new in [("tinyint", "bigint"), ("int", "bigint"), ("float", "double"), ("decimal(5,2)", "decimal(6,2)")])
    refused = [("bigint", "int"), ("double", "float"), ("decimal(6,2)", "decimal(5,2)"), ("decimal(5,2)", "decimal(6,3)"),
               ("date", "timestamp"), ("int", "string"), ("int", "double")]  # fmt: skip
    assert not any(widens(old, new) for old, new in refused)


def test_integer_and_decimal_widenings_hash_as_before(spark):
    stored, configured = _spec([("n", "int"), ("m", "decimal(5,2)")]), _spec([("n", "bigint"), ("m", "decimal(12,2)")])
    before = _hashed(spark, [(1, 42, Decimal("1.50"))], stored, "id int, n int, m decimal(5,2)")
    after = _hashed(spark, [(1, 42, Decimal("1.50"))], configured, "id int, n bigint, m decimal(12,2)")
    assert before.first()[NON_KEY_HASH] == after.first()[NON_KEY_HASH]


def test_added_column_keeps_equal_keys_unchanged_and_current_takes_its_value(spark):
    stored, configured = _spec([("a", "string")]), _spec([("a", "string"), ("c", "int")])
    previous = _previous(spark, [(1, "x"), (2, "y"), (3, "z")], stored, "id int, a string")
    incoming = _hashed(spark, [(1, "x", 5), (2, "Y", 6), (4, "w", 7)], configured, "id int, a string, c int")
    change, operations, changes = _classify(spark, previous, stored, configured, incoming, load_type=LoadType.delta)
    assert change.added == ("c",)
    assert operations == {1: ("N", []), 2: ("U", ["a"]), 3: ("X", []), 4: ("I", [])}
    rows = {row["id"]: row for row in changes.collect()}
    assert rows[1]["c"] == 5 and rows[3]["c"] is None  # N takes today's payload; X holds NULL
    # X's stored hash is today's hash of its row, so it reads as N when sent again with c NULL.
    assert rows[3][NON_KEY_HASH] == _hashed(spark, [(3, "z", None)], configured, "id int, a string, c int").first()[NON_KEY_HASH]


def test_drop_rename_reorder_and_move_between_tracked_and_untracked(spark):
    stored = _spec([("a", "string"), ("b", "int"), ("gone", "string")], [("note", "string")])
    # b renamed b2, gone dropped, note now tracked and first, a now untracked.
    configured = _spec([("note", "string"), ("b2", "int")], [("a", "string")])
    previous = _previous(
        spark, [(1, "x", 10, "g1", "n1"), (2, "y", 20, "g2", "n2"), (3, "z", 30, "g3", "n3")], stored,
        "id int, a string, b int, gone string, note string",
    )  # fmt: skip
    incoming = _hashed(
        spark, [(1, "n1", 10, "X!"), (2, "n2-changed", 20, "y"), (3, "n3", 31, "z")], configured, "id int, note string, b2 int, a string"
    )
    change, operations, _ = _classify(spark, previous, stored, configured, incoming, renamed_from={"b2": ("b",)})
    assert change.describe() == {
        "dropped": ["gone"], "now_tracked": ["note"], "now_untracked": ["a"], "renamed": {"b2": "b"}, "reordered": True,
    }  # fmt: skip
    # Key 1 changed only a, untracked now: N. Key 2 changed note, tracked now: U. Key 3 changed b2: U.
    assert operations == {1: ("N", []), 2: ("U", ["note"]), 3: ("U", ["b2"])}


def test_an_update_equal_on_every_shared_column_is_found(spark):
    """The check's rule: an update whose previous version holds the same values (widened) is a false U."""
    stored, configured = _spec([("a", "string"), ("n", "int")]), _spec([("a", "string"), ("n", "bigint"), ("c", "int")])
    previous = _previous(spark, [(1, "x", 1), (2, "y", 2)], stored, "id int, a string, n int")
    updates = _hashed(spark, [(1, "x", 1, 9), (2, "y", 3, 9)], configured, "id int, a string, n bigint, c int")
    change = schema_change(stored, configured, {}, "t", "t.yaml", "2024-05-01")
    shared = shared_tracked_columns(stored, configured, change)
    assert [name for name, *_ in shared] == ["a", "n"]
    assert [row["id"] for row in updates_equal_on_shared_columns(updates, previous, shared).collect()] == [1]


def test_a_state_stored_before_specs_is_read_with_the_config_grouping():
    fields = [{"name": name, "type": kind, "metadata": {}} for name, kind in
              [("id", "integer"), ("a", "string"), ("b", "long"), ("old", "string"), ("key_hash", "string"), ("non_key_hash", "string")]]  # fmt: skip
    configured = _spec([("a", "string"), ("b", "bigint")])
    assert stored_spec(fields, configured) == HashSpec(KEYS, (("a", "string"), ("b", "bigint")), (("old", "string"),))


# -- refused through real runs: the exact error, and nothing written for the date ---------------------


def _land(source: Path, day: str, header: list[str], rows: list[tuple]) -> None:
    source.mkdir(parents=True, exist_ok=True)
    with open(source / f"{day}.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def _refusal(configs: Path, source: Path, instance, keys, non_keys):
    """Run date 2 under a config of ``keys`` and ``non_keys``; the intake's error message, and the config."""
    config = write_table_config(configs, "refused", str(source / "{date}.csv"), start_date="2024-05-01", keys=keys,
                                non_keys=non_keys)  # fmt: skip
    (result,) = run_dates(definitions_for(config), ["2024-05-02"], instance=instance, raise_on_error=False)
    assert not result.success
    failure = next(event for event in result.all_events if event.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "refused__hashed_incoming"  # the intake refuses it: it writes first
    return failure.step_failure_data.error.cause.message, config


def _nothing_written(storage: WarehouseStorage) -> None:
    for asset in (HASHED_INCOMING, CURRENT, HISTORY):
        assert storage.stored_dates("refused", asset) == ["2024-05-01"], asset


def test_a_narrowing_and_a_key_change_are_refused_before_anything_is_written(spark, tmp_path, monkeypatch):
    """One table, date 1 stored; date 2 refused under a narrowed column, then under changed keys (nothing
    written either time: each refusal meets the state as of date 1), then re-baselined under the new keys."""
    warehouse, source, configs = tmp_path / "warehouse", tmp_path / "source", tmp_path / "configs"
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    storage, config_file = WarehouseStorage(str(warehouse)), configs / "refused.yaml"
    instance = DagsterInstance.ephemeral()
    _land(source, "2024-05-01", ["id", "region", "amount"], [(1, "eu", 5), (2, "us", 7)])
    first = write_table_config(configs, "refused", str(source / "{date}.csv"), start_date="2024-05-01",
                               keys=[{"name": "id", "type": "int"}],
                               non_keys=[{"name": "region", "type": "string"}, {"name": "amount", "type": "bigint"}])  # fmt: skip
    assert run_dates(definitions_for(first), ["2024-05-01"], instance=instance)[0].success
    _land(source, "2024-05-02", ["id", "region", "amount"], [(1, "eu", 5), (2, "us", 8)])

    message, _ = _refusal(
        configs, source, instance,
        keys=[{"name": "id", "type": "int"}],
        non_keys=[{"name": "region", "type": "string"}, {"name": "amount", "type": "int"}],
    )  # fmt: skip
    assert message == (
        f"cdc_assets.core.capture.schema.SchemaChangeError: {config_file}: table refused: field 'non_keys.1.type' (amount) "
        "changed from bigint to int: the state as of 2024-05-01 holds amount as bigint, and bigint -> int is not a "
        "widening that reads every stored value as an equal one (allowed: tinyint -> smallint -> int -> bigint, "
        "float -> double, decimal(p,s) -> decimal(p',s) with p' > p); nothing was written. Keep bigint, or add the "
        "column under a new name. Either define a new table (a new name) with the new definition, or re-baseline this "
        "one: run this date with run config ops: {refused__cdc: {config: {rebaseline: true}}}, which compares every key "
        "under the new definition (docs/schema-changes.md, Re-baseline).\n"
    )
    _nothing_written(storage)

    message, config = _refusal(
        configs, source, instance,
        keys=[{"name": "id", "type": "int"}, {"name": "region", "type": "string"}],
        non_keys=[{"name": "amount", "type": "bigint"}],
    )  # fmt: skip
    assert message == (
        f"cdc_assets.core.capture.schema.SchemaChangeError: {config_file}: table refused: field 'keys' changed: the state as of "
        "2024-05-01 was written with keys [id int], the config now says [id int, region string]. A change to the keys "
        "changes every key's hash, so it is not applied between dates; nothing was written. Either define a new table "
        "(a new name) with the new definition, or re-baseline this one: run this date with run config ops: "
        "{refused__cdc: {config: {rebaseline: true}}}, which compares every key under the new definition "
        "(docs/schema-changes.md, Re-baseline).\n"
    )
    _nothing_written(storage)
    # Declared, the re-baseline runs: each stored row's key hash is recomputed from its values under the new
    # keys (id, region), so nothing is re-versioned but key 2, whose amount changed.
    job = definitions_for(config).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        partition_key="2024-05-02", instance=instance, run_config={"ops": {"refused__cdc": {"config": {"rebaseline": True}}}}
    )
    assert result.success
    history = storage.read_one(spark, "refused", HISTORY, "2024-05-02")
    assert sorted((row["id"], row["operation"]) for row in history.collect()) == [(2, "U")]
    assert instance.get_run_by_id(result.run_id).tags["cdc/rebaseline"] == "true"
