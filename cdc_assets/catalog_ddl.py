"""The SQL catalog's objects and the statements that define them: every table's current state and history
by name in Spark's Hive metastore, brought there afresh (:func:`sync_statements`, for spark-sql) or in
place (:func:`sync_in_place`, in the SQL server). Which process runs them, and how, is
:mod:`cdc_assets.services.sql_server`'s; ``cdc-catalog`` (:mod:`cdc_assets.catalog`) is the command.

For each configured table with stored data, database ``cdc`` (``CDC_CATALOG_DATABASE``) holds:

- ``<table>_current`` and ``<table>_history``: external Parquet tables over the warehouse folders,
  partitioned by ``business_date`` (a DATE); for a table with ``storage: {current: incremental}``,
  ``<table>_current`` is a view of each date's state over ``<table>_current_full`` and
  ``<table>_current_changes`` (docs/incremental-state.md);
- ``<table>_latest``: a view of current_table as of its newest committed date;
- ``<table>_scd2``: the SCD type 2 view over all stored history (``cdc_assets/sql/scd2.sql``);
- and ``runs_log``: the runs log (``_runs/``), one row per run, table and business date.

A table's schema is declared, not inferred from its files (which fails once a column was widened):
the configured columns with their configured types, each former name of a renamed column that a
stored file still has, and the pipeline's own columns as the newest date stores them. Spark then
reads a column a date lacks as NULL and a narrower stored type as the declared one. The views show
the configured columns as configured now, a renamed column with its former name's values on older
dates (:mod:`cdc_assets.core.as_configured`).

The tables do not track partitions in the metastore (``spark.sql.hive.manageFilesourcePartitions=false``
in the catalog's sessions): Spark lists a table's folder when a query is planned, so a commit's rename
into ``business_date=D`` is what registers date D, and runs never write to the metastore.

The metastore lives in ``<warehouse>/_catalog`` (``CDC_CATALOG_DIR`` for a warehouse that is not a
local folder): deleting it loses nothing the next sync does not rebuild, except objects a user added.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark.sql import SparkSession

from cdc_assets.config import TableConfig
from cdc_assets.core.as_configured import configured_select_list, pipeline_columns, wide_columns
from cdc_assets.core.changes import AUDIT_COLUMNS, EFF_START_DATE, OPERATION
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH
from cdc_assets.core.scd2 import Dialect, quote_identifier, scd2_sql
from cdc_assets.core.state import state_sql, untouched_operation
from cdc_assets.names import CURRENT, HISTORY
from cdc_assets.stored_schema import date_schema, stored_former_names
from resources.storage import WarehouseStorage, state_changes_asset

DATABASE_ENV = "CDC_CATALOG_DATABASE"
DEFAULT_DATABASE = "cdc"
CATALOG_DIR_ENV = "CDC_CATALOG_DIR"
RUNS_LOG = "runs_log"
RUNS_LOG_COMMENT = "one row per run, table and business date (docs/operations.md, Audit columns and the runs log)"
# The SCD2 view sees every stored history date: its as-of is a date after any business date.
ALL_HISTORY = "9999-12-31"
TABLE_SUFFIXES = {CURRENT: "current", HISTORY: "history"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SYNC_ATTEMPTS = 4
# A sync or query that listed a folder while a commit renamed it away: listing again finds the new one.
_VANISHED_FILE = re.compile(r"FileNotFoundException|FAILED_READ_FILE|PATH_NOT_FOUND|File does not exist|No such file", re.IGNORECASE)


def catalog_database() -> str:
    """``CDC_CATALOG_DATABASE`` or ``cdc``: the database every table is registered in."""
    name = os.environ.get(DATABASE_ENV, "").strip() or DEFAULT_DATABASE
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{DATABASE_ENV}={name!r} is not a database name (letters, digits and _)")
    return name


def catalog_dir(storage: WarehouseStorage) -> Path:
    """``CDC_CATALOG_DIR``, else ``<warehouse>/_catalog``: the metastore, its lock and the server's state."""
    configured = os.environ.get(CATALOG_DIR_ENV, "").strip()
    return Path(os.path.abspath(configured or storage.catalog_path()))


