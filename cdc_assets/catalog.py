"""The SQL catalog: every table's current state and history by name, in Spark's Hive metastore.

    cdc-catalog sync                      register every table (what `make sql` and the SQL server do first)
    cdc-catalog sql [spark-sql args]      spark-sql on the catalog (`make sql`), e.g. -e "SELECT ..."
    cdc-catalog server start|status|stop  the Spark Thrift server on 127.0.0.1:10000 (`make sql-server`)

For each configured table with stored data, database ``cdc`` (``CDC_CATALOG_DATABASE``) holds:

- ``<table>_current`` and ``<table>_history``: external Parquet tables over the warehouse folders,
  partitioned by ``business_date`` (a DATE);
- ``<table>_latest``: a view of current_table as of its newest committed date;
- ``<table>_scd2``: the SCD type 2 view over all stored history (``cdc_assets/sql/scd2.sql``);
- and ``runs_log``: the runs log (``_runs/``), one row per run, table and business date.

**One writer, and no writer in the runs.** Spark's embedded Derby metastore admits one JVM at a time,
and a pipeline run is a JVM of its own (several at once when tables run side by side). So runs never
open the metastore. The tables do not track partitions in the metastore
(``spark.sql.hive.manageFilesourcePartitions=false`` when they are created): Spark finds a table's
partitions from its folder when a query is planned, and the catalog sessions keep that listing for at
most a second (``spark.sql.metadataCacheTTLSeconds=1``). A commit's rename into
``business_date=D`` is therefore what registers date D, a replaced partition is read as replaced, and a
catalog created over an existing warehouse sees every partition there. The metastore only holds
definitions, written by :func:`sync_statements`; only the process that holds the catalog writes them:
``cdc-catalog sql`` (spark-sql) for as long as it runs, or the SQL server, which then takes every
other client's statements, ``make sql`` included. A per-catalog lock file, held by that process, makes
a second opener fail with a message naming the holder instead of Derby's. A table whose first date was
committed after the holder synced appears at the next sync (``cdc-catalog sync`` goes through a
running server).

The metastore lives in ``<warehouse>/_catalog`` (``CDC_CATALOG_DIR`` for a warehouse that is not a
local folder): deleting it loses nothing the next sync does not rebuild, except objects a user added.
"""

from __future__ import annotations

import argparse
import fcntl
import getpass
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from cdc_assets.config import TableConfig, load_table_configs
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
from cdc_assets.core.scd2 import Dialect, quote_identifier, scd2_sql
from cdc_assets.names import CURRENT, HISTORY
from resources.storage import WarehouseStorage, warehouse_root

