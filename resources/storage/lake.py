"""The Iceberg catalog every output lives in: its name, where it keeps its state, and how Spark and
pyiceberg open it (:class:`LakeCatalog`).

Two kinds. A REST catalog (``CDC_CATALOG_URI``: Polaris, Lakekeeper, Nessie, AWS Glue's or S3 Tables'
REST endpoint, SeaweedFS's) keeps its tables in an object store, where it decides (its warehouse,
``CDC_CATALOG_WAREHOUSE``), and Spark and pyiceberg reach it over HTTP, signing requests with AWS
SigV4 when ``CDC_CATALOG_SIGNING_NAME`` is set (``s3tables`` for S3 Tables and SeaweedFS, ``glue`` for
Glue). The embedded default needs no server: Iceberg's JDBC catalog on a SQLite file in the warehouse folder
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

from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from cdc_assets.model import settings
from cdc_assets.model.file_modes import owner_only_folder
from resources.storage.object_store import DEFAULT_REGION, ObjectStore, is_object_store, sql_text

# The name Spark and pyiceberg open the catalog under (also the key of its rows in the SQLite file).
CATALOG_NAME = "lake"
CATALOG_FILE = "lake_catalog.db"
_SPARK_PREFIX = f"spark.sql.catalog.{CATALOG_NAME}"
CATALOG_URI_ENV = settings.CATALOG_URI.name
CATALOG_WAREHOUSE_ENV = settings.CATALOG_WAREHOUSE.name
CATALOG_SIGNING_NAME_ENV = settings.CATALOG_SIGNING_NAME.name


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
    """Open the warehouse's embedded catalog as ``lake`` in ``spark`` (session conf: a classic session and
    a Spark Connect one alike). A session keeps the first catalog it opens, so a session that already opened
    another catalog raises :class:`CatalogInUseError`: use a session per warehouse
    (``spark.newSession()`` on a classic session)."""
    _use_conf(spark, spark_catalog_conf(root), catalog_file(root))


def _use_conf(spark: SparkSession, wanted: dict[str, str], described: str) -> None:
    uri_key = f"{_SPARK_PREFIX}.uri"
    current = spark.conf.get(uri_key, None)
    if current == wanted[uri_key] and spark.conf.get(f"{_SPARK_PREFIX}.warehouse", None) == wanted[f"{_SPARK_PREFIX}.warehouse"]:
        return
    if current:
        raise CatalogInUseError(
            f"this Spark session opened the catalog {CATALOG_NAME!r} on {current.removeprefix('jdbc:sqlite:')}, "
            f"not on {described}: a session reads and writes one warehouse; start a new session for another"
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


def open_catalog_once(root: str, open_catalog: Callable[[], object]) -> None:
    """Run ``open_catalog`` (the first use of the catalog by Spark) under a lock on the warehouse when
    the catalog's tables are not all there yet.

    Iceberg's JDBC catalog creates its tables, then adds the V1 column, the first time each session
    opens it, checking first and not in one transaction: two sessions opening a new warehouse at once
    (two tables' first runs on one Spark Connect server) raced, and one failed with "Cannot check and
    eventually update SQL schema". Once the tables are there, opening only reads them and needs no lock."""
    if catalog_ready(root):
        return
    owner_only_folder(root)  # a new warehouse, or one an older release left readable by others (CDC_UMASK)
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


class CatalogSettingError(ValueError):
    """The catalog settings do not fit together (an S3 warehouse without a REST catalog, ...)."""


@dataclass(frozen=True)
class LakeCatalog:
    """The catalog of the warehouse at ``root``: the embedded one in it (``uri`` empty), or a REST catalog.

    ``root`` is where the project keeps its own records: a local folder for the embedded catalog, a local
    folder or an ``s3://`` prefix beside a REST catalog. ``warehouse`` is the REST catalog's warehouse
    (for S3 Tables and SeaweedFS, a table bucket: ``s3://lake``); ``signing_name`` signs its requests with
    SigV4 (empty: unsigned). Credentials are no field: every client takes them from its environment
    (resources/storage/object_store.py).
    """

    root: str
    uri: str = ""
    warehouse: str = ""
    signing_name: str = ""
    store: ObjectStore = field(default_factory=ObjectStore)

    @classmethod
    def from_environment(cls, root: str) -> "LakeCatalog":
        """The one reading of the catalog's variables, for code outside a Dagster run."""
        return cls(
            root=root,
            uri=settings.CATALOG_URI.value(),
            warehouse=settings.CATALOG_WAREHOUSE.value(),
            signing_name=settings.CATALOG_SIGNING_NAME.value(),
            store=ObjectStore.from_environment(),
        )

    def __post_init__(self) -> None:
        if not self.uri:
            if is_object_store(self.root):
                raise CatalogSettingError(
                    f"warehouse {self.root}: a warehouse in a bucket needs a REST catalog: set {CATALOG_URI_ENV} "
                    f"(and {CATALOG_WAREHOUSE_ENV}); the embedded catalog is a SQLite file in a local warehouse "
                    "(docs/object-storage.md)"
                )
            return
        if not self.uri.startswith(("http://", "https://")):
            raise CatalogSettingError(f"catalog URI {self.uri!r} ({CATALOG_URI_ENV}): expected the REST catalog's http(s):// URL")
        if not self.warehouse:
            raise CatalogSettingError(
                f"REST catalog {self.uri} ({CATALOG_URI_ENV}) needs its warehouse ({CATALOG_WAREHOUSE_ENV}), e.g. s3://lake"
            )

    @property
    def embedded(self) -> bool:
        return not self.uri

    def describe(self) -> str:
        """Where the catalog is, for messages (no credential is part of it)."""
        return catalog_file(self.root) if self.embedded else f"REST catalog {self.uri} (warehouse {self.warehouse})"

    def spark_conf(self) -> dict[str, str]:
        """The session conf that opens the catalog as ``lake`` in Spark."""
        if self.embedded:
            return spark_catalog_conf(self.root)
        conf = {
            _SPARK_PREFIX: "org.apache.iceberg.spark.SparkCatalog",
            f"{_SPARK_PREFIX}.type": "rest",
            f"{_SPARK_PREFIX}.uri": self.uri,
            f"{_SPARK_PREFIX}.warehouse": self.warehouse,
            f"{_SPARK_PREFIX}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            f"{_SPARK_PREFIX}.cache-enabled": "false",  # as the embedded catalog's, for the same reason
            **{f"{_SPARK_PREFIX}.{key}": value for key, value in self.store.iceberg_properties().items()},
        }
        if self.signing_name:
            conf.update({
                f"{_SPARK_PREFIX}.rest.sigv4-enabled": "true",
                f"{_SPARK_PREFIX}.rest.signing-name": self.signing_name,
                f"{_SPARK_PREFIX}.rest.signing-region": self.store.region or DEFAULT_REGION,
            })  # fmt: skip
        return conf

    def pyiceberg_properties(self) -> dict[str, str]:
        """What ``pyiceberg.catalog.load_catalog(CATALOG_NAME, **properties)`` takes to open the catalog
        (no credential: pyiceberg's clients read them from the environment)."""
        if self.embedded:
            return pyiceberg_properties(self.root)
        properties = {"type": "rest", "uri": self.uri, "warehouse": self.warehouse, **self.store.iceberg_properties()}
        if self.signing_name:
            properties.update({
                "rest.sigv4-enabled": "true",
                "rest.signing-name": self.signing_name,
                "rest.signing-region": self.store.region or DEFAULT_REGION,
            })  # fmt: skip
        return properties

    def duckdb_attach_sql(self, alias: str = CATALOG_NAME) -> list[str]:
        """The statements that attach this REST catalog to a DuckDB connection as ``alias``, read-only, so
        that ``alias.<table>.<asset>`` reads a table by name (DuckDB's iceberg extension, 1.4): a secret
        for the objects, one for the catalog, and the ``ATTACH``. They hold the environment's keys: run
        them, never print or log them.

        The catalog secret is OAuth2 client credentials (the key pair, at the REST spec's token endpoint
        ``<uri>/v1/oauth/tokens``), which the lake of ``make lake-up`` accepts: DuckDB 1.4.4 signs
        SigV4 requests to a plain-http catalog wrongly. ``READ_ONLY``: DuckDB itself refuses INSERT,
        DELETE and DDL on the attached catalog. The embedded catalog (SQLite, a JDBC catalog) is none
        DuckDB can attach: its tables are read by ``iceberg_scan`` of their metadata files."""
        if self.embedded:
            raise CatalogSettingError(
                f"{self.describe()}: DuckDB attaches REST catalogs only; read a table of the embedded catalog "
                "with iceberg_scan of its metadata file (`cdc-catalog sql-for TABLE --engine duckdb`)"
            )
        key, secret = settings.ACCESS_KEY.value(), settings.SECRET_KEY.value()
        if not (key and secret):
            raise CatalogSettingError(
                f"{self.describe()}: DuckDB's attach signs in with the key pair: set {settings.ACCESS_KEY.name} and "
                f"{settings.SECRET_KEY.name} in the environment"
            )
        uri = self.uri.rstrip("/")
        return [
            self.store.duckdb_secret_sql(),
            f"CREATE OR REPLACE SECRET cdc_catalog (TYPE iceberg, CLIENT_ID '{sql_text(key)}', "
            f"CLIENT_SECRET '{sql_text(secret)}', OAUTH2_SERVER_URI '{sql_text(uri)}/v1/oauth/tokens')",
            f"ATTACH '{sql_text(self.warehouse)}' AS {alias} (TYPE iceberg, ENDPOINT '{sql_text(uri)}', SECRET cdc_catalog, READ_ONLY)",
        ]

    def use(self, spark: SparkSession) -> None:
        """Open the catalog as ``lake`` in ``spark`` (see :func:`use_catalog`)."""
        # With the session's S3A settings: extracts in a bucket are read through it (a Connect session's too).
        wanted = {**self.spark_conf(), **self.store.hadoop_conf()}
        _use_conf(spark, wanted, self.describe())

    def opened_in(self, spark: SparkSession) -> bool | None:
        """Whether ``spark`` opened this catalog as ``lake`` (None: it opened none yet)."""
        uri = spark.conf.get(f"{_SPARK_PREFIX}.uri", None)
        if not uri:
            return None
        return uri == self.spark_conf()[f"{_SPARK_PREFIX}.uri"] and (
            self.embedded or spark.conf.get(f"{_SPARK_PREFIX}.warehouse", None) == self.warehouse
        )

    def open_once(self, open_catalog: Callable[[], object]) -> None:
        """Run ``open_catalog`` (the catalog's first use) so that two processes never create the embedded
        catalog's tables at once (:func:`open_catalog_once`); a REST catalog needs no such care."""
        if self.embedded:
            open_catalog_once(self.root, open_catalog)
        else:
            open_catalog()

    def may_hold_tables(self) -> bool:
        """False when the catalog certainly holds no table yet (an embedded one whose file is not there)."""
        return not self.embedded or os.path.exists(catalog_file(self.root))
