"""The Iceberg catalog every output lives in: its name, where it keeps its state, and how Spark and
pyiceberg open it.

The embedded default needs no server: Iceberg's JDBC catalog on a SQLite file in the warehouse folder
(``{warehouse}/lake_catalog.db``), which Spark opens through the Iceberg runtime and pyiceberg through
its ``SqlCatalog``. Each table config is a namespace and each asset a table in it, so the current state
of ``orders`` is ``lake.orders.current_table``. Tables live under ``{warehouse}/{namespace}/{table}``.

The catalog's name is part of every row of the JDBC catalog: it must be the same wherever the catalog
is opened, so it is fixed here. No Dagster here.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Callable
from contextlib import closing

from pyspark.sql import SparkSession

# The name Spark and pyiceberg open the catalog under (also the key of its rows in the SQLite file).
CATALOG_NAME = "lake"
CATALOG_FILE = "lake_catalog.db"
_SPARK_PREFIX = f"spark.sql.catalog.{CATALOG_NAME}"


class CatalogInUseError(RuntimeError):
    """The Spark session already opened the catalog on another warehouse."""


def catalog_file(root: str) -> str:
    """The SQLite file of the warehouse under ``root`` (an absolute local path)."""
    return f"{root.rstrip('/')}/{CATALOG_FILE}"


# How long a connection waits for another process's lock on the SQLite file, in seconds. The default
# (3 s for Spark's driver, 5 s for pyiceberg) was seen to fail a commit under load, and Iceberg does
# not retry a locked catalog: the commit's files are left behind and the run fails.
BUSY_TIMEOUT_SECONDS = 60


def pyiceberg_properties(root: str) -> dict[str, str]:
    """What ``pyiceberg.catalog.load_catalog(CATALOG_NAME, **properties)`` takes to open the catalog."""
    return {
        "type": "sql",
        "uri": f"sqlite:///{catalog_file(root)}?timeout={BUSY_TIMEOUT_SECONDS}",
        "warehouse": f"file://{root.rstrip('/')}",
    }


def spark_catalog_conf(root: str) -> dict[str, str]:
    """The session conf that opens the catalog as ``lake`` in Spark (the Iceberg runtime must be on the
    JVM's classpath: ``resources/spark.py`` puts it there)."""
    return {
        _SPARK_PREFIX: "org.apache.iceberg.spark.SparkCatalog",
        f"{_SPARK_PREFIX}.type": "jdbc",
        f"{_SPARK_PREFIX}.uri": f"jdbc:sqlite:{catalog_file(root)}",
        # V1 also records views; pyiceberg reads a catalog Spark created with it.
        f"{_SPARK_PREFIX}.jdbc.schema-version": "V1",
        f"{_SPARK_PREFIX}.warehouse": f"file://{root.rstrip('/')}",
        f"{_SPARK_PREFIX}.jdbc.busy_timeout": str(BUSY_TIMEOUT_SECONDS * 1000),
        # A cached table keeps the snapshot it was loaded at until 30 s after its last use: a reader that
        # keeps reading would never see another process's commits (the runs of a warm Connect server).
        f"{_SPARK_PREFIX}.cache-enabled": "false",
    }


def use_catalog(spark: SparkSession, root: str) -> None:
    """Open the warehouse's catalog as ``lake`` in ``spark`` (session conf: a classic session and a
    Spark Connect one alike). A session keeps the first catalog it opens, so a session that already opened
    the catalog of another warehouse raises :class:`CatalogInUseError`: use a session per warehouse
    (``spark.newSession()`` on a classic session)."""
    wanted = spark_catalog_conf(root)
    uri_key = f"{_SPARK_PREFIX}.uri"
    current = spark.conf.get(uri_key, None)
    if current == wanted[uri_key]:
        return
    if current:
        raise CatalogInUseError(
            f"this Spark session opened the catalog {CATALOG_NAME!r} on {current.removeprefix('jdbc:sqlite:')}, "
            f"not on {catalog_file(root)}: a session reads and writes one warehouse; start a new session for another"
        )
    for key, value in wanted.items():
        spark.conf.set(key, value)


# The catalog's own tables, as Iceberg's JDBC catalog (schema V1) leaves them once it opened the file.
_CATALOG_TABLES = ("iceberg_tables", "iceberg_namespace_properties")
_V1_COLUMN = "iceberg_type"
INIT_LOCK_FILE = ".lake_catalog.init.lock"


def catalog_ready(root: str) -> bool:
    """Whether the warehouse's SQLite file holds the catalog's tables in their V1 shape: opening it
    then only reads them."""
    path = catalog_file(root)
    if not os.path.exists(path):
        return False
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_SECONDS)) as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns = {row[1] for row in connection.execute("PRAGMA table_info(iceberg_tables)")}
    return all(name in tables for name in _CATALOG_TABLES) and _V1_COLUMN in columns


def open_catalog_once(root: str, open_catalog: Callable[[], None]) -> None:
    """Run ``open_catalog`` (the first use of the catalog by Spark) under a lock on the warehouse when
    the catalog's tables are not all there yet.

    Iceberg's JDBC catalog creates its tables, then adds the V1 column, the first time each session
    opens it, checking first and not in one transaction: two sessions opening a new warehouse at once
    (two tables' first runs on one Spark Connect server) raced, and one failed with "Cannot check and
    eventually update SQL schema". Once the tables are there, opening only reads them and needs no lock."""
    if catalog_ready(root):
        return
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, INIT_LOCK_FILE), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not catalog_ready(root):
                open_catalog()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def opened_warehouse(spark: SparkSession) -> str | None:
    """The SQLite file of the catalog ``spark`` opened as ``lake``, or None if it opened none."""
    uri = spark.conf.get(f"{_SPARK_PREFIX}.uri", None)
    return uri.removeprefix("jdbc:sqlite:") if uri else None


def table_identifier(table: str, asset: str) -> str:
    """The asset's table in the catalog, as Spark names it: ``lake.<table>.<asset>``."""
    return f"{CATALOG_NAME}.{table}.{asset}"
