"""A sync in place (what the SQL server runs) and a fresh sync (spark-sql's), on the test session's catalog.

The session's own catalog stands in for the metastore: the statements are the same Spark SQL, run in
a session with the warehouse's ``lake`` catalog open (as the SQL server's and spark-sql's are). The
SQL server itself is started in tests/test_catalog_server.py.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
import yaml

from cdc_assets.usecases.catalog_ddl import sync_in_place, sync_statements
from cdc_assets.model.config import load_table_config
from resources.storage import WarehouseStorage
from tests.codegen import generated_code
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
# (id, name, key_hash, operation) on day 1; day 2 was stored after the config gained the column "extra".
DAY_1_ROWS = [(1, "a", "h1", "I"), (2, "b", "h2", "I")]
DAY_1_SCHEMA = "id int, name string, key_hash string, operation string"
# "extra" after business_date: the storage's Iceberg write refuses a frame whose new column comes before
# a column the table has ("extra is out of order, before business_date"), a storage matter this test
# does not cover.
DAY_2_ROWS = [(1, "a", "h1", "U", date(2024, 1, 2), 1.5), (3, "c", "h3", "I", date(2024, 1, 2), None)]
DAY_2_SCHEMA = "id int, name string, key_hash string, operation string, business_date date, extra double"
OBJECTS = [f"{TABLE}_current", f"{TABLE}_history", f"{TABLE}_latest", f"{TABLE}_scd2"]


def _store(spark, storage: WarehouseStorage, day: str, rows: list[tuple], schema: str) -> None:
    """``rows`` as the date of both assets, one Iceberg commit each (what a run does)."""
    for asset in ("current_table", "history_partition"):
        storage.write(spark.createDataFrame(rows, schema), TABLE, asset, [day])
    storage.release()


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
    """Each object's creation time in the metastore: what a sync that dropped and re-created it changes."""
    return {
        name: next(row["data_type"] for row in spark.sql(f"DESCRIBE TABLE EXTENDED {database}.{name}").collect() if row["col_name"] == "Created Time")
        for name in OBJECTS
    }


def _extra_by_date(spark, relation: str) -> dict[str, tuple[int, int]]:
    rows = spark.sql(f"SELECT CAST(business_date AS STRING) AS day, count(*) AS n, count(extra) AS extra FROM {relation} GROUP BY 1").collect()
    return {row["day"]: (row["n"], row["extra"]) for row in rows}


def test_a_sync_in_place_alters_the_views_for_a_gained_column_and_a_commit_needs_no_sync(spark, database, tmp_path):
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    session = storage.tables.session_for(spark)  # the warehouse's lake catalog open, as in the SQL server
    _store(spark, storage, DAY_1, DAY_1_ROWS, DAY_1_SCHEMA)
    report = sync_in_place(spark, [_config(tmp_path)], storage, database)
    assert report.errors == []
    # listTables also lists the session's temporary views (other tests' scd2 views): only the database's own.
    # Listed with generated code: Spark 4.0 cannot decode its catalog.Table rows with interpreted expressions,
    # the suite's default (EXPRESSION_DECODING_FAILED; tests/codegen.py). Both sessions: the decoding reads
    # the conf of the thread's active session, which may be ``spark`` when ``session`` is another.
    with generated_code(spark), generated_code(session):
        stored = {table.name: table.tableType for table in session.catalog.listTables(database) if not table.isTemporary}
    assert stored == {name: "VIEW" for name in OBJECTS}  # views only: no table over the data folders
    created = _created(session, database)

    # The config gained "extra" and a date stored since has it: the views are altered, it reads NULL before.
    _store(spark, storage, DAY_2, DAY_2_ROWS, DAY_2_SCHEMA)
    report = sync_in_place(spark, [_config(tmp_path, gained=True)], storage, database)
    assert report.errors == []
    assert [statement.split()[2] for statement in report.statements if statement.startswith("ALTER VIEW")] == [
        f"`{database}`.`{name}`" for name in OBJECTS
    ]
    redefining = ("DROP", "CREATE TABLE", "CREATE VIEW", "CREATE OR")
    assert not [statement for statement in report.statements if statement.startswith(redefining) and TABLE in statement]
    with_extra = sum(row[-1] is not None for row in DAY_2_ROWS)
    expected = {DAY_1: (len(DAY_1_ROWS), 0), DAY_2: (len(DAY_2_ROWS), with_extra)}
    assert _extra_by_date(session, f"{database}.{TABLE}_current") == expected
    assert _extra_by_date(session, f"{database}.{TABLE}_latest") == {DAY_2: expected[DAY_2]}
    assert session.sql(f"SELECT count(extra) FROM {database}.{TABLE}_scd2").first()[0] == with_extra
    assert _created(session, database) == created  # every object altered in place, none dropped

    # A re-run replaces day 2, with no sync after it: the views read the new snapshot only, though the
    # date's data folder still holds the replaced snapshot's files (a table over the folder would read both).
    rerun = [(1, "a", "h1", "U", date(2024, 1, 2), 9.5)]
    _store(spark, storage, DAY_2, rerun, DAY_2_SCHEMA)
    folder = Path(storage.partition_path(TABLE, "current_table", DAY_2))
    assert len(list(folder.glob("*.parquet"))) > 1
    assert _extra_by_date(session, f"{database}.{TABLE}_current") == {DAY_1: expected[DAY_1], DAY_2: (1, 1)}
    assert session.sql(f"SELECT extra FROM {database}.{TABLE}_latest").collect() == [(9.5,)]


