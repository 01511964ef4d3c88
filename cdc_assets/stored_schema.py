"""Which columns a table's stored dates hold, read from their Parquet footers (pyarrow: no Spark job).

A date's files are written by one write, so one file's footer tells the date's columns. Readers
need this to read across a change of the table's config (:mod:`cdc_assets.core.as_configured`):
which former names of renamed columns some date still stores, and which columns DuckDB may name.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

import pyarrow.parquet as pq
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from cdc_assets.config import TableConfig
from cdc_assets.core.as_configured import former_names, stored_names
from resources.storage import WarehouseStorage

# Where Spark keeps the schema it wrote in a Parquet footer: its exact types (a timestamp stored as
# INT96 is a timestamp, not the timestamp without time zone pyarrow reads it as).
_SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def folder_schema(storage: WarehouseStorage, folder: str) -> StructType:
    """The Spark schema of a stored date's folder (its first Parquet file's footer)."""
    names = sorted(name for name in storage.list_names(folder) if name.endswith(".parquet"))
    if not names:
        raise ValueError(f"{folder} holds no Parquet file")
    schema = pq.read_schema(f"{folder}/{names[0]}")
    written = (schema.metadata or {}).get(_SPARK_SCHEMA_KEY)
    if written is not None:
        return StructType.fromJson(json.loads(written))
    # Not written by Spark: read as Spark infers it.
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def date_schema(storage: WarehouseStorage, table: str, asset: str, business_date: str) -> StructType:
    """The Spark schema the date's current version of ``[table, asset]`` was stored with."""
    return folder_schema(storage, storage.stored_path(table, asset, business_date))


def stored_among(storage: WarehouseStorage, table: str, asset: str, dates: Sequence[str], wanted: Collection[str]) -> set[str]:
    """The names of ``wanted`` (lower case) that some date of ``dates`` stores. Newest date first, and
    it stops once every one is found, so the usual case reads a footer or two."""
    missing = {name.lower() for name in wanted}
    found: set[str] = set()
    for day in reversed(sorted(dates)):
        if not missing:
            break
        names = {field.name.lower() for field in date_schema(storage, table, asset, day).fields}
        found |= missing & names
        missing -= names
    return found


def stored_former_names(storage: WarehouseStorage, config: TableConfig, asset: str, dates: Sequence[str]) -> list[str]:
    """The former names of the config's renamed columns that some date of ``dates`` stores, in config
    order (no footer is read for a config without ``renamed_from``)."""
    formers = former_names(config.columns)
    found = stored_among(storage, config.name, asset, dates, formers) if formers else set()
    return [name for name in formers if name.lower() in found]


def stored_configured_names(storage: WarehouseStorage, config: TableConfig, asset: str, dates: Sequence[str]) -> set[str]:
    """Which of the config's column names, former names included, some date of ``dates`` stores (lower case)."""
    wanted = [name for column in config.columns for name in stored_names(column)]
    return stored_among(storage, config.name, asset, dates, wanted)