# -- what the catalog holds --------------------------------------------------------------------------


def _quoted(database: str, name: str) -> str:
    return f"{quote_identifier(database, Dialect.spark)}.{quote_identifier(name, Dialect.spark)}"


def _string_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_name(config: TableConfig, asset: str) -> str:
    return f"{config.name}_{TABLE_SUFFIXES[asset]}"


def _create_database(storage: WarehouseStorage, database: str) -> str:
    location = _string_literal(str(catalog_dir(storage) / f"{database}.db"))
    return f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database, Dialect.spark)} LOCATION {location}"


def _create_table(
    name: str, location: str, comment: str, if_not_exists: bool = False, columns: Sequence[tuple[str, str]] | None = None
) -> str:
    """A table's ``CREATE TABLE``: with ``columns`` (name, type) declared and partitioned by
    ``business_date``; without, the schema merged from every stored file's footer (the runs log's)."""
    create = f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{name}"
    where = f"LOCATION {_string_literal(location)} COMMENT {_string_literal(comment)}"
    if columns is None:
        return f"{create} USING parquet OPTIONS (mergeSchema 'true') {where}"
    declared = ", ".join(f"{quote_identifier(column, Dialect.spark)} {data_type}" for column, data_type in [*columns, (BUSINESS_DATE, "date")])
    return f"{create} ({declared}) USING parquet PARTITIONED BY ({quote_identifier(BUSINESS_DATE, Dialect.spark)}) {where}"


def _asset_comment(config: TableConfig, asset: str) -> str:
    return f"{config.name}: {asset}, one partition per business_date"


@dataclass(frozen=True)
class View:
    """One of a table's views: over the table of ``asset``, defined by ``query``."""

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
class StoredTable:
    """An external table over one of a table's asset folders: its name, folder, whether anything is
    stored, and its declared columns (name, type; ``business_date`` aside): see :func:`declared_columns`."""

    name: str
    location: str
    comment: str
    stored: bool
    columns: tuple[tuple[str, str], ...] = ()

    def as_configured(self, config: TableConfig, database: str) -> str:
        """The table as a relation with the configured columns as configured now (a renamed column's
        former name carried across), then its pipeline columns and ``business_date``."""
        stored = [name for name, _ in self.columns]
        items = [
            *configured_select_list(config.columns, stored, Dialect.spark),
            *(quote_identifier(name, Dialect.spark) for name in pipeline_columns(stored)),
            BUSINESS_DATE,
        ]
        return f"(SELECT {', '.join(items)} FROM {_quoted(database, self.name)}) AS {quote_identifier(f'{self.name}_as_configured', Dialect.spark)}"


def declared_columns(config: TableConfig, storage: WarehouseStorage, asset: str) -> list[tuple[str, str]]:
    """The columns (name, type) an asset's table declares: the configured columns with their configured
    types, each former name of a renamed column that a stored date has (with its new name's type),
    then the pipeline's own columns as the newest stored date has them. Empty when nothing is stored.
    Reads Parquet footers (a file of the newest date, and older ones while a former name is not found)."""
    dates = storage.stored_dates(config.name, asset)
    if not dates:
        return []
    newest = date_schema(storage, config.name, asset, dates[-1])
    own = set(pipeline_columns(newest.names)) - {BUSINESS_DATE}
    return [
        *wide_columns(config.columns, stored_former_names(storage, config, asset, dates)),
        *((field.name, field.dataType.simpleString()) for field in newest.fields if field.name in own),
    ]


def stored_tables(config: TableConfig, storage: WarehouseStorage) -> list[StoredTable]:
    """The external tables of one table: ``<table>_current`` and ``<table>_history``; for an incremental
    state ``<table>_current_full`` (its full copies) and ``<table>_current_changes`` instead of ``_current``,
    which is then a view (:func:`table_views`)."""
    folders = [(table_name(config, CURRENT), CURRENT, _asset_comment(config, CURRENT))]
    if config.storage.incremental:
        folders = [
            (f"{config.name}_current_full", CURRENT, f"{config.name}: full copies of the state (storage: incremental)"),
            (f"{config.name}_current_changes", state_changes_asset(CURRENT),
             f"{config.name}: each date's changes to the state (storage: incremental)"),
        ]
    folders.append((table_name(config, HISTORY), HISTORY, _asset_comment(config, HISTORY)))
    tables = []
    for name, asset, comment in folders:
        columns = tuple(declared_columns(config, storage, asset))
        tables.append(StoredTable(name, storage.asset_path(config.name, asset), comment, bool(columns), columns))
    return tables


