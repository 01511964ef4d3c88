"""A sync in place (what the SQL server runs) and a fresh sync (spark-sql's), on the test session's catalog.

The session's own catalog stands in for the metastore: the statements are the same Spark SQL. The
SQL server itself is started in tests/test_catalog_server.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cdc_assets.catalog_ddl import sync_in_place, sync_statements
from cdc_assets.config import load_table_config
from resources.storage import WarehouseStorage
from tests.pipeline import own_catalog_database

TABLE = "tiny"
DAY_1, DAY_2 = "2024-01-01", "2024-01-02"
CONFIG = {
    "name": TABLE,
    "start_date": DAY_1,
    "load_type": "full",
    "source": {"path": "data/{date}.csv", "format": "csv"},
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}],
}
DAY_1_ROWS = {"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"], "key_hash": ["h1", "h2"], "operation": ["I", "I"]}
# Stored after the config gained the column "extra".
DAY_2_ROWS = {"id": pa.array([1, 3], pa.int32()), "name": ["a", "c"], "extra": [1.5, None], "key_hash": ["h1", "h3"], "operation": ["U", "I"]}
OBJECTS = [f"{TABLE}_current", f"{TABLE}_history", f"{TABLE}_latest", f"{TABLE}_scd2"]


def _store(warehouse: Path, day: str, rows: dict) -> None:
    for asset in ("current_table", "history_partition"):
        folder = warehouse / TABLE / asset / f"business_date={day}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table(rows), folder / "part-0.parquet")


def _config(folder: Path, gained: bool = False):
    document = {**CONFIG, "non_keys": [*CONFIG["non_keys"], *([{"name": "extra", "type": "double"}] if gained else [])]}
    path = folder / f"{TABLE}{'_gained' if gained else ''}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_table_config(path)


@pytest.fixture()
def database(spark, monkeypatch):
    """A database of its own in the session's catalog, partitions from folders as in catalog_conf."""
    yield from own_catalog_database(spark, monkeypatch, "catalog_sync_test")


def _created(spark, database: str) -> dict[str, str]:
    return {
        name: next(row["data_type"] for row in spark.sql(f"DESCRIBE TABLE EXTENDED {database}.{name}").collect() if row["col_name"] == "Created Time")
        for name in OBJECTS
    }


def _extra_by_date(spark, relation: str) -> dict[str, tuple[int, int]]:
    rows = spark.sql(f"SELECT CAST(business_date AS STRING) AS day, count(*) AS n, count(extra) AS extra FROM {relation} GROUP BY 1").collect()
    return {row["day"]: (row["n"], row["extra"]) for row in rows}


def test_a_sync_in_place_adds_a_gained_column_and_follows_a_moved_warehouse_without_dropping(spark, database, tmp_path):
    first = tmp_path / "first"
    _store(first, DAY_1, DAY_1_ROWS)
    report = sync_in_place(spark, [_config(tmp_path)], WarehouseStorage(str(first)), database)
    assert report.errors == []
    # listTables also lists the session's temporary views (other tests' scd2 views): only the database's own.
    stored = [table.name for table in spark.catalog.listTables(database) if not table.isTemporary]
    assert sorted(stored) == sorted(OBJECTS)
    created = _created(spark, database)

    # The config gained "extra" and a date stored since has it: it is added, read as NULL before.
    _store(first, DAY_2, DAY_2_ROWS)
    report = sync_in_place(spark, [_config(tmp_path, gained=True)], WarehouseStorage(str(first)), database)
    assert report.errors == []
    added = [statement for statement in report.statements if "ADD COLUMNS" in statement]
    assert added == [f"ALTER TABLE `{database}`.`{name}` ADD COLUMNS (`extra` double)" for name in (f"{TABLE}_current", f"{TABLE}_history")]
    assert not [statement for statement in report.statements if statement.startswith(("DROP", "CREATE TABLE", "CREATE VIEW", "CREATE OR")) and TABLE in statement]
    with_extra = sum(value is not None for value in DAY_2_ROWS["extra"])
    expected = {DAY_1: (len(DAY_1_ROWS["id"]), 0), DAY_2: (len(DAY_2_ROWS["id"]), with_extra)}
    assert _extra_by_date(spark, f"{database}.{TABLE}_current") == expected
    assert _extra_by_date(spark, f"{database}.{TABLE}_latest") == {DAY_2: expected[DAY_2]}
    assert spark.sql(f"SELECT count(extra) FROM {database}.{TABLE}_scd2").first()[0] == with_extra

    # The warehouse moved: the tables follow it, and nothing is read from the old place.
    second = tmp_path / "second"
    shutil.copytree(first, second)
    report = sync_in_place(spark, [_config(tmp_path, gained=True)], WarehouseStorage(str(second)), database)
    assert report.errors == []
    assert len([statement for statement in report.statements if "SET LOCATION" in statement]) == 2
    shutil.rmtree(first)
    assert _extra_by_date(spark, f"{database}.{TABLE}_current") == expected
    assert _created(spark, database) == created  # every object altered in place, none dropped


