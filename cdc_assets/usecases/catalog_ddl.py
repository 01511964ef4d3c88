"""The SQL catalog's objects and the statements that define them: every table's current state and history
by name in Spark's Hive metastore, as views over the warehouse's Iceberg tables, brought there afresh
(:func:`sync_statements`, for spark-sql) or in place (:func:`sync_in_place`, in the SQL server). Which
process runs them, and how, is :mod:`cdc_assets.cli.sql_server`'s; ``cdc-catalog``
(:mod:`cdc_assets.cli.catalog`) is the command.

The rows are in the Iceberg catalog ``lake`` (``lake.<table>.<asset>``, resources/storage/lake.py). For
each configured table with stored data, database ``cdc`` (``CDC_CATALOG_DATABASE``) holds views of it
under the names analysts use:

- ``<table>_current`` and ``<table>_history``: ``lake.<table>.current_table`` and
  ``lake.<table>.history_partition``, ``business_date`` (a DATE) last; for a table with
  ``storage: {current: incremental}``, ``<table>_current`` reads each date's tag of the one table
  ``lake.<table>.current_table`` (docs/incremental-state.md);
- ``<table>_latest``: current_table as of its newest date with rows;
- ``<table>_scd2``: the SCD type 2 view over all stored history (``cdc_assets/sql/scd2.sql``);
- and ``runs_log``: the runs log (``_runs/``, Parquet files a run only adds), an external Parquet table,
  one row per run, table and business date.

A view of an asset declares its columns: the configured columns with their configured types, each
former name of a renamed column that a stored date still has, and the pipeline's own columns as the
newest date stores them (a column the Iceberg table does not have yet reads as NULL). The derived views
show the configured columns as configured now, a renamed column with its former name's values on older
dates (:mod:`cdc_assets.core.views.as_configured`).

A view names its Iceberg table, not files: each query reads the table's snapshot committed when it is
planned, so a run's commit is visible to the next query without any sync, and a date is never read
half-replaced. Only a new table, a table's config change or a new column needs a sync. A view over
``lake`` is resolved by the session that reads it: every session on the catalog opens ``lake`` on the
warehouse (:func:`cdc_assets.cli.sql_server.catalog_conf`).

The metastore lives in ``<warehouse>/_catalog`` (``CDC_CATALOG_DIR`` for a warehouse that is not a
local folder): deleting it loses nothing the next sync does not rebuild, except objects a user added.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark.sql import SparkSession

from cdc_assets.model import settings
from cdc_assets.model.config import TableConfig
from cdc_assets.core.views.as_configured import configured_select_list, pipeline_columns, wide_columns
from cdc_assets.core.capture.changes import AUDIT_COLUMNS, EFF_START_DATE, OPERATION
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH
from cdc_assets.core.views.scd2 import Dialect, quote_identifier, scd2_sql
from cdc_assets.core.capture.state import untouched_operation
from cdc_assets.model.names import CURRENT, HISTORY
from cdc_assets.usecases.stored_schema import date_schema, stored_former_names
from resources.storage import WarehouseStorage
from resources.storage.lake import CATALOG_NAME
from resources.storage.merged import LAST_OPERATION, operation_as_of_sql

DATABASE_ENV = settings.CATALOG_DATABASE.name
CATALOG_DIR_ENV = settings.CATALOG_DIR.name
RUNS_LOG = "runs_log"
RUNS_LOG_COMMENT = "one row per run, table and business date (docs/operations.md, Audit columns and the runs log)"
# The SCD2 view sees every stored history date: its as-of is a date after any business date.
ALL_HISTORY = "9999-12-31"
TABLE_SUFFIXES = {CURRENT: "current", HISTORY: "history"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SYNC_ATTEMPTS = 4
# A sync that listed the runs log's folder while a file went (its files are only added, but a user
# may tidy it): listing again finds what is there.
_VANISHED_FILE = re.compile(r"FileNotFoundException|FAILED_READ_FILE|PATH_NOT_FOUND|File does not exist|No such file", re.IGNORECASE)


def catalog_database() -> str:
    """``CDC_CATALOG_DATABASE`` or ``cdc``: the database every table is registered in."""
    name = settings.CATALOG_DATABASE.value()
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{DATABASE_ENV}={name!r} is not a database name (letters, digits and _)")
    return name


def catalog_dir(storage: WarehouseStorage) -> Path:
    """``CDC_CATALOG_DIR``, else ``<warehouse>/_catalog``: the metastore, its lock and the server's state."""
    configured = settings.CATALOG_DIR.value()
    if not configured and storage.layout.files.remote:
        raise ValueError(
            f"the warehouse {storage.root} is in a bucket, and Derby keeps its metastore on a local disk: set "
            f"{CATALOG_DIR_ENV} to a local folder for the SQL catalog (`make -s lake-env` sets one for the local lake)"
        )
    return Path(os.path.abspath(configured or storage.catalog_path()))


