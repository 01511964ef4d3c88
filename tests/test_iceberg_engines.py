"""Every engine reads the same Iceberg tables: pyiceberg (no Spark) and DuckDB (the offline extension
packages) read ``current_table`` as of every date and ``history_partition`` of every date of a five-date
chain, equal row for row to what Spark reads through the project's storage.

One chain per load type (full, delta, change set, Debezium): the five dates of extracts of
tests/test_incremental_state.py (inserts, updates, deletes; a delta's deleted key is left out, so it
is X), run as a user runs them, through the project's Dagster definitions and IO manager, in a single
five-date run. The catalog is opened from what ``cdc-catalog describe TABLE --json`` prints, as
docs/consumers.md shows a script doing.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from pyiceberg.catalog import load_catalog

from cdc_assets.catalog import main as catalog_main
from cdc_assets.duckdb_iceberg import duckdb_connection
from cdc_assets.names import CURRENT, HISTORY
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_range, write_table_config
from tests.test_incremental_state import COLUMNS, DAYS, LOAD_TYPES, _land

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MICROSECOND = timedelta(microseconds=1)


def _plain(value):
    """One value as a Python value all three engines agree on when they hold the same data.

    - Timestamps become microseconds since the epoch: an Iceberg ``timestamptz`` (Spark's TimestampType)
      comes back from pyarrow and DuckDB as an aware datetime (UTC or the connection's zone), from Spark's
      collect() as a naive one in the Python process's local zone. The instant is what is stored, so the
      instant is compared (a naive one is read as local time, as PySpark built it).
    - Lists (``changed_columns``) become tuples and maps sorted tuples, so rows hash and sort.
    Everything else is compared as returned (int, float, str, bool, None, Decimal with its scale, date):
    the engines must agree on those exactly; a float or a decimal of another precision would show.
    """
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.astimezone()
        return ("instant", (aware - EPOCH) // MICROSECOND)
    if isinstance(value, (list, tuple)):
        return tuple(_plain(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _plain(item)) for key, item in value.items()))
    assert value is None or isinstance(value, (int, float, str, bool, Decimal, date)), f"unexpected {type(value)}: {value!r}"
    return value


def _sorted(rows) -> list[tuple]:
    return sorted((tuple(_plain(value) for value in row) for row in rows), key=repr)


def _described(capsys) -> dict:
    """What ``cdc-catalog describe t --json`` prints (run in this process: it needs no Spark)."""
    capsys.readouterr()
    assert catalog_main(["describe", "t", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("load_type", LOAD_TYPES)
def test_pyiceberg_and_duckdb_read_every_date_as_spark_does(spark, tmp_path, warehouse, monkeypatch, capsys, load_type):
    fields = _land(tmp_path / "source", load_type)
    config = write_table_config(tmp_path / "configs", "t", fields["source"]["path"], start_date=DAYS[0], **COLUMNS, **fields)
    assert run_range(definitions_for(config), DAYS[0], DAYS[-1]).success
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(tmp_path / "configs"))

    described = _described(capsys)
    catalog = load_catalog(described["catalog"]["name"], **described["catalog"]["properties"])
    storage = WarehouseStorage(str(warehouse))
    operations = {}
    with duckdb_connection() as duck:
        for asset in (CURRENT, HISTORY):
            how = described["assets"][asset]
            assert how["stored_dates"] == DAYS, asset
            table = catalog.load_table(how["identifier"])
            column = how["partition_column"]
            # Spark: every date in one scan through the project's storage (one Spark job, not one per date),
            # split by its business_date column.
            by_spark = storage.read(spark, "t", asset, DAYS)
            columns = [name for name in by_spark.columns if name != column]
            # Every column of the table is compared.
            assert {field.name for field in table.schema().fields} == {*columns, column}, asset
            spark_rows = {day: [] for day in DAYS}
            for row in by_spark.collect():
                spark_rows[row[column].isoformat()].append(tuple(row[name] for name in columns))
            operations[asset] = {row[columns.index("operation")] for rows in spark_rows.values() for row in rows}
            selected = ", ".join(f'"{name}"' for name in columns)
            for day in DAYS:
                expected = _sorted(spark_rows[day])
                by_pyiceberg = table.scan(row_filter=f"{column} = '{day}'").to_arrow()
                assert set(by_pyiceberg.column(column).to_pylist()) <= {date.fromisoformat(day)}
                pyiceberg_rows = _sorted([tuple(record[name] for name in columns) for record in by_pyiceberg.to_pylist()])
                duckdb_rows = _sorted(duck.sql(
                    f"SELECT {selected} FROM iceberg_scan('{table.metadata_location}') WHERE \"{column}\" = DATE '{day}'"
                ).fetchall())

                # Every date of the chain holds rows in both assets (each date inserts keys).
                assert expected, (load_type, asset, day)
                assert pyiceberg_rows == expected, f"pyiceberg, {asset} of {day}"
                assert duckdb_rows == expected, f"DuckDB, {asset} of {day}"

    # The chain is the one described: inserts, updates and deletes (a delta has none: its deleted keys are
    # not supplied), a full load's unchanged keys N, a delta's or change set's keys not supplied X.
    assert operations[HISTORY] == ({"I", "U"} if load_type == "delta" else {"I", "U", "D"}), operations
    assert operations[CURRENT] == ({"I", "U", "N"} if load_type == "full" else {"I", "U", "X"}), operations