def table_views(config: TableConfig, database: str, tables: Sequence[StoredTable]) -> list[View]:
    """``<table>_latest`` over current_table and ``<table>_scd2`` over history_partition; for an
    incremental state also ``<table>_current``, every stored date's state. ``tables`` are the table's
    :func:`stored_tables`; the views show the configured columns as configured now."""
    by_name = {table.name: table for table in tables}
    current = _quoted(database, table_name(config, CURRENT))
    history_relation = by_name[table_name(config, HISTORY)].as_configured(config, database)
    scd2 = scd2_sql([column.name for column in config.columns], history_relation, ALL_HISTORY, config.scd2.open_end, config.scd2.hard_deletes, Dialect.spark)
    views = []
    if config.storage.incremental:
        # The newest date is read from the stored folders' partitions, not from the view (which would
        # build every date's state to find it).
        full_table, changes_table = by_name[f"{config.name}_current_full"], by_name[f"{config.name}_current_changes"]
        full, changes = _quoted(database, full_table.name), _quoted(database, changes_table.name)
        state = state_sql(
            state_columns(config),
            full_table.as_configured(config, database),
            changes_table.as_configured(config, database) if changes_table.stored else None,
            untouched_operation(config.load_type),
        )
        views.append(View(table_name(config, CURRENT), CURRENT, f"{config.name}: the state as of each business_date", state))
        newest = f"(SELECT max(business_date) FROM {full})" if not changes_table.stored else (
            f"(SELECT greatest(max(business_date), (SELECT max(business_date) FROM {changes})) FROM {full})")
        latest = f"SELECT * FROM {current} WHERE business_date = {newest}"  # the view above is as configured
    else:
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


def table_statements(config: TableConfig, storage: WarehouseStorage, database: str) -> list[str]:
    """The statements that define one table's objects afresh in ``database``, from what is stored.

    For a metastore no one else reads while they run (``cdc-catalog sql`` holds it alone): tables are
    dropped and created again, which loses no data (they are external) and takes the stored schema as
    it is now. An asset with nothing stored loses its objects. The SQL server syncs in place instead
    (:func:`sync_in_place`).
    """
    stored, tables = _stored(config, storage), stored_tables(config, storage)
    views = table_views(config, database, tables)
    statements = [view.drop(database) for view in reversed(views)]
    for table in tables:
        name = _quoted(database, table.name)
        statements.append(f"DROP TABLE IF EXISTS {name}")
        if table.stored:
            statements.append(_create_table(name, table.location, table.comment, columns=table.columns))
    return statements + [view.create(database) for view in views if stored[view.asset]]


