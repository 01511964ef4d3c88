"""Readers across a table's schema changes (issue 25): every reader shows the columns as configured now.

A small warehouse written through WarehouseStorage, as the pipeline stores a table whose config changed
twice: D1 holds id, a int, b int, f float, d decimal(10,2) and a column ``gone`` the config has since
dropped; from D2 on ``c`` (string) was added; on D3 ``a`` is a bigint, ``b`` was renamed ``b2``, ``f`` is a
double and ``d`` a decimal(12,2). Each reader must show a bigint, b2 (b's values on D1-D2), c (NULL on D1),
f double and d decimal(12,2) on every date, and never ``gone``.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

import duckdb
import pytest

from cdc_assets.usecases.catalog_ddl import sync_in_place, sync_statements
from cdc_assets.model.config import TableConfig
from cdc_assets.usecases.readers import changes_between, current_duckdb_sql, current_state, read_history, scd2_duckdb_sql, scd2_view
from cdc_assets.core.views.as_configured import configured_select_list
from cdc_assets.core.views.scd2 import Dialect
from resources.storage import WarehouseStorage
from tests.pipeline import own_catalog_database

TABLE = "evolving"
D1, D2, D3 = "2024-01-01", "2024-01-02", "2024-01-03"
DAY = {D1: date(2024, 1, 1), D2: date(2024, 1, 2), D3: date(2024, 1, 3)}
BIG = 3_000_000_000  # needs the bigint a became on D3
CONFIG = {
    "name": TABLE,
    "start_date": D1,
    "load_type": "full",
    "source": {"path": "data/evolving/{date}.csv"},
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [
        {"name": "a", "type": "bigint"},
        {"name": "b2", "type": "int", "renamed_from": "b"},
        {"name": "c", "type": "string"},
        {"name": "f", "type": "double"},
        {"name": "d", "type": "decimal(12,2)"},
    ],
}
# The config D2 was stored under.
CONFIG_D2 = {**CONFIG, "non_keys": [{"name": "a", "type": "int"}, {"name": "b", "type": "int"}, {"name": "c", "type": "string"},
                                    {"name": "f", "type": "float"}, {"name": "d", "type": "decimal(10,2)"}]}  # fmt: skip

# Each date's stored payload columns, then the pipeline's own.
PAYLOAD = {
    D1: "id int, a int, b int, f float, d decimal(10,2), gone string",
    D2: "id int, a int, b int, c string, f float, d decimal(10,2)",
    D3: "id int, a bigint, b2 int, c string, f double, d decimal(12,2)",
}
OWN = "key_hash string, non_key_hash string, operation string, eff_start_date date, process_id string, processed_at timestamp"
STAMP = datetime(2024, 1, 5, 8, 0, 0)


def _row(key, a, b, c, f, d, operation, since, day):
    """A stored row of ``day``'s schema: (payload..., key_hash, non_key_hash, operation, eff_start_date, process_id, processed_at)."""
    payload = {D1: (key, a, b, f, d, "dropped"), D2: (key, a, b, c, f, d), D3: (key, a, b, c, f, d)}[day]
    return (*payload, f"k{key}", f"n{key}-{a}-{b}-{c}", operation, DAY[since], f"run-{day}", STAMP)


# (id, a, b, c, f, d, operation, eff_start_date) per date; 2 is deleted on D3.
CURRENT = {
    D1: [(1, 10, 100, None, 1.5, Decimal("1.25"), "I", D1), (2, 20, 200, None, 2.5, Decimal("2.50"), "I", D1)],
    D2: [(1, 11, 101, "c1", 1.5, Decimal("1.25"), "U", D2), (2, 20, 200, None, 2.5, Decimal("2.50"), "N", D1),
         (3, 30, 300, "c3", 3.5, Decimal("3.75"), "I", D2)],
    D3: [(1, 11, 101, "c1", 1.5, Decimal("1.25"), "N", D2), (3, BIG, 301, "c3", 3.25, Decimal("1234567890.12"), "U", D3)],
}  # fmt: skip
HISTORY = {
    D1: [(1, 10, 100, None, 1.5, Decimal("1.25"), "I", D1), (2, 20, 200, None, 2.5, Decimal("2.50"), "I", D1)],
    D2: [(1, 11, 101, "c1", 1.5, Decimal("1.25"), "U", D2), (3, 30, 300, "c3", 3.5, Decimal("3.75"), "I", D2)],
    D3: [(2, 20, 200, None, 2.5, Decimal("2.50"), "D", D1), (3, BIG, 301, "c3", 3.25, Decimal("1234567890.12"), "U", D3)],
}  # fmt: skip


