"""How a table stores its state when its config does not say (``storage.current`` unset): a table with no
stored state is stored as ``NEW_TABLE_STATE_FORM`` says, and a table whose current_table exists keeps the
layout it has (per date, or incremental), so changing the default leaves every stored table as it is.

Real runs in this process on the session's Spark: a 300-row table of the demo's shape, two dates.
"""

from __future__ import annotations

import pytest
from dagster import DagsterInstance

from cdc_assets.cli.generate import generate
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.config import NEW_TABLE_STATE_FORM, StateForm
from cdc_assets.model.names import CURRENT
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates, write_table_config

DAYS = ["2019-06-18", "2019-06-19"]


@pytest.fixture()
def extracts(tmp_path):
    folder = tmp_path / "extracts"
    generate(300, 300, 5, 10, 0.02, 0.05, 0.93, folder / DAYS[0], folder / DAYS[1], seed=7)
    return folder


def _stored_state_check(result, day: str):
    """The date's ``current_table:stored_state_reconciles`` evaluation in a run's events."""
    found = [
        event.event_specific_data
        for event in result.all_events
        if event.event_type_value == "ASSET_CHECK_EVALUATION"
        and event.event_specific_data.check_name == "stored_state_reconciles"
        and event.event_specific_data.partition == day
    ]
    assert len(found) == 1, [event.event_type_value for event in result.all_events]
    return found[0]


def _state_storage_metadata(config) -> str:
    spec = next(
        spec for assets in definitions_for(config).assets or [] for spec in getattr(assets, "specs", [])
        if spec.key == asset_key(config, CURRENT)
    )
    return spec.metadata["cdc/state_storage"]


def test_a_new_table_without_storage_takes_the_default_and_an_incremental_one_stays_incremental(spark, warehouse, tmp_path, extracts):
    source = f"{extracts}/{{date}}/"
    unset = write_table_config(tmp_path / "configs", "synthetic", source)
    assert unset.storage.current is None
    assert _state_storage_metadata(unset) == f"{NEW_TABLE_STATE_FORM.value} for a new table, else as stored (storage.current unset)"
    # Nothing stored yet: the new-table default.
    assert run_dates(definitions_for(unset), DAYS[:1], DagsterInstance.ephemeral())[0].success
    assert WarehouseStorage(str(warehouse)).stored_state_form("synthetic") is NEW_TABLE_STATE_FORM

    # Another warehouse: stored incrementally from its first date, then run with the key left out.
    other = tmp_path / "other"
    other.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_WAREHOUSE", str(other))
        incremental = write_table_config(tmp_path / "configs", "synthetic", source, storage={"current": "incremental"})
        assert run_dates(definitions_for(incremental), DAYS[:1], DagsterInstance.ephemeral())[0].success
        unset = write_table_config(tmp_path / "configs", "synthetic", source)
        result = run_dates(definitions_for(unset), DAYS[1:], DagsterInstance.ephemeral())[0]
    assert result.success
    storage = WarehouseStorage(str(other))
    assert storage.stored_state_form("synthetic") is StateForm.incremental
    # The first date is a full copy (no earlier state), the second the date's changes (a MERGE).
    assert [storage.stored_as("synthetic", CURRENT, day) for day in DAYS] == ["full", "changes"]
    checked = _stored_state_check(result, DAYS[1])
    assert checked.passed and checked.metadata["stored_as"].value == "changes"


def test_a_table_stored_per_date_keeps_its_layout_when_its_config_leaves_storage_unset(spark, warehouse, tmp_path, extracts):
    source = f"{extracts}/{{date}}/"
    per_date = write_table_config(tmp_path / "configs", "synthetic", source, storage={"current": "snapshot"})
    assert run_dates(definitions_for(per_date), DAYS[:1], DagsterInstance.ephemeral())[0].success
    storage = WarehouseStorage(str(warehouse))
    assert storage.stored_state_form("synthetic") is StateForm.snapshot

    # A config that says incremental is refused before anything is written: the table cannot switch.
    switched = write_table_config(tmp_path / "configs", "synthetic", source, storage={"current": "incremental"})
    refused = run_dates(definitions_for(switched), DAYS[1:], DagsterInstance.ephemeral(), raise_on_error=False)[0]
    assert not refused.success
    failures = " ".join(str(event.event_specific_data.error) for event in refused.all_events if event.event_type_value == "STEP_FAILURE")
    assert "synthetic/current_table is stored per date" in failures and "Switching modes" in failures
    assert WarehouseStorage(str(warehouse)).stored_dates("synthetic", CURRENT) == DAYS[:1]

    # Unset, the table runs on in the layout it has: the date stored whole, the stored state's check passed.
    unset = write_table_config(tmp_path / "configs", "synthetic", source)
    result = run_dates(definitions_for(unset), DAYS[1:], DagsterInstance.ephemeral())[0]
    assert result.success
    storage = WarehouseStorage(str(warehouse))
    assert storage.stored_state_form("synthetic") is StateForm.snapshot
    assert storage.stored_dates("synthetic", CURRENT) == DAYS
    assert storage.stored_as("synthetic", CURRENT, DAYS[1]) == "full"
    checked = _stored_state_check(result, DAYS[1])
    assert checked.passed and checked.metadata["stored_as"].value == "full copy"
