"""The resources' settings are fields fed by ``EnvVar``: the UI shows where each comes from, and runs use them.

What the UI's resource page shows is read from the code location's snapshot (``RepositorySnap``), as the
webserver gets it; the runs are real Dagster runs of a one-asset graph on the shared Spark session.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DailyPartitionsDefinition, asset, materialize
from dagster._core.remote_representation.external_data import RepositorySnap, ResourceConfigEnvVarSnap

from cdc_assets.defs.component import build_definitions
from cdc_assets.defs.factory import IO_MANAGER_KEY
from resources.parquet_io_manager import PartitionedParquetIOManager
from resources.spark import PipelineSparkResource
from resources.storage import WarehouseStorage

DAY = "2024-01-02"
SETTINGS = {
    "CDC_WAREHOUSE": ("parquet_io_manager", "warehouse_root"),
    "CDC_WRITER_LOCK_TIMEOUT": ("parquet_io_manager", "lock_timeout_seconds"),
    "CDC_WRITER_LEASE_SECONDS": ("parquet_io_manager", "writer_lease_seconds"),
    "CDC_SPARK_MASTER": ("pyspark", "spark_master"),
    "CDC_SPARK_CONF": ("pyspark", "spark_conf_json"),
}
# A conf key of no meaning to Spark: setting it on the shared test session changes nothing else.
MARKER_CONF = "spark.cdc.test.marker"
seen_conf: list[str | None] = []


@asset(key=AssetKey(["t", "rows"]), partitions_def=DailyPartitionsDefinition(start_date="2024-01-01"), io_manager_key=IO_MANAGER_KEY)
def rows(pyspark: PipelineSparkResource):
    session = pyspark.spark_session
    seen_conf.append(session.conf.get(MARKER_CONF, None))
    return session.createDataFrame([("k1", 1), ("k2", 2)], "key_hash string, amount int")


def _configured_values(defs) -> dict[tuple[str, str], object]:
    snap = RepositorySnap.from_def(defs.get_repository_def())
    return {(resource.name, key): value for resource in snap.resources for key, value in resource.configured_values.items()}


def _unset_settings(monkeypatch) -> None:
    for name in [*SETTINGS, "SPARK_REMOTE", "CDC_CATALOG_URI", "CDC_CATALOG_WAREHOUSE", "CDC_CATALOG_SIGNING_NAME", "CDC_S3_ENDPOINT"]:
        monkeypatch.delenv(name, raising=False)


def test_the_resource_page_names_the_variable_behind_each_setting_and_shows_defaults_for_unset_ones(monkeypatch):
    _unset_settings(monkeypatch)
    monkeypatch.setenv("CDC_WAREHOUSE", "/srv/cdc-warehouse")
    monkeypatch.setenv("CDC_SPARK_CONF", '{"spark.sql.shuffle.partitions": "4"}')
    defs = build_definitions([])
    shown = _configured_values(defs)
    for name in ("CDC_WAREHOUSE", "CDC_SPARK_CONF"):
        assert shown[SETTINGS[name]] == ResourceConfigEnvVarSnap(name=name), name
    # Unset when the code location loaded: the default, as a value (a run needs no variable).
    assert shown[SETTINGS["CDC_WRITER_LOCK_TIMEOUT"]] == json.dumps("900")
    assert shown[SETTINGS["CDC_SPARK_MASTER"]] == json.dumps("")
    used = RepositorySnap.from_def(defs.get_repository_def()).utilized_env_vars
    assert {"CDC_WAREHOUSE", "CDC_SPARK_CONF"} <= set(used)
    assert not {"CDC_WRITER_LOCK_TIMEOUT", "CDC_SPARK_MASTER"} & set(used)

    monkeypatch.setenv("CDC_WRITER_LOCK_TIMEOUT", "30")
    shown = _configured_values(build_definitions([]))
    assert shown[SETTINGS["CDC_WRITER_LOCK_TIMEOUT"]] == ResourceConfigEnvVarSnap(name="CDC_WRITER_LOCK_TIMEOUT")

    _unset_settings(monkeypatch)
    shown = _configured_values(build_definitions([]))
    assert shown[SETTINGS["CDC_WAREHOUSE"]] == json.dumps("warehouse")
    assert shown[SETTINGS["CDC_WRITER_LOCK_TIMEOUT"]] == json.dumps("900")


def test_a_run_writes_where_the_warehouse_variable_says_and_its_session_gets_the_spark_conf_variable(spark, tmp_path, monkeypatch):
    _unset_settings(monkeypatch)
    warehouse = tmp_path / "from_env"
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    monkeypatch.setenv("CDC_SPARK_CONF", json.dumps({MARKER_CONF: "from CDC_SPARK_CONF"}))
    seen_conf.clear()
    result = materialize([rows], partition_key=DAY, resources=build_definitions([]).resources, instance=DagsterInstance.ephemeral())
    assert result.success
    assert seen_conf == ["from CDC_SPARK_CONF"]
    assert WarehouseStorage(str(warehouse)).row_counts("t", "rows", [DAY]) == {DAY: 2}


def test_a_variable_unset_when_the_code_location_loads_leaves_the_default_warehouse(spark, tmp_path, monkeypatch):
    _unset_settings(monkeypatch)
    monkeypatch.chdir(tmp_path)
    result = materialize([rows], partition_key=DAY, resources=build_definitions([]).resources, instance=DagsterInstance.ephemeral())
    assert result.success
    assert WarehouseStorage(str(tmp_path / "warehouse")).row_counts("t", "rows", [DAY]) == {DAY: 2}


def test_a_field_set_in_code_wins_over_the_variable(spark, tmp_path, monkeypatch):
    _unset_settings(monkeypatch)
    elsewhere, chosen = tmp_path / "from_env", tmp_path / "chosen"
    monkeypatch.setenv("CDC_WAREHOUSE", str(elsewhere))
    pyspark = PipelineSparkResource(spark_conf_json=json.dumps({MARKER_CONF: "from the field"}))
    manager = PartitionedParquetIOManager(pyspark=pyspark, warehouse_root=str(chosen))
    seen_conf.clear()
    result = materialize([rows], partition_key=DAY, resources={"pyspark": pyspark, IO_MANAGER_KEY: manager}, instance=DagsterInstance.ephemeral())
    assert result.success
    assert seen_conf == ["from the field"]
    assert WarehouseStorage(str(chosen)).row_counts("t", "rows", [DAY]) == {DAY: 2}
    assert not elsewhere.exists()


def test_a_run_waits_for_a_held_lock_as_long_as_the_lock_timeout_variable_says(spark, tmp_path, monkeypatch):
    _unset_settings(monkeypatch)
    warehouse = tmp_path / "warehouse"
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    monkeypatch.setenv("CDC_WRITER_LOCK_TIMEOUT", "1")
    holder = WarehouseStorage(str(warehouse), run_id="holding-run")
    holder.hold_writer_lock("t")
    try:
        result = materialize(
            [rows], partition_key=DAY, resources=build_definitions([]).resources, instance=DagsterInstance.ephemeral(), raise_on_error=False
        )
    finally:
        holder.release()
    assert not result.success
    failures = [event.event_specific_data.error.to_string() for event in result.all_events if event.is_step_failure]
    assert len(failures) == 1
    assert "holding-run" in failures[0] and "waited 1s (CDC_WRITER_LOCK_TIMEOUT)" in failures[0], failures[0]
    assert not Path(warehouse / "t" / "rows").exists()


def test_a_malformed_seconds_setting_fails_the_run_naming_the_field_and_variable(spark, tmp_path, monkeypatch):
    _unset_settings(monkeypatch)
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("CDC_WRITER_LOCK_TIMEOUT", "an hour")
    with pytest.raises(Exception) as raised:
        materialize([rows], partition_key=DAY, resources=build_definitions([]).resources, instance=DagsterInstance.ephemeral())
    chain, error = [], raised.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    assert any("lock_timeout_seconds='an hour' (CDC_WRITER_LOCK_TIMEOUT)" in message for message in chain), chain


# The lake's settings (docs/object-storage.md): the IO manager's fields, each fed by its variable.
LAKE_SETTINGS = {
    "CDC_CATALOG_URI": "catalog_uri",
    "CDC_CATALOG_WAREHOUSE": "catalog_warehouse",
    "CDC_CATALOG_SIGNING_NAME": "catalog_signing_name",
    "CDC_S3_ENDPOINT": "s3_endpoint",
    "AWS_REGION": "s3_region",
    "AWS_ACCESS_KEY_ID": "s3_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "s3_secret_access_key",
}


def test_the_lake_settings_are_shown_by_their_variables_and_the_secret_key_nowhere_in_the_code_locations_snapshot(monkeypatch):
    from dagster._serdes import serialize_value

    _unset_settings(monkeypatch)
    secret = "not-shown-" + "x" * 24
    values = {
        "CDC_WAREHOUSE": "s3://cdc/warehouse", "CDC_CATALOG_URI": "http://127.0.0.1:1", "CDC_CATALOG_WAREHOUSE": "s3://lake",
        "CDC_CATALOG_SIGNING_NAME": "s3tables", "CDC_S3_ENDPOINT": "http://127.0.0.1:2", "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "cdc-key", "AWS_SECRET_ACCESS_KEY": secret,
    }  # fmt: skip
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    defs = build_definitions([])
    shown = _configured_values(defs)
    for name, field in LAKE_SETTINGS.items():
        assert shown[("parquet_io_manager", field)] == ResourceConfigEnvVarSnap(name=name), name
    snapshot = serialize_value(RepositorySnap.from_def(defs.get_repository_def()))
    assert secret not in snapshot and "cdc-key" not in snapshot
    assert "AWS_SECRET_ACCESS_KEY" in snapshot  # the variable is named, its value is not
    manager = defs.resources["parquet_io_manager"]
    lake = manager.lake()
    assert (lake.uri, lake.warehouse, lake.signing_name, lake.store.endpoint, lake.store.region) == (
        "http://127.0.0.1:1", "s3://lake", "s3tables", "http://127.0.0.1:2", "eu-west-1",
    )  # fmt: skip
    assert secret not in json.dumps(lake.spark_conf()) and secret not in json.dumps(lake.pyiceberg_properties())