def sync_statements(configs: Sequence[TableConfig], storage: WarehouseStorage, database: str) -> list[str]:
    """Every statement of a fresh sync: the database, each table's objects, the runs log; then ``USE database``."""
    statements = [_create_database(storage, database)]
    for config in configs:
        statements += table_statements(config, storage, database)
    runs_log = _quoted(database, RUNS_LOG)
    statements.append(f"DROP TABLE IF EXISTS {runs_log}")
    if storage.list_names(storage.runs_log_path()):
        statements.append(_create_table(runs_log, storage.runs_log_path(), RUNS_LOG_COMMENT))
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
        """``action``, again after a pause while it fails on a file a commit renamed away meanwhile."""
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

    A table that exists keeps its definition, brought up to date: the declared columns it lacks are
    added (``ALTER TABLE ... ADD COLUMNS``, so a column a config gained reads as NULL on older dates), its
    location is set if it moved, and ``REFRESH TABLE`` drops this session's listing. A table not yet
    registered is created. A view that exists gets its new query in place (``ALTER VIEW ... AS``;
    Spark's ``CREATE OR REPLACE VIEW`` drops it first). So a query planned while a sync runs finds
    every name. Dropped are only the objects of an asset with nothing stored, and a table whose
    registered partitioning or columns no longer match its declared ones (a widened column's type, a
    column it should no longer have, a table registered before schemas were declared): it is dropped
    and created again, the one case where a name is missing for a moment.
    """
    report = SyncReport()
    report.run(spark, _create_database(storage, database))
    for config in configs:
        report.attempt(config.name, lambda config=config: _sync_table_in_place(spark, report, config, storage, database))
    report.attempt(RUNS_LOG, lambda: _sync_runs_log_in_place(spark, report, storage, database))
    return report


def _sync_table_in_place(spark: SparkSession, report: SyncReport, config: TableConfig, storage: WarehouseStorage, database: str) -> None:
    stored, tables = _stored(config, storage), stored_tables(config, storage)
    for table in tables:
        if table.stored:
            if _is_view(spark, database, table.name):  # the table's storage mode changed since the last sync
                report.run(spark, f"DROP VIEW IF EXISTS {_quoted(database, table.name)}")
            _define_table(spark, report, database, table.name, table.location, table.comment, [BUSINESS_DATE], table.columns)
    for view in table_views(config, database, tables):
        if not stored[view.asset]:
            report.run(spark, view.drop(database))
        elif _is_view(spark, database, view.name):
            report.run(spark, view.alter(database))
        else:
            if spark.catalog.tableExists(f"{database}.{view.name}"):  # a table of the other storage mode
                report.run(spark, f"DROP TABLE IF EXISTS {_quoted(database, view.name)}")
            report.run(spark, view.create(database, replace=False))
    for table in tables:
        if not table.stored and not _is_view(spark, database, table.name):
            report.run(spark, f"DROP TABLE IF EXISTS {_quoted(database, table.name)}")


def _is_view(spark: SparkSession, database: str, name: str) -> bool:
    return spark.catalog.tableExists(f"{database}.{name}") and spark.catalog.getTable(f"{database}.{name}").tableType == "VIEW"


def _sync_runs_log_in_place(spark: SparkSession, report: SyncReport, storage: WarehouseStorage, database: str) -> None:
    if storage.list_names(storage.runs_log_path()):
        _define_table(spark, report, database, RUNS_LOG, storage.runs_log_path(), RUNS_LOG_COMMENT, [])
    else:
        report.run(spark, f"DROP TABLE IF EXISTS {_quoted(database, RUNS_LOG)}")


def _define_table(spark: SparkSession, report: SyncReport, database: str, name: str, location: str, comment: str,
                  partition_columns: list[str], columns: Sequence[tuple[str, str]] | None = None) -> None:  # fmt: skip
    """Create the table, or bring the registered one to ``columns`` (declared; None: the stored files'
    merged schema, for the runs log): add the ones it lacks, or drop and create it again when its
    partitioning, a column's type or (declared) a column it should not have differs."""
    quoted = _quoted(database, name)
    if not spark.catalog.tableExists(f"{database}.{name}"):
        report.run(spark, _create_table(quoted, location, comment, if_not_exists=True, columns=columns))
        return
    registered = {column.name.lower(): column for column in spark.catalog.listColumns(f"{database}.{name}")}
    if columns is None:
        merged = spark.read.option("mergeSchema", "true").parquet(location).schema
        wanted = [(field.name, field.dataType.simpleString()) for field in merged.fields]
    else:
        wanted = list(columns)
    wanted_names = {column.lower() for column, _ in wanted}
    partitioned = [key for key, column in registered.items() if column.isPartition]
    conflicts = [column for column, data_type in wanted if column.lower() in registered and registered[column.lower()].dataType != data_type]
    undeclared = columns is not None and any(key not in wanted_names for key, column in registered.items() if not column.isPartition)
    if partitioned != [column.lower() for column in partition_columns] or conflicts or undeclared:
        # Spark cannot change a column's type or drop one of a Parquet table in place.
        report.run(spark, f"DROP TABLE IF EXISTS {quoted}")
        report.run(spark, _create_table(quoted, location, comment, columns=columns))
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

