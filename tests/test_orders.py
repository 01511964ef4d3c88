"""The hand-written `orders` table shipped in table_configs/: composite key, mixed types, delta load."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path

from dagster import DagsterInstance

from cdc_assets.model.config import load_table_config
from cdc_assets.model.names import CDC_OUTPUTS
from tests.pipeline import definitions_for, operation_counts, partition_dir, read_stored, run_dates, run_range, sorted_rows

REPO = Path(__file__).resolve().parent.parent
DATES = ["2024-01-01", "2024-01-02", "2024-01-03"]


def test_orders_three_days(spark, warehouse, monkeypatch):
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    config = load_table_config(REPO / "table_configs" / "orders.yaml")
    instance = DagsterInstance.ephemeral()
    results = run_dates(definitions_for(config), DATES, instance)

    checks = [e.event_specific_data for r in results for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    # Ten checks a date, and the stored state's (storage.current unset: defined in either layout).
    assert len(checks) == 11 * len(DATES) and all(check.passed for check in checks)

    def counts(asset, day):
        return operation_counts(spark, partition_dir(warehouse, "orders", asset, day))

    assert counts("current_table", DATES[0]) == {"I": 6}
    # 2024-01-02: shipped_at set (U), quantity changed (U), "12.5" vs "12.50" is no change (N), one new line.
    assert counts("current_table", DATES[1]) == {"I": 1, "U": 2, "N": 1, "X": 3}
    assert counts("history_partition", DATES[1]) == {"I": 1, "U": 2}
    assert counts("current_table", DATES[2]) == {"I": 1, "U": 2, "X": 5}
    assert counts("history_partition", DATES[2]) == {"I": 1, "U": 2}
    assert counts("deletes", DATES[2]) == {}  # X is counted, not stored
    assert counts("hash_join_classification", DATES[2]) == {"I": 1, "U": 2}

    current = read_stored(spark, partition_dir(warehouse, "orders", "current_table", DATES[2]))
    rows = {(row.store_code, row.order_id): row for row in current.collect()}
    assert dict(current.dtypes)["amount"] == "decimal(10,2)" and dict(current.dtypes)["order_date"] == "date"
    # Unchanged on 01-02, then not supplied on 01-03: payload and eff_start_date of its last version kept,
    # including the untracked column's value as of 01-02.
    carol = rows[("LON", 1003)]
    assert (carol.operation, carol.eff_start_date.isoformat(), carol.amount) == ("X", "2024-01-01", Decimal("12.50"))
    assert carol.extracted_at == datetime(2024, 1, 2, 23, 0)
    shipped = rows[("PAR", 1002)]
    assert (shipped.operation, shipped.shipped_at, shipped.eff_start_date.isoformat()) == (
        "U", datetime(2024, 1, 3, 11, 30), "2024-01-03"
    )
    assert rows[("NYC", 1001)].note == 'said "leave at door"'  # RFC 4180 doubled quotes
    assert rows[("PAR", 1001)].note == "fragile, handle with care"
    assert rows[("LON", 1001)].note is None  # an empty CSV field reads as NULL


def test_orders_range_in_one_run_equals_day_by_day(spark, tmp_path, monkeypatch):
    # A delta load's range goes date by date inside the run; its outputs must equal one run per date.
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    config = load_table_config(REPO / "table_configs" / "orders.yaml")
    by_day, by_range = tmp_path / "by_day", tmp_path / "by_range"
    monkeypatch.setenv("CDC_WAREHOUSE", str(by_day))
    run_dates(definitions_for(config), DATES)
    monkeypatch.setenv("CDC_WAREHOUSE", str(by_range))
    assert run_range(definitions_for(config), DATES[0], DATES[-1]).success

    for asset in ("hashed_incoming", "rejects", *CDC_OUTPUTS):
        for day in DATES:
            expected = sorted_rows(spark, partition_dir(by_day, "orders", asset, day))
            assert sorted_rows(spark, partition_dir(by_range, "orders", asset, day)) == expected, (asset, day)
