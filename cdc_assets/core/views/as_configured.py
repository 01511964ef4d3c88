"""Stored rows as the table is configured now, across the schema changes of its config.

A table's config may change its columns between dates without rewriting what is stored, so the
dates of one stored asset can differ: a column added later is missing on older dates, a renamed
column is stored under its former name (``Column.renamed_from``, newest first) on older dates, and
a widened column (an integer to a wider one, float to double, a decimal to a greater precision) is
stored with its narrower type. Readers read every date with a *wide* schema: each configured column
with its configured type, and each former name that some date stores, with the type of the column
it became (Spark's Parquet reader widens a narrower stored type to the type asked for; a column a
file lacks reads as NULL). Then they show the configured columns: the first non-NULL of the
column's names, newest first (a date stores one of them), cast to the configured type. A stored
column the config no longer has is not shown.

The same projection as DataFrame columns (:func:`configured_columns`) and as a SQL select list for
Spark SQL or DuckDB (:func:`configured_select_list`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.model.config import RESERVED_COLUMNS, Column
from cdc_assets.core.views.scd2 import Dialect, quote_identifier

# The configured types a stored column can be narrower than (see the module docstring).
_NUMERIC = {"tinyint", "smallint", "int", "bigint", "float", "double"}
# DuckDB's names of the configured (Spark SQL) types that differ.
_DUCKDB_TYPES = {"string": "VARCHAR", "int": "INTEGER"}
# Trino's: its Iceberg connector reads a stored timestamp as timestamp(6) with time zone.
_TRINO_TYPES = {"string": "varchar", "int": "integer", "float": "real", "timestamp": "timestamp(6) with time zone"}


def stored_names(column: Column) -> tuple[str, ...]:
    """Every name ``column`` may be stored under, newest first: its name, then its former names."""
    return (column.name, *column.renamed_from)


def former_names(columns: Iterable[Column]) -> list[str]:
    """The former names of ``columns`` (``renamed_from``), in config order."""
    return [former for column in columns for former in column.renamed_from]


def wide_columns(columns: Sequence[Column], stored_former: Collection[str]) -> list[tuple[str, str]]:
    """The (name, type) pairs to read stored dates with: each configured column with its type, then
    each former name in ``stored_former`` (the ones some stored date has; any case) with the type of
    the column it became."""
    present = {name.lower() for name in stored_former}
    wide = [(column.name, column.type) for column in columns]
    for column in columns:
        wide += [(former, column.type) for former in column.renamed_from if former.lower() in present]
    return wide


def pipeline_columns(stored: Iterable[str]) -> list[str]:
    """The names among ``stored`` that are the pipeline's own columns (``key_hash``, ``operation``,
    audit columns, ``business_date``...), in their order: what readers show besides the configured ones."""
    return [name for name in stored if name.lower() in RESERVED_COLUMNS]


def configured_columns(stored: Iterable[str], columns: Sequence[Column]) -> list[SparkColumn]:
    """``columns`` as configured, from a frame with the columns ``stored``: for each configured column
    the first non-NULL of its names the frame has (NULL when it has none), cast to the configured type."""
    by_lower = {name.lower(): name for name in stored}
    projected = []
    for column in columns:
        names = [by_lower[name.lower()] for name in stored_names(column) if name.lower() in by_lower]
        value = F.lit(None) if not names else F.col(names[0]) if len(names) == 1 else F.coalesce(*(F.col(name) for name in names))
        projected.append(value.cast(column.type).alias(column.name))
    return projected


def as_configured(frame: DataFrame, columns: Sequence[Column], keep: Sequence[str] | None = None) -> DataFrame:
    """``frame`` with ``columns`` as configured (:func:`configured_columns`), then the columns ``keep``
    that the frame has (default: its pipeline columns, :func:`pipeline_columns`), in that order.
    Its other columns (stored columns the config no longer has, former names) are dropped."""
    present = {name.lower(): name for name in frame.columns}
    kept = pipeline_columns(frame.columns) if keep is None else [present[name.lower()] for name in keep if name.lower() in present]
    return frame.select(*configured_columns(frame.columns, columns), *kept)


def configured_select_list(columns: Sequence[Column], stored: Collection[str], dialect: Dialect | str) -> list[str]:
    """:func:`configured_columns` as SQL select-list items of ``dialect``, over a relation with the
    columns ``stored`` (any case). A name the relation lacks is not referenced: DuckDB fails on one.

    DuckDB and Trino cast only numeric columns (the ones a stored type can be narrower than) and NULLs:
    DuckDB reads a Spark timestamp as a TIMESTAMP or a TIMESTAMP WITH TIME ZONE depending on how it is
    stored, and a cast between the two would shift it by the session's time zone.
    """
    dialect = Dialect(dialect)
    present = {name.lower() for name in stored}
    items = []
    for column in columns:
        names = [quote_identifier(name, dialect) for name in stored_names(column) if name.lower() in present]
        value = "NULL" if not names else names[0] if len(names) == 1 else f"coalesce({', '.join(names)})"
        if dialect is Dialect.spark:
            value = f"CAST({value} AS {column.type})"
        elif not names or _numeric(column.type):
            value = f"CAST({value} AS {_trino_type(column.type) if dialect is Dialect.trino else _duckdb_type(column.type)})"
        items.append(f"{value} AS {quote_identifier(column.name, dialect)}")
    return items


def _numeric(data_type: str) -> bool:
    return data_type in _NUMERIC or data_type.startswith("decimal(")


def _duckdb_type(data_type: str) -> str:
    return _DUCKDB_TYPES.get(data_type, data_type.upper())


def _trino_type(data_type: str) -> str:
    return _TRINO_TYPES.get(data_type, data_type)
