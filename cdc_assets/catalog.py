"""The SQL catalog: every table's current state and history by name, in Spark's Hive metastore.

    cdc-catalog sync                      register every table (what `make sql` and the SQL server do first)
    cdc-catalog sql [spark-sql args]      spark-sql on the catalog (`make sql`), e.g. -e "SELECT ..."
    cdc-catalog server start|status|stop  the SQL server (Spark Thrift server) on 127.0.0.1:10000 (`make sql-server`)

For each configured table with stored data, database ``cdc`` (``CDC_CATALOG_DATABASE``) holds:

- ``<table>_current`` and ``<table>_history``: external Parquet tables over the warehouse folders,
  partitioned by ``business_date`` (a DATE); for a table with ``storage: {current: incremental}``,
  ``<table>_current`` is a view of each date's state over ``<table>_current_full`` and
  ``<table>_current_changes`` (docs/incremental-state.md);
- ``<table>_latest``: a view of current_table as of its newest committed date;
- ``<table>_scd2``: the SCD type 2 view over all stored history (``cdc_assets/sql/scd2.sql``);
- and ``runs_log``: the runs log (``_runs/``), one row per run, table and business date.

**One writer, and no writer in the runs.** Spark's embedded Derby metastore admits one JVM at a time,
and a pipeline run is a JVM of its own (several at once when tables run side by side). So runs never
open the metastore. The tables do not track partitions in the metastore
(``spark.sql.hive.manageFilesourcePartitions=false`` when they are created): Spark lists a table's
folder when a query is planned, and the catalog sessions keep a table's resolved relation for at most
a second (``spark.sql.metadataCacheTTLSeconds=1``). A commit's rename into ``business_date=D`` is
therefore what registers date D, and a catalog created over an existing warehouse sees every
partition there. The metastore only holds definitions, and only the process that holds the catalog
writes them: ``cdc-catalog sql`` (spark-sql) for as long as it runs, or the SQL server, which then
syncs for every other client, ``make sql`` included. A per-catalog lock file, held by that process,
makes a second opener fail with a message naming the holder instead of Derby's. A table whose first
date was committed after the holder synced appears at the next sync (``cdc-catalog sync`` asks a
running server to sync).

**No name goes missing while the SQL server serves.** Its driver is this module under spark-submit
(:func:`serve_sql`): it syncs in its own session before the Thrift server listens, so the first
client finds every name, and later syncs (:func:`request_sync`) change objects in place
(:func:`sync_in_place`) rather than dropping them. spark-sql, which holds the metastore alone, defines
them afresh (:func:`sync_statements`).

The metastore lives in ``<warehouse>/_catalog`` (``CDC_CATALOG_DIR`` for a warehouse that is not a
local folder): deleting it loses nothing the next sync does not rebuild, except objects a user added.
"""

from __future__ import annotations

import argparse
import fcntl
import getpass
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark.sql import SparkSession

from cdc_assets.config import TABLE_CONFIGS_ENV, TableConfig, TableConfigError, load_table_configs, table_configs_dir
from cdc_assets.connect_server import (
    HOST,
    _alive,
    _cmdline,
    _port_accepts,
    _port_is_free,
    _signal_group,
    _wait_for_exit,
    log_tail,
    spark_home,
)
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.scd2 import Dialect, quote_identifier, scd2_sql
from cdc_assets.core.changes import AUDIT_COLUMNS, EFF_START_DATE, OPERATION
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH
from cdc_assets.core.state import state_sql, untouched_operation
from cdc_assets.names import CURRENT, HISTORY
from resources.storage import WAREHOUSE_ENV, WarehouseStorage, state_changes_asset, warehouse_root