def _store(spark, storage: WarehouseStorage, day: str) -> None:
    """current_table and history_partition of ``day``, with that date's schema, as one run writes them."""
    for asset, rows, extra in (("current_table", CURRENT, ""), ("history_partition", HISTORY, ", changed_columns array<string>")):
        stored = [(*_row(*row[:7], row[7], day), *([[]] if extra else [])) for row in rows[day]]
        storage.write(spark.createDataFrame(stored, f"{PAYLOAD[day]}, {OWN}{extra}"), TABLE, asset, [day])
    storage.release()


@pytest.fixture(scope="module")
def warehouse(spark, tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("schema_readers") / "warehouse")
    storage = WarehouseStorage(root)
    for day in (D1, D2, D3):
        _store(spark, storage, day)
    return root


@pytest.fixture(scope="module")
def config() -> TableConfig:
    return TableConfig.model_validate(CONFIG)


def _configured(row: tuple) -> tuple:
    """(id, a, b2, c, f, d) as configured now: the values read back from a stored row of any date."""
    key, a, b, c, f, d = row[:6]
    return (key, a, b, c, f, d)


CONFIGURED = ["id", "a", "b2", "c", "f", "d"]
TYPES = {"id": "int", "a": "bigint", "b2": "int", "c": "string", "f": "double", "d": "decimal(12,2)"}


def _sorted(rows) -> list[tuple]:
    return sorted((tuple(row) for row in rows), key=repr)


# The SCD type 2 versions of all three dates: (id, a, b2, c, f, d, valid_from, valid_to, is_current).
VERSIONS = _sorted([
    (1, 10, 100, None, 1.5, Decimal("1.25"), DAY[D1], DAY[D2], False),
    (1, 11, 101, "c1", 1.5, Decimal("1.25"), DAY[D2], None, True),
    (2, 20, 200, None, 2.5, Decimal("2.50"), DAY[D1], DAY[D3], False),
    (3, 30, 300, "c3", 3.5, Decimal("3.75"), DAY[D2], DAY[D3], False),
    (3, BIG, 301, "c3", 3.25, Decimal("1234567890.12"), DAY[D3], None, True),
])  # fmt: skip


def test_history_reads_every_date_as_configured_now(spark, warehouse, config):
    history = read_history(spark, config, D3, warehouse)
    assert history.columns == [*CONFIGURED, "key_hash", "non_key_hash", "operation", "business_date"]
    assert {field.name: field.dataType.simpleString() for field in history.schema.fields if field.name in TYPES} == TYPES
    found = _sorted(row[:6] + (row["operation"], row["business_date"]) for row in history.collect())
    expected = _sorted(_configured(row) + (row[6], DAY[day]) for day, rows in HISTORY.items() for row in rows)
    assert found == expected
    # b's values on D1 and D2 are b2's; c is NULL on D1 (added on D2); gone is not shown.
    assert (1, 10, 100, None, 1.5, Decimal("1.25"), "I", DAY[D1]) in found


def test_scd2_in_spark_and_duckdb_show_the_configured_columns_on_every_version(spark, warehouse, config):
    versions = VERSIONS
    view = scd2_view(spark, config, warehouse=warehouse)
    assert {field.name: field.dataType.simpleString() for field in view.schema.fields if field.name in TYPES} == TYPES
    assert _sorted(view.collect()) == versions
    query = duckdb.sql(scd2_duckdb_sql(config, warehouse))
    assert _sorted(query.fetchall()) == versions
    assert [str(column_type) for column_type in query.types[:6]] == ["INTEGER", "BIGINT", "INTEGER", "VARCHAR", "DOUBLE", "DECIMAL(12,2)"]
    # As of D2 only the first two dates count: key 3's D2 version is still open.
    as_of_d2 = _sorted(duckdb.sql(scd2_duckdb_sql(config, warehouse, as_of=D2)).fetchall())
    assert (3, 30, 300, "c3", 3.5, Decimal("3.75"), DAY[D2], None, True) in as_of_d2
    assert as_of_d2 == _sorted(scd2_view(spark, config, as_of=D2, warehouse=warehouse).collect())


def test_changes_across_the_rename_compare_b_with_b2(spark, warehouse, config):
    changes = changes_between(spark, config, D1, D3, warehouse=warehouse)
    found = _sorted((*row[:6], row["_change_type"], tuple(row["changed_columns"])) for row in changes.collect())
    assert found == _sorted([
        (1, 10, 100, None, 1.5, Decimal("1.25"), "update_preimage", ("a", "b2", "c")),
        (1, 11, 101, "c1", 1.5, Decimal("1.25"), "update_postimage", ("a", "b2", "c")),
        (2, 20, 200, None, 2.5, Decimal("2.50"), "delete", ()),
        (3, BIG, 301, "c3", 3.25, Decimal("1234567890.12"), "insert", ()),
    ])  # fmt: skip


