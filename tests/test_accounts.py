"""The hand-written `accounts` table shipped in table_configs/: a flagged change set (seed 003's shape)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from dagster import DagsterInstance

from cdc_assets.model.config import load_table_config
from cdc_assets.model.names import APPLIED_SEQUENCES, CDC_OUTPUTS, LATE_CHANGES
from tests.pipeline import definitions_for, operation_counts, partition_dir, read_stored, run_dates, run_range, sorted_rows

REPO = Path(__file__).resolve().parent.parent
DATES = ["2024-02-01", "2024-02-02", "2024-02-03"]


def _materialization_metadata(results, asset: str, day: str) -> dict:
    for result in results:
        for event in result.get_asset_materialization_events():
            materialization = event.event_specific_data.materialization
            if materialization.asset_key.path[-1] == asset and materialization.partition == day:
                return {name: value.value for name, value in materialization.metadata.items()}
    raise AssertionError(f"no materialization of {asset} for {day}")


@pytest.fixture(scope="module")
def by_day(spark, tmp_path_factory):
    """The shipped table run one date at a time into a warehouse both tests read; (warehouse, results)."""
    warehouse = tmp_path_factory.mktemp("accounts") / "warehouse"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_DATA_ROOT", str(REPO))
        patch.setenv("CDC_WAREHOUSE", str(warehouse))
        config = load_table_config(REPO / "table_configs" / "accounts.yaml")
        results = run_dates(definitions_for(config), DATES, DagsterInstance.ephemeral())
    return warehouse, results


def test_accounts_three_days(spark, by_day):
    warehouse, results = by_day
    assert all(result.success for result in results)

    checks = [e.event_specific_data for r in results for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert {check.check_name for check in checks} >= {"records_reconcile", "previous_plus_changes", "rows_read_reconcile"}
    assert checks and all(check.passed for check in checks)

    def counts(asset, day):
        return operation_counts(spark, partition_dir(warehouse, "accounts", asset, day))

    def current(day):
        frame = read_stored(spark, partition_dir(warehouse, "accounts", "current_table", day))
        return {row.account_id: row for row in frame.collect()}

    # Day 1: four inserts; 1002's earlier record is superseded by its later update.
    assert counts("current_table", DATES[0]) == {"I": 4}
    assert current(DATES[0])[1002].balance == Decimal("80.50")
    day1 = _materialization_metadata(results, "hash_join_classification", DATES[0])
    assert (day1["winners"], day1["superseded"], day1["late"]) == (4, 1, 0)

    # Day 2: 1005 is inserted, updated and deleted within the day (no trace); 1001's update arrives
    # twice (one duplicate event); 1004 is deleted; 1003's record repeats its payload (N); 1002 is X.
    assert counts("current_table", DATES[1]) == {"U": 1, "N": 1, "X": 1}
    assert counts("history_partition", DATES[1]) == {"U": 1, "D": 1}
    day2 = current(DATES[1])
    assert 1005 not in day2 and 1004 not in day2
    assert day2[1003].operation == "N" and day2[1003].eff_start_date.isoformat() == DATES[0]
    assert day2[1003].changed_at == datetime(2024, 2, 2, 12, 0)  # N takes the winner's untracked values
    figures = _materialization_metadata(results, "hash_join_classification", DATES[1])
    assert (figures["duplicate_events"], figures["deletes_of_unknown_keys"], figures["superseded"]) == (1, 1, 2)
    history = read_stored(spark, partition_dir(warehouse, "accounts", "history_partition", DATES[1]))
    deleted = history.filter("operation = 'D'").collect()
    assert [(row.account_id, row.balance, row.status) for row in deleted] == [(1004, Decimal("0.00"), "open")]
    incoming = read_stored(spark, partition_dir(warehouse, "accounts", "hashed_incoming", DATES[1]))
    assert incoming.count() == 7  # every accepted record of the day, the repeat included
    assert sorted(row.change_flag for row in incoming.filter("account_id = 1005").collect()) == ["D", "I", "U"]

    # Day 3: 1004's update is older than its delete (a tombstone): late, not a resurrection; 1001's
    # update is older than the one applied on day 2: late.
    day3 = current(DATES[2])
    assert sorted(day3) == [1001, 1002, 1003, 1006]
    assert (day3[1001].balance, day3[1001].operation) == (Decimal("150.00"), "X")
    assert (day3[1002].balance, day3[1002].operation) == (Decimal("90.00"), "U")
    late = read_stored(spark, partition_dir(warehouse, "accounts", LATE_CHANGES, DATES[2]))
    assert sorted((row.account_id, row.reason) for row in late.collect()) == [(1001, "late"), (1004, "late")]
    applied = {row.account_id: row.applied_sequence.changed_at for row in late.collect()}
    assert applied == {1001: datetime(2024, 2, 2, 10, 0), 1004: datetime(2024, 2, 2, 11, 0)}
    tombstones = read_stored(spark, partition_dir(warehouse, "accounts", APPLIED_SEQUENCES, DATES[2]))
    assert tombstones.filter("deleted").count() == 2  # 1004 and 1005


def test_accounts_range_in_one_run_equals_day_by_day(spark, tmp_path, monkeypatch, by_day):
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    config = load_table_config(REPO / "table_configs" / "accounts.yaml")
    (by_day, results), by_range = by_day, tmp_path / "by_range"
    assert all(result.success for result in results)
    monkeypatch.setenv("CDC_WAREHOUSE", str(by_range))
    assert run_range(definitions_for(config), DATES[0], DATES[-1]).success
    for asset in (*CDC_OUTPUTS, LATE_CHANGES, APPLIED_SEQUENCES):
        for day in DATES:
            assert sorted_rows(spark, partition_dir(by_range, "accounts", asset, day)) == sorted_rows(
                spark, partition_dir(by_day, "accounts", asset, day)
            ), (asset, day)