DATABASE_ENV = "CDC_CATALOG_DATABASE"
DEFAULT_DATABASE = "cdc"
CATALOG_DIR_ENV = "CDC_CATALOG_DIR"
SQL_PORT_ENV = "CDC_SQL_PORT"
DEFAULT_SQL_PORT = 10000
THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
SQL_CLI_CLASS = "org.apache.spark.sql.hive.thriftserver.SparkSQLCLIDriver"
LOCK_FILE = "catalog.lock"
SERVER_FOLDER = "sql-server"
# The SCD2 view sees every stored history date: its as-of is a date after any business date.
ALL_HISTORY = "9999-12-31"
TABLE_SUFFIXES = {CURRENT: "current", HISTORY: "history"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={location}",
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


def table_statements(config: TableConfig, storage: WarehouseStorage, database: str) -> list[str]:
    """The statements that (re)define one table's objects in ``database``, from what is stored.

    Tables are dropped and created again rather than altered: they are external, so that loses no
    data, and the new definition takes the stored schema as it is now (Spark merges every partition's
    footer, so a column added later is there). An asset with nothing stored loses its objects.
    """
    statements = []
    stored = {asset: bool(storage.stored_dates(config.name, asset)) for asset in (CURRENT, HISTORY)}
    latest, scd2 = _quoted(database, f"{config.name}_latest"), _quoted(database, f"{config.name}_scd2")
    statements += [f"DROP VIEW IF EXISTS {latest}", f"DROP VIEW IF EXISTS {scd2}"]
    for asset in (CURRENT, HISTORY):
        name = _quoted(database, table_name(config, asset))
        statements.append(f"DROP TABLE IF EXISTS {name}")
        if stored[asset]:
            statements.append(
                f"CREATE TABLE {name} USING parquet OPTIONS (mergeSchema 'true') "
                f"LOCATION {_string_literal(storage.asset_path(config.name, asset))} "
                f"COMMENT {_string_literal(f'{config.name}: {asset}, one partition per business_date')}"
            )
    if stored[CURRENT]:
        current = _quoted(database, table_name(config, CURRENT))
        statements.append(
            f"CREATE VIEW {latest} COMMENT {_string_literal(f'{config.name}: current_table as of its newest business_date')} "
            f"AS SELECT * FROM {current} WHERE business_date = (SELECT max(business_date) FROM {current})"
        )
    if stored[HISTORY]:
        history = _quoted(database, table_name(config, HISTORY))
        query = scd2_sql(
            [column.name for column in config.columns], history, ALL_HISTORY, config.scd2.open_end, config.scd2.hard_deletes, Dialect.spark
        )
        body = " ".join(line for line in query.splitlines() if not line.lstrip().startswith("--"))
        statements.append(f"CREATE VIEW {scd2} COMMENT {_string_literal(f'{config.name}: SCD type 2 versions from history_partition')} AS {body}")
    return statements


def sync_statements(configs: Sequence[TableConfig], storage: WarehouseStorage, database: str) -> list[str]:
    """Every statement of a sync: the database, each table's objects, the runs log; then ``USE database``."""
    location = _string_literal(str(catalog_dir(storage) / f"{database}.db"))
    statements = [f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database, Dialect.spark)} LOCATION {location}"]
    for config in configs:
        statements += table_statements(config, storage, database)
    runs_log = _quoted(database, "runs_log")
    statements.append(f"DROP TABLE IF EXISTS {runs_log}")
    if storage.list_names(storage.runs_log_path()):
        statements.append(
            f"CREATE TABLE {runs_log} USING parquet LOCATION {_string_literal(storage.runs_log_path())} "
            "COMMENT 'one row per run, table and business date (README, Audit columns and the runs log)'"
        )
    statements.append(f"USE {quote_identifier(database, Dialect.spark)}")
    return statements


def write_sync_file(statements: Sequence[str], folder: Path) -> Path:
    """The statements as a SQL file (one per line, ``;``-terminated) in ``folder``, for ``-i``/``-f``."""
    folder.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix="sync-", suffix=".sql", dir=folder)
    with os.fdopen(handle, "w") as out:
        out.write("".join(f"{statement};\n" for statement in statements))
    return Path(name)


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


def run_spark_sql(storage: WarehouseStorage, args: Sequence[str], configs: Sequence[TableConfig] | None = None) -> int:
    """``cdc-catalog sql``: sync, then spark-sql with ``args``; beeline through the SQL server if one runs."""
    location = catalog_dir(storage)
    statements = sync_statements(load_table_configs() if configs is None else configs, storage, catalog_database())
    server = running_sql_server(location)
    if server is not None:
        sync_through_server(location, server[1], statements)
        return subprocess.call(beeline_command(server[1], catalog_database(), _beeline_args(args)), env=_spark_env())
    init_file = write_sync_file(statements, location / "tmp")
    try:
        fd = _hold(location, f"pid {os.getpid()} (cdc-catalog sql)")
        try:
            process = subprocess.Popen(spark_sql_command(location, init_file, args), env=_spark_env())
            return _wait_forwarding_signals(process)
        finally:
            os.close(fd)
    finally:
        init_file.unlink(missing_ok=True)


