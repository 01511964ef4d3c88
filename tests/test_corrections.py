"""Corrections flow forward: a re-run of a date that later stored dates were computed from recomputes them in
the same run, through real Dagster runs of the shipped ``orders`` table on a copy of its sample extracts.
The result is compared with a fresh chain built from the corrected extracts."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance, EventRecordsFilter

from cdc_assets.core.hashing import KEY_HASH
from cdc_assets.model.config import load_table_config
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates

REPO = Path(__file__).resolve().parent.parent
DAY1, DAY2, DAY3 = "2024-01-01", "2024-01-02", "2024-01-03"
COMPARED = ["key_hash", "non_key_hash", "operation", "business_date"]
OUTPUTS = ("hash_join_classification", "inserts", "updates", "deletes", "current_table", "history_partition")


def _rows(spark, root: Path, asset: str, days: list[str]) -> list:
    frame = WarehouseStorage(str(root)).read(spark, "orders", asset, days)
    return sorted(frame.select(*COMPARED).collect())


def _classification(instance: DagsterInstance, day: str) -> dict:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(["orders", "hash_join_classification"]), asset_partitions=[day]), limit=1
    ).records
    return {name: value.value for name, value in records[0].asset_materialization.metadata.items()}


def _evaluations(instance: DagsterInstance) -> list:
    records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ASSET_CHECK_EVALUATION), ascending=True)
    return [record.event_log_entry.dagster_event.event_specific_data for record in records]


def _step_error(result) -> str:
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    error, message = failure.event_specific_data.error, ""
    while error is not None:
        message, error = message + error.message, error.cause
    return message


def test_class_changes_counts_keys_whose_class_differs_or_that_one_side_lacks(spark):
    from cdc_assets.core.capture.corrections import class_changes

    columns = ["key_hash", "operation", "business_date"]
    before = spark.createDataFrame([("a", "U", DAY2), ("b", "N", DAY2), ("c", "D", DAY3), ("d", "I", DAY3)], columns)
    after = spark.createDataFrame([("a", "U", DAY2), ("b", "U", DAY2), ("d", "I", DAY3), ("e", "I", DAY3)], columns)
    before, after = (frame.withColumn("business_date", frame.business_date.cast("date")) for frame in (before, after))
    found = {row.business_date.isoformat(): (row.changed_keys, list(row.sample_key_hashes)) for row in class_changes(before, after).collect()}
    assert found == {DAY2: (1, ["b"]), DAY3: (2, ["c", "e"])}
    assert class_changes(before, after, sample=1).where("business_date = date'2024-01-03'").first().sample_key_hashes == ["c"]


def test_a_corrected_date_recomputes_the_later_dates_in_the_same_run(spark, tmp_path, monkeypatch):
    landing = tmp_path / "data" / "samples" / "orders"
    shutil.copytree(REPO / "samples" / "orders", landing)
    monkeypatch.setenv("CDC_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    defs = definitions_for(load_table_config(REPO / "table_configs" / "orders.yaml"))
    job = defs.resolve_implicit_global_asset_job_def()
    instance = DagsterInstance.ephemeral()
    assert all(result.success for result in run_dates(defs, [DAY1, DAY2, DAY3], instance))
    updates_before = _classification(instance, DAY3)["updates"]
    evaluated_before = len(_evaluations(instance))

    # The switch keeps the refusal: nothing is written, and the message names the range to launch.
    refused = job.execute_in_process(
        partition_key=DAY2, instance=instance, raise_on_error=False,
        run_config={"ops": {"orders__cdc": {"config": {"carry_forward": False}}}},
    )
    assert not refused.success
    assert f"current_table stores {DAY3}" in _step_error(refused) and f"Launch {DAY2}..{DAY3} instead" in _step_error(refused)

    # The source corrects DAY2: NYC 1001's new note was made on DAY2, not DAY3. DAY3 was computed from DAY2's
    # state (it took the note for an update), so the run of DAY2 recomputes DAY3 as well, in the same commits.
    extract = landing / f"{DAY2}.csv"
    extract.write_text(extract.read_text() + 'NYC,1001,frank,1,7.25,2024-01-01,,"said ""leave at door""",2024-01-02 23:00:00\n')
    corrected = job.execute_in_process(partition_key=DAY2, instance=instance)
    assert corrected.success
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    for asset in OUTPUTS:  # one commit per output wrote both dates; an incremental state commits (and tags) a date at a time
        if storage.merged.holds("orders", asset):
            tagged = [storage.merged.summary("orders", asset, day) for day in (DAY2, DAY3)]
            assert [summary["cdc.business-dates"] for summary in tagged] == [DAY2, DAY3], asset
            assert tagged[0]["cdc.run-id"] == tagged[1]["cdc.run-id"] == corrected.run_id, asset
            continue
        summary = storage.tables.load("orders", asset).current_snapshot().summary
        assert summary["cdc.business-dates"] == f"{DAY2},{DAY3}", asset

    # What the correction did, per date, on the classification's materializations: counts and hashes, no values.
    day2, day3 = _classification(instance, DAY2), _classification(instance, DAY3)
    assert day2["correction_changed_keys"] == 1 and day3["correction_changed_keys"] == 1, (day2, day3)
    [changed] = day3["correction_sample_key_hashes"]
    assert day2["correction_sample_key_hashes"] == [changed] and len(changed) == 32
    [key] = storage.read(spark, "orders", "hashed_incoming", [DAY3]).where("store_code = 'NYC' AND order_id = 1001").select(KEY_HASH).collect()
    assert key[KEY_HASH] == changed
    history = [row.operation for row in _rows(spark, tmp_path / "warehouse", "history_partition", [DAY2, DAY3]) if row[KEY_HASH] == changed]
    assert history == ["U"]  # an update on DAY2 now, none on DAY3
    # The carried date's own materialization records its new figures: one update fewer.
    assert day3["updates"] == updates_before - 1 and "dagster/row_count" in day3

    # DAY3's checks, which the run's check steps do not target, were evaluated again on what is stored now.
    since = _evaluations(instance)[evaluated_before:]
    on_day3 = [e for e in since if e.partition == DAY3]
    assert {e.check_name for e in on_day3} >= {"row_count_reconciles", "previous_state_reconciles"} and all(e.passed for e in on_day3), on_day3

    # Equal to a fresh chain built from the corrected extracts.
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "fresh"))
    assert all(result.success for result in run_dates(defs, [DAY1, DAY2, DAY3], DagsterInstance.ephemeral()))
    for asset in OUTPUTS:
        assert _rows(spark, tmp_path / "warehouse", asset, [DAY2, DAY3]) == _rows(spark, tmp_path / "fresh", asset, [DAY2, DAY3]), asset
