"""Each reconciliation check passes on good data and fails on a partition broken on purpose in storage."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from dagster import AssetKey, AssetSelection, DagsterInstance, define_asset_job
from pyspark.sql import functions as F

from cdc_assets.model.config import StateForm, load_table_config
from cdc_assets.defs.component import build_definitions
from cdc_assets.defs.factory import build_table_definitions
from resources.storage import WarehouseStorage
from resources.storage.lake import CATALOG_NAME
from tests.pipeline import partition_dir, read_stored, run_dates

REPO = Path(__file__).resolve().parent.parent
DAY1, DAY2 = "2024-01-01", "2024-01-02"
ALL_CHECKS = {
    ("hashed_incoming", "rows_read_reconcile"),
    ("hashed_incoming", "keys_unique"),
    ("hashed_incoming", "no_erased_keys_in_extract"),
    ("hash_join_classification", "incoming_reconciles"),
    ("hash_join_classification", "previous_state_reconciles"),
    ("current_table", "row_count_reconciles"),
    ("current_table", "key_hash_unique"),
    ("current_table", "keys_not_null"),
    ("history_partition", "row_count_reconciles"),
    ("updates", "no_update_without_change"),
}


@pytest.fixture(scope="module")
def orders_warehouse(spark, tmp_path_factory):
    """Two good days of the shipped orders table, materialized once; a test breaks it and
    :func:`warehouse` puts every asset back at its good snapshot afterwards."""
    root = tmp_path_factory.mktemp("checks_good")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_DATA_ROOT", str(REPO))
        patch.setenv("CDC_WAREHOUSE", str(root))
        instance = DagsterInstance.ephemeral()
        # What Dagster's executor logs of the steps (not run events: Python logging), for the gating test below.
        executor_log = logging.getLogger("dagster._core.execution.plan.active")
        warnings: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
        executor_log.addHandler(handler)
        try:
            results = run_dates(_defs(), [DAY1, DAY2], instance)
        finally:
            executor_log.removeHandler(handler)
    evaluations = [e.event_specific_data for r in results for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    outputs = [(e.step_key, e.event_specific_data.step_output_handle.output_name) for r in results for e in r.all_events if e.event_type_value == "STEP_OUTPUT"]
    return root, instance, evaluations, outputs, warnings


def _defs():
    # Stored per date, pinned: a test breaks a date by writing its partition again (_break). The checks of
    # an incremental state run in tests/test_incremental_state.py and fail in tests/test_reconcile.py.
    config = load_table_config(REPO / "table_configs" / "orders.yaml").with_state_stored(StateForm.snapshot)
    assert config.storage.current is StateForm.snapshot  # the shipped config leaves it unset
    table = build_table_definitions(config)
    checks_only = define_asset_job(
        "checks_only", selection=AssetSelection.all_asset_checks(), partitions_def=table.partitions_def
    )
    # The intake checks and the CDC step, without re-reading the source: a failed blocking check must stop the step.
    gated = define_asset_job(
        "gated_cdc",
        selection=AssetSelection.checks_for_assets(AssetKey(["orders", "hashed_incoming"]))
        | AssetSelection.assets(AssetKey(["orders", "current_table"])).required_multi_asset_neighbors(),
        partitions_def=table.partitions_def,
    )
    table.jobs += [checks_only, gated]
    return build_definitions([table])


def test_every_check_passes_on_good_data(orders_warehouse):
    _, _, evaluations, _, _ = orders_warehouse
    seen = {(e.asset_key.path[1], e.check_name, e.partition) for e in evaluations if e.passed}
    assert seen == {(asset, name, day) for asset, name in ALL_CHECKS for day in (DAY1, DAY2)}
    assert all(e.passed for e in evaluations)


def test_each_check_step_tells_dagster_each_check_ran_so_no_blocking_check_is_said_ungated(orders_warehouse):
    """Dagster gates the steps after a blocking check on the check's output: a check step that yields only
    its evaluations (one per date) left Dagster warning, at every run, that each blocking check "emitted no
    result" and the next step "will proceed without gating on it". Each check's output is yielded once."""
    _, _, _, outputs, warnings = orders_warehouse
    checks = {f"orders__{asset}_{name}" for asset, name in ALL_CHECKS}
    told = [(step, output) for step, output in outputs if output in checks]
    assert sorted(output for _, output in told) == sorted([*checks, *checks])  # each check, once a run, two runs
    assert {step for step, _ in told} == {"orders__intake_checks", "orders__cdc_checks"}
    assert not [message for message in warnings if "emitted no result" in message], warnings


def _duplicate_a_row(frame):
    return frame.unionByName(frame.limit(1))


def _null_a_key(frame):
    first = frame.limit(1).withColumn("store_code", F.lit(None).cast("string"))
    return frame.exceptAll(frame.limit(1)).unionByName(first)


def _drop_a_row(frame):
    return frame.exceptAll(frame.limit(1))


def _unname_the_changes(frame):
    from pyspark.sql import functions as F

    return frame.withColumn("changed_columns", F.array().cast("array<string>"))


def _drop_an_update(frame):
    return frame.exceptAll(frame.filter("operation = 'U'").limit(1))


