"""Faults end to end: bad input, guards, header problems, pools (a run killed with SIGKILL inside a
commit: tests/test_commits.py).

Real Dagster runs with the project's IO manager, real Spark, tiny hand-written CSVs in tmp_path. Every
test checks the outcome and that nothing was lost: rows read = accepted + rejected, and the outputs of
dates that were already materialized are unchanged (same rows, compared as sorted snapshots).
"""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from cdc_assets.defs.factory import MASS_DELETE_OVERRIDE_TAG
from cdc_assets.model.names import CDC_OUTPUTS, HASHED_INCOMING, REJECTS
from resources.storage import WarehouseStorage
from tests.pipeline import (
    definitions_for,
    operation_counts,
    partition_dir,
    read_stored,
    run_dates,
    run_range,
    sorted_rows,
    write_table_config,
)

REPO = Path(__file__).resolve().parent.parent
TABLE = "shop"
DAY1, DAY2, DAY3 = "2024-01-01", "2024-01-02", "2024-01-03"
INTAKE_OUTPUTS = (HASHED_INCOMING, REJECTS)
ALL_ASSETS = (*INTAKE_OUTPUTS, *CDC_OUTPUTS)
HEADER = "id,name,qty,amount\n"
COLUMNS = {
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [
        {"name": "name", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "amount", "type": "decimal(10,2)"},
    ],
}


# --- helpers ------------------------------------------------------------------------------------


def _table(tmp_path: Path, name: str = TABLE, **fields):
    """A table config (id:int key; name, qty, amount) reading ``landing/<name>/<date>.csv``."""
    source = f"{tmp_path / 'landing' / name}/{{date}}.csv"
    return write_table_config(tmp_path / "configs", name, source, start_date=DAY1, **{**COLUMNS, **fields})


def _land(tmp_path: Path, day: str, text: str, name: str = TABLE) -> Path:
    path = tmp_path / "landing" / name / f"{day}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _csv(*ids: int, qty_offset: int = 0) -> str:
    """Good rows for the given ids: name n<id>, qty id + qty_offset, amount id.50."""
    return HEADER + "".join(f"{i},n{i},{i + qty_offset},{i}.50\n" for i in ids)


def _failure(result) -> str:
    """The error text of every failed step of a run."""
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "expected a failed step"
    return "\n".join(e.step_failure_data.error.to_string() for e in failures)


def _failed_steps(result) -> set[str]:
    return {e.step_key for e in result.all_events if e.event_type_value == "STEP_FAILURE"}


def _snapshot(spark, warehouse: Path, table: str = TABLE) -> dict[tuple[str, str], list[tuple]]:
    """Every stored date of every asset (Iceberg table) of the table, as sorted rows."""
    storage = WarehouseStorage(str(warehouse))
    return {
        (asset, f"business_date={day}"): sorted_rows(spark, partition_dir(warehouse, table, asset, day))
        for asset in storage.stored_assets(table)
        for day in storage.stored_dates(table, asset)
    }


def _for_day(snapshot: dict, day: str) -> dict:
    return {key: rows for key, rows in snapshot.items() if key[1] == f"business_date={day}"}


def _written(warehouse: Path, day: str, table: str = TABLE) -> set[str]:
    """The assets that have a partition folder for the date."""
    return {asset for asset in ALL_ASSETS if partition_dir(warehouse, table, asset, day).exists()}


def _unreferenced(warehouse: Path, day: str, table: str = TABLE, staged_by: str | None = None) -> list[str]:
    """The date's data files that no table's current snapshot reads (what a failed write would leave); with
    ``staged_by``, the snapshot that run staged on its branch where it staged one."""
    storage = WarehouseStorage(str(warehouse), run_id=staged_by) if staged_by else WarehouseStorage(str(warehouse))
    return [path for _, found_day, path, live in storage.data_files(table) if found_day == day and not live]