# -- what the catalog holds --------------------------------------------------------------------------


def _quoted(database: str, name: str) -> str:
    return f"{quote_identifier(database, Dialect.spark)}.{quote_identifier(name, Dialect.spark)}"


def _string_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_name(config: TableConfig, asset: str) -> str:
    return f"{config.name}_{TABLE_SUFFIXES[asset]}"


def lake_table(table: str, asset: str) -> str:
    """The asset's Iceberg table as a view names it: ``lake.<table>.<asset>``, quoted."""
    return ".".join(quote_identifier(part, Dialect.spark) for part in (CATALOG_NAME, table, asset))


def _create_database(storage: WarehouseStorage, database: str) -> str:
    location = _string_literal(str(catalog_dir(storage) / f"{database}.db"))
    return f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database, Dialect.spark)} LOCATION {location}"


def _create_runs_log(name: str, location: str, if_not_exists: bool = False) -> str:
    """The runs log's ``CREATE TABLE``: external Parquet, its schema merged from every file's footer."""
    create = f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{name}"
    return f"{create} USING parquet OPTIONS (mergeSchema 'true') LOCATION {_string_literal(location)} COMMENT {_string_literal(RUNS_LOG_COMMENT)}"


def _asset_comment(config: TableConfig, asset: str) -> str:
    return f"{config.name}: {asset} (Iceberg table {CATALOG_NAME}.{config.name}.{asset}), one business_date per partition"


@dataclass(frozen=True)
class View:
    """One of a table's views: over the Iceberg table of ``asset``, defined by ``query``."""

    name: str
    asset: str
    comment: str
    query: str

    def create(self, database: str, replace: bool = True) -> str:
        # Spark replaces a view by dropping it and creating it again: only for a metastore read by no one else.
        verb = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW IF NOT EXISTS"
        return f"{verb} {_quoted(database, self.name)} COMMENT {_string_literal(self.comment)} AS {self.query}"

    def alter(self, database: str) -> str:
        """The new definition in place (one metastore update): readers see the old view or the new one."""
        return f"ALTER VIEW {_quoted(database, self.name)} AS {self.query}"

    def drop(self, database: str) -> str:
        return f"DROP VIEW IF EXISTS {_quoted(database, self.name)}"


@dataclass(frozen=True)
class AssetView:
    """The view of one of a table's Iceberg tables: its name, the asset, whether anything is stored,
    its declared columns (name, type; ``business_date`` aside, see :func:`declared_columns`) and the
    columns the Iceberg table has (lower case)."""

    name: str
    table: str
    asset: str
    comment: str
    stored: bool
    columns: tuple[tuple[str, str], ...] = ()
    lake_columns: frozenset[str] = frozenset()
    # A merged state (storage: incremental): each date's tag with the columns (lower case) the date was
    # written with (its snapshot's schema may lack later columns), and the operation of an untouched row.
    tags: tuple[tuple[str, frozenset[str]], ...] = ()
    untouched: str = ""
    stored_operation: str = LAST_OPERATION  # the merged state's stored operation column (merged.py)

    def view(self) -> View:
        """``SELECT`` the declared columns, each as its declared type (NULL if the Iceberg table lacks it),
        then ``business_date``, from the Iceberg table; for a merged state, from each date's tag, each
        row labelled with the date's operation (``resources/storage/merged.py``)."""
        if not self.tags:
            items = [*self._items(self.lake_columns), quote_identifier(BUSINESS_DATE, Dialect.spark)]
            return View(self.name, self.asset, self.comment, f"SELECT {', '.join(items)} FROM {lake_table(self.table, self.asset)}")
        selects = []
        for day, columns in self.tags:
            operation = operation_as_of_sql(day, self.untouched, Dialect.spark, self.stored_operation)
            items = [*self._items(columns, {OPERATION: operation}), f"DATE '{day}' AS {quote_identifier(BUSINESS_DATE, Dialect.spark)}"]
            selects.append(f"SELECT {', '.join(items)} FROM {lake_table(self.table, self.asset)} VERSION AS OF '{day}'")
        return View(self.name, self.asset, self.comment, " UNION ALL ".join(selects))

    def _items(self, present: frozenset[str], values: dict[str, str] | None = None) -> list[str]:
        """Each declared column as its declared type: its value (or ``values``'s expression for it) where
        ``present`` (lower-case names) has it, else NULL."""
        items = []
        for column, data_type in self.columns:
            quoted = quote_identifier(column, Dialect.spark)
            value = (values or {}).get(column, quoted) if column.lower() in present else "NULL"
            items.append(f"CAST({value} AS {data_type}) AS {quoted}")
        return items

    def as_configured(self, config: TableConfig, database: str) -> str:
        """The view as a relation with the configured columns as configured now (a renamed column's
        former name carried across), then its pipeline columns and ``business_date``."""
        stored = [name for name, _ in self.columns]
        items = [
            *configured_select_list(config.columns, stored, Dialect.spark),
            *(quote_identifier(name, Dialect.spark) for name in pipeline_columns(stored)),
            BUSINESS_DATE,
        ]
        return f"(SELECT {', '.join(items)} FROM {_quoted(database, self.name)}) AS {quote_identifier(f'{self.name}_as_configured', Dialect.spark)}"


