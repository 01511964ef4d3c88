"""``retention.current_days`` also bounds a change set's ``applied_sequences`` (a whole key set per date), and a
re-run outside it fails naming the setting; ``retention.staging_days`` bounds ``late_changes`` with the other
staging outputs. Real Dagster runs: dates 1-3 in one run, then date 4."""

from __future__ import annotations

from datetime import date

import pytest
from dagster import DagsterInstance

from cdc_assets.model.names import APPLIED_SEQUENCES, CLASSIFICATION, CURRENT, HASHED_INCOMING, HISTORY, LATE_CHANGES, REJECTS
from resources.storage import DroppedPartitionError, WarehouseStorage
from tests.pipeline import definitions_for, run_dates, run_range, write_table_config
from tests.test_changeset_chain import COLUMNS, land, rec

TABLE = "t"
D1, D2, D3, D4 = (date(2018, 1, day) for day in (1, 2, 3, 4))


def test_applied_sequences_follow_current_days_and_a_rerun_outside_fails_naming_it(spark, warehouse, tmp_path):
    source = tmp_path / "source"
    for day in (D1, D2, D3, D4):
        land(source, day, [rec("U", 1, day.day, f"{day.isoformat()} 09:00:00"), rec("I", day.day + 1, 0, f"{day.isoformat()} 09:00:00")])
    config = write_table_config(
        tmp_path / "configs", TABLE, f"{source}/{{date}}.csv", start_date=D1.isoformat(), load_type="changeset", **COLUMNS,
        changes={"operation_column": "flag", "sequence_columns": ["cdc_timestamp"]},
        retention={"current_days": 2, "staging_days": 3},
    )
    defs, instance = definitions_for(config), DagsterInstance.ephemeral()
    assert run_range(defs, D1.isoformat(), D3.isoformat(), instance).success  # a range drops nothing of its own
    [day4] = run_dates(defs, [D4.isoformat()], instance)
    assert day4.success
    assert all(evaluation.passed for evaluation in day4.get_asset_check_evaluations())

    storage = WarehouseStorage(str(warehouse))
    kept = [D3.isoformat(), D4.isoformat()]
    assert storage.stored_dates(TABLE, CURRENT) == kept
    assert storage.stored_dates(TABLE, APPLIED_SEQUENCES) == kept
    # Records, not state: current_days leaves late_changes alone; staging_days (3) drops day 1's with the
    # other staging outputs. History keeps every date.
    for asset in (HASHED_INCOMING, REJECTS, CLASSIFICATION, LATE_CHANGES):
        assert storage.stored_dates(TABLE, asset) == [D2.isoformat(), D3.isoformat(), D4.isoformat()], asset
    assert len(storage.stored_dates(TABLE, HISTORY)) == 4
    assert storage.dropped_partition(TABLE, LATE_CHANGES, D1.isoformat())["staging_days"] == 3
    assert storage.dropped_partition(TABLE, APPLIED_SEQUENCES, D2.isoformat())["current_days"] == 2
    with pytest.raises(DroppedPartitionError, match=rf"{TABLE}/{APPLIED_SEQUENCES} has no partition for {D2}: retention.current_days \(2"):
        storage.read_one(spark, TABLE, APPLIED_SEQUENCES, D2.isoformat())

    # Re-running date 3 (with date 4, computed from it) needs the state as of date 2: the run fails naming the setting.
    rerun = run_range(defs, D3.isoformat(), D4.isoformat(), instance, raise_on_error=False)
    assert not rerun.success
    failure = next(event for event in rerun.all_events if event.event_type_value == "STEP_FAILURE")
    assert failure.step_key == f"{TABLE}__cdc"
    assert "retention.current_days (2, in the table config" in failure.step_failure_data.error.to_string()
