"""Every engine reads the same Iceberg tables: pyiceberg (no Spark) and DuckDB (the offline extension
packages) read ``current_table`` as of every date and ``history_partition`` of every date of a chain,
equal row for row to what Spark reads through the project's storage.

tests/test_incremental_state.py runs it on the five-date chain of each load type (full, delta, change
set, Debezium) it builds anyway. The catalog is opened from what ``cdc-catalog describe TABLE --json``
prints, as docs/consumers.md shows a script doing.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import contextlib
import io

from pyiceberg.catalog import load_catalog

from cdc_assets.cli.catalog import main as catalog_main
from cdc_assets.engines.duckdb_iceberg import duckdb_connection
from cdc_assets.model.names import CURRENT, HISTORY
from resources.storage import WarehouseStorage

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


def _described(table: str) -> dict:
    """What ``cdc-catalog describe TABLE --json`` prints (run in this process: it needs no Spark)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert catalog_main(["describe", table, "--json"]) == 0
    return json.loads(printed.getvalue())


def assert_engines_read_as_spark(spark, warehouse, table_name: str, days: list[str]) -> dict[str, set[str]]:
    """pyiceberg and DuckDB read ``current_table`` and ``history_partition`` of each of ``days`` equal, row for
    row and every column, to Spark through the storage; every date's state holds rows, and history of all
    dates but one (a date that changed nothing). ``CDC_WAREHOUSE`` and
    ``CDC_TABLE_CONFIGS`` name the warehouse and the table's configs. Returns each asset's operations."""
    described = _described(table_name)
    catalog = load_catalog(described["catalog"]["name"], **described["catalog"]["properties"])
    storage = WarehouseStorage(str(warehouse))
    operations = {}
    with duckdb_connection() as duck:
        for asset in (CURRENT, HISTORY):
            how = described["assets"][asset]
            assert how["stored_dates"] == days, asset
            table = catalog.load_table(how["identifier"])
            column = how["partition_column"]
            # Spark: every date in one scan through the project's storage (one Spark job, not one per date),
            # split by its business_date column.
            by_spark = storage.read(spark, table_name, asset, days)
            columns = [name for name in by_spark.columns if name != column]
            # Every column of the table is compared.
            assert {field.name for field in table.schema().fields} == {*columns, column}, asset
            spark_rows = {day: [] for day in days}
            for row in by_spark.collect():
                spark_rows[row[column].isoformat()].append(tuple(row[name] for name in columns))
            operations[asset] = {row[columns.index("operation")] for rows in spark_rows.values() for row in rows}
            assert sum(bool(rows) for rows in spark_rows.values()) >= len(days) - 1, (asset, "more than one date without rows")
            selected = ", ".join(f'"{name}"' for name in columns)
            for day in days:
                expected = _sorted(spark_rows[day])
                by_pyiceberg = table.scan(row_filter=f"{column} = '{day}'").to_arrow()
                assert set(by_pyiceberg.column(column).to_pylist()) <= {date.fromisoformat(day)}
                pyiceberg_rows = _sorted([tuple(record[name] for name in columns) for record in by_pyiceberg.to_pylist()])
                duckdb_rows = _sorted(duck.sql(
                    f"SELECT {selected} FROM iceberg_scan('{table.metadata_location}') WHERE \"{column}\" = DATE '{day}'"
                ).fetchall())

                # Every date's state holds rows; a date that changed nothing has no history, read as empty alike.
                assert expected or asset == HISTORY, (asset, day)
                assert pyiceberg_rows == expected, f"pyiceberg, {asset} of {day}"
                assert duckdb_rows == expected, f"DuckDB, {asset} of {day}"

    return operations