def declared_columns(config: TableConfig, storage: WarehouseStorage, asset: str) -> list[tuple[str, str]]:
    """The columns (name, type) an asset's view declares: the configured columns with their configured
    types, each former name of a renamed column that a stored date has (with its new name's type),
    then the pipeline's own columns as the newest stored date has them. Empty when nothing is stored.
    Reads the schemas the dates were written with (the newest, and older ones while a former name is not found)."""
    dates = storage.stored_dates(config.name, asset)
    if not dates:
        return []
    newest = date_schema(storage, config.name, asset, dates[-1])
    own = set(pipeline_columns(newest.names)) - {BUSINESS_DATE}
    return [
        *wide_columns(config.columns, stored_former_names(storage, config, asset, dates)),
        *((field.name, field.dataType.simpleString()) for field in newest.fields if field.name in own),
    ]


def _lake_columns(storage: WarehouseStorage, table: str, asset: str) -> frozenset[str]:
    """The columns of the asset's Iceberg table now (lower case; its metadata, no Spark job)."""
    loaded = storage.tables.load(table, asset)
    return frozenset() if loaded is None else frozenset(field.name.lower() for field in loaded.schema().fields)


def asset_views(config: TableConfig, storage: WarehouseStorage) -> list[AssetView]:
    """The views of one table's Iceberg tables: ``<table>_current`` and ``<table>_history``. A merged
    state's view reads each stored date's tag: a sync after each date brings in the new one."""
    views = []
    for asset in (CURRENT, HISTORY):
        columns = tuple(declared_columns(config, storage, asset))
        lake_columns = _lake_columns(storage, config.name, asset) if columns else frozenset()
        merged = columns and storage.merged.holds(config.name, asset)
        tags = tuple(
            (day, frozenset(name.lower() for name in storage.stored_schema(config.name, asset, day).names))
            for day in storage.stored_dates(config.name, asset)
        ) if merged else ()
        untouched = untouched_operation(config.load_type) if merged else ""
        stored_operation = storage.merged.operation_column(config.name, asset) if merged else LAST_OPERATION
        views.append(AssetView(table_name(config, asset), config.name, asset, _asset_comment(config, asset), bool(columns), columns,
                               lake_columns, tags, untouched, stored_operation))
    return views


def table_views(config: TableConfig, database: str, assets: Sequence[AssetView]) -> list[View]:
    """``<table>_latest`` over current_table and ``<table>_scd2`` over history_partition. ``assets`` are
    the table's :func:`asset_views`; the views show the configured columns as configured now."""
    by_name = {view.name: view for view in assets}
    current = _quoted(database, table_name(config, CURRENT))
    history_relation = by_name[table_name(config, HISTORY)].as_configured(config, database)
    scd2 = scd2_sql([column.name for column in config.columns], history_relation, ALL_HISTORY, config.scd2.open_end, config.scd2.hard_deletes, Dialect.spark)
    views = []
    newest = f"(SELECT max(business_date) FROM {current})"
    relation = by_name[table_name(config, CURRENT)].as_configured(config, database)
    latest = f"SELECT * FROM {relation} WHERE business_date = {newest}"
    views.append(View(f"{config.name}_latest", CURRENT, f"{config.name}: current_table as of its newest business_date", latest))
    views.append(View(f"{config.name}_scd2", HISTORY, f"{config.name}: SCD type 2 versions from history_partition",
                      " ".join(line for line in scd2.splitlines() if not line.lstrip().startswith("--"))))
    return views  # fmt: skip