@pytest.mark.parametrize("day", [D1, D2, D3])
def test_the_state_of_any_date_in_spark_and_duckdb_is_as_configured_now(spark, warehouse, config, day):
    own = ["key_hash", "non_key_hash", "operation", "eff_start_date", "process_id", "processed_at"]
    state = current_state(spark, config, day, warehouse)
    assert state.columns == [*CONFIGURED, *own]
    assert {field.name: field.dataType.simpleString() for field in state.schema.fields if field.name in TYPES} == TYPES
    expected = _sorted(_configured(row) + (row[6], DAY[row[7]]) for row in CURRENT[day])
    assert _sorted((*row[:6], row["operation"], row["eff_start_date"]) for row in state.collect()) == expected

    query = duckdb.sql(f"SELECT {', '.join(CONFIGURED)}, operation, eff_start_date FROM ({current_duckdb_sql(config, warehouse, as_of=day)})")
    assert _sorted(query.fetchall()) == expected
    assert duckdb.sql(current_duckdb_sql(config, warehouse, as_of=day)).columns == [*CONFIGURED, *own]


def test_the_select_list_names_only_stored_names(config):
    # Nothing of c stored, b2 only under its former name b: c is a typed NULL, b2 reads b.
    assert configured_select_list(config.columns, ["ID", "a", "b", "f", "d"], Dialect.duckdb) == [
        'CAST("id" AS INTEGER) AS "id"', 'CAST("a" AS BIGINT) AS "a"', 'CAST("b" AS INTEGER) AS "b2"',
        'CAST(NULL AS VARCHAR) AS "c"', 'CAST("f" AS DOUBLE) AS "f"', 'CAST("d" AS DECIMAL(12,2)) AS "d"',
    ]  # fmt: skip
    # Both names stored (dates before and after the rename): the new name first.
    assert configured_select_list(config.columns[1:4], ["a", "b", "b2", "c"], Dialect.spark) == [
        "CAST(`a` AS bigint) AS `a`", "CAST(coalesce(`b2`, `b`) AS int) AS `b2`", "CAST(`c` AS string) AS `c`",
    ]  # fmt: skip
    # Trino's own type names (tests/test_trino.py runs its queries).
    assert configured_select_list(config.columns, ["ID", "a", "b", "f", "d"], Dialect.trino) == [
        'CAST("id" AS integer) AS "id"', 'CAST("a" AS bigint) AS "a"', 'CAST("b" AS integer) AS "b2"',
        'CAST(NULL AS varchar) AS "c"', 'CAST("f" AS double) AS "f"', 'CAST("d" AS decimal(12,2)) AS "d"',
    ]  # fmt: skip


@pytest.fixture()
def database(spark, monkeypatch):
    """A database of its own in the session's catalog, partitions from folders as in catalog_conf."""
    yield from own_catalog_database(spark, monkeypatch, "schema_readers_test")


OWN_COLUMNS = ("key_hash", "non_key_hash", "operation", "eff_start_date", "process_id", "processed_at", "business_date")


def _registered(spark, database: str, name: str) -> dict[str, str]:
    return {column.name: column.dataType for column in spark.catalog.listColumns(f"{database}.{name}")}


def _check_catalog(spark, database: str) -> None:
    """The tables declare the configured types (and b, which D1-D2 store), read every date, and the views
    show the configured columns as configured now."""
    own = {"key_hash": "string", "non_key_hash": "string", "operation": "string", "eff_start_date": "date",
           "process_id": "string", "processed_at": "timestamp", "business_date": "date"}  # fmt: skip
    assert _registered(spark, database, f"{TABLE}_current") == {**TYPES, "b": "int", **own}
    assert _registered(spark, database, f"{TABLE}_history") == {**TYPES, "b": "int", **own, "changed_columns": "array<string>"}
    raw = spark.sql(f"SELECT id, a, b, b2, CAST(business_date AS STRING) FROM {database}.{TABLE}_history")
    assert _sorted(raw.collect()) == _sorted(
        (row[0], row[1], row[2] if day != D3 else None, row[2] if day == D3 else None, day) for day, rows in HISTORY.items() for row in rows
    )
    scd2 = spark.sql(f"SELECT * FROM {database}.{TABLE}_scd2")
    assert scd2.columns == [*CONFIGURED, "valid_from", "valid_to", "is_current"]
    assert _sorted(scd2.collect()) == VERSIONS
    latest = spark.sql(f"SELECT * FROM {database}.{TABLE}_latest")
    assert latest.columns[:6] == CONFIGURED and "b" not in latest.columns and "gone" not in latest.columns
    assert _sorted((*row[:6], row["operation"]) for row in latest.collect()) == _sorted(_configured(row) + (row[6],) for row in CURRENT[D3])


