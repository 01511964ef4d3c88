"""DuckDB with its Iceberg extension, offline: the extension files come from PyPI packages, not the internet.

DuckDB's own ``INSTALL iceberg`` downloads from extensions.duckdb.org. The PyPI packages
``duckdb-ext-iceberg``, ``duckdb-ext-avro`` (Iceberg's manifests are Avro) and ``duckdb-ext-httpfs`` ship
the same files for one DuckDB release (pyproject.toml pins both) under
``site-packages/duckdb_ext/extensions/v<version>/<platform>/``, the layout of DuckDB's extension
directory: :func:`duckdb_connection` points DuckDB at that folder, never installs, and loads iceberg and
avro. httpfs (for ``s3://`` and ``https://`` paths) loads from the same folder the first time a query
needs it.

    con = duckdb_connection()
    con.sql(f"SELECT * FROM iceberg_scan('{metadata_location}')")   # pyiceberg: table.metadata_location

:func:`load_extensions` does the same to a connection already open (``duckdb.default_connection()``,
the one ``duckdb.sql`` runs on).

No Spark, no Dagster.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import duckdb

# The extensions every connection loads, and the PyPI package that ships each.
LOADED_EXTENSIONS = {"iceberg": "duckdb-ext-iceberg", "avro": "duckdb-ext-avro"}
# Shipped for DuckDB to load on first use from the same folder.
ON_DEMAND_EXTENSIONS = {"httpfs": "duckdb-ext-httpfs"}


class DuckDBExtensionMissing(RuntimeError):
    """An extension's file for this DuckDB release and platform is not installed."""


def extension_file(name: str) -> Path:
    """The installed ``<name>.duckdb_extension`` built for this DuckDB release and platform."""
    package = {**LOADED_EXTENSIONS, **ON_DEMAND_EXTENSIONS}[name]
    version, platform = f"v{duckdb.__version__}", _platform()
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise DuckDBExtensionMissing(f"the PyPI package {package} (DuckDB's {name} extension) is not installed: run `make install`") from None
    shipped = [file for file in distribution.files or [] if file.name == f"{name}.duckdb_extension"]
    for file in shipped:
        if file.parent.parent.name == version and file.parent.name == platform:
            return Path(str(distribution.locate_file(file)))
    found = ", ".join(f"{file.parent.parent.name}/{file.parent.name}" for file in shipped) or "none"
    raise DuckDBExtensionMissing(
        f"{package} {distribution.version} has no {name} extension for DuckDB {version} on {platform} (it has: {found}): "
        "install the DuckDB release pyproject.toml pins, with `make install`"
    )


def extension_directory() -> Path:
    """The folder DuckDB looks in for ``v<version>/<platform>/<name>.duckdb_extension``."""
    return extension_file("iceberg").parents[2]


def duckdb_connection(database: str = ":memory:", read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the Iceberg and Avro extensions loaded from the PyPI packages, offline.

    Raises :class:`DuckDBExtensionMissing` naming the package when an extension's file is not installed
    for this DuckDB release and platform.
    """
    for name in LOADED_EXTENSIONS:
        extension_file(name)  # a missing one is named here, not as DuckDB's failed download
    config: dict[str, str | bool | int | float | list[str]] = {
        "extension_directory": str(extension_directory()),
        # Never download: what is not in the folder fails rather than reaching for the internet.
        "autoinstall_known_extensions": "false",
        "autoload_known_extensions": "true",
    }
    connection = duckdb.connect(database, read_only=read_only, config=config)
    try:
        for name in LOADED_EXTENSIONS:
            connection.execute(f"LOAD {name}")
    except BaseException:
        connection.close()
        raise
    return connection


def load_extensions(connection: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Load the Iceberg and Avro extensions into an open ``connection`` from the PyPI packages, offline,
    as :func:`duckdb_connection` does (it also points the connection's extension directory there and turns
    off downloads). Returns ``connection``."""
    for name in LOADED_EXTENSIONS:
        extension_file(name)
    folder = str(extension_directory()).replace("'", "''")
    connection.execute(f"SET extension_directory = '{folder}'")
    connection.execute("SET autoinstall_known_extensions = false")
    connection.execute("SET autoload_known_extensions = true")
    for name in LOADED_EXTENSIONS:
        connection.execute(f"LOAD {name}")
    return connection


def _platform() -> str:
    with duckdb.connect() as connection:
        row = connection.execute("PRAGMA platform").fetchone()
    assert row is not None  # a PRAGMA returns its row
    return row[0]