def sync_through_server(location: Path, port: int, statements: Sequence[str]) -> None:
    """Run the sync's statements on the SQL server (the holder of the metastore) with beeline."""
    sync_file = write_sync_file(statements, location / "tmp")
    try:
        done = subprocess.run(beeline_command(port, "default", ["--silent=true", "-f", str(sync_file)]), env=_spark_env(),
                              capture_output=True, text=True)  # fmt: skip
    finally:
        sync_file.unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(f"registering the tables through the SQL server failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def _beeline_args(args: Sequence[str]) -> list[str]:
    # spark-sql's -e/-f mean the same to beeline; its -S (silent) is beeline's --silent=true, always on.
    return ["--silent=true", "--showHeader=true", "--outputformat=tsv2", *(arg for arg in args if arg not in ("-S", "--silent"))]


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
    if not _alive(pid) or THRIFT_SERVER_CLASS not in (_cmdline(pid) or THRIFT_SERVER_CLASS):
        return None
    return pid, port


def start_sql_server(storage: WarehouseStorage, port: int = DEFAULT_SQL_PORT, timeout: float = 180,
                     configs: Sequence[TableConfig] | None = None) -> tuple[int, int]:
    """Start the Thrift server on 127.0.0.1:``port`` holding the catalog, then sync through it.

    Returns (pid, port). The server runs detached in a session of its own and keeps the catalog's lock
    (inherited) until it exits. An already running server is synced and returned as it is.
    """
    location = catalog_dir(storage)
    state = location / SERVER_FOLDER
    database = catalog_database()
    running = running_sql_server(location)
    if running is None:
        if not _port_is_free(port):
            raise RuntimeError(f"port {HOST}:{port} is in use by another process")
        fd = _hold(location, f"the SQL server on {HOST}:{port} (cdc-catalog server, started by pid {os.getpid()})")
        try:
            state.mkdir(parents=True, exist_ok=True)
            log_path = state / "server.log"
            command = [
                os.path.join(spark_home(), "bin", "spark-submit"), "--class", THRIFT_SERVER_CLASS,
                "--name", "cdc_assets SQL server", *_conf_args(catalog_conf(location)), "spark-internal",
                "--hiveconf", f"hive.server2.thrift.bind.host={HOST}", "--hiveconf", f"hive.server2.thrift.port={port}",
            ]  # fmt: skip
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=_spark_env(),
                    cwd=location, start_new_session=True, pass_fds=(fd,),
                )  # fmt: skip
            (state / "server.port").write_text(f"{port}\n")
            (state / "server.pid").write_text(f"{process.pid}\n")
        finally:
            os.close(fd)  # the server's inherited copy keeps the lock
        running = (process.pid, port)
        try:
            _wait_until_serving(process.pid, port, log_path, timeout)
        except BaseException:
            stop_sql_server(storage)
            raise
    statements = sync_statements(load_table_configs() if configs is None else configs, storage, database)
    sync_through_server(location, running[1], statements)
    return running


def _wait_until_serving(pid: int, port: int, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _port_accepts(port):
        if not _alive(pid):
            raise RuntimeError(f"the SQL server exited while starting; end of {log_path}:\n{log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the SQL server did not listen on {HOST}:{port} within {timeout:g} s; end of {log_path}:\n{log_tail(log_path)}")
        time.sleep(0.5)


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
    for name in ("server.pid", "server.port"):
        (state / name).unlink(missing_ok=True)
    return running is not None


def sync(storage: WarehouseStorage, configs: Sequence[TableConfig] | None = None) -> int:
    """``cdc-catalog sync``: register every table, through the SQL server if one runs."""
    location = catalog_dir(storage)
    server = running_sql_server(location)
    if server is not None:
        start_sql_server(storage, server[1], configs=configs)
        return 0
    return run_spark_sql(storage, ["-e", "SELECT 1"], configs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdc-catalog", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("sync", help="register every table in the catalog")
    sql = commands.add_parser("sql", help="spark-sql on the catalog; the remaining arguments go to spark-sql", add_help=False)
    sql.add_argument("args", nargs=argparse.REMAINDER)
    server = commands.add_parser("server", help="the SQL (Thrift) server on 127.0.0.1")
    server.add_argument("action", choices=["start", "status", "stop"])
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