def test_a_fresh_sync_declares_the_configured_schema_and_its_views_show_it(spark, warehouse, config, database):
    session = WarehouseStorage(warehouse).tables.session_for(spark)  # the warehouse's lake catalog open, as in spark-sql
    for statement in sync_statements([config], WarehouseStorage(warehouse), database):
        session.sql(statement)
    _check_catalog(session, database)


def test_a_sync_in_place_alters_the_views_when_a_column_was_widened(spark, config, database, tmp_path):
    root = str(tmp_path / "warehouse")
    storage = WarehouseStorage(root)
    for day in (D1, D2):
        _store(spark, storage, day)
    session = storage.tables.session_for(spark)  # the warehouse's lake catalog open, as in the SQL server
    assert sync_in_place(session, [TableConfig.model_validate(CONFIG_D2)], WarehouseStorage(root), database).errors == []
    assert _registered(session, database, f"{TABLE}_history")["a"] == "int"
    assert "gone" not in _registered(session, database, f"{TABLE}_history")

    _store(spark, storage, D3)
    report = sync_in_place(session, [config], WarehouseStorage(root), database)
    assert report.errors == []
    # a int -> bigint: every object is a view over the lake tables, altered in place; nothing is dropped.
    assert not [statement for statement in report.statements if statement.startswith("DROP") and TABLE in statement]
    altered = {statement.split()[2] for statement in report.statements if statement.startswith("ALTER VIEW")}
    assert {f"`{database}`.`{TABLE}_current`", f"`{database}`.`{TABLE}_history`"} <= altered, report.statements
    assert _registered(session, database, f"{TABLE}_history")["a"] == "bigint"
    _check_catalog(session, database)
    # Nothing changed since: the next sync drops nothing.
    again = sync_in_place(session, [config], WarehouseStorage(root), database)
    assert again.errors == [] and not [statement for statement in again.statements if statement.startswith("DROP") and TABLE in statement]


@pytest.fixture(scope="module")
def incremental_warehouse(spark, tmp_path_factory) -> str:
    """The same states stored as one merged table (storage: incremental): each date's whole state in its
    own columns (a date whose columns changed is stored whole), the table's columns evolved in place."""
    root = str(tmp_path_factory.mktemp("schema_readers_incremental") / "warehouse")
    storage = WarehouseStorage(root)
    for day in (D1, D2, D3):
        stored = [_row(*row[:7], row[7], day) for row in CURRENT[day]]
        storage.write_state(spark.createDataFrame(stored, f"{PAYLOAD[day]}, {OWN}"), TABLE, "current_table", day, True, "N")
    storage.release()
    return root


def test_an_incremental_state_across_the_changes_in_duckdb_and_the_catalog(spark, incremental_warehouse, database):
    config = TableConfig.model_validate({**CONFIG, "storage": {"current": "incremental"}})
    expected = {day: _sorted(_configured(row) + (row[6],) for row in rows) for day, rows in CURRENT.items()}
    for day in (D1, D2, D3):  # a full copy of the old config, changes of two newer ones
        query = f"SELECT {', '.join(CONFIGURED)}, operation FROM ({current_duckdb_sql(config, incremental_warehouse, as_of=day)})"
        assert _sorted(duckdb.sql(query).fetchall()) == expected[day], day

    session = WarehouseStorage(incremental_warehouse).tables.session_for(spark)
    for statement in sync_statements([config], WarehouseStorage(incremental_warehouse), database):
        session.sql(statement)
    # The view of current_table reads each date's tag as a snapshot table's view reads its partition: the
    # configured types, and b where D1 and D2 stored it (each tag has the columns its date was written with).
    assert set(_registered(session, database, f"{TABLE}_current")) == {*TYPES, "b", *OWN_COLUMNS}
    raw = session.sql(f"SELECT id, b, b2, operation, CAST(business_date AS STRING) FROM {database}.{TABLE}_current")
    assert _sorted(raw.collect()) == _sorted(
        (row[0], row[2] if day != D3 else None, row[2] if day == D3 else None, row[6], day) for day, rows in CURRENT.items() for row in rows
    )
    latest = session.sql(f"SELECT {', '.join(CONFIGURED)}, operation FROM {database}.{TABLE}_latest")
    assert _sorted(latest.collect()) == expected[D3]
