"""A run stopped between a date's commits (current_table committed, history_partition not) leaves that date
partly stored; the next date's run refuses to build on it, naming it and what to run, and writes nothing.
The table's state is made as such a stop leaves it: history_partition set back to the snapshot it had
before the date, with Iceberg's own procedure, on a real warehouse written by real runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInstance

from cdc_assets.core.capture.rerun import PartlyStoredDateError, require_wholly_stored
from cdc_assets.defs.component import build_definitions
from cdc_assets.defs.factory import build_table_definitions
from cdc_assets.model.config import load_table_config
from resources.storage import WarehouseStorage
from resources.storage.lake import CATALOG_NAME
from tests.pipeline import run_dates

REPO = Path(__file__).resolve().parent.parent
DAY1, DAY2, DAY3 = "2024-01-01", "2024-01-02", "2024-01-03"


def test_the_refusal_names_the_date_the_outputs_it_lacks_and_the_run_to_launch():
    require_wholly_stored("orders", [DAY3], DAY2, [])  # wholly stored: nothing to refuse
    with pytest.raises(PartlyStoredDateError) as refused:
        require_wholly_stored("orders", [DAY3, "2024-01-04"], DAY2, ["history_partition", "applied_sequences"])
    message = str(refused.value)
    assert f"the run of {DAY3}..2024-01-04 is refused, nothing was written: {DAY2}, the date it builds on" in message
    assert "current_table holds it, history_partition and applied_sequences do not" in message
    assert f"--select 'group:orders' --partition {DAY2}" in message


def test_a_date_whose_run_stopped_after_current_table_is_not_built_on_until_it_is_run_again(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    defs = build_definitions([build_table_definitions(load_table_config(REPO / "table_configs" / "orders.yaml"))])
    instance = DagsterInstance.ephemeral()
    storage = WarehouseStorage(str(tmp_path / "warehouse"))

    run_dates(defs, [DAY1], instance)
    history_after_day1 = storage.tables.load("orders", "history_partition").current_snapshot().snapshot_id
    run_dates(defs, [DAY2], instance)
    # What a kill between DAY2's current_table and history_partition commits leaves behind.
    storage.tables.session_for(spark).sql(
        f"CALL {CATALOG_NAME}.system.set_current_snapshot(table => 'orders.history_partition', snapshot_id => {history_after_day1})"
    ).collect()
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    assert storage.has_partition("orders", "current_table", DAY2) and not storage.has_partition("orders", "history_partition", DAY2)
    current_before = storage.tables.load("orders", "current_table").current_snapshot().snapshot_id

    [refused] = run_dates(defs, [DAY3], instance, raise_on_error=False)
    assert not refused.success
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE" and e.step_key == "orders__cdc")
    error, message = failure.event_specific_data.error, ""
    while error is not None:  # Dagster's step error, then the use case's own as its cause
        message, error = message + error.message, error.cause
    assert f"{DAY2}, the date it builds on, is not wholly stored: current_table holds it, history_partition does not" in message, message
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    assert not storage.has_partition("orders", "current_table", DAY3)
    assert storage.tables.load("orders", "current_table").current_snapshot().snapshot_id == current_before  # nothing written

    # Run again as the message says: DAY2, then DAY3; history then holds every date as an unbroken chain would.
    assert all(result.success for result in run_dates(defs, [DAY2, DAY3], instance))
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    assert storage.stored_dates("orders", "history_partition") == [DAY1, DAY2, DAY3]
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("CDC_WAREHOUSE", str(fresh))
    run_dates(defs, [DAY1, DAY2, DAY3], DagsterInstance.ephemeral())
    columns = ["key_hash", "non_key_hash", "operation", "business_date"]
    for asset in ("history_partition", "current_table"):
        repaired = storage.read(spark, "orders", asset, [DAY2, DAY3]).select(*columns)
        unbroken = WarehouseStorage(str(fresh)).read(spark, "orders", asset, [DAY2, DAY3]).select(*columns)
        assert sorted(repaired.collect()) == sorted(unbroken.collect()), asset