def test_a_fresh_sync_reads_a_gained_column_as_null_on_older_dates(spark, database, tmp_path):
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    _store(spark, storage, DAY_1, DAY_1_ROWS, DAY_1_SCHEMA)
    _store(spark, storage, DAY_2, DAY_2_ROWS, DAY_2_SCHEMA)
    session = storage.tables.session_for(spark)
    for statement in sync_statements([_config(tmp_path, gained=True)], storage, database):
        session.sql(statement)
    with_extra = sum(row[-1] is not None for row in DAY_2_ROWS)
    assert _extra_by_date(session, f"{database}.{TABLE}_history") == {DAY_1: (len(DAY_1_ROWS), 0), DAY_2: (len(DAY_2_ROWS), with_extra)}
    assert session.sql(f"SELECT count(extra) FROM {database}.{TABLE}_scd2").first()[0] == with_extra


STATE_SCHEMA = ("id int, name string, key_hash string, non_key_hash string, operation string, eff_start_date date, "
                "process_id string, processed_at timestamp")  # fmt: skip


def _store_state(spark, storage: WarehouseStorage, day: str, rows: list[tuple], whole: bool) -> None:
    """Rows (id, name, operation, eff_start_date) as a date of an incremental (merged) state: its whole
    state, or its changes (applied with a MERGE)."""
    from datetime import date as day_of

    stored = [(row[0], row[1], f"h{row[0]}", f"n{row[1]}", row[2], day_of.fromisoformat(row[3]), "run", None) for row in rows]
    storage.write_state(spark.createDataFrame(stored, STATE_SCHEMA), TABLE, "current_table", day, whole, "N")
    storage.release()


@pytest.mark.parametrize("fresh", [False, True])
def test_an_incremental_tables_current_and_latest_apply_its_changes(spark, database, tmp_path, fresh):
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    day_3 = "2024-01-03"
    _store_state(spark, storage, DAY_1, [(1, "a", "I", DAY_1), (2, "b", "I", DAY_1)], whole=True)
    _store_state(spark, storage, DAY_2, [(1, "a2", "U", DAY_2), (2, "b", "D", DAY_2), (3, "c", "I", DAY_2)], whole=False)
    _store_state(spark, storage, day_3, [(3, "c3", "U", day_3)], whole=False)
    path = tmp_path / f"{TABLE}.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "storage": {"current": "incremental"}}, sort_keys=False))
    config = load_table_config(path)
    session = storage.tables.session_for(spark)
    if fresh:
        for statement in sync_statements([config], storage, database):
            session.sql(statement)
    else:
        assert sync_in_place(spark, [config], storage, database).errors == []

    def state(relation: str) -> dict[str, list[tuple]]:
        found: dict[str, list[tuple]] = {}
        query = f"SELECT CAST(business_date AS STRING) AS day, id, name, operation FROM {database}.{relation}"
        for row in session.sql(query).collect():
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