def _metadata(instance: DagsterInstance, asset: str, day: str, table: str = TABLE) -> dict:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey([table, asset]), asset_partitions=[day]), limit=1
    ).records
    assert records, f"{table}/{asset} has no materialization for {day}"
    return {key: value.value for key, value in records[0].asset_materialization.metadata.items()}


def _count(spark, warehouse: Path, asset: str, day: str, table: str = TABLE, staged_by: str | None = None) -> int:
    """The date's rows as readers see them (published), or as run ``staged_by`` staged them on its branch."""
    if staged_by is not None:
        return WarehouseStorage(str(warehouse), run_id=staged_by).read_one(spark, table, asset, day).count()
    return read_stored(spark, partition_dir(warehouse, table, asset, day)).count()


def _staged(warehouse: Path, day: str, run_id: str, table: str = TABLE) -> set[str]:
    """The assets run ``run_id`` staged the date of (on its branch, docs/publishing.md)."""
    staged = WarehouseStorage(str(warehouse), run_id=run_id)
    return {asset for asset in ALL_ASSETS if asset in staged.staged_assets(table) and staged.has_partition(table, asset, day)}


def _assert_intake_balances(
    spark, warehouse: Path, instance: DagsterInstance, day: str, rows_read: int, table: str = TABLE, staged_by: str | None = None
):
    """Nothing lost at intake: rows read = rows stored in hashed_incoming + rows stored in rejects."""
    accepted, rejected = (_count(spark, warehouse, asset, day, table, staged_by) for asset in INTAKE_OUTPUTS)
    meta = _metadata(instance, HASHED_INCOMING, day, table)
    assert meta["rows_read"] == rows_read == accepted + rejected
    assert (meta["rows_accepted"], meta["rows_rejected"]) == (accepted, rejected)
    return accepted, rejected


def _job(defs):
    return defs.resolve_implicit_global_asset_job_def()


# --- 1, 2: bad records ----------------------------------------------------------------------------

BAD_CSV = (
    HEADER
    + "1,alpha,10,1.50\n"  # record 1: good
    + "2,beta,3,2.00,extra\n"  # record 2: too many fields
    + "3,gamma,abc,3.00\n"  # record 3: qty is not an int
    + ",delta,4,4.00\n"  # record 4: empty key
    + "5,eps,6,5.00\n"  # record 5: good
)


def test_bad_records_are_quarantined(spark, warehouse, tmp_path):
    source = _land(tmp_path, DAY1, BAD_CSV)
    instance = DagsterInstance.ephemeral()
    # Records 2 and 4 name no key: a full load quarantines them only when told to (tests/test_bad_values.py).
    [result] = run_dates(definitions_for(_table(tmp_path, bad_records="quarantine_unkeyed")), [DAY1], instance)
    assert result.success

    rejects = read_stored(spark, partition_dir(warehouse, TABLE, REJECTS, DAY1))
    assert rejects.columns == ["raw_record", "reason", "source_file"]
    rows = rejects.collect()
    assert len(rows) == 3
    assert all(row["source_file"].endswith(source.name) for row in rows)
    reasons = {row["raw_record"]: row["reason"] for row in rows}
    assert "malformed" in reasons["2,beta,3,2.00,extra"]
    parsed = {json.loads(raw).get("name"): reason for raw, reason in reasons.items() if raw.startswith("{")}
    assert set(parsed) == {"gamma", "delta"}
    assert "column qty" in parsed["gamma"] and "abc" in parsed["gamma"]
    assert "key column id" in parsed["delta"] and "NULL or empty" in parsed["delta"]

    incoming = read_stored(spark, partition_dir(warehouse, TABLE, HASHED_INCOMING, DAY1))
    assert sorted((r["id"], r["name"], r["qty"], r["amount"]) for r in incoming.collect()) == [
        (1, "alpha", 10, Decimal("1.50")),
        (5, "eps", 6, Decimal("5.00")),
    ]
    # Nothing lost: 5 read = 2 accepted + 3 rejected, in the metadata and in storage alike.
    assert _assert_intake_balances(spark, warehouse, instance, DAY1, rows_read=5) == (2, 3)
    assert _metadata(instance, REJECTS, DAY1)["rows_rejected"] == 3
    checks = {
        (e.event_specific_data.check_name, e.event_specific_data.partition): e.event_specific_data.passed
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }
    assert checks[("rows_read_reconcile", DAY1)] is True
    assert all(checks.values()), checks
    assert operation_counts(spark, partition_dir(warehouse, TABLE, "current_table", DAY1)) == {"I": 2}


