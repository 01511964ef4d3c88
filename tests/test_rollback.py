"""Undo (cdc-rollback): every output of a table back to a date, through the CLI and the UI's job, on real
warehouses written by real Dagster runs of the shipped ``orders`` table (three dates), and of a copy of it
whose state is stored incrementally (one table, a tag per date)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from cdc_assets.cli.erase import main as erase
from cdc_assets.cli.rollback import main as rollback
from cdc_assets.model.config import TableConfigError, load_table_config
from resources.storage import WarehouseStorage
from resources.storage.rollback import DONE, ROLLBACK_ID, STARTED, Rollback, UnfinishedRollbackError, _save, rollbacks
from tests.pipeline import definitions_for, run_dates

REPO = Path(__file__).resolve().parent.parent
DAY1, DAY2, DAY3 = "2024-01-01", "2024-01-02", "2024-01-03"
COMPARED = ["key_hash", "non_key_hash", "operation", "business_date"]


def _heads(storage: WarehouseStorage, table: str) -> dict[str, int]:
    return {asset: storage.tables.load(table, asset).current_snapshot().snapshot_id for asset in storage.stored_assets(table)}


def _tags(storage: WarehouseStorage, table: str) -> dict[str, dict[str, int]]:
    """Each output's date tags (docs/publishing.md, Time travel by date)."""
    return {asset: storage.tables.date_tags(table, asset) for asset in storage.stored_assets(table)}


def _rows(spark, storage: WarehouseStorage, table: str, asset: str, days: list[str]) -> list:
    frame = storage.read(spark, table, asset, days)
    return sorted(frame.select(*[c for c in COMPARED if c in frame.columns]).collect())


