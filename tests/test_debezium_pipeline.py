"""Debezium change events through the real asset graph: the shipped `customers_debezium` table, and the
hand-written edge cases of tests/data/debezium (a PK-less truncate, bad lines, tombstones, a repeat)."""

from __future__ import annotations

from pathlib import Path

import yaml
from dagster import DagsterInstance

from cdc_assets.model.config import load_table_config
from tests.pipeline import definitions_for, operation_counts, partition_dir, read_stored, run_dates

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DATES = ["2024-03-01", "2024-03-02", "2024-03-03"]


def _metadata(results, asset: str, day: str) -> dict:
    for result in results:
        for event in result.get_asset_materialization_events():
            materialization = event.event_specific_data.materialization
            if materialization.asset_key.path[-1] == asset and materialization.partition == day:
                return {name: value.value for name, value in materialization.metadata.items()}
    raise AssertionError(f"no materialization of {asset} for {day}")


def _checks(results) -> list:
    return [e.event_specific_data for r in results for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]


def _ids(spark, warehouse: Path, table: str, asset: str, day: str, key: str) -> dict[int, str]:
    frame = read_stored(spark, partition_dir(warehouse, table, asset, day))
    return {row[key]: row["operation"] for row in frame.collect()}


def test_customers_debezium_sample(spark, warehouse, monkeypatch):
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    config = load_table_config(REPO / "table_configs" / "customers_debezium.yaml")
    results = run_dates(definitions_for(config), SAMPLE_DATES, DagsterInstance.ephemeral())
    checks = _checks(results)
    # Ten checks a date, and the stored state's (storage.current unset: defined in either layout).
    assert len(checks) == 11 * len(SAMPLE_DATES) and all(check.passed for check in checks)

    def current(day):
        return _ids(spark, warehouse, "customers_debezium", "current_table", day, "customer_id")

    # Day 1: the snapshot (r) and the day's changes; customer 5 is created by the snapshot and
    # deleted the same day (no earlier state): no trace. Customer 1's update arrives twice.
    assert current(SAMPLE_DATES[0]) == {1: "I", 2: "I", 3: "I", 4: "I", 6: "I", 7: "I", 8: "I"}
    day1 = _metadata(results, "hash_join_classification", SAMPLE_DATES[0])
    assert (day1["duplicate_events"], day1["deletes_of_unknown_keys"]) == (1, 1)
    intake = _metadata(results, "hashed_incoming", SAMPLE_DATES[0])
    assert (intake["rows_read"], intake["tombstone_lines"], intake["rows_rejected"]) == (14, 1, 0)

    # Day 2: customer 3 is deleted with a key-only `before`; history's D row carries its payload from current.
    day2 = current(SAMPLE_DATES[1])
    assert 3 not in day2 and day2[9] == "I" and day2[10] == "I" and day2[7] == "U" and day2[4] == "X"
    history = read_stored(spark, partition_dir(warehouse, "customers_debezium", "history_partition", SAMPLE_DATES[1]))
    deleted = history.filter("operation = 'D'").collect()
    assert [(row.customer_id, row.name, row.email) for row in deleted] == [(3, "Grace Hopper", "grace@example.com")]

    # Day 3: customer 3 is created again (I), 9 and 7 are deleted.
    day3 = current(SAMPLE_DATES[2])
    assert sorted(day3) == [1, 2, 3, 4, 6, 8, 10, 11]
    assert day3[3] == "I" and day3[11] == "I" and day3[8] == "U"
    assert operation_counts(spark, partition_dir(warehouse, "customers_debezium", "history_partition", SAMPLE_DATES[2]))["D"] == 2
    stored = read_stored(spark, partition_dir(warehouse, "customers_debezium", "current_table", SAMPLE_DATES[2]))
    assert dict(stored.dtypes)["balance"] == "decimal(12,2)" and dict(stored.dtypes)["birth_date"] == "date"
    assert "change_flag" not in stored.columns


def test_debezium_truncate_bad_lines_and_tombstones(spark, warehouse, tmp_path):
    document = {
        "name": "events",
        "start_date": "2024-03-01",
        "load_type": "changeset",
        "source": {"path": str(REPO / "tests" / "data" / "debezium" / "{date}.jsonl"), "format": "debezium",
                   "options": {"timestamp_unit": "millis"}},  # bare events' timestamps carry no schema
        "keys": [{"name": "id", "type": "int"}],
        "non_keys": [
            {"name": "name", "type": "string"},
            {"name": "active", "type": "boolean"},
            {"name": "birth_date", "type": "date"},
            {"name": "balance", "type": "decimal(12,2)"},
            {"name": "updated_at", "type": "timestamp"},
        ],
        "changes": {"sequence_columns": ["source.lsn"]},
    }
    path = tmp_path / "events.yaml"
    path.write_text(yaml.safe_dump(document))
    config = load_table_config(path)
    days = ["2024-03-01", "2024-03-02"]
    results = run_dates(definitions_for(config), days, DagsterInstance.ephemeral())
    assert all(check.passed for check in _checks(results))

    # Day 1: the truncate at lsn 1600 supersedes every record before it (keys 1, 2, 3: never in
    # current, so no trace, not even a delete of an unknown key); 10 and 12 come after it. Four lines
    # are bad, two are tombstones, one a repeat.
    assert _ids(spark, warehouse, "events", "current_table", days[0], "id") == {10: "I", 12: "I"}
    intake = _metadata(results, "hashed_incoming", days[0])
    assert (intake["rows_read"], intake["rows_rejected"], intake["tombstone_lines"], intake["rows_accepted"]) == (16, 4, 2, 10)
    rejects = read_stored(spark, partition_dir(warehouse, "events", "rejects", days[0])).collect()
    assert len(rejects) == 4 and all(row.reason and row.raw_record is not None for row in rejects)
    figures = _metadata(results, "hash_join_classification", days[0])
    # Winners: 10, 12 and the truncate; superseded: the six records before the truncate.
    assert (figures["winners"], figures["superseded"], figures["duplicate_events"], figures["truncates"]) == (3, 6, 1, 1)
    assert figures["deletes_of_unknown_keys"] == 0
    incoming = read_stored(spark, partition_dir(warehouse, "events", "hashed_incoming", days[0]))
    assert incoming.filter("change_flag = 'T'").count() == 1 and incoming.count() == 10

    # Day 2: key 1's update is newer than the truncate (the table's floor): inserted again; key 3's
    # delete is of a key current does not hold.
    assert _ids(spark, warehouse, "events", "current_table", days[1], "id") == {1: "I", 4: "I", 10: "X", 12: "X"}
    assert _metadata(results, "hash_join_classification", days[1])["deletes_of_unknown_keys"] == 1
