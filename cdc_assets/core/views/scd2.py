"""The SCD type 2 view of a table's history: one SQL text, rendered for Spark SQL, DuckDB or Trino.

The query lives in ``cdc_assets/sql/scd2.sql`` (shipped with the package) so that it can be read,
and run, outside this project. Rendering only fills in its placeholders; the dialects differ in
identifier quoting alone, and ``tests/test_scd2.py`` (Spark, DuckDB) and ``tests/test_trino.py`` check
that they give the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from enum import Enum
from functools import cache
from importlib.resources import files
from string import Template

from cdc_assets.model.config import HardDeletes

VALID_FROM, VALID_TO, IS_CURRENT, IS_DELETED = "valid_from", "valid_to", "is_current", "is_deleted"
SCD2_SQL_FILE = "sql/scd2.sql"


class Dialect(str, Enum):
    spark = "spark"
    duckdb = "duckdb"
    trino = "trino"


# Each dialect's identifier quote; a quote inside a name is doubled.
_QUOTES = {Dialect.spark: "`", Dialect.duckdb: '"', Dialect.trino: '"'}


def quote_identifier(name: str, dialect: Dialect | str) -> str:
    """``name`` as a quoted identifier of ``dialect``: `name` for Spark, "name" for DuckDB and Trino."""
    quote = _QUOTES[Dialect(dialect)]
    return quote + name.replace(quote, quote * 2) + quote


def date_literal(value: date | str) -> str:
    """``DATE 'YYYY-MM-DD'``; the value is parsed first, so only a real date reaches the SQL text."""
    return f"DATE '{as_date(value).isoformat()}'"


def as_date(value: date | str) -> date:
    """A ``date`` from a date or an ISO ``YYYY-MM-DD`` string; a ValueError naming the value otherwise."""
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a date (expected YYYY-MM-DD)") from None


@cache
def scd2_template() -> Template:
    """The shipped SQL template (``cdc_assets/sql/scd2.sql``)."""
    return Template(files("cdc_assets").joinpath(SCD2_SQL_FILE).read_text(encoding="utf-8"))


def scd2_output_columns(columns: Sequence[str], hard_deletes: HardDeletes | str) -> list[str]:
    """The view's columns, in order: ``columns``, valid_from, valid_to, is_current (, is_deleted)."""
    extra = [IS_DELETED] if HardDeletes(hard_deletes) is HardDeletes.new_record else []
    return [*columns, VALID_FROM, VALID_TO, IS_CURRENT, *extra]


def scd2_sql(
    columns: Sequence[str],
    history_relation: str,
    as_of: date | str,
    open_end: date | str | None,
    hard_deletes: HardDeletes | str,
    dialect: Dialect | str,
) -> str:
    """The SCD type 2 query over ``history_relation``, as of ``as_of``, in ``dialect`` (spark, duckdb or trino).

    ``columns`` are the configured column names (keys, non-keys, untracked), quoted here;
    ``history_relation`` is SQL text used as is (a quoted view name, or DuckDB's ``iceberg_scan(...)``)
    and must have those columns and ``key_hash``, ``operation`` and ``business_date``. One row per
    version of a key: ``columns``, ``valid_from`` (the business date of the I or U that started it),
    ``valid_to`` (the business date of the key's next history row, the change that closed it; for an
    open version ``open_end``: NULL, or a high date such as 9999-12-31) and ``is_current`` (the version
    is open). With ``hard_deletes`` ``new_record`` each delete also gives a row with the deleted
    payload from the delete's date until the key returns, and every row has ``is_deleted``.

    A version's columns, untracked ones included, are those of the I or U row that started it: a
    change to untracked columns alone is not in history, so it changes no version.
    """
    if not columns:
        raise ValueError("the SCD type 2 view needs at least one column")
    dialect, hard_deletes = Dialect(dialect), HardDeletes(hard_deletes)
    quoted = [quote_identifier(name, dialect) for name in columns]
    output = [*quoted, *(quote_identifier(name, dialect) for name in scd2_output_columns([], hard_deletes))]
    return scd2_template().substitute(
        history=history_relation,
        columns=", ".join(quoted),
        output_columns=", ".join(output),
        as_of=as_date(as_of).isoformat(),
        open_end="CAST(NULL AS DATE)" if open_end is None else date_literal(open_end),
        deletion_rows="TRUE" if hard_deletes is HardDeletes.new_record else "FALSE",
    )