def state_columns(config: TableConfig) -> list[str]:
    """current_table's columns, in their stored order."""
    return [column.name for column in config.columns] + [KEY_HASH, NON_KEY_HASH, OPERATION, EFF_START_DATE, *AUDIT_COLUMNS]


def _stored(config: TableConfig, storage: WarehouseStorage) -> dict[str, bool]:
    return {asset: bool(storage.stored_dates(config.name, asset)) for asset in (CURRENT, HISTORY)}


def _every_view(config: TableConfig, storage: WarehouseStorage, database: str) -> list[tuple[View, bool]]:
    """Each of the table's views, those over the Iceberg tables first, with whether it is to exist
    (something of its asset is stored)."""
    stored, assets = _stored(config, storage), asset_views(config, storage)
    return [(asset.view(), asset.stored) for asset in assets] + [
        (view, stored[view.asset]) for view in table_views(config, database, assets)
    ]


def table_statements(config: TableConfig, storage: WarehouseStorage, database: str) -> list[str]:
    """The statements that define one table's views afresh in ``database``, from what is stored.

    For a metastore no one else reads while they run (``cdc-catalog sql`` holds it alone): each view is
    replaced (dropped and created again). An asset with nothing stored loses its views. The SQL server
    syncs in place instead (:func:`sync_in_place`).
    """
    return [view.create(database) if wanted else view.drop(database) for view, wanted in _every_view(config, storage, database)]


def sync_statements(configs: Sequence[TableConfig], storage: WarehouseStorage, database: str) -> list[str]:
    """Every statement of a fresh sync: the database, each table's views, the runs log; then ``USE database``.

    Their session must open the warehouse's ``lake`` catalog (a view is checked against its table when created)."""
    statements = [_create_database(storage, database)]
    for config in configs:
        statements += table_statements(config, storage, database)
    runs_log = _quoted(database, RUNS_LOG)
    statements.append(f"DROP TABLE IF EXISTS {runs_log}")
    if storage.list_names(storage.runs_log_path()):
        statements.append(_create_runs_log(runs_log, storage.runs_log_path()))
    statements.append(f"USE {quote_identifier(database, Dialect.spark)}")
    return statements


def write_sync_file(statements: Sequence[str], folder: Path) -> Path:
    """The statements as a SQL file (one per line, ``;``-terminated) in ``folder``, for ``-i``/``-f``."""
    folder.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix="sync-", suffix=".sql", dir=folder)
    with os.fdopen(handle, "w") as out:
        out.write("".join(f"{statement};\n" for statement in statements))
    return Path(name)


# -- syncing in place, in the SQL server -------------------------------------------------------------


@dataclass
class SyncReport:
    """What a sync in place ran, and what failed (one line per object); the rest was synced regardless."""

    statements: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def run(self, spark: SparkSession, statement: str) -> None:
        spark.sql(statement)
        self.statements.append(statement)

    def attempt(self, what: str, action: Callable[[], None]) -> None:
        """``action``, again after a pause while it fails on a file that went meanwhile."""
        for attempt in range(1, SYNC_ATTEMPTS + 1):
            try:
                action()
                return
            except Exception as error:  # noqa: BLE001 - reported per object; the sync goes on with the others
                message = str(error).strip()
                if attempt < SYNC_ATTEMPTS and _VANISHED_FILE.search(message):
                    time.sleep(0.5 * attempt)
                    continue
                self.errors.append(f"{what}: {message.splitlines()[0][:1000] if message else type(error).__name__}")
                return