def test_bad_records_fail_policy_fails_the_date_and_writes_nothing(spark, warehouse, tmp_path):
    defs = definitions_for(_table(tmp_path, bad_records="fail"))
    instance = DagsterInstance.ephemeral()
    _land(tmp_path, DAY1, _csv(1, 2, 3))
    source = _land(tmp_path, DAY2, BAD_CSV)
    [first] = run_dates(defs, [DAY1], instance)
    assert first.success
    before = _snapshot(spark, warehouse)

    [result] = run_dates(defs, [DAY2], instance, raise_on_error=False)

    assert not result.success
    assert _failed_steps(result) == {f"{TABLE}__hashed_incoming"}
    message = _failure(result)
    assert "3 bad record(s)" in message and "nothing was written for this date" in message
    lines = {n: next((line for line in message.splitlines() if f"record {n}:" in line), "") for n in range(1, 6)}
    assert lines[1] == lines[5] == ""  # good records are not listed
    assert all(source.name in lines[n] for n in (2, 3, 4)), message
    assert "malformed" in lines[2]
    assert "column qty" in lines[3] and "abc" in lines[3]
    assert "key column id" in lines[4]
    # Nothing for the date, not even the quarantine; the day before is exactly as it was.
    assert _written(warehouse, DAY2) == set()
    assert _unreferenced(warehouse, DAY2) == []  # no data file was even written
    assert _snapshot(spark, warehouse) == before


# --- 3: duplicate keys ----------------------------------------------------------------------------

# Key 2: two identical rows. Key 5: three rows with different values (9 rows, 6 distinct keys).
DUPLICATES_CSV = (
    _csv(1, 2, 2, 3, 4, 5, 6) + "5,e2,6,5.00\n5,e3,7,5.00\n"  # other rows as on day 1 (_csv)
)


def test_duplicate_keys_fail_by_default_and_can_be_quarantined(spark, warehouse, tmp_path):
    _land(tmp_path, DAY1, _csv(1, 2, 3, 4, 5, 6))
    _land(tmp_path, DAY2, DUPLICATES_CSV)
    instance = DagsterInstance.ephemeral()
    [first] = run_dates(definitions_for(_table(tmp_path)), [DAY1], instance)
    assert first.success
    before = _snapshot(spark, warehouse)

    [failed] = run_dates(definitions_for(_table(tmp_path)), [DAY2], instance, raise_on_error=False)

    assert not failed.success
    message = _failure(failed)
    assert "2 key(s) occur more than once" in message
    # identical rows are duplicates too; the keys themselves are masked (a key is sensitive unless declared not)
    assert "{id=(masked)} x2" in message and "{id=(masked)} x3" in message
    assert "Nothing was written for this date" in message
    assert _written(warehouse, DAY2) == set()
    assert _snapshot(spark, warehouse) == before

    [quarantined] = run_dates(definitions_for(_table(tmp_path, duplicate_keys="quarantine")), [DAY2], instance)

    assert quarantined.success
    rejects = read_stored(spark, partition_dir(warehouse, TABLE, REJECTS, DAY2)).collect()
    assert all("duplicate" in row["reason"] for row in rejects)
    assert sorted(json.loads(row["raw_record"])["id"] for row in rejects) == ["2", "2", "5", "5", "5"]
    incoming = read_stored(spark, partition_dir(warehouse, TABLE, HASHED_INCOMING, DAY2))
    assert sorted(row["id"] for row in incoming.collect()) == [1, 3, 4, 6]
    assert _assert_intake_balances(spark, warehouse, instance, DAY2, rows_read=9) == (4, 5)
    assert _metadata(instance, HASHED_INCOMING, DAY2)["duplicate_keys"] == 2
    # Quarantined keys are held as they were (X), not deleted for their absence from the accepted rows.
    assert operation_counts(spark, partition_dir(warehouse, TABLE, "current_table", DAY2)) == {"N": 4, "X": 2}
    assert operation_counts(spark, partition_dir(warehouse, TABLE, "deletes", DAY2)) == {}
    assert _metadata(instance, "hash_join_classification", DAY2)["held_by_reject"] == 2
    assert _for_day(_snapshot(spark, warehouse), DAY1) == before