DATABASE_ENV = "CDC_CATALOG_DATABASE"
DEFAULT_DATABASE = "cdc"
CATALOG_DIR_ENV = "CDC_CATALOG_DIR"
SQL_PORT_ENV = "CDC_SQL_PORT"
DEFAULT_SQL_PORT = 10000
# The SQL server's application name, also how its process is recognized.
SERVER_NAME = "cdc_assets SQL server"
LOCK_FILE = "catalog.lock"
SERVER_FOLDER = "sql-server"
# What the server's first sync left, written before it listens; and the folder of sync requests.
STARTED_FILE = "started.json"
REQUESTS_FOLDER = "requests"
RUNS_LOG = "runs_log"
RUNS_LOG_COMMENT = "one row per run, table and business date (README, Audit columns and the runs log)"
# The SCD2 view sees every stored history date: its as-of is a date after any business date.
ALL_HISTORY = "9999-12-31"
TABLE_SUFFIXES = {CURRENT: "current", HISTORY: "history"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SYNC_ATTEMPTS = 4
BEELINE_ATTEMPTS = 3
# A sync or query that listed a folder while a commit renamed it away: listing again finds the new one.
_VANISHED_FILE = re.compile(r"FileNotFoundException|FAILED_READ_FILE|PATH_NOT_FOUND|File does not exist|No such file", re.IGNORECASE)
# Rejections after which beeline ran nothing, and those a single statement may not meet a second time.
_REJECTED_CONNECTION = re.compile(r"Could not open client transport|Connection refused|Invalid SessionHandle", re.IGNORECASE)
_REJECTED_STATEMENT = re.compile(
    r"Invalid OperationHandle|FileNotFoundException|FAILED_READ_FILE|PATH_NOT_FOUND|File does not exist", re.IGNORECASE
)


class CatalogBusy(RuntimeError):
    """Another process holds the catalog's Derby metastore."""


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


def catalog_conf(location: Path) -> dict[str, str]:
    """Spark conf of a session on the catalog at ``location`` (spark-sql, the Thrift server)."""
    from resources.spark import LOCAL_DEFAULTS, PIPELINE_DEFAULTS, spark_conf_from_env

    conf = {**PIPELINE_DEFAULTS}
    master = os.environ.get("CDC_SPARK_MASTER") or "local[*]"
    conf["spark.master"] = master
    if master.startswith("local"):
        conf.update(LOCAL_DEFAULTS)
    conf.update(spark_conf_from_env())
    conf.update(
        {
            "spark.sql.catalogImplementation": "hive",
            "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={location}/metastore_db;create=true",
            # Managed tables a user creates in the catalog; the pipeline's tables are external.
            "spark.sql.warehouse.dir": str(location / "spark-warehouse"),
            # Partitions are found from the folders (see the module docstring), so runs need no writer.
            "spark.sql.hive.manageFilesourcePartitions": "false",
            "spark.sql.metadataCacheTTLSeconds": "1",
            # derby.log goes beside the metastore, not into the working directory.
            "spark.driver.extraJavaOptions": f"{conf.get('spark.driver.extraJavaOptions', '')} -Dderby.system.home={location}".strip(),
        }
    )
    return conf


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


def _create_table(name: str, location: str, comment: str, if_not_exists: bool = False) -> str:
    # No schema given: Spark takes it from every stored file's footer (mergeSchema), partitions from the folders.
    return (
        f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{name} USING parquet OPTIONS (mergeSchema 'true') "
        f"LOCATION {_string_literal(location)} COMMENT {_string_literal(comment)}"
    )


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
    """An external table over one of a table's asset folders: its name, folder, and whether anything is stored."""

    name: str
    location: str
    comment: str
    stored: bool


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
    return [
        StoredTable(name, storage.asset_path(config.name, asset), comment, bool(storage.stored_dates(config.name, asset)))
        for name, asset, comment in folders
    ]


def table_views(config: TableConfig, database: str, changes_stored: bool = False) -> list[View]:
    """``<table>_latest`` over current_table and ``<table>_scd2`` over history_partition; for an
    incremental state also ``<table>_current``, every stored date's state (``changes_stored``: whether
    ``<table>_current_changes`` exists)."""
    current, history = _quoted(database, table_name(config, CURRENT)), _quoted(database, table_name(config, HISTORY))
    scd2 = scd2_sql([column.name for column in config.columns], history, ALL_HISTORY, config.scd2.open_end, config.scd2.hard_deletes, Dialect.spark)
    views = []
    if config.storage.incremental:
        # The newest date is read from the stored folders' partitions, not from the view (which would
        # build every date's state to find it).
        full, changes = _quoted(database, f"{config.name}_current_full"), _quoted(database, f"{config.name}_current_changes")
        state = state_sql(state_columns(config), full, changes if changes_stored else None, untouched_operation(config.load_type))
        views.append(View(table_name(config, CURRENT), CURRENT, f"{config.name}: the state as of each business_date", state))
        newest = f"(SELECT max(business_date) FROM {full})" if not changes_stored else (
            f"(SELECT greatest(max(business_date), (SELECT max(business_date) FROM {changes})) FROM {full})")
    else:
        newest = f"(SELECT max(business_date) FROM {current})"
    views.append(View(f"{config.name}_latest", CURRENT, f"{config.name}: current_table as of its newest business_date",
                      f"SELECT * FROM {current} WHERE business_date = {newest}"))
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
    views = table_views(config, database, changes_stored=config.storage.incremental and tables[1].stored)
    statements = [view.drop(database) for view in reversed(views)]
    for table in tables:
        name = _quoted(database, table.name)
        statements.append(f"DROP TABLE IF EXISTS {name}")
        if table.stored:
            statements.append(_create_table(name, table.location, table.comment))
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

    A table that exists keeps its definition, brought up to date: the stored columns it lacks are added
    (``ALTER TABLE ... ADD COLUMNS``, so a column a config gained reads as NULL on older dates), its
    location is set if it moved, and ``REFRESH TABLE`` drops this session's listing. A table not yet
    registered is created. A view that exists gets its new query in place (``ALTER VIEW ... AS``;
    Spark's ``CREATE OR REPLACE VIEW`` drops it first). So a query planned while a sync runs finds
    every name. Dropped are only the objects of an asset with nothing stored, and a table whose
    registered partitioning or column types no longer match its files (dropped and created again, the
    one case where a name is missing for a moment).
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
            _define_table(spark, report, database, table.name, table.location, table.comment, [BUSINESS_DATE])
    for view in table_views(config, database, changes_stored=config.storage.incremental and tables[1].stored):
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
                  partition_columns: list[str]) -> None:  # fmt: skip
    quoted = _quoted(database, name)
    if not spark.catalog.tableExists(f"{database}.{name}"):
        report.run(spark, _create_table(quoted, location, comment, if_not_exists=True))
        return
    registered = {column.name.lower(): column for column in spark.catalog.listColumns(f"{database}.{name}")}
    stored = spark.read.option("mergeSchema", "true").parquet(location).schema
    partitioned = [key for key, column in registered.items() if column.isPartition]
    conflicts = [field for field in stored.fields
                 if field.name.lower() in registered and registered[field.name.lower()].dataType != field.dataType.simpleString()]  # fmt: skip
    if partitioned != [column.lower() for column in partition_columns] or conflicts:
        report.run(spark, f"DROP TABLE IF EXISTS {quoted}")
        report.run(spark, _create_table(quoted, location, comment))
        return
    if _registered_location(spark, quoted) != _normalized_location(location):
        report.run(spark, f"ALTER TABLE {quoted} SET LOCATION {_string_literal(location)}")
    missing = [field for field in stored.fields if field.name.lower() not in registered]
    if missing:
        columns = ", ".join(f"{quote_identifier(field.name, Dialect.spark)} {field.dataType.simpleString()}" for field in missing)
        report.run(spark, f"ALTER TABLE {quoted} ADD COLUMNS ({columns})")
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


# -- the one holder of the metastore ---------------------------------------------------------------


def _hold(location: Path, holder: str) -> int:
    """Lock the catalog for this process (and the children it passes the fd to); returns the fd.

    Raises :class:`CatalogBusy` naming the current holder.
    """
    location.mkdir(parents=True, exist_ok=True)
    fd = os.open(location / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        current = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise CatalogBusy(
            f"the SQL catalog in {location} is open in {current}. Spark's embedded Derby metastore admits one "
            "process at a time: close that one, or use `make sql-server`, through which every `make sql` goes"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode(), 0)
    return fd


def _spark_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env["SPARK_HOME"] = spark_home()
    env["SPARK_LOCAL_IP"] = HOST
    return env


def _conf_args(conf: dict[str, str]) -> list[str]:
    master = conf.pop("spark.master")
    args = ["--master", master]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def spark_sql_command(location: Path, init_file: Path, args: Sequence[str]) -> list[str]:
    """``spark-sql`` from the installed pyspark on the catalog, running ``init_file`` first."""
    return [os.path.join(spark_home(), "bin", "spark-sql"), *_conf_args(catalog_conf(location)), "-i", str(init_file), *args]


def run_spark_sql(storage: WarehouseStorage, args: Sequence[str], configs_dir: Path | None = None) -> int:
    """``cdc-catalog sql``: sync, then spark-sql with ``args``; beeline through the SQL server if one runs."""
    location = catalog_dir(storage)
    configs_dir = Path(configs_dir or table_configs_dir()).resolve()
    server = running_sql_server(location)
    if server is not None:
        request_sync(location, server[0], configs_dir)
        return run_beeline(server[1], catalog_database(), args)
    init_file = write_sync_file(sync_statements(load_table_configs(configs_dir), storage, catalog_database()), location / "tmp")
    try:
        fd = _hold(location, f"pid {os.getpid()} (cdc-catalog sql)")
        try:
            process = subprocess.Popen(spark_sql_command(location, init_file, args), env=_spark_env())
            return _wait_forwarding_signals(process)
        finally:
            os.close(fd)
    finally:
        init_file.unlink(missing_ok=True)


def _beeline_args(args: Sequence[str]) -> list[str]:
    # spark-sql's -e/-f mean the same to beeline; its -S (silent) is beeline's --silent=true, always on.
    return ["--silent=true", "--showHeader=true", "--outputformat=tsv2", *(arg for arg in args if arg not in ("-S", "--silent"))]


def run_beeline(port: int, database: str, args: Sequence[str], attempts: int = BEELINE_ATTEMPTS) -> int:
    """beeline with spark-sql's ``args`` on the SQL server; a batch the server rejects transiently runs again.

    Interactive use runs as it is. With ``-e``/``-f`` the output is passed on once the batch is done;
    a failed connection is retried, and so is a single statement the server failed on a handle it lost
    or on a file a commit replaced while the query ran (several statements are not: some may have run).
    """
    command = beeline_command(port, database, _beeline_args(args))
    if not {"-e", "-f"} & set(args):
        return subprocess.call(command, env=_spark_env())
    for attempt in range(1, attempts + 1):
        done = subprocess.run(command, env=_spark_env(), capture_output=True, text=True)
        rejection = _transient_rejection(args, done.stdout + done.stderr) if done.returncode != 0 else None
        if rejection is None or attempt == attempts:
            sys.stdout.write(done.stdout)
            sys.stdout.flush()
            sys.stderr.write(done.stderr)
            return done.returncode
        print(f"cdc-catalog: the SQL server rejected the statement ({rejection}); trying again", file=sys.stderr)
        time.sleep(attempt)
    raise AssertionError("unreachable")


def _transient_rejection(args: Sequence[str], output: str) -> str | None:
    """The transient error in beeline's ``output``, if it is one that running ``args`` again may not meet."""
    found = _REJECTED_CONNECTION.search(output)
    if found is None and _single_statement(args):
        found = _REJECTED_STATEMENT.search(output)
    return found.group(0) if found else None


def _single_statement(args: Sequence[str]) -> bool:
    if "-f" in args or "-e" not in args or args.index("-e") + 1 >= len(args):
        return False
    return ";" not in args[args.index("-e") + 1].strip().rstrip(";")


def _wait_forwarding_signals(process: subprocess.Popen) -> int:
    """Wait for ``process``; a SIGINT/SIGTERM to this process is passed on, so the JVM stops too."""

    def forward(signum, _frame):
        if process.poll() is None:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- the SQL server (Spark Thrift server) ----------------------------------------------------------


def beeline_command(port: int, database: str, args: Sequence[str]) -> list[str]:
    """pyspark's ``bin/beeline`` connected to the SQL server on 127.0.0.1:``port``."""
    url = f"jdbc:hive2://{HOST}:{port}/{database}"
    return [os.path.join(spark_home(), "bin", "beeline"), "-u", url, "-n", getpass.getuser(), *args]


def running_sql_server(location: Path) -> tuple[int, int] | None:
    """(pid, port) of the SQL server holding the catalog at ``location``, if it is alive."""
    state = location / SERVER_FOLDER
    try:
        pid = int((state / "server.pid").read_text())
        port = int((state / "server.port").read_text())
    except (OSError, ValueError):
        return None
    if not _alive(pid) or SERVER_NAME not in (_cmdline(pid) or SERVER_NAME):
        return None
    return pid, port


def start_sql_server(storage: WarehouseStorage, port: int = DEFAULT_SQL_PORT, timeout: float = 300,
                     configs_dir: Path | None = None) -> tuple[int, int]:
    """Start the SQL server on 127.0.0.1:``port`` holding the catalog; returns (pid, port) once it serves.

    The server syncs before it listens (:func:`serve_sql`), so the first client finds every name. It
    runs detached in a session of its own and keeps the catalog's lock (inherited) until it exits. An
    already running server is synced and returned as it is. Raises ``RuntimeError`` when some object
    could not be registered; the server then serves the others.
    """
    location = catalog_dir(storage)
    state = location / SERVER_FOLDER
    configs_dir = Path(configs_dir or table_configs_dir()).resolve()
    running = running_sql_server(location)
    if running is not None:
        request_sync(location, running[0], configs_dir)
        return running
    if not _port_is_free(port):
        raise RuntimeError(f"port {HOST}:{port} is in use by another process")
    load_table_configs(configs_dir)  # a config error is told here, before a JVM starts
    fd = _hold(location, f"the SQL server on {HOST}:{port} (cdc-catalog server, started by pid {os.getpid()})")
    try:
        state.mkdir(parents=True, exist_ok=True)
        (state / STARTED_FILE).unlink(missing_ok=True)
        log_path = state / "server.log"
        conf = {**catalog_conf(location), "spark.hadoop.hive.server2.thrift.bind.host": HOST, "spark.hadoop.hive.server2.thrift.port": str(port)}
        command = [os.path.join(spark_home(), "bin", "spark-submit"), "--name", SERVER_NAME, *_conf_args(conf), __file__, "server", "run"]
        env = {
            **_spark_env(), WAREHOUSE_ENV: storage.root, TABLE_CONFIGS_ENV: str(configs_dir),
            # The driver is this module under spark-submit: its own folder must not shadow top-level modules.
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONSAFEPATH": "1",
        }  # fmt: skip
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=location, start_new_session=True, pass_fds=(fd,),
            )  # fmt: skip
        (state / "server.port").write_text(f"{port}\n")
        (state / "server.pid").write_text(f"{process.pid}\n")
    finally:
        os.close(fd)  # the server's inherited copy keeps the lock
    try:
        _wait_until_serving(process.pid, port, log_path, timeout)
    except BaseException:
        stop_sql_server(storage)
        raise
    started = json.loads((state / STARTED_FILE).read_text())
    if started["errors"]:
        raise RuntimeError("the SQL server serves, but registering these objects failed:\n" + "\n".join(started["errors"]))
    return process.pid, port


def _wait_until_serving(pid: int, port: int, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _port_accepts(port):
        if not _alive(pid):
            raise RuntimeError(f"the SQL server exited while starting; end of {log_path}:\n{log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the SQL server did not listen on {HOST}:{port} within {timeout:g} s; end of {log_path}:\n{log_tail(log_path)}")
        time.sleep(0.1)


def serve_sql(storage: WarehouseStorage, configs_dir: Path) -> None:
    """The SQL server's driver (``cdc-catalog server run``, launched by :func:`start_sql_server`).

    In the JVM that holds the metastore: sync in place, then start the Thrift server on this session,
    then answer sync requests (:func:`request_sync`) one after another until the process is stopped.
    """
    from pyspark.sql import SparkSession

    state = catalog_dir(storage) / SERVER_FOLDER
    spark = SparkSession.builder.getOrCreate()
    database = catalog_database()
    _write_json(state / STARTED_FILE, _sync_for_server(spark, storage, database, configs_dir))
    # The Thrift server has no Python API; it serves this session's catalog, now synced, from here on.
    spark._jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(spark._jsparkSession.sqlContext())
    requests = state / REQUESTS_FOLDER
    while True:
        pending: dict[str, list[Path]] = {}
        for request in sorted(requests.glob("*.request")):
            try:
                pending.setdefault(json.loads(request.read_text())["configs"], []).append(request)
            except OSError:
                continue  # its requester gave up waiting and took it back
        for configs, waiting in pending.items():  # one sync answers every request pending for the same configs
            result = _sync_for_server(spark, storage, database, Path(configs))
            for request in waiting:
                _write_json(request.with_suffix(".result"), result)
                request.unlink(missing_ok=True)
        time.sleep(0.2)


def _sync_for_server(spark: SparkSession, storage: WarehouseStorage, database: str, configs_dir: Path) -> dict:
    began = time.monotonic()
    try:
        configs = load_table_configs(configs_dir)
    except TableConfigError as error:
        return {"statements": 0, "errors": [str(error)]}
    try:
        report = sync_in_place(spark, configs, storage, database)
        spark.sql(f"USE {quote_identifier(database, Dialect.spark)}")
    except Exception as error:  # noqa: BLE001 - e.g. the database could not be created: told to the requester, the server goes on
        return {"statements": 0, "errors": [f"{database}: {str(error).strip().splitlines()[0][:1000]}"]}
    changes = [statement[:300] for statement in report.statements if statement.startswith(("ALTER TABLE", "DROP", "CREATE TABLE"))]
    print(f"cdc-catalog: synced {len(configs)} table configs from {configs_dir} in {time.monotonic() - began:.1f} s: "
          f"{len(report.statements)} statements, {len(report.errors)} errors", *changes, *report.errors, sep="\n", flush=True)  # fmt: skip
    return {"statements": len(report.statements), "errors": report.errors}


def request_sync(location: Path, server_pid: int, configs_dir: Path, timeout: float = 900) -> None:
    """Have the running SQL server sync the tables of ``configs_dir`` in place, and wait until it has.

    Raises ``RuntimeError`` naming what failed (the rest is synced), or if the server exits first.
    """
    requests = location / SERVER_FOLDER / REQUESTS_FOLDER
    name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    _write_json(requests / f"{name}.request", {"configs": str(configs_dir)})
    result_path = requests / f"{name}.result"
    deadline = time.monotonic() + timeout
    while not result_path.exists():
        if not _alive(server_pid) or time.monotonic() > deadline:
            (requests / f"{name}.request").unlink(missing_ok=True)
            log_path = location / SERVER_FOLDER / "server.log"
            why = "exited" if not _alive(server_pid) else f"did not sync within {timeout:g} s"
            raise RuntimeError(f"the SQL server (pid {server_pid}) {why}; end of {log_path}:\n{log_tail(log_path)}")
        time.sleep(0.1)
    result = json.loads(result_path.read_text())
    result_path.unlink()
    if result["errors"]:
        raise RuntimeError("registering these objects through the SQL server failed:\n" + "\n".join(result["errors"]))


def _write_json(path: Path, value: dict) -> None:
    """Written whole or not at all: readers poll for ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def stop_sql_server(storage: WarehouseStorage, timeout: float = 30) -> bool:
    """Stop the SQL server of this warehouse's catalog; whether one was running."""
    location = catalog_dir(storage)
    running = running_sql_server(location)
    state = location / SERVER_FOLDER
    if running is not None:
        pid = running[0]
        _signal_group(pid, signal.SIGTERM)
        if not _wait_for_exit(pid, timeout):
            _signal_group(pid, signal.SIGKILL)
            _wait_for_exit(pid, 10)
    for name in ("server.pid", "server.port", STARTED_FILE):
        (state / name).unlink(missing_ok=True)
    shutil.rmtree(state / REQUESTS_FOLDER, ignore_errors=True)
    return running is not None


def sync(storage: WarehouseStorage, configs_dir: Path | None = None) -> int:
    """``cdc-catalog sync``: register every table, through the SQL server if one runs."""
    location = catalog_dir(storage)
    server = running_sql_server(location)
    if server is not None:
        request_sync(location, server[0], Path(configs_dir or table_configs_dir()).resolve())
        return 0
    return run_spark_sql(storage, ["-e", "SELECT 1"], configs_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdc-catalog", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("sync", help="register every table in the catalog")
    sql = commands.add_parser("sql", help="spark-sql on the catalog; the remaining arguments go to spark-sql", add_help=False)
    sql.add_argument("args", nargs=argparse.REMAINDER)
    server = commands.add_parser("server", help="the SQL (Thrift) server on 127.0.0.1")
    server.add_argument("action", choices=["start", "status", "stop", "run"], help="run: the server's driver, as start launches it under spark-submit")
    server.add_argument("--port", type=int, default=None, help=f"start: the port (default: ${SQL_PORT_ENV} or {DEFAULT_SQL_PORT})")
    argv = sys.argv[1:] if argv is None else argv
    # Everything after "sql" belongs to spark-sql, options included.
    args = parser.parse_args(argv[:1] if argv[:1] == ["sql"] else argv)
    if args.command == "sql":
        args.args = argv[1:]

    storage = WarehouseStorage(warehouse_root())
    try:
        if args.command == "sync":
            return sync(storage)
        if args.command == "sql":
            return run_spark_sql(storage, args.args)
        location = catalog_dir(storage)
        if args.action == "run":
            serve_sql(storage, table_configs_dir())
            return 0
        if args.action == "start":
            port = args.port or int(os.environ.get(SQL_PORT_ENV) or DEFAULT_SQL_PORT)
            began = time.monotonic()
            pid, port = start_sql_server(storage, port)
            print(f"SQL server ready in {time.monotonic() - began:.1f} s: pid {pid}, log {location / SERVER_FOLDER / 'server.log'}", file=sys.stderr)
            print(f"jdbc:hive2://{HOST}:{port}/{catalog_database()}")
            return 0
        if args.action == "stop":
            print("stopped" if stop_sql_server(storage) else "not running", file=sys.stderr)
            return 0
        running = running_sql_server(location)
        print("not running" if running is None else f"jdbc:hive2://{HOST}:{running[1]}/{catalog_database()} pid {running[0]}")
        return 0 if running is not None else 1
    except (CatalogBusy, ValueError, RuntimeError, TimeoutError) as error:
        print(f"cdc-catalog: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
