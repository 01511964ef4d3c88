"""Where the project's own records live in the warehouse, beside the Iceberg tables.

Per table::

    {root}/{table}/{asset}/                               the asset's Iceberg table (data/, metadata/): Iceberg's
    {root}/{table}/_schemas/{asset}/{id}.json             a Spark schema dates were written with (the hash spec)
    {root}/{table}/_retention/{asset}/business_date=D.json a date retention dropped (when, why)
    {root}/{table}/_writer.lock                           who is writing the table
    {root}/{table}/_erasures/{request}/request.json       an erase: when, who, why, what it removed
    {root}/{table}/_erasures/{request}/key_hashes/*.parquet the erased keys' hashes (no key value)
    {root}/lake_catalog.db                                the Iceberg catalog (resources/storage/lake.py)
    {root}/.lake_catalog.init.lock                        held while a new catalog's tables are created
    {root}/_runs/{table}-{time}-{run}-{id}.parquet        the runs log, a file per append
    {root}/_catalog/                                      the SQL catalog's metastore (cdc_assets.catalog)

An incremental state (``storage: {current: incremental}``) is one table, ``lake.{table}.current_table``, with a
tag per business date (``merged.py``).

The warehouse is a local (or mounted POSIX) folder for now: a URI other than ``file://`` is refused.
Nothing here writes.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from cdc_assets.core.columns import BUSINESS_DATE


WAREHOUSE_ENV = "CDC_WAREHOUSE"
# Relative to the working directory of the process that uses it.
DEFAULT_WAREHOUSE = "warehouse"
LOCK_FILE = "_writer.lock"
# The runs log's folder, beside the tables (no table name starts with "_").
RUNS_FOLDER = "_runs"
# Per table, one small file per partition dropped by retention: what tells "dropped" from "never written".
RETENTION_FOLDER = "_retention"
# Per table, one folder per erase request: the ledger of erased keys (resources/storage/erasure.py).
ERASURES_FOLDER = "_erasures"
# The SQL catalog's own state (Derby metastore, server state), beside the tables.
CATALOG_FOLDER = "_catalog"


class UnsupportedWarehouseError(ValueError):
    """The warehouse names something other than a local or mounted POSIX folder."""


def warehouse_root(configured: str | None = None) -> str:
    """``configured``, else ``CDC_WAREHOUSE``, else ``./warehouse``, as an absolute local path.

    The one place the environment variable is read, for code outside a Dagster run (the command-line
    tools, consumers, scripts); a run gets its warehouse from the IO manager's ``warehouse_root`` field.
    """
    return local_warehouse_path(configured or os.environ.get(WAREHOUSE_ENV, ""))


def local_warehouse_path(configured: str) -> str:
    """``configured`` (empty: ``./warehouse``) as an absolute local path.

    Made absolute, because a Spark Connect server resolves a relative path in its own working directory.
    A ``file://`` URI is taken as its path; any other URI (``s3a://``, ``gs://``, ``abfs://``, ``hdfs://``)
    raises :class:`UnsupportedWarehouseError`: the embedded catalog (a SQLite file) and the project's own
    records (ledger, locks, runs log) are local files.
    """
    configured = configured.strip()
    if not configured:
        return os.path.abspath(DEFAULT_WAREHOUSE)
    if "://" in configured:
        scheme, rest = configured.split("://", 1)
        if scheme.lower() != "file":
            raise UnsupportedWarehouseError(
                f"warehouse {configured!r} ({WAREHOUSE_ENV}, or the IO manager's warehouse_root): the warehouse must "
                f"be a local folder or a POSIX mount (NFS and the like) at the same path everywhere, not a {scheme}:// "
                "URI. The embedded Iceberg catalog is a SQLite file in the warehouse, and the project keeps its erase "
                "ledger, writer locks and runs log there as local files; no object store has been tested with this "
                "project yet. Set it to a path."
            )
        configured = rest if rest.startswith("/") else "/" + rest.split("/", 1)[-1]
    return os.path.abspath(configured).rstrip("/") or "/"


@dataclass(frozen=True)
class WarehouseLayout:
    """The paths of the warehouse under ``root`` (an absolute local path)."""

    root: str

    def table_path(self, table: str) -> str:
        return f"{self.root}/{table}"

    def asset_path(self, table: str, asset: str) -> str:
        return f"{self.root}/{table}/{asset}"

    def lock_path(self, table: str) -> str:
        return f"{self.root}/{table}/{LOCK_FILE}"

    def retention_path(self, table: str, asset: str) -> str:
        return f"{self.root}/{table}/{RETENTION_FOLDER}/{asset}"

    def dropped_marker_path(self, table: str, asset: str, business_date: str) -> str:
        return f"{self.retention_path(table, asset)}/{BUSINESS_DATE}={business_date}.json"

    def erasures_path(self, table: str, request_id: str | None = None) -> str:
        base = f"{self.root}/{table}/{ERASURES_FOLDER}"
        return base if request_id is None else f"{base}/{request_id}"

    def runs_log_path(self) -> str:
        return f"{self.root}/{RUNS_FOLDER}"

    def runs_log_file(self, table: str, run_id: str) -> str:
        """A new file of the runs log, for one append: unique to the append, sorting by time."""
        name = f"{table}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{run_id[:8]}-{uuid.uuid4().hex[:8]}.parquet"
        return f"{self.runs_log_path()}/{name}"

    def catalog_path(self) -> str:
        """Where the SQL catalog keeps its metastore."""
        return f"{self.root}/{CATALOG_FOLDER}"