def _configs(tmp_path: Path, monkeypatch, incremental: bool = False) -> Path:
    folder = tmp_path / "configs"
    folder.mkdir()
    document = yaml.safe_load((REPO / "table_configs" / "orders.yaml").read_text())
    document["publish"] = {"keep_rolled_back_days": 2}
    document["storage"] = {"current": "incremental" if incremental else "snapshot"}
    (folder / "orders.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(folder))
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    return folder / "orders.yaml"


def test_publish_settings_are_validated_naming_the_field(tmp_path):
    path = tmp_path / "orders.yaml"
    document = yaml.safe_load((REPO / "table_configs" / "orders.yaml").read_text())
    assert load_table_config(REPO / "table_configs" / "orders.yaml").publish.keep_rolled_back_days == 7
    path.write_text(yaml.safe_dump({**document, "publish": {"keep_rolled_back_days": 0}}))
    with pytest.raises(TableConfigError, match="publish.keep_rolled_back_days"):
        load_table_config(path)


def test_rollback_undo_and_a_rerun_from_the_date_rolled_back_to(spark, tmp_path, monkeypatch, capsys):
    config_path = _configs(tmp_path, monkeypatch)
    defs = definitions_for(load_table_config(config_path))
    instance = DagsterInstance.ephemeral()
    assert all(result.success for result in run_dates(defs, [DAY1, DAY2, DAY3], instance))
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    published = _heads(storage, "orders")
    assert len(published) >= 8  # the intake's two outputs and the CDC step's six
    before = {asset: _rows(spark, storage, "orders", asset, [DAY1, DAY2, DAY3]) for asset in published}
    tagged = _tags(storage, "orders")
    assert all(sorted(days) == [DAY1, DAY2, DAY3] for days in tagged.values()), tagged

    # Refused, changing nothing: a date current_table does not store, and no date at all.
    assert rollback(["orders", "--to", "2023-12-31"]) == 2
    assert "current_table does not store it (it stores 2024-01-01..2024-01-03)" in capsys.readouterr().err
    assert rollback(["orders", "--to", "yesterday"]) == 2
    assert rollback(["orders", "--undo"]) == 2
    assert "no rollback to undo" in capsys.readouterr().err
    assert _heads(WarehouseStorage(str(tmp_path / "warehouse")), "orders") == published
    # The newest date: nothing after it to remove, and nothing recorded.
    assert rollback(["orders", "--to", DAY3]) == 0
    assert "nothing to roll back" in capsys.readouterr().out
    assert rollbacks(WarehouseStorage(str(tmp_path / "warehouse")), "orders") == []

    # Roll back to DAY1: every output holds DAY1 only; the commit names the rollback; the undo point is a tag.
    assert rollback(["orders", "--to", DAY1, "--reason", "ticket OPS-7"]) == 0
    said = capsys.readouterr().out
    assert f"rolled back to {DAY1}" in said and "2024-01-02..2024-01-03 removed from" in said, said
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    [record] = rollbacks(storage, "orders")
    assert record.status == DONE and record.reason == "ticket OPS-7" and set(record.assets) == set(published)
    for asset in published:
        assert storage.stored_dates("orders", asset) == [DAY1], asset
        loaded = storage.tables.load("orders", asset)
        assert loaded.current_snapshot().summary[ROLLBACK_ID] == record.id
        assert loaded.metadata.refs[record.tag].snapshot_id == published[asset]
        assert loaded.metadata.refs[record.tag].max_ref_age_ms >= 2 * 24 * 3600 * 1000
        # The dates removed lose their tags, kept for the undo as the rollback's own.
        assert storage.tables.date_tags("orders", asset) == {DAY1: tagged[asset][DAY1]}, asset
        assert {day: loaded.metadata.refs[f"{record.tag}_{day}"].snapshot_id for day in (DAY2, DAY3)} == {
            day: tagged[asset][day] for day in (DAY2, DAY3)
        }
    logged = ds.dataset(str(tmp_path / "warehouse" / "_runs"), format="parquet").to_table().to_pylist()
    rolled = sorted((row["business_date"].isoformat(), row["status"]) for row in logged if row["step"] == "rollback")
    assert rolled == [(DAY2, "rolled_back"), (DAY3, "rolled_back")]

    # Undo: every table exactly as it was (the same snapshots), the undo tags gone.
    assert rollback(["orders", "--undo"]) == 0
    assert "is undone: 2024-01-02..2024-01-03 published again" in capsys.readouterr().out
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    assert _heads(storage, "orders") == published
    assert all(record.tag not in storage.tables.load("orders", asset).metadata.refs for asset in published)
    # The dates' tags are back, kept as long as before; no undo tag is left.
    assert _tags(storage, "orders") == tagged
    for asset in published:
        refs = storage.tables.load("orders", asset).metadata.refs
        assert {refs[day].max_ref_age_ms for day in tagged[asset]} == {7 * 24 * 3600 * 1000}
        assert not any(name.startswith("cdc_rollback_") for name in refs), refs
    assert rollbacks(storage, "orders")[0].status == "undone"

    # The UI's job rolls back again; DAY2 and DAY3 run again from DAY1 and equal what they were.
    rolled_back = defs.get_job_def("orders_rollback").execute_in_process(
        run_config={"ops": {"orders__rollback": {"config": {"to": DAY1}}}}, instance=instance
    )
    assert rolled_back.success
    observed = instance.fetch_observations(AssetRecordsFilter(asset_key=AssetKey(["orders", "current_table"])), limit=50).records
    partitions = sorted(
        record.asset_observation.partition for record in observed
        if str(record.asset_observation.metadata["cdc/publication"].value).startswith("rolled back")  # not the publications'
    )
    assert partitions == [DAY2, DAY3]
    assert WarehouseStorage(str(tmp_path / "warehouse")).stored_dates("orders", "history_partition") == [DAY1]
    assert all(result.success for result in run_dates(defs, [DAY2, DAY3], instance))
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    for asset in published:
        assert _rows(spark, storage, "orders", asset, [DAY1, DAY2, DAY3]) == before[asset], asset
    # The dates run again are tagged again, at their new snapshots.
    retagged = _tags(storage, "orders")
    assert all(sorted(days) == [DAY1, DAY2, DAY3] and days[DAY1] == tagged[asset][DAY1] and days[DAY3] != tagged[asset][DAY3]
               for asset, days in retagged.items()), retagged
    # A run committed since: undoing would discard it, so the undo is refused and changes nothing.
    heads = _heads(storage, "orders")
    assert rollback(["orders", "--undo"]) == 2
    assert "cannot be undone, nothing was changed: current_table was committed to since" in capsys.readouterr().err
    assert _heads(WarehouseStorage(str(tmp_path / "warehouse")), "orders") == heads

    # An erase after a rollback drops its undo point (it held the key): the key stays erased.
    assert rollback(["orders", "--to", DAY2]) == 0
    keys = tmp_path / "keys.csv"
    keys.write_text("store_code,order_id\nLON,1001\n")
    assert erase(["orders", "--keys", str(keys), "--reason", "GDPR-1"]) in (0, 3)
    said = capsys.readouterr().out
    assert "cdc-rollback --undo can no longer restore them" in said
    # The date tags go too (their versions held the key): no ref keeps a version from the erase's expiry.
    assert "date tag(s) dropped" in said, said
    assert all(days == {} for days in _tags(WarehouseStorage(str(tmp_path / "warehouse")), "orders").values())
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    assert not any(name.startswith("cdc_rollback_") for asset in published for name in storage.tables.load("orders", asset).metadata.refs)
    assert rollback(["orders", "--undo"]) == 2
    assert "dropped by erase request" in capsys.readouterr().err


def test_an_unfinished_rollback_stops_the_tables_runs_until_it_is_completed(spark, tmp_path, monkeypatch, capsys):
    _configs(tmp_path, monkeypatch, incremental=True)
    defs = definitions_for(load_table_config(tmp_path / "configs" / "orders.yaml"))
    instance = DagsterInstance.ephemeral()
    assert all(result.success for result in run_dates(defs, [DAY1, DAY2, DAY3], instance))
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    assert storage.merged.holds("orders", "current_table")
    published = _heads(storage, "orders")
    state_before = _rows(spark, storage, "orders", "current_table", [DAY2, DAY3])

    # A rollback stopped before its first change (its record written, no table touched yet), as a kill leaves it.
    _save(storage, Rollback(id="stopped0", table="orders", to=DAY2, status=STARTED, started_at="2026-01-01T00:00:00+00:00"))
    [refused] = run_dates(defs, [DAY3], instance, raise_on_error=False)
    assert not refused.success
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE")
    error, message = failure.event_specific_data.error, ""
    while error is not None:
        message, error = message + error.message, error.cause
    assert f"a rollback to {DAY2} (id stopped0" in message and f"cdc-rollback orders --to {DAY2}" in message, message
    with pytest.raises(UnfinishedRollbackError):
        from resources.storage.rollback import require_no_unfinished_rollback

        require_no_unfinished_rollback(WarehouseStorage(str(tmp_path / "warehouse")), "orders")

    # The UI job asks for a date or an undo, not neither.
    neither = defs.get_job_def("orders_rollback").execute_in_process(
        run_config={"ops": {"orders__rollback": {"config": {}}}}, instance=instance, raise_on_error=False
    )
    assert not neither.success
    failure = next(e for e in neither.all_events if e.event_type_value == "STEP_FAILURE")
    assert "give either to (a business date) or undo: true, not neither" in failure.event_specific_data.error.to_string()

    # Completing it rolls the merged state back to DAY2's tag; DAY3's tag is kept under the undo name.
    assert rollback(["orders", "--to", DAY2]) == 0
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    assert storage.stored_dates("orders", "current_table") == [DAY1, DAY2]
    state = storage.tables.load("orders", "current_table")
    assert state.current_snapshot().snapshot_id == state.metadata.refs[DAY2].snapshot_id
    assert "cdc_rollback_stopped0_2024-01-03" in state.metadata.refs and DAY3 not in state.metadata.refs
    assert rollback(["orders", "--undo"]) == 0
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    assert _heads(storage, "orders") == published
    assert storage.stored_dates("orders", "current_table") == [DAY1, DAY2, DAY3]
    assert _rows(spark, storage, "orders", "current_table", [DAY2, DAY3]) == state_before
