"""`cdc-catalog describe TABLE --json`: with what it prints, pyiceberg alone (no Spark) reads every asset's
every stored date, equal row for row to what the pipeline's own reader gets through Spark: in both storage
modes (an incremental current_table is one table with a tag per date)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from pyiceberg.catalog import load_catalog

from cdc_assets.model.config import load_table_config
from cdc_assets.model.names import CDC_OUTPUTS, HASHED_INCOMING, REJECTS
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_range

REPO = Path(__file__).resolve().parent.parent
DATES = ["2024-01-01", "2024-01-02", "2024-01-03"]


def _plain(value):
    """A value as both readers give it: timestamps as naive UTC (Spark gives naive, pyarrow aware ones)."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    if isinstance(value, list):
        return tuple(_plain(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _plain(item)) for key, item in value.items()))
    return value


def _rows(records: list[dict], columns: list[str]) -> list[tuple]:
    return sorted((tuple(_plain(record[name]) for name in columns) for record in records), key=repr)


def read_date(catalog, how: dict, day: str) -> pa.Table:
    """One business date of an asset, as a script reads it from what ``describe`` printed: the rows of
    the date's partition, or the table at the date's tag with each row's operation as of the date."""
    table = catalog.load_table(how["identifier"])
    if "partition_column" in how:
        return table.scan(row_filter=f"{how['partition_column']} = '{day}'").to_arrow()
    rows = table.scan(snapshot_id=table.snapshot_by_name(how["tag"].format(date=day)).snapshot_id).to_arrow()
    stored = how["operation_column"]  # last_operation: each key's last change, not the date's label
    if stored not in rows.column_names:  # a state without operations of its own (applied_sequences)
        return rows
    on_day = pc.fill_null(pc.equal(rows[how["operation_date_column"]], pa.scalar(datetime.fromisoformat(day).date())), False)
    labelled = pc.if_else(on_day, rows[stored], pa.scalar(how["untouched_operation"]))
    return rows.set_column(rows.column_names.index(stored), "operation", labelled)


@pytest.mark.parametrize("mode", ["snapshot", "incremental"])
def test_describe_prints_what_pyiceberg_needs_to_read_every_date_of_every_asset(spark, warehouse, monkeypatch, tmp_path, mode):
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(REPO / "table_configs" / "orders.yaml", configs / "orders.yaml")
    fields = yaml.safe_load((configs / "orders.yaml").read_text())
    (configs / "orders.yaml").write_text(yaml.safe_dump({**fields, "storage": {"current": mode}}, sort_keys=False))
    config = load_table_config(configs / "orders.yaml")
    assert run_range(definitions_for(config), DATES[0], DATES[-1]).success

    env = {**os.environ, "CDC_WAREHOUSE": str(warehouse), "CDC_TABLE_CONFIGS": str(configs)}
    printed = subprocess.run(
        [sys.executable, "-m", "cdc_assets.cli.catalog", "describe", "orders", "--json"], env=env, capture_output=True, text=True, check=True
    ).stdout
    described = json.loads(printed)
    assert described["table"] == "orders"
    assert set(described["assets"]) == {HASHED_INCOMING, REJECTS, *CDC_OUTPUTS}

    catalog = load_catalog(described["catalog"]["name"], **described["catalog"]["properties"])
    storage = WarehouseStorage(str(warehouse))
    for asset, how in described["assets"].items():
        assert how["stored_dates"] == DATES, asset
        assert ("tag" in how) == (mode == "incremental" and asset == "current_table"), (asset, how)
        for day in how["stored_dates"]:
            read_by_pyiceberg = read_date(catalog, how, day)
            by_spark = storage.read_one(spark, "orders", asset, day)
            columns = by_spark.columns
            assert _rows(read_by_pyiceberg.to_pylist(), columns) == _rows([row.asDict(recursive=True) for row in by_spark.collect()], columns), (
                asset, day
            )
    # Nothing here needed Spark to find the tables: the catalog's own file is in the warehouse.
    assert Path(described["catalog"]["properties"]["uri"].removeprefix("sqlite:///").split("?")[0]).is_file()