def sync_in_place(spark: SparkSession, configs: Sequence[TableConfig], storage: WarehouseStorage, database: str) -> SyncReport:
    """Bring the catalog in ``spark``'s metastore to what is stored, without any name going missing.

    Runs in ``spark`` with the warehouse's ``lake`` catalog opened (``storage.tables.session_for``). A
    view that exists gets its new query in place (``ALTER VIEW ... AS``, one metastore update; Spark's
    ``CREATE OR REPLACE VIEW`` drops it first), so a query planned while a sync runs finds every name; a
    view not yet there is created. Dropped are only the views of an asset with nothing stored, and a
    table in a view's name (an external table of a catalog synced before the warehouse held Iceberg
    tables), which is dropped and the view created: the one case where a name is missing for a moment.
    The runs log's table is created, or brought to its files' columns (:func:`_define_runs_log`).
    """
    spark = storage.tables.session_for(spark)
    report = SyncReport()
    report.run(spark, _create_database(storage, database))
    for config in configs:
        report.attempt(config.name, partial(_sync_table_in_place, spark, report, config, storage, database))
    report.attempt(RUNS_LOG, lambda: _sync_runs_log_in_place(spark, report, storage, database))
    return report


def _sync_table_in_place(spark: SparkSession, report: SyncReport, config: TableConfig, storage: WarehouseStorage, database: str) -> None:
    for view, wanted in _every_view(config, storage, database):
        exists = spark.catalog.tableExists(f"{database}.{view.name}")
        is_view = exists and _is_view(spark, database, view.name)
        if not wanted:
            if exists:
                report.run(spark, view.drop(database) if is_view else f"DROP TABLE IF EXISTS {_quoted(database, view.name)}")
        elif is_view:
            report.run(spark, view.alter(database))
        else:
            if exists:
                report.run(spark, f"DROP TABLE IF EXISTS {_quoted(database, view.name)}")
            report.run(spark, view.create(database, replace=False))


def _is_view(spark: SparkSession, database: str, name: str) -> bool:
    return spark.catalog.getTable(f"{database}.{name}").tableType == "VIEW"


def _sync_runs_log_in_place(spark: SparkSession, report: SyncReport, storage: WarehouseStorage, database: str) -> None:
    if storage.list_names(storage.runs_log_path()):
        _define_runs_log(spark, report, database, storage.runs_log_path())
    else:
        report.run(spark, f"DROP TABLE IF EXISTS {_quoted(database, RUNS_LOG)}")


def _define_runs_log(spark: SparkSession, report: SyncReport, database: str, location: str) -> None:
    """Create the runs log's table, or bring the registered one to its files' merged schema: add the
    columns it lacks, set its location if the warehouse moved, or drop and create it again when a column's
    type differs or it is partitioned (Spark cannot change either in place)."""
    quoted = _quoted(database, RUNS_LOG)
    if not spark.catalog.tableExists(f"{database}.{RUNS_LOG}"):
        report.run(spark, _create_runs_log(quoted, location, if_not_exists=True))
        return
    registered = {column.name.lower(): column for column in spark.catalog.listColumns(f"{database}.{RUNS_LOG}")}
    merged = spark.read.option("mergeSchema", "true").parquet(location).schema
    wanted = [(field.name, field.dataType.simpleString()) for field in merged.fields]
    partitioned = any(column.isPartition for column in registered.values())
    conflicts = [column for column, data_type in wanted if column.lower() in registered and registered[column.lower()].dataType != data_type]
    if partitioned or conflicts:
        report.run(spark, f"DROP TABLE IF EXISTS {quoted}")
        report.run(spark, _create_runs_log(quoted, location))
        return
    if _registered_location(spark, quoted) != _normalized_location(location):
        report.run(spark, f"ALTER TABLE {quoted} SET LOCATION {_string_literal(location)}")
    missing = [(column, data_type) for column, data_type in wanted if column.lower() not in registered]
    if missing:
        added = ", ".join(f"{quote_identifier(column, Dialect.spark)} {data_type}" for column, data_type in missing)
        report.run(spark, f"ALTER TABLE {quoted} ADD COLUMNS ({added})")
    report.run(spark, f"REFRESH TABLE {quoted}")


def _registered_location(spark: SparkSession, quoted: str) -> str | None:
    for row in spark.sql(f"DESCRIBE TABLE EXTENDED {quoted}").collect():  # a few dozen rows of metadata
        if row["col_name"] == "Location":
            return _normalized_location(row["data_type"])
    return None


def _normalized_location(location: str) -> str:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return os.path.normpath(unquote(parsed.path))
    return location.rstrip("/")