def test_a_fresh_sync_reads_a_gained_column_as_null_on_older_dates(spark, database, tmp_path):
    warehouse = tmp_path / "warehouse"
    _store(warehouse, DAY_1, DAY_1_ROWS)
    _store(warehouse, DAY_2, DAY_2_ROWS)
    for statement in sync_statements([_config(tmp_path, gained=True)], WarehouseStorage(str(warehouse)), database):
        spark.sql(statement)
    with_extra = sum(value is not None for value in DAY_2_ROWS["extra"])
    assert _extra_by_date(spark, f"{database}.{TABLE}_history") == {DAY_1: (len(DAY_1_ROWS["id"]), 0), DAY_2: (len(DAY_2_ROWS["id"]), with_extra)}
    assert spark.sql(f"SELECT count(extra) FROM {database}.{TABLE}_scd2").first()[0] == with_extra


def _store_state(warehouse: Path, asset: str, day: str, rows: list[tuple]) -> None:
    """Rows (id, name, operation, eff_start_date) as a stored part of an incremental state."""
    from datetime import date as day_of

    folder = warehouse / TABLE / asset / f"business_date={day}"
    folder.mkdir(parents=True)
    ids = [row[0] for row in rows]
    pq.write_table(
        pa.table({
            "id": pa.array(ids, pa.int32()), "name": [row[1] for row in rows], "key_hash": [f"h{i}" for i in ids],
            "non_key_hash": [f"n{row[1]}" for row in rows], "operation": [row[2] for row in rows],
            "eff_start_date": pa.array([day_of.fromisoformat(row[3]) for row in rows], pa.date32()),
            "process_id": ["run"] * len(rows), "processed_at": pa.array([None] * len(rows), pa.timestamp("us")),
        }),
        folder / "part-0.parquet",
    )


@pytest.mark.parametrize("fresh", [False, True])
def test_an_incremental_tables_current_and_latest_apply_its_changes(spark, database, tmp_path, fresh):
    warehouse = tmp_path / "warehouse"
    day_3 = "2024-01-03"
    _store_state(warehouse, "current_table", DAY_1, [(1, "a", "I", DAY_1), (2, "b", "I", DAY_1)])
    _store_state(warehouse, "current_table_changes", DAY_2, [(1, "a2", "U", DAY_2), (2, "b", "D", DAY_2), (3, "c", "I", DAY_2)])
    _store_state(warehouse, "current_table_changes", day_3, [(3, "c3", "U", day_3)])
    path = tmp_path / f"{TABLE}.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "storage": {"current": "incremental"}}, sort_keys=False))
    config = load_table_config(path)
    storage = WarehouseStorage(str(warehouse))
    if fresh:
        for statement in sync_statements([config], storage, database):
            spark.sql(statement)
    else:
        assert sync_in_place(spark, [config], storage, database).errors == []

    def state(relation: str) -> dict[str, list[tuple]]:
        found: dict[str, list[tuple]] = {}
        query = f"SELECT CAST(business_date AS STRING) AS day, id, name, operation FROM {database}.{relation}"
        for row in spark.sql(query).collect():
            found.setdefault(row["day"], []).append((row["id"], row["name"], row["operation"]))
        return {day: sorted(rows) for day, rows in found.items()}

    # A full load's untouched keys are N; the D key leaves; each date applies the changes up to it.
    expected = {
        DAY_1: [(1, "a", "I"), (2, "b", "I")],
        DAY_2: [(1, "a2", "U"), (3, "c", "I")],
        day_3: [(1, "a2", "N"), (3, "c3", "U")],
    }
    assert state(f"{TABLE}_current") == expected
    assert state(f"{TABLE}_latest") == {day_3: expected[day_3]}