BREAKAGES = [
    # (asset, date, how, checks that must fail)
    ("current_table", DAY2, _duplicate_a_row, {("current_table", "row_count_reconciles"), ("current_table", "key_hash_unique")}),
    ("current_table", DAY2, _null_a_key, {("current_table", "keys_not_null")}),
    ("history_partition", DAY2, _drop_a_row, {("history_partition", "row_count_reconciles")}),
    ("updates", DAY2, _unname_the_changes, {("updates", "no_update_without_change")}),
    ("hash_join_classification", DAY2, _drop_an_update, {
        ("hash_join_classification", "incoming_reconciles"),
        ("hash_join_classification", "previous_state_reconciles"),
        ("current_table", "row_count_reconciles"),
        ("history_partition", "row_count_reconciles"),
    }),
    ("current_table", DAY1, _drop_a_row, {("hash_join_classification", "previous_state_reconciles")}),
    ("hashed_incoming", DAY2, _duplicate_a_row, {
        ("hashed_incoming", "rows_read_reconcile"),
        ("hashed_incoming", "keys_unique"),
        ("hash_join_classification", "incoming_reconciles"),
    }),
    ("rejects", DAY2, lambda frame: frame.unionByName(
        frame.sparkSession.createDataFrame([("x", "made up", "f")], frame.schema)), {("hashed_incoming", "rows_read_reconcile")}),
]


def _break(spark, warehouse: Path, asset: str, day: str, how) -> None:
    """Replace the stored date with a broken copy of its rows: one Iceberg commit, as a run's write."""
    storage = WarehouseStorage(str(warehouse), run_id="breaking-on-purpose")
    broken = how(read_stored(spark, partition_dir(warehouse, "orders", asset, day))).withColumn("business_date", F.lit(day).cast("date"))
    # In the table's column order (hashed_incoming stores business_date among the extract's columns), and
    # materialized before the date is replaced.
    broken = broken.select(*[column.name for column in storage.tables.load("orders", asset).schema().fields]).localCheckpoint()
    try:
        storage.write(broken, "orders", asset, [day])
    finally:
        storage.release()


def _current_snapshots(storage: WarehouseStorage) -> dict[str, int]:
    return {asset: storage.tables.load("orders", asset).current_snapshot().snapshot_id for asset in storage.stored_assets("orders")}


@pytest.fixture
def warehouse(spark, orders_warehouse, monkeypatch):
    """The good warehouse, to break; afterwards each asset is set back to the snapshot it had (the Iceberg
    tables' locations are absolute paths in their metadata: a copied warehouse would still write into this one)."""
    good, *_ = orders_warehouse
    monkeypatch.setenv("CDC_WAREHOUSE", str(good))
    storage = WarehouseStorage(str(good))
    before = _current_snapshots(storage)
    yield good
    session = storage.tables.session_for(spark)
    for asset, snapshot_id in before.items():
        if storage.tables.load("orders", asset).current_snapshot().snapshot_id != snapshot_id:
            session.sql(f"CALL {CATALOG_NAME}.system.set_current_snapshot(table => 'orders.{asset}', snapshot_id => {snapshot_id})").collect()
    assert _current_snapshots(storage) == before


@pytest.mark.parametrize("asset, day, how, failing", BREAKAGES, ids=[f"{b[0]}-{b[1]}-{b[2].__name__}" for b in BREAKAGES])
def test_check_fails_on_a_broken_partition(spark, orders_warehouse, warehouse, asset, day, how, failing):
    _, instance, *_ = orders_warehouse
    _break(spark, warehouse, asset, day, how)

    result = _defs().resolve_job_def("checks_only").execute_in_process(tags={"dagster/partition": DAY2}, instance=instance, raise_on_error=False)

    evaluations = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert {e.partition for e in evaluations} == {DAY2}
    failed = {(e.asset_key.path[1], e.check_name) for e in evaluations if not e.passed}
    assert failed == failing
    assert not result.success  # blocking ERROR checks fail their step
    for evaluation in evaluations:
        if not evaluation.passed:  # both sides of the equation are shown
            assert {"left", "right", "equation"} <= set(evaluation.metadata)
            assert evaluation.metadata["left"].value != evaluation.metadata["right"].value


def test_failed_blocking_intake_check_stops_the_cdc_step(spark, orders_warehouse, warehouse):
    _, instance, *_ = orders_warehouse
    _break(spark, warehouse, "hashed_incoming", DAY2, _duplicate_a_row)
    current = WarehouseStorage(str(warehouse)).tables
    before = current.load("orders", "current_table").current_snapshot().snapshot_id

    result = _defs().resolve_job_def("gated_cdc").execute_in_process(tags={"dagster/partition": DAY2}, instance=instance, raise_on_error=False)

    assert not result.success
    step_events = {(e.step_key, e.event_type_value) for e in result.all_events if e.step_key}
    assert ("orders__intake_checks", "STEP_FAILURE") in step_events
    assert not any(key == "orders__cdc" and kind == "STEP_START" for key, kind in step_events)
    assert current.load("orders", "current_table").current_snapshot().snapshot_id == before  # the CDC step never wrote
