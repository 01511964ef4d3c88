"""The asset graph end to end: real Dagster runs, the project's IO manager, real Spark, Parquet on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
from pyiceberg.catalog import load_catalog
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from cdc_assets.cli.generate import generate
from resources.storage import WarehouseStorage
from resources.storage.lake import pyiceberg_properties
from tests.pipeline import (
    add_backfill,
    definitions_for,
    operation_counts,
    partition_dir,
    read_stored,
    run_dates,
    run_range,
    sorted_rows,
    write_table_config,
)

DAY1, DAY2, DAY3 = "2019-06-18", "2019-06-19", "2019-06-20"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def seed_data(tmp_path_factory) -> Path:
    """The seed's scenario: 10,000 + 10,000 rows, 5 keys, 10 non-keys, 20% deleted, 40% updated, 40% unchanged.

    A third day is derived from day 2: 500 rows deleted, 1,000 updated, 700 inserted.
    """
    root = tmp_path_factory.mktemp("source")
    generate(10_000, 10_000, 5, 10, 0.2, 0.4, 0.4, root / DAY1, root / DAY2, seed=11)
    day2 = pacsv.read_csv(root / DAY2 / "part-00000.csv", convert_options=pacsv.ConvertOptions(strings_can_be_null=False))
    kept = day2.slice(500)  # the first 500 are deleted
    updated = kept.slice(0, 1000).set_column(
        kept.schema.get_field_index("nonkey_1"), "nonkey_1", pc.add(kept.slice(0, 1000)["nonkey_1"], 1.0)
    )
    new_rows = day2.slice(0, 700)
    for i in range(1, 6):  # fresh keys for the inserted rows
        index = new_rows.schema.get_field_index(f"key_{i}")
        new_rows = new_rows.set_column(index, f"key_{i}", pc.binary_join_element_wise(new_rows[f"key_{i}"], "-day3", ""))
    day3 = pa.concat_tables([updated, kept.slice(1000), new_rows])
    (root / DAY3).mkdir()
    pacsv.write_csv(day3, root / DAY3 / "part-00000.csv")
    return root


def _config(tmp_path: Path, seed_data: Path, name: str = "synthetic", **fields):
    return write_table_config(tmp_path / "configs", name, f"{seed_data}/{{date}}/", **fields)


class DayByDay:
    """The seed's full load run one date at a time over DAY1..DAY3, in a warehouse of the module's own."""

    def __init__(self, root: Path, seed_data: Path):
        self.warehouse = root / "warehouse"
        self.warehouse.mkdir()
        self.config = _config(root, seed_data)
        self.instance = DagsterInstance.ephemeral()
        self.results = run_dates(definitions_for(self.config), [DAY1, DAY2, DAY3], self.instance)


@pytest.fixture(scope="module")
def day_by_day(spark, seed_data, tmp_path_factory):
    """One day-by-day chain that several tests read, instead of one chain each. Only the last test of the
    module that uses it writes to it: a re-run of DAY2, which leaves every column but the audit ones as
    they were (what that test asserts); no other test reads the audit columns of DAY2."""
    root = tmp_path_factory.mktemp("day_by_day")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_WAREHOUSE", str(root / "warehouse"))
        chain = DayByDay(root, seed_data)
    assert all(result.success for result in chain.results)
    return chain


def test_seed_scenario_full_load(spark, day_by_day):
    warehouse, instance = day_by_day.warehouse, day_by_day.instance

    current = partition_dir(warehouse, "synthetic", "current_table", DAY2)
    assert operation_counts(spark, current) == {"U": 4000, "N": 4000, "I": 2000}
    unchanged_dates = read_stored(spark, current).filter("operation = 'N'").select("eff_start_date").distinct().collect()
    assert [row[0].isoformat() for row in unchanged_dates] == [DAY1]
    assert operation_counts(spark, partition_dir(warehouse, "synthetic", "history_partition", DAY2)) == {
        "I": 2000,
        "U": 4000,
        "D": 2000,
    }
    # Day 1 stays readable as it was: every row an insert.
    assert operation_counts(spark, partition_dir(warehouse, "synthetic", "current_table", DAY1)) == {"I": 10000}

    # Materialization metadata: each asset reports its own counts for the date.
    def metadata(asset: str) -> dict:
        records = instance.fetch_materializations(AssetRecordsFilter(AssetKey(["synthetic", asset]), asset_partitions=[DAY2]), limit=1).records
        assert records and records[0].asset_materialization.partition == DAY2
        return {key: value.value for key, value in records[0].asset_materialization.metadata.items()}

    assert metadata("inserts")["dagster/row_count"] == 2000
    assert metadata("updates")["dagster/row_count"] == 4000
    assert metadata("deletes")["dagster/row_count"] == 2000
    assert metadata("current_table")["dagster/row_count"] == 10000
    assert metadata("current_table")["unchanged"] == 4000
    assert metadata("history_partition")["dagster/row_count"] == 8000
    assert metadata("hash_join_classification")["dagster/row_count"] == 12000
    assert metadata("hashed_incoming")["rows_read"] == 10000
    assert metadata("rejects")["dagster/row_count"] == 0
    current_metadata = metadata("current_table")
    assert [column.name for column in current_metadata["dagster/column_schema"].columns][-6:] == [
        "key_hash", "non_key_hash", "operation", "eff_start_date", "process_id", "processed_at"
    ]
    assert current_metadata["preview"].count("\n") == 1 + 5  # header, separator and five rows
    assert current_metadata["path"].endswith("synthetic/current_table/data/business_date=2019-06-19")


def test_output_schema_and_history_as_one_dataset(spark, day_by_day):
    warehouse = day_by_day.warehouse
    current = read_stored(spark, partition_dir(warehouse, "synthetic", "current_table", DAY2))
    expected = [f"key_{i}" for i in range(1, 6)] + [f"nonkey_{i}" for i in range(1, 11)]
    assert current.columns == [*expected, "key_hash", "non_key_hash", "operation", "eff_start_date", "process_id", "processed_at"]
    types = dict(current.dtypes)
    assert types["nonkey_1"] == "double" and types["eff_start_date"] == "date" and types["processed_at"] == "timestamp"
    history = read_stored(spark, partition_dir(warehouse, "synthetic", "history_partition", DAY2))
    assert history.columns == [*current.columns, "changed_columns"]
    assert dict(history.dtypes)["changed_columns"] == "array<string>"
    assert current.filter("key_hash not rlike '^[0-9a-f]{32}$' or non_key_hash not rlike '^[0-9a-f]{32}$'").count() == 0

    # Every date at once: the Iceberg table in the warehouse's catalog.
    history = WarehouseStorage(str(warehouse)).tables.session_for(spark).table("lake.synthetic.history_partition")
    by_date = {(row[0].isoformat(), row[1]): row[2] for row in history.groupBy("business_date", "operation").count().collect()}
    assert by_date == {
        (DAY1, "I"): 10000, (DAY2, "I"): 2000, (DAY2, "U"): 4000, (DAY2, "D"): 2000, (DAY3, "I"): 700, (DAY3, "U"): 1000, (DAY3, "D"): 500,
    }  # fmt: skip
    # The same table read outside Spark: pyiceberg's scan, queried in DuckDB.
    rows = load_catalog("lake", **pyiceberg_properties(str(warehouse))).load_table("synthetic.history_partition").scan().to_arrow()  # noqa: F841 — DuckDB reads it by name
    duck = duckdb.sql("select cast(business_date as varchar), count(*) from rows group by 1 order by 1").fetchall()
    assert duck == [(DAY1, 10000), (DAY2, 8000), (DAY3, 2200)]


def test_seed_scenario_delta_load(spark, warehouse, tmp_path, seed_data):
    defs = definitions_for(_config(tmp_path, seed_data, name="synthetic_delta", load_type="delta"))
    run_dates(defs, [DAY1, DAY2])

    current = partition_dir(warehouse, "synthetic_delta", "current_table", DAY2)
    assert operation_counts(spark, current) == {"U": 4000, "N": 4000, "I": 2000, "X": 2000}
    not_supplied = read_stored(spark, current).filter("operation = 'X'")
    assert [row[0].isoformat() for row in not_supplied.select("eff_start_date").distinct().collect()] == [DAY1]
    assert operation_counts(spark, partition_dir(warehouse, "synthetic_delta", "history_partition", DAY2)) == {
        "I": 2000,
        "U": 4000,
    }
    # The 2,000 X keys are in current_table; deletes and the classification hold the touched keys only.
    assert operation_counts(spark, partition_dir(warehouse, "synthetic_delta", "deletes", DAY2)) == {}
    classified = partition_dir(warehouse, "synthetic_delta", "hash_join_classification", DAY2)
    assert operation_counts(spark, classified) == {"U": 4000, "N": 4000, "I": 2000}


def _snapshot(spark, warehouse: Path, table: str, with_audit: bool = False) -> dict[tuple[str, str], list[tuple]]:
    snapshot = {}
    storage = WarehouseStorage(str(warehouse))
    for asset in storage.stored_assets(table):
        for day in storage.stored_dates(table, asset):
            snapshot[(asset, f"business_date={day}")] = sorted_rows(spark, partition_dir(warehouse, table, asset, day), with_audit=with_audit)
    return snapshot


def _writers(spark, warehouse: Path, asset: str, day: str) -> set[tuple[str, str]]:
    """(operation, process_id) pairs of a stored partition."""
    frame = read_stored(spark, partition_dir(warehouse, "synthetic", asset, day))
    return {(row[0], row[1]) for row in frame.select("operation", "process_id").distinct().collect()}


def test_range_in_one_run_equals_day_by_day(spark, tmp_path, day_by_day, monkeypatch, generated_code):
    """The range runs with generated code, as the product does; the day-by-day chain (the suite's default)
    interpreted: the two must write the same rows (tests/codegen.py)."""
    config = day_by_day.config
    by_day, by_range = day_by_day.warehouse, tmp_path / "by_range"
    monkeypatch.setenv("CDC_WAREHOUSE", str(by_range))
    instance = DagsterInstance.ephemeral()
    result = run_range(definitions_for(config), DAY1, DAY3, instance)
    assert result.success

    assert _snapshot(spark, by_range, "synthetic") == _snapshot(spark, by_day, "synthetic")
    # One materialization per date, each with that date's own counts.
    records = instance.fetch_materializations(AssetKey(["synthetic", "history_partition"]), limit=10).records
    counts = {r.asset_materialization.partition: r.asset_materialization.metadata["dagster/row_count"].value for r in records}
    assert counts == {DAY1: 10000, DAY2: 8000, DAY3: 2200}
    # Each date's preview shows that date's rows: a history row's eff_start_date is its business date.
    for record in records:
        day, preview = record.asset_materialization.partition, record.asset_materialization.metadata["preview"].value
        assert preview.count("\n") == 1 + 5
        assert day in preview and not any(other in preview for other in {DAY1, DAY2, DAY3} - {day}), day


def test_a_range_starts_from_the_state_an_earlier_separate_run_stored(spark, tmp_path, day_by_day, monkeypatch):
    """Not from nothing: DAY1 alone, then DAY2..DAY3 as one range, equal the day-by-day chain."""
    config = day_by_day.config
    instance = DagsterInstance.ephemeral()
    after_day1 = tmp_path / "after_day1"
    monkeypatch.setenv("CDC_WAREHOUSE", str(after_day1))
    run_dates(definitions_for(config), [DAY1], instance)
    assert run_range(definitions_for(config), DAY2, DAY3, instance).success
    assert _snapshot(spark, after_day1, "synthetic") == _snapshot(spark, day_by_day.warehouse, "synthetic")


def test_third_day_and_rerunning_a_middle_day_is_idempotent(spark, day_by_day, monkeypatch):
    """Last of the tests that read ``day_by_day``: it re-runs DAY2 there, in a backfill of DAY2..DAY3."""
    warehouse, instance, first = day_by_day.warehouse, day_by_day.instance, day_by_day.results
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    defs = definitions_for(day_by_day.config)

    assert operation_counts(spark, partition_dir(warehouse, "synthetic", "history_partition", DAY3)) == {
        "D": 500,
        "U": 1000,
        "I": 700,
    }
    current3 = operation_counts(spark, partition_dir(warehouse, "synthetic", "current_table", DAY3))
    assert current3 == {"U": 1000, "I": 700, "N": 10000 - 500 - 1000}
    first_runs = [result.run_id for result in first]  # DAY1, DAY2, DAY3
    # Audit columns: history rows carry the run that wrote the date; current rows the run that
    # started their version, so N rows keep it from an earlier date, as eff_start_date does.
    assert _writers(spark, warehouse, "history_partition", DAY3) == {(op, first_runs[2]) for op in "IUD"}
    assert _writers(spark, warehouse, "current_table", DAY3) == {
        ("I", first_runs[2]), ("U", first_runs[2]), ("N", first_runs[1]), ("N", first_runs[0]),
    }
    before = _snapshot(spark, warehouse, "synthetic")
    audited_before = _snapshot(spark, warehouse, "synthetic", with_audit=True)
    storage = WarehouseStorage(str(warehouse))
    day1_files = sorted(storage.tables.live_files("synthetic", "current_table", [DAY1]))

    # DAY3 was computed from DAY2's state, so DAY2 is re-run in a backfill of DAY2..DAY3 (alone it is
    # refused: tests/test_rerun.py). Its writes drop DAY3, which the backfill's next run writes again.
    backfill = add_backfill(defs, [DAY2, DAY3], instance)
    (rerun,) = run_dates(defs, [DAY2], instance, backfill_id=backfill)
    assert not storage.has_partition("synthetic", "current_table", DAY3)
    # Each table's newest snapshot says who wrote which dates.
    summary = storage.tables.load("synthetic", "history_partition").current_snapshot().summary
    assert (summary["cdc.run-id"], summary["cdc.business-dates"], summary["cdc.dropped-dates"]) == (rerun.run_id, DAY2, DAY3)
    assert "added-records=8000" in summary[f"partitions.business_date={DAY2}"].split(",")
    (rerun3,) = run_dates(defs, [DAY3], instance, backfill_id=backfill)

    # Identical outputs but for the audit columns, and those only on the rows the re-runs wrote.
    after = _snapshot(spark, warehouse, "synthetic")
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] == before[key], f"{key} changed after re-running {DAY2}"
    audited_after = _snapshot(spark, warehouse, "synthetic", with_audit=True)
    rewritten = {key for key in audited_before if audited_after[key] != audited_before[key]}
    audited = ("inserts", "deletes", "updates", "current_table", "history_partition")
    assert rewritten == {(asset, f"business_date={day}") for asset in audited for day in (DAY2, DAY3)}
    assert _writers(spark, warehouse, "history_partition", DAY2) == {(op, rerun.run_id) for op in "IUD"}
    assert _writers(spark, warehouse, "current_table", DAY2) == {("I", rerun.run_id), ("U", rerun.run_id), ("N", first_runs[0])}
    processed_at = read_stored(spark, partition_dir(warehouse, "synthetic", "history_partition", DAY2))
    started = instance.get_run_record_by_id(rerun.run_id).start_time
    stamps = [row[0].timestamp() for row in processed_at.select("processed_at").distinct().collect()]
    assert len(stamps) == 1 and stamps[0] == pytest.approx(started, abs=1e-3)  # the run's start
    # Re-running days 2 and 3 rewrote those only: day 1's files are the very same files.
    assert sorted(storage.tables.live_files("synthetic", "current_table", [DAY1])) == day1_files
    assert _writers(spark, warehouse, "history_partition", DAY3) == {(op, rerun3.run_id) for op in "IUD"}


def test_a_date_whose_previous_state_is_missing_fails_clearly(spark, warehouse, tmp_path, seed_data):
    defs = definitions_for(_config(tmp_path, seed_data))
    [result] = run_dates(defs, [DAY2], raise_on_error=False)
    assert not result.success
    failure = next(event for event in result.all_events if event.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.to_string()
    assert "current_table has no partition for 2019-06-18" in message
    assert not partition_dir(warehouse, "synthetic", "current_table", DAY2).exists()


@pytest.mark.slow
def test_definitions_load_from_workspace_yaml(tmp_path):
    # A throwaway instance: the CLI refuses a DAGSTER_HOME that does not exist (as in a fresh clone).
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    completed = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env={**os.environ, "DAGSTER_HOME": str(dagster_home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "Validation successful" in completed.stdout + completed.stderr
