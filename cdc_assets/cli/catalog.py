"""The SQL catalog: every table's current state and history by name, as views over its Iceberg tables.

    cdc-catalog sync                      register every table (what `make sql` and the SQL server do first)
    cdc-catalog sql [spark-sql args]      spark-sql on the catalog (`make sql`), e.g. -e "SELECT ..."
    cdc-catalog server start|status|stop  the SQL server (Spark Thrift server) on 127.0.0.1:10000 (`make sql-server`):
                                          read-only, a password in its 0600 file (docs/consumers.md)
    cdc-catalog describe TABLE --json     what pyiceberg needs to read any asset's any date (no Spark)
    cdc-catalog sql-for TABLE --engine trino|duckdb|spark [--view current|scd2] [--as-of DATE]
                                          the query of a friendly name in that engine's SQL (no Spark)

Database ``cdc`` (``CDC_CATALOG_DATABASE``) in Spark's Hive metastore holds, as views over the
Iceberg catalog ``lake`` (``lake.<table>.<asset>``), each stored table's ``<table>_current``,
``<table>_history``, ``<table>_latest`` and ``<table>_scd2``; and ``runs_log``; what each one is, and how
a sync defines them, is :mod:`cdc_assets.usecases.catalog_ddl`'s. Spark's embedded Derby metastore admits one
process at a time: spark-sql or the SQL server holds it, and while the server runs, ``sync`` and ``sql``
go through it (:mod:`cdc_assets.cli.sql_server`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from cdc_assets.model.file_modes import apply_umask
from cdc_assets.model import settings
from cdc_assets.usecases.catalog_ddl import catalog_database, catalog_dir
from cdc_assets.usecases.catalog_describe import describe
from cdc_assets.usecases.readers import (
    current_duckdb_sql,
    current_spark_sql,
    current_trino_sql,
    scd2_duckdb_sql,
    scd2_spark_sql,
    scd2_trino_sql,
    table_config,
)
from cdc_assets.engines.process import HOST
from cdc_assets.cli.sql_server import (
    DEFAULT_SQL_PORT,
    LOG_FILE,
    SQL_PORT_ENV,
    CatalogBusy,
    password_file,
    run_spark_sql,
    running_sql_server,
    server_state_dir,
    start_sql_server,
    stop_sql_server,
    sync,
)
from resources.storage import WarehouseStorage, warehouse_root

# The queries `sql-for` prints: Trino's and Spark's read the catalog when they run, DuckDB's the metadata
# files committed when they were generated (docs/consumers.md).
QUERIES_BY_ENGINE = {
    "trino": {"current": current_trino_sql, "scd2": scd2_trino_sql},
    "duckdb": {"current": current_duckdb_sql, "scd2": scd2_duckdb_sql},
    "spark": {"current": current_spark_sql, "scd2": scd2_spark_sql},
}


def main(argv: list[str] | None = None) -> int:
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
    parser = argparse.ArgumentParser(prog="cdc-catalog", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("sync", help="register every table in the catalog")
    sql = commands.add_parser("sql", help="spark-sql on the catalog; the remaining arguments go to spark-sql", add_help=False)
    sql.add_argument("args", nargs=argparse.REMAINDER)
    server = commands.add_parser("server", help="the SQL (Thrift) server on 127.0.0.1")
    server.add_argument("action", choices=["start", "status", "stop"])
    server.add_argument("--port", type=int, default=None, help=f"start: the port (default: ${SQL_PORT_ENV} or {DEFAULT_SQL_PORT})")
    describe_table = commands.add_parser("describe", help="the table's Iceberg catalog and tables, for scripts (pyiceberg)")
    describe_table.add_argument("table", help="the table config's name")
    describe_table.add_argument("--json", action="store_true", required=True, help="print one JSON object (the only format)")
    sql_for = commands.add_parser(
        "sql-for", help="print the query of a name (current, scd2) for an engine that has no Spark view of it (no Spark)"
    )
    sql_for.add_argument("table", help="the table config's name")
    sql_for.add_argument("--engine", choices=sorted(QUERIES_BY_ENGINE), required=True)
    sql_for.add_argument("--view", choices=["current", "scd2"], default="current", help="current: a date's state with its labels (default)")
    sql_for.add_argument("--as-of", default=None, help="the business date (default: the newest stored)")
    argv = sys.argv[1:] if argv is None else argv
    # Everything after "sql" belongs to spark-sql, options included.
    args = parser.parse_args(argv[:1] if argv[:1] == ["sql"] else argv)
    if args.command == "sql":
        args.args = argv[1:]

    storage = WarehouseStorage(warehouse_root())
    try:
        if args.command == "sql-for":
            print(QUERIES_BY_ENGINE[args.engine][args.view](table_config(args.table), None, args.as_of))
            return 0
        if args.command == "describe":
            print(json.dumps(describe(storage, table_config(args.table)), indent=2))
            return 0
        if args.command == "sync":
            return sync(storage)
        if args.command == "sql":
            return run_spark_sql(storage, args.args)
        location = catalog_dir(storage)
        if args.action == "start":
            port = args.port or int(settings.SQL_PORT.value())
            began = time.monotonic()
            pid, port = start_sql_server(storage, port)
            state = server_state_dir(location)
            print(f"SQL server ready in {time.monotonic() - began:.1f} s: pid {pid}, log {state / LOG_FILE}; "
                  f"read-only; log in with any user name and the password in {password_file(state)}", file=sys.stderr)  # fmt: skip
            print(f"jdbc:hive2://{HOST}:{port}/{catalog_database()}")
            return 0
        if args.action == "stop":
            print("stopped" if stop_sql_server(storage) else "not running", file=sys.stderr)
            return 0
        running = running_sql_server(location)
        if running is not None:
            print(f"password in {password_file(server_state_dir(location))}", file=sys.stderr)
        print("not running" if running is None else f"jdbc:hive2://{HOST}:{running[1]}/{catalog_database()} pid {running[0]}")
        return 0 if running is not None else 1
    except (CatalogBusy, ValueError, RuntimeError, TimeoutError) as error:
        print(f"cdc-catalog: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
