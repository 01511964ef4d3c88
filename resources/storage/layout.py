"""Where the project's own records live in the warehouse, beside the Iceberg tables.

Per table::

    {root}/{table}/{asset}/                               the asset's Iceberg table (data/, metadata/): Iceberg's
    {root}/{table}/_schemas/{asset}/{id}.json             a Spark schema dates were written with (the hash spec)
    {root}/{table}/_retention/{asset}/business_date=D.json a date retention dropped (when, why)
    {root}/{table}/_writer.lock                           who is writing the table (in a bucket: _writer.lease)
    {root}/{table}/_erasures/{request}/request.json       an erase: when, who, why, what it removed
    {root}/{table}/_erasures/{request}/key_hashes/*.parquet the erased keys' hashes (no key value)
    {root}/{table}/_rollbacks/{id}.json                   a rollback: each output's snapshot before and after (rollback.py)
    {root}/lake_catalog.db                                the Iceberg catalog (resources/storage/lake.py)
    {root}/.lake_catalog.init.lock                        held while a new catalog's tables are created
    {root}/_runs/{table}-{time}-{run}-{id}.parquet        the runs log, a file per append
    {root}/_catalog/                                      the SQL catalog's metastore (cdc_assets.cli.catalog)

An incremental state (``storage: {current: incremental}``) is one table, ``lake.{table}.current_table``, with a
tag per business date (``merged.py``).

The warehouse is a local (or mounted POSIX) folder, or a prefix in an S3 bucket (``s3://bucket/prefix``):
then the tables are in a REST catalog wherever it keeps them, the catalog is no file here, and the writer
lock is a lease object (``lease.py``). Nothing here writes.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from cdc_assets.model import settings
from cdc_assets.core.columns import BUSINESS_DATE
from resources.storage.files import Files, files_for


WAREHOUSE_ENV = settings.WAREHOUSE.name
# Relative to the working directory of the process that uses it.
DEFAULT_WAREHOUSE = settings.WAREHOUSE.default
LOCK_FILE = "_writer.lock"
LEASE_FILE = "_writer.lease"  # resources/storage/lease.py
# The runs log's folder, beside the tables (no table name starts with "_").
RUNS_FOLDER = "_runs"
# Per table, one small file per partition dropped by retention: what tells "dropped" from "never written".
RETENTION_FOLDER = "_retention"
# Per table, one folder per erase request: the ledger of erased keys (resources/storage/erasure.py).
ERASURES_FOLDER = "_erasures"
# The SQL catalog's own state (Derby metastore, server state), beside the tables.
CATALOG_FOLDER = "_catalog"


class UnsupportedWarehouseError(ValueError):
    """The warehouse names something other than a local folder or an S3 bucket."""


def warehouse_root(configured: str | None = None) -> str:
    """``configured``, else ``CDC_WAREHOUSE``, else ``./warehouse``, as :func:`warehouse_location` gives it.

    The one place the environment variable is read, for code outside a Dagster run (the command-line
    tools, consumers, scripts); a run gets its warehouse from the IO manager's ``warehouse_root`` field.
    """
    return warehouse_location(configured or settings.WAREHOUSE.value())


def warehouse_location(configured: str) -> str:
    """``configured`` (empty: ``./warehouse``) as an absolute local path, or as ``s3://bucket/prefix``.

    A local path is made absolute, because a Spark Connect server resolves a relative path in its own
    working directory; a ``file://`` URI is taken as its path. ``s3://`` and ``s3a://`` name a bucket
    (docs/object-storage.md): the tables then live in a REST catalog, and the project's own records under
    this prefix. Any other URI (``gs://``, ``abfs://``, ``hdfs://``) raises :class:`UnsupportedWarehouseError`.
    """
    configured = configured.strip()
    if not configured:
        return os.path.abspath(DEFAULT_WAREHOUSE)
    if "://" in configured:
        scheme, rest = configured.split("://", 1)
        if scheme.lower() in ("s3", "s3a"):
            bucket = rest.split("/", 1)[0]
            if not bucket:
                raise UnsupportedWarehouseError(f"warehouse {configured!r} ({WAREHOUSE_ENV}): name a bucket, e.g. s3://lake/warehouse")
            return f"s3://{rest.rstrip('/')}"
        if scheme.lower() != "file":
            raise UnsupportedWarehouseError(
                f"warehouse {configured!r} ({WAREHOUSE_ENV}, or the IO manager's warehouse_root): the warehouse must "
                f"be a local folder, a POSIX mount (NFS and the like) at the same path everywhere, or an S3 bucket "
                f"(s3://bucket/prefix, any S3-compatible store), not a {scheme}:// URI: no other object store has "
                "been tested with this project yet (docs/object-storage.md)."
            )
        configured = rest if rest.startswith("/") else "/" + rest.split("/", 1)[-1]
    return os.path.abspath(configured).rstrip("/") or "/"


@dataclass(frozen=True)
class WarehouseLayout:
    """The paths of the warehouse under ``root`` (an absolute local path, or ``s3://bucket/prefix``)."""

    root: str
    # The file operations on the root: a local folder's or a bucket's (resources/storage/files.py).
    files: Files = field(default=None, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.files is None:
            object.__setattr__(self, "files", files_for(self.root))

    def table_path(self, table: str) -> str:
        return f"{self.root}/{table}"

    def asset_path(self, table: str, asset: str) -> str:
        return f"{self.root}/{table}/{asset}"

    def lock_path(self, table: str) -> str:
        """The writer lock: a local file (``lock.py``), or in a bucket the lease object (``lease.py``)."""
        return f"{self.root}/{table}/{LEASE_FILE if self.files.remote else LOCK_FILE}"

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