# --- 4: missing input -----------------------------------------------------------------------------


def test_missing_input_fails_naming_the_resolved_path(spark, warehouse, tmp_path, monkeypatch):
    # A relative source path, resolved against CDC_DATA_ROOT: the message must show where it looked.
    monkeypatch.setenv("CDC_DATA_ROOT", str(tmp_path))
    config = write_table_config(tmp_path / "configs", TABLE, f"landing/{TABLE}/{{date}}.csv", start_date=DAY1, **COLUMNS)
    defs = definitions_for(config)
    _land(tmp_path, DAY1, _csv(1, 2, 3))
    instance = DagsterInstance.ephemeral()
    [first] = run_dates(defs, [DAY1], instance)
    assert first.success
    before = _snapshot(spark, warehouse)

    [result] = run_dates(defs, [DAY2], instance, raise_on_error=False)

    assert not result.success
    message = _failure(result)
    assert f"no input at {tmp_path / 'landing' / TABLE / f'{DAY2}.csv'}" in message
    assert "never treated as an empty one" in message
    # Never an empty extract: no hashed_incoming with 0 rows, no deletes, no state change.
    assert _written(warehouse, DAY2) == set()
    assert _snapshot(spark, warehouse) == before


# --- 5: mass delete guard -------------------------------------------------------------------------


