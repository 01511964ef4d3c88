"""Where everything lives in the warehouse: every path, and which version a date's pointer names.

Per table::

    {root}/{table}/{asset}/business_date=D -> ../_versions/{asset}/business_date=D/_cdc_version=V
                                                                       the date's pointer: a symlink
    {root}/{table}/_versions/{asset}/business_date=D/_cdc_version=V/part-*.parquet
                                                                       a version: written once, never changed
    {root}/{table}/_versions/{asset}/business_date=D/_cdc_version=V.retired
                                                                       V stopped being the date's version then
    {root}/{table}/_staging/{asset}/{write}/...                       a write in progress (unique per write)
    {root}/{table}/_retention/{asset}/business_date=D.json            a partition retention dropped (when, why)
    {root}/{table}/_writer.lock                                       who is writing the table
    {root}/{table}/_erasures/{request}/request.json                   an erase: when, who, why, what it rewrote
    {root}/{table}/_erasures/{request}/key_hashes/*.parquet           the erased keys' hashes (no key value)
    {root}/_runs/{table}-{time}-{run}-{id}.parquet                    the runs log, a file per append
    {root}/_catalog/                                                  the SQL catalog's metastore (cdc_assets.catalog)

An incremental state stores its per-date changes as the asset ``{asset}_changes`` beside its full copies.

The warehouse is a local (or mounted POSIX) folder: a commit relies on an atomic rename and a symlink,
which object stores do not have, so a URI other than ``file://`` is refused. Nothing here writes.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

from cdc_assets.core.columns import BUSINESS_DATE
from resources.storage.files import list_names

WAREHOUSE_ENV = "CDC_WAREHOUSE"
# Relative to the working directory of the process that uses it.
DEFAULT_WAREHOUSE = "warehouse"
STAGING_FOLDER = "_staging"
VERSIONS_FOLDER = "_versions"
# A version folder's name is "_cdc_version=<id>": Spark reads a date's version with the asset's
# _versions folder as basePath, which yields business_date (and this column, dropped) from the names.
VERSION_KEY = "_cdc_version"
RETIRED_SUFFIX = ".retired"
POINTER_SUFFIX = ".pointer"
# Releases before versioned commits moved a date's folder aside to "_staging/{asset}/business_date=D.{write}.old"
# while replacing it: a commit of theirs killed then left the date there.
EARLIER_RELEASE_ASIDE_SUFFIX = ".old"
LOCK_FILE = "_writer.lock"
# The runs log's folder, beside the tables (no table name starts with "_").
RUNS_FOLDER = "_runs"
# Per table, one small file per partition dropped by retention: what tells "dropped" from "never written".
RETENTION_FOLDER = "_retention"
# Per table, one folder per erase request: the ledger of erased keys (resources/storage/erasure.py).
ERASURES_FOLDER = "_erasures"
# The SQL catalog's own state (Derby metastore, server state), beside the tables.
CATALOG_FOLDER = "_catalog"
# An incremental state's changes go to "{asset}_changes" (no asset name ends so).
CHANGES_SUFFIX = "_changes"


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
    raises :class:`UnsupportedWarehouseError`, since commits need an atomic rename and symlinks.
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
                "URI. A commit replaces a date by an atomic rename of a symlink and keeps replaced versions for "
                "readers; object stores have neither (pyarrow's S3 file system cannot even move a folder), and no "
                "object store has been tested with this project. Set it to a path."
            )
        configured = rest if rest.startswith("/") else "/" + rest.split("/", 1)[-1]
    return os.path.abspath(configured).rstrip("/") or "/"


def state_changes_asset(asset: str) -> str:
    """Where an incremental state's per-date changes are stored, beside the asset's full copies."""
    return f"{asset}{CHANGES_SUFFIX}"


@dataclass(frozen=True)
class WarehouseLayout:
    """The paths of the warehouse under ``root`` (an absolute local path)."""

    root: str

    def table_path(self, table: str) -> str:
        return f"{self.root}/{table}"

    def asset_path(self, table: str, asset: str) -> str:
        return f"{self.root}/{table}/{asset}"

    def partition_path(self, table: str, asset: str, business_date: str) -> str:
        """The date's pointer, ``{asset}/business_date=D``: what Spark, DuckDB and the catalog list."""
        return f"{self.asset_path(table, asset)}/{BUSINESS_DATE}={business_date}"

    def pointer_path(self, table: str, asset: str, business_date: str, write_id: str) -> str:
        """A new pointer, hidden beside the date's, until it is renamed over it."""
        return f"{self.asset_path(table, asset)}/.{BUSINESS_DATE}={business_date}.{write_id}{POINTER_SUFFIX}"

    def staging_path(self, table: str, asset: str | None = None) -> str:
        base = f"{self.root}/{table}/{STAGING_FOLDER}"
        return base if asset is None else f"{base}/{asset}"

    def versions_path(self, table: str, asset: str | None = None, business_date: str | None = None) -> str:
        """The table's versions, an asset's, or a date's (``business_date`` needs ``asset``)."""
        base = f"{self.root}/{table}/{VERSIONS_FOLDER}"
        if asset is None:
            return base
        return f"{base}/{asset}" if business_date is None else f"{base}/{asset}/{BUSINESS_DATE}={business_date}"

    def version_path(self, table: str, asset: str, business_date: str, version_id: str) -> str:
        return f"{self.versions_path(table, asset, business_date)}/{VERSION_KEY}={version_id}"

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

    def dated_version_folders(self, table: str) -> Iterator[tuple[str, str | None, set[str]]]:
        """Each date's folder of versions in the table: the folder, the version its pointer names
        (:meth:`current_version`) and the folder's entries. The one walk recovery and the sweep share."""
        for asset in list_names(self.versions_path(table)):
            for dated in list_names(self.versions_path(table, asset)):
                folder = f"{self.versions_path(table, asset)}/{dated}"
                current = self.current_version(table, asset, dated.removeprefix(f"{BUSINESS_DATE}="))
                yield folder, current, set(list_names(folder))

    def current_version(self, table: str, asset: str, business_date: str) -> str | None:
        """The folder holding the date's current version: the one its pointer names, or the date's own
        folder when an earlier release wrote a real one; None when there is neither."""
        final = self.partition_path(table, asset, business_date)
        try:
            target = os.readlink(final)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.EINVAL:  # not a symlink: a real folder
                return final if os.path.isdir(final) else None
            raise
        version = os.path.normpath(os.path.join(self.asset_path(table, asset), target))
        return version if os.path.isdir(version) else None