def test_mass_delete_guard_override_empty_extract_and_delta(spark, warehouse, tmp_path):
    ten = list(range(1, 11))
    _land(tmp_path, DAY1, _csv(*ten))
    _land(tmp_path, DAY2, _csv(1, 2, 3))
    _land(tmp_path, DAY3, HEADER)  # header only: an empty full extract
    defs = definitions_for(_table(tmp_path))
    job = _job(defs)
    cdc_op = f"{TABLE}__cdc"
    assert cdc_op in {node.name for node in job.nodes}
    instance = DagsterInstance.ephemeral()
    [first] = run_dates(defs, [DAY1], instance)
    assert first.success
    day1 = _snapshot(spark, warehouse)

    [blocked] = run_dates(defs, [DAY2], instance, raise_on_error=False)

    assert not blocked.success
    assert _failed_steps(blocked) == {cdc_op}
    message = _failure(blocked)
    assert "would delete 7 of 10" in message and "allow_mass_delete" in message
    # The CDC step wrote nothing for day 2. The intake step ran before it (a separate step) and staged
    # the day's input on the run's branch, which balances; nothing is published; day 1 is untouched.
    assert _written(warehouse, DAY2) == set()
    assert _staged(warehouse, DAY2, blocked.run_id) == set(INTAKE_OUTPUTS)
    _assert_intake_balances(spark, warehouse, instance, DAY2, rows_read=3, staged_by=blocked.run_id)
    assert _for_day(_snapshot(spark, warehouse), DAY1) == day1
    assert MASS_DELETE_OVERRIDE_TAG not in instance.get_run_by_id(blocked.run_id).tags

    allowed = job.execute_in_process(
        partition_key=DAY2, instance=instance, run_config={"ops": {cdc_op: {"config": {"allow_mass_delete": True}}}}
    )

    assert allowed.success
    assert instance.get_run_by_id(allowed.run_id).tags[MASS_DELETE_OVERRIDE_TAG] == "true"
    assert "would delete 7 of 10" in _metadata(instance, "current_table", DAY2)["mass_delete_override"]
    assert operation_counts(spark, partition_dir(warehouse, TABLE, "deletes", DAY2)) == {"D": 7}
    assert operation_counts(spark, partition_dir(warehouse, TABLE, "current_table", DAY2)) == {"N": 3}
    assert operation_counts(spark, partition_dir(warehouse, TABLE, "history_partition", DAY2)) == {"D": 7}
    after_override = _snapshot(spark, warehouse)
    assert _for_day(after_override, DAY1) == day1

    [empty] = run_dates(defs, [DAY3], instance, raise_on_error=False)

    assert not empty.success
    assert "the full extract is empty; it would delete all 3 current rows" in _failure(empty)
    assert _written(warehouse, DAY3) == set()
    assert _staged(warehouse, DAY3, empty.run_id) == set(INTAKE_OUTPUTS)
    assert _assert_intake_balances(spark, warehouse, instance, DAY3, rows_read=0, staged_by=empty.run_id) == (0, 0)
    assert {k: v for k, v in _snapshot(spark, warehouse).items() if k[1] != f"business_date={DAY3}"} == after_override

    # A delta extract with the same three rows deletes nothing: the seven others are X, no guard.
    delta = "shop_delta"
    _land(tmp_path, DAY1, _csv(*ten), name=delta)
    _land(tmp_path, DAY2, _csv(1, 2, 3), name=delta)
    delta_defs = definitions_for(_table(tmp_path, name=delta, load_type="delta"))
    both = run_range(delta_defs, DAY1, DAY2, instance)  # one run for both dates, as a single-run backfill
    assert both.success
    assert operation_counts(spark, partition_dir(warehouse, delta, "current_table", DAY2)) == {"N": 3, "X": 7}
    # The seven X keys are counted, not stored: a delta's deletes hold no rows.
    assert operation_counts(spark, partition_dir(warehouse, delta, "deletes", DAY2)) == {}
    assert _count(spark, warehouse, "history_partition", DAY2, delta) == 0
    assert operation_counts(spark, partition_dir(warehouse, delta, "current_table", DAY1)) == {"I": 10}
    assert _assert_intake_balances(spark, warehouse, instance, DAY2, rows_read=3, table=delta) == (3, 0)
    assert MASS_DELETE_OVERRIDE_TAG not in instance.get_run_by_id(both.run_id).tags


# --- 6: header problems ---------------------------------------------------------------------------


def test_header_missing_extra_and_reordered_columns(spark, warehouse, tmp_path):
    # Day 1: the columns in another order than the config; they are matched by name.
    _land(tmp_path, DAY1, "amount,qty,id,name\n1.25,7,1,one\n2.50,8,2,two\n")
    strict = definitions_for(_table(tmp_path))
    instance = DagsterInstance.ephemeral()
    [first] = run_dates(strict, [DAY1], instance)
    assert first.success
    current = read_stored(spark, partition_dir(warehouse, TABLE, "current_table", DAY1))
    assert current.columns[:4] == ["id", "name", "qty", "amount"]
    assert sorted((r["id"], r["name"], r["qty"], r["amount"]) for r in current.collect()) == [
        (1, "one", 7, Decimal("1.25")),
        (2, "two", 8, Decimal("2.50")),
    ]
    _assert_intake_balances(spark, warehouse, instance, DAY1, rows_read=2)
    before = _snapshot(spark, warehouse)

    _land(tmp_path, DAY2, "id,name,amount\n1,one,1.25\n")  # qty is missing
    [missing] = run_dates(strict, [DAY2], instance, raise_on_error=False)
    assert not missing.success
    assert "missing configured column(s) ['qty']" in _failure(missing)
    assert _written(warehouse, DAY2) == set()

    _land(tmp_path, DAY2, "id,name,qty,amount,colour\n1,one,7,1.25,red\n2,two,9,2.50,blue\n")
    [extra] = run_dates(strict, [DAY2], instance, raise_on_error=False)
    assert not extra.success
    message = _failure(extra)
    assert "unexpected column(s) ['colour']" in message and "allow_extra_columns" in message
    assert _written(warehouse, DAY2) == set()
    assert _snapshot(spark, warehouse) == before

    [allowed] = run_dates(definitions_for(_table(tmp_path, allow_extra_columns=True)), [DAY2], instance)
    assert allowed.success
    for asset in ALL_ASSETS:
        columns = read_stored(spark, partition_dir(warehouse, TABLE, asset, DAY2)).columns
        assert "colour" not in columns, (asset, columns)
    assert operation_counts(spark, partition_dir(warehouse, TABLE, "current_table", DAY2)) == {"N": 1, "U": 1}
    _assert_intake_balances(spark, warehouse, instance, DAY2, rows_read=2)
    assert _for_day(_snapshot(spark, warehouse), DAY1) == before


def test_mass_delete_guard_in_a_range_of_full_loads_fails_before_any_cdc_output(spark, warehouse, tmp_path):
    # Day 2 of the range deletes 7 of 10 keys: the range (classified in one query) must stop before
    # writing any CDC output for any of its dates, naming the date, as a one-date run does.
    _land(tmp_path, DAY1, _csv(*range(1, 11)))
    _land(tmp_path, DAY2, _csv(1, 2, 3))
    _land(tmp_path, DAY3, _csv(1, 2, 3, 4))
    defs = definitions_for(_table(tmp_path))
    instance = DagsterInstance.ephemeral()
    result = _job(defs).execute_in_process(
        instance=instance,
        tags={"dagster/asset_partition_range_start": DAY1, "dagster/asset_partition_range_end": DAY3},
        raise_on_error=False,
    )
    assert not result.success
    assert _failed_steps(result) == {f"{TABLE}__cdc"}
    message = _failure(result)
    assert DAY2 in message and "would delete 7 of 10" in message and "allow_mass_delete" in message
    for day in (DAY1, DAY2, DAY3):
        assert _written(warehouse, day) == set(), day  # nothing published
        assert _staged(warehouse, day, result.run_id) == set(INTAKE_OUTPUTS), day  # the intake staged; no CDC output
        assert _unreferenced(warehouse, day, staged_by=result.run_id) == []


# --- 8: one writer per table ----------------------------------------------------------------------


def test_every_asset_and_check_runs_in_its_tables_pool_and_the_instance_limits_pools(tmp_path):
    defs = definitions_for(_table(tmp_path), _table(tmp_path, name="other"))
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        assert graph.get(key).pools == {f"cdc_{key.path[0]}"}, key
        assert graph.get(key).assets_def.op.pool == f"cdc_{key.path[0]}", key
    assert {key.path[0] for key in graph.get_all_asset_keys()} == {TABLE, "other"}
    # A full load has no_key_held_by_reject too, and a state that may be stored incrementally (storage.current
    # unset) stored_state_reconciles.
    assert len(graph.asset_check_keys) == 2 * 12
    for check_key in graph.asset_check_keys:
        assert graph.assets_def_for_key(check_key).op.pool == f"cdc_{check_key.asset_key.path[0]}", check_key

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    with DagsterInstance.from_config(str(home)) as instance:
        pools = instance.get_concurrency_config().pool_config
        assert pools.pool_granularity.value == "run"
        assert pools.default_pool_limit == 1
