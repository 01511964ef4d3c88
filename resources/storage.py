"""The warehouse: every path, the one commit path, crash recovery, the writer lock and the schema memo.

Layout, per table::

    {root}/{table}/{asset}/business_date=D -> ../_versions/{asset}/business_date=D/_cdc_version=V
                                                                       the date's pointer: a symlink
    {root}/{table}/_versions/{asset}/business_date=D/_cdc_version=V/part-*.parquet
                                                                       a version: written once, never changed
    {root}/{table}/_versions/{asset}/business_date=D/_cdc_version=V.retired
                                                                       V stopped being the date's version then
    {root}/{table}/_staging/{asset}/{write}/...                       a write in progress (unique per write)
    {root}/{table}/_retention/{asset}/business_date=D.json            a partition retention dropped (when, why)
    {root}/{table}/_writer.lock                                       who is writing the table
    {root}/_runs/{table}-{time}-{run}-{id}.parquet                    the runs log, a file per append
    {root}/_catalog/                                                  the SQL catalog's metastore (cdc_assets.catalog)

The warehouse is a local (or mounted POSIX) folder: a commit relies on an atomic rename and a
symlink, which object stores do not have (:func:`warehouse_root` refuses their URIs). Spark writes
the files; everything else (listing, renaming, linking, the lock, row counts from Parquet footers)
happens in the run's Python process, so the same code commits through a classic session and through
Spark Connect, where there is no JVM handle.

A write of one date or of many goes the same way: Spark writes every date's rows into a staging
folder unique to that write, rows dated outside the write fail it before anything is committed, and
then each date is committed on its own: its staged files are synced to disk and renamed into a new
version folder, and the date's pointer is replaced by one atomic rename of a new symlink over it. A
reader resolves the pointer once and reads that version's folder, which nothing changes or deletes
for ``CDC_RETIRED_VERSION_GRACE_SECONDS`` after it stops being current: it sees the old version or the
new one, never nothing and never a mix. Readers take no lock and write nothing, so they work on a
read-only mount. Only a writer cleans up, when it takes the table's lock: staging leftovers, versions
that a killed commit never pointed to, and retired versions past the grace period.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc_assets.core.columns import BUSINESS_DATE

WAREHOUSE_ENV = "CDC_WAREHOUSE"
LOCK_TIMEOUT_ENV = "CDC_WRITER_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_SECONDS = 900.0
# How long a replaced (or retention-dropped) version stays on disk for readers that resolved it before.
RETIRED_GRACE_ENV = "CDC_RETIRED_VERSION_GRACE_SECONDS"
DEFAULT_RETIRED_GRACE_SECONDS = 3600.0
STAGING_FOLDER = "_staging"
VERSIONS_FOLDER = "_versions"
# A version folder's name is "_cdc_version=<id>": Spark reads a date's version with the asset's
# _versions folder as basePath, which yields business_date (and this column, dropped) from the names.
VERSION_KEY = "_cdc_version"
RETIRED_SUFFIX = ".retired"
POINTER_SUFFIX = ".pointer"
LOCK_FILE = "_writer.lock"
# The runs log's folder, beside the tables (no table name starts with "_").
RUNS_FOLDER = "_runs"
# Per table, one small file per partition dropped by retention: what tells "dropped" from "never written".
RETENTION_FOLDER = "_retention"
# The SQL catalog's own state (Derby metastore, server state), beside the tables.
CATALOG_FOLDER = "_catalog"
_ROWS = "rows"
# An incremental state's changes go to "{asset}_changes" (no asset name ends so).
CHANGES_SUFFIX = "_changes"
_log = logging.getLogger(__name__)


class UnsupportedWarehouseError(ValueError):
    """``CDC_WAREHOUSE`` names something other than a local or mounted POSIX folder."""


def warehouse_root(configured: str | None = None) -> str:
    """``configured``, else ``CDC_WAREHOUSE``, else ``./warehouse``, as an absolute local path.

    Made absolute, because a Spark Connect server resolves a relative path in its own working directory.
    A ``file://`` URI is taken as its path; any other URI (``s3a://``, ``gs://``, ``abfs://``, ``hdfs://``)
    raises :class:`UnsupportedWarehouseError`, since commits need an atomic rename and symlinks.
    """
    configured = (configured or os.environ.get(WAREHOUSE_ENV, "")).strip()
    if not configured:
        return os.path.abspath("warehouse")
    if "://" in configured:
        scheme, rest = configured.split("://", 1)
        if scheme.lower() != "file":
            raise UnsupportedWarehouseError(
                f"{WAREHOUSE_ENV}={configured!r}: the warehouse must be a local folder or a POSIX mount "
                f"(NFS and the like) at the same path everywhere, not a {scheme}:// URI. A commit replaces a date "
                "by an atomic rename of a symlink and keeps replaced versions for readers; object stores have "
                "neither (pyarrow's S3 file system cannot even move a folder), and no object store has been "
                "tested with this project. Set CDC_WAREHOUSE to a path."
            )
        configured = rest if rest.startswith("/") else "/" + rest.split("/", 1)[-1]
    return os.path.abspath(configured).rstrip("/") or "/"


def lock_timeout_seconds() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    return float(raw) if raw else DEFAULT_LOCK_TIMEOUT_SECONDS


def retired_grace_seconds() -> float:
    raw = os.environ.get(RETIRED_GRACE_ENV, "").strip()
    return float(raw) if raw else DEFAULT_RETIRED_GRACE_SECONDS


class MissingPartitionError(RuntimeError):
    """An upstream partition the step needs has never been written."""


class DroppedPartitionError(MissingPartitionError):
    """The partition was stored, then dropped by the table's retention setting (``retention.current_days``)."""


class WriterLockTimeout(RuntimeError):
    """Another run held the table's writer lock for longer than this run was willing to wait."""


def state_changes_asset(asset: str) -> str:
    """Where an incremental state's per-date changes are stored, beside the asset's full copies."""
    return f"{asset}{CHANGES_SUFFIX}"


@dataclass(frozen=True)
class StateLayout:
    """The parts a date's state is read from: a full copy, and the changes of later dates up to it."""

    full_date: str
    change_dates: list[str]


@dataclass
class _HeldLock:
    handle: IO[str]  # the open, flock-ed lock file
    path: str
    pid: int  # the process that took it: only that process lets it go


@dataclass
class WarehouseStorage:
    """The warehouse under ``root`` as one run sees it. Create one per run (``run_id`` names its writes).

    Not safe for two runs at once by itself: the writer lock (:meth:`hold_writer_lock`) makes one run
    at a time write a table, in this process or any other on the machine. Reading needs no lock.
    """

    root: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lock_timeout: float = field(default_factory=lock_timeout_seconds)
    retired_grace: float = field(default_factory=retired_grace_seconds)
    # Versions this run committed: folder -> schema written. Reading one back skips Spark's schema
    # inference (a job per read); a version folder never changes once committed.
    _committed: dict[str, StructType] = field(default_factory=dict)
    _locks: dict[str, _HeldLock] = field(default_factory=dict)
    _writes: int = 0
    # Partitions this run has read or committed, as (table, asset, date): retention leaves them alone,
    # since the run's later writes and checks may still scan them (DataFrames are read lazily).
    _in_use: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.root = warehouse_root(self.root)
        self._token = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{self.run_id[:8]}-{uuid.uuid4().hex[:6]}"

    # -- paths -----------------------------------------------------------------------------------------
    def asset_path(self, table: str, asset: str) -> str:
        return f"{self.root}/{table}/{asset}"

    def partition_path(self, table: str, asset: str, business_date: str) -> str:
        """The date's pointer, ``{asset}/business_date=D``: what Spark, DuckDB and the catalog list."""
        return f"{self.asset_path(table, asset)}/{BUSINESS_DATE}={business_date}"

    def _staging(self, table: str, asset: str | None = None) -> str:
        base = f"{self.root}/{table}/{STAGING_FOLDER}"
        return base if asset is None else f"{base}/{asset}"

    def _versions(self, table: str, asset: str, business_date: str | None = None) -> str:
        base = f"{self.root}/{table}/{VERSIONS_FOLDER}/{asset}"
        return base if business_date is None else f"{base}/{BUSINESS_DATE}={business_date}"

    # -- file operations ---------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_names(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _delete(self, path: str) -> None:
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)

    # -- the writer lock -------------------------------------------------------------------------------
    def hold_writer_lock(self, table: str) -> None:
        """Make this run the table's only writer until :meth:`release`; wait for another holder first.

        The lock is an ``flock`` on ``{table}/_writer.lock``: the kernel releases it when the holding
        process ends, however it ends, so a killed run's lock is stale the moment it is gone. The file
        names the holder (run id, host, pid) for the message of a writer that gives up after
        ``lock_timeout`` seconds. Taking the lock cleans up what earlier holders left behind
        (:meth:`_recover_and_sweep`): they are all gone, since only the holder writes.
        """
        if table in self._locks:
            return
        path = f"{self.root}/{table}/{LOCK_FILE}"
        holder = {"run_id": self.run_id, "host": socket.gethostname(), "pid": os.getpid(),
                  "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self._locks[table] = self._flock(table, path, holder)
        self._recover_and_sweep(table)

    def _flock(self, table: str, path: str, holder: dict) -> _HeldLock:
        import fcntl  # POSIX only, like the rest of the warehouse

        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")  # O_CREAT: created atomically if absent
        deadline = time.monotonic() + self.lock_timeout
        waiting = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    handle.close()
                    raise
            if not waiting and self.lock_timeout > 0:
                waiting = True
                handle.seek(0)
                _log.warning(
                    f"table {table}: waiting for the writer lock held by {handle.read().strip() or 'another run'} "
                    f"(up to {self.lock_timeout:.0f}s, {LOCK_TIMEOUT_ENV})"
                )
            if time.monotonic() >= deadline:
                handle.seek(0)
                current = handle.read().strip() or "unknown"
                handle.close()
                raise WriterLockTimeout(self._timeout_message(table, path, current))
            time.sleep(0.5)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder) + "\n")
        handle.flush()
        return _HeldLock(handle=handle, path=path, pid=os.getpid())

    def _timeout_message(self, table: str, path: str, current: str) -> str:
        return (
            f"table {table}: another run is writing it (writer lock {path} held by {current}); waited "
            f"{self.lock_timeout:.0f}s ({LOCK_TIMEOUT_ENV}). Wait for that run to finish, or stop it."
        )

    def release(self) -> None:
        """Give up every writer lock this process holds (at the end of the run, however it ended).

        The lock file stays: deleting it would let a waiting writer and a new one lock two different
        files. A copy of this object in another process (a fork) releases nothing it did not take.
        """
        for table, held in list(self._locks.items()):
            if held.pid == os.getpid():
                held.handle.close()  # closing the file releases the flock
            del self._locks[table]

    def _recover_and_sweep(self, table: str) -> None:
        """What a writer does when it takes the lock, and only a writer:

        - put back a date whose folder a commit of an earlier release (which retired the folder before
          renaming the new one in) left missing, and empty the table's staging folder;
        - delete pointer files a killed commit never renamed into place;
        - delete versions a killed commit placed but never pointed to (no reader can have seen them),
          and versions retired more than ``retired_grace`` seconds ago.
        """
        for asset in self.list_names(self._staging(table)):
            folder = self._staging(table, asset)
            for name in self.list_names(folder):
                if name.endswith(".old"):
                    self._restore_retired_folder(table, asset, name)
            for name in self.list_names(folder):
                self._delete(f"{folder}/{name}")
        for asset in self.list_names(f"{self.root}/{table}"):
            if asset.startswith(("_", ".")):
                continue
            for name in self.list_names(self.asset_path(table, asset)):
                if name.startswith(".") and name.endswith(POINTER_SUFFIX):
                    self._delete(f"{self.asset_path(table, asset)}/{name}")
        now = time.time()
        for asset in self.list_names(f"{self.root}/{table}/{VERSIONS_FOLDER}"):
            for dated in self.list_names(self._versions(table, asset)):
                self._sweep_versions(table, asset, dated.removeprefix(f"{BUSINESS_DATE}="), now)

    def _sweep_versions(self, table: str, asset: str, business_date: str, now: float) -> None:
        folder = self._versions(table, asset, business_date)
        current = self._resolve(table, asset, business_date)
        names = set(self.list_names(folder))
        for name in names:
            if name.endswith(RETIRED_SUFFIX):
                if f"{folder}/{name.removesuffix(RETIRED_SUFFIX)}" == current:
                    os.unlink(f"{folder}/{name}")  # a retirement whose pointer switch never happened
                elif name.removesuffix(RETIRED_SUFFIX) not in names:
                    os.unlink(f"{folder}/{name}")  # its version is gone already
                continue
            version = f"{folder}/{name}"
            if version == current:
                continue
            retired = f"{version}{RETIRED_SUFFIX}"
            if not os.path.exists(retired):
                self._delete(version)  # placed by a killed commit, never pointed to: never read
            elif now - os.path.getmtime(retired) >= self.retired_grace:
                self._delete(version)
                os.unlink(retired)
        if not self.list_names(folder):
            os.rmdir(folder)

    def _restore_retired_folder(self, table: str, asset: str, name: str) -> None:
        """Undo a commit of an earlier release killed between its two renames (it left the date without
        a folder and the stored one under ``_staging/{asset}/business_date=D.{write}.old``)."""
        business_date = name.split(".", 1)[0].removeprefix(f"{BUSINESS_DATE}=")
        final = self.partition_path(table, asset, business_date)
        if not os.path.lexists(final):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.rename(f"{self._staging(table, asset)}/{name}", final)
            _fsync_folder(os.path.dirname(final))

    # -- writing ---------------------------------------------------------------------------------------
    def write(self, frame: DataFrame, table: str, asset: str, business_dates: list[str]) -> dict[str, int]:
        """Store ``frame`` as the partitions ``business_dates`` of ``[table, asset]``; rows per date.

        ``frame`` has a ``business_date`` (date) column whose values must be among ``business_dates``,
        or, for a single date, may have none. Rows dated elsewhere (NULL included) fail the write before
        any commit. A date without rows gets a partition holding an empty file. Rows are counted while
        they are written (observed metrics), not by a second job.
        """
        self.hold_writer_lock(table)
        dated = BUSINESS_DATE in frame.columns
        if not dated and len(business_dates) != 1:
            raise ValueError(f"{table}/{asset}: rows for {len(business_dates)} dates need a {BUSINESS_DATE} column")
        observation = Observation(f"rows_written_{uuid.uuid4().hex}")
        counted = [F.count(F.lit(1)).alias(_ROWS)]
        if dated:
            counted += [F.count_if(_on(day)).alias(day) for day in business_dates]
        observed = frame.observe(observation, *counted)
        self._writes += 1
        staged = f"{self._staging(table, asset)}/{self._token}-{self._writes}"
        if len(business_dates) == 1:
            # One date needs no partitioned write (it would sort by the date and, without rows,
            # write no folder at all); its rows go straight into the date's folder.
            day = business_dates[0]
            observed.drop(BUSINESS_DATE).write.mode("error").parquet(f"{staged}/{BUSINESS_DATE}={day}")
        else:
            observed.write.partitionBy(BUSINESS_DATE).mode("error").parquet(staged)
        figures = observation.get
        if _ROWS in figures:
            total = int(figures[_ROWS])
            rows = {day: int(figures[day]) for day in business_dates} if dated else {business_dates[0]: total}
        else:
            # Spark 4.0's Connect server waits only 100 ms for a write's observed metrics (SPARK-54279,
            # fixed after 4.0): on a busy shared server they can come back empty. The staged files'
            # footers hold the same counts, read without a Spark job.
            total, rows = self._staged_counts(staged, business_dates)
            if dated and len(business_dates) == 1:
                # One date's rows all went into its folder: those dated elsewhere need a job of their own.
                day = business_dates[0]
                rows = {day: total - frame.filter(~F.coalesce(_on(day), F.lit(False))).count()}
        if total != sum(rows.values()):
            self._delete(staged)
            span = business_dates[0] if len(business_dates) == 1 else f"{business_dates[0]}..{business_dates[-1]}"
            raise ValueError(
                f"{table}/{asset}: {total - sum(rows.values())} row(s) are dated outside the write's "
                f"partition(s) {span}; nothing was committed"
            )
        missing = [day for day in business_dates if not self.exists(f"{staged}/{BUSINESS_DATE}={day}")]
        if missing:
            # A partitioned write makes no folder for a date without rows, but readers need one: such
            # dates get a copy of one empty file. limit(0) plans as an empty local relation: no
            # upstream work, and no Python worker (createDataFrame([]) would start one).
            empty = f"{staged}/_empty"
            frame.drop(BUSINESS_DATE).limit(0).write.parquet(empty)
            for day in missing:
                os.makedirs(f"{staged}/{BUSINESS_DATE}={day}")
                for name in self.list_names(empty):
                    if name.endswith(".parquet"):
                        shutil.copyfile(f"{empty}/{name}", f"{staged}/{BUSINESS_DATE}={day}/{name}")
        _pause_if_requested(PAUSE_ENV, table, asset)
        schema = as_stored(frame.drop(BUSINESS_DATE).schema)
        for day in business_dates:
            self._commit(table, asset, day, f"{staged}/{BUSINESS_DATE}={day}", schema)
        self._delete(staged)
        self._forget_dropped(table, asset, business_dates)
        return rows

    def _commit(self, table: str, asset: str, business_date: str, staged: str, schema: StructType) -> None:
        """Make ``staged`` the date's version: durable first, then visible in one atomic rename.

        1. fsync the staged files and folder, rename the folder to a new version under ``_versions``
           (not yet visible: no pointer names it) and fsync the folders it was renamed into;
        2. mark the version being replaced as retired (the sweep keeps it ``retired_grace`` seconds);
        3. create a new symlink beside the pointer and rename it over the pointer (a rename replaces its
           target atomically), then fsync the asset folder so the switch survives a power loss.

        A kill before 3 leaves the old version current and an unreferenced new one, which the next
        writer deletes; after 3 the new version is current.
        """
        final = self.partition_path(table, asset, business_date)
        folder = self._versions(table, asset, business_date)
        version = f"{folder}/{VERSION_KEY}={self._token}-{self._writes}"
        _fsync_tree(staged)
        os.makedirs(folder, exist_ok=True)
        os.rename(staged, version)
        for synced in (folder, os.path.dirname(folder), os.path.dirname(os.path.dirname(folder))):
            _fsync_folder(synced)
        _pause_if_requested(PAUSE_IN_COMMIT_ENV, table, asset)
        previous = self._resolve(table, asset, business_date)
        legacy = previous == final  # a real folder, as releases before versioning wrote
        if previous is not None and not legacy:
            _mark_retired(previous)
        asset_folder = self.asset_path(table, asset)
        os.makedirs(asset_folder, exist_ok=True)
        pointer = f"{asset_folder}/.{BUSINESS_DATE}={business_date}.{self._token}-{self._writes}{POINTER_SUFFIX}"
        os.symlink(os.path.relpath(version, asset_folder), pointer)
        if legacy:
            self._replace_legacy_folder(table, asset, business_date, pointer)
        else:
            os.rename(pointer, final)
        _fsync_folder(asset_folder)
        self._committed[version] = schema
        self._in_use.add((table, asset, business_date))

    def _replace_legacy_folder(self, table: str, asset: str, business_date: str, pointer: str) -> None:
        """Swap a real date folder (written before versioning) for the pointer, and retire the folder.

        rename(2) cannot put a symlink over a folder; Linux's renameat2(RENAME_EXCHANGE) swaps the two
        atomically. Where it is missing, the folder is moved aside first, and a reader arriving in
        between finds neither (once per date, on the first re-run after an upgrade).
        """
        final = self.partition_path(table, asset, business_date)
        aside = f"{self._versions(table, asset, business_date)}/{VERSION_KEY}=legacy-{self._token}"
        if _exchange(pointer, final):
            os.rename(pointer, aside)  # the pointer's name now holds the old folder
        else:
            _log.warning(f"{table}/{asset}: no atomic exchange here; {final} is missing for a moment")
            os.rename(final, aside)
            os.rename(pointer, final)
        _mark_retired(aside)

    # -- retention -------------------------------------------------------------------------------------
    def drop_outside_retention(self, table: str, asset: str, current_days: int) -> list[str]:
        """Apply ``retention.current_days``: drop the asset's partitions older than its newest ``current_days``
        business dates; returns the dates dropped, oldest first.

        The window is counted in calendar days back from the newest stored date: it keeps that date and
        the ``current_days - 1`` days before it (dates are materialized in order, so these are the
        newest ``current_days`` partitions). A partition this run has read or committed stays whatever
        its date, because the run's later writes and its checks may still scan it; the table's next run
        drops it. Each date is first recorded under ``_retention`` (so that a later read can say why it
        is missing), then its pointer is removed (readers see the partition or nothing, never part of
        it) and its version retired, to be deleted by a writer after ``retired_grace`` seconds. Holds
        the table's writer lock.
        """
        if current_days < 1:
            raise ValueError(f"{table}/{asset}: retention.current_days must be at least 1, got {current_days}")
        self.hold_writer_lock(table)
        stored = self.stored_dates(table, asset)
        if not stored:
            return []
        oldest_kept = (date.fromisoformat(stored[-1]) - timedelta(days=current_days - 1)).isoformat()
        expired = [day for day in stored if day < oldest_kept and (table, asset, day) not in self._in_use]
        return self._drop(table, asset, expired, current_days, stored[-1])

    def drop_state_outside_retention(self, table: str, asset: str, current_days: int) -> list[str]:
        """``retention.current_days`` for a state stored as full copies and changes (:meth:`state_layout`):
        keep what the states of the newest ``current_days`` dates need, the full copy the oldest of them
        is read from included; drop the rest of both. Returns the dates whose full copy or changes were
        dropped, oldest first."""
        if current_days < 1:
            raise ValueError(f"{table}/{asset}: retention.current_days must be at least 1, got {current_days}")
        self.hold_writer_lock(table)
        changes_asset = state_changes_asset(asset)
        fulls, changes = self.stored_dates(table, asset), self.stored_dates(table, changes_asset)
        if not fulls and not changes:
            return []
        newest = max(fulls[-1:] + changes[-1:])
        oldest_kept = (date.fromisoformat(newest) - timedelta(days=current_days - 1)).isoformat()
        needed = [day for day in fulls if day <= oldest_kept]
        if not needed:
            return []  # no full copy the kept states could do without
        keep_from = needed[-1]  # the full copy the oldest kept state is read from
        expired_fulls = [d for d in fulls if d < keep_from and (table, asset, d) not in self._in_use]
        expired_changes = [d for d in changes if d <= keep_from and (table, changes_asset, d) not in self._in_use]
        self._drop(table, asset, expired_fulls, current_days, newest)
        self._drop(table, changes_asset, expired_changes, current_days, newest)
        return sorted(set(expired_fulls) | set(expired_changes))

    def _drop(self, table: str, asset: str, expired: list[str], current_days: int, newest: str) -> list[str]:
        for day in expired:
            self._record_dropped(
                table,
                asset,
                day,
                {
                    "current_days": current_days,
                    "newest": newest,
                    "run_id": self.run_id,
                    "dropped_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                },
            )
            final = self.partition_path(table, asset, day)
            version = self._resolve(table, asset, day)
            if version is not None and version != final:
                _mark_retired(version)
                os.unlink(final)
            elif version == final:  # a real folder of an earlier release: moved among the versions, retired
                aside = f"{self._versions(table, asset, day)}/{VERSION_KEY}=legacy-{self._token}"
                os.makedirs(os.path.dirname(aside), exist_ok=True)
                os.rename(final, aside)
                _mark_retired(aside)
            elif os.path.islink(final):
                os.unlink(final)  # a pointer whose version is gone
            _fsync_folder(self.asset_path(table, asset))
        return expired

    def dropped_partition(self, table: str, asset: str, business_date: str) -> dict | None:
        """What retention recorded when it dropped the partition (``current_days``, ``newest``, ``run_id``,
        ``dropped_at``), or None if it never dropped it. Reads one small file; no lock, no Spark."""
        path = self._dropped_marker(table, asset, business_date)
        try:
            with open(path, encoding="utf-8") as stream:
                return json.load(stream)
        except FileNotFoundError:
            return None

    def _dropped_marker(self, table: str, asset: str, business_date: str) -> str:
        return f"{self.root}/{table}/{RETENTION_FOLDER}/{asset}/{BUSINESS_DATE}={business_date}.json"

    def _record_dropped(self, table: str, asset: str, business_date: str, record: dict) -> None:
        # Written under a hidden name and renamed, so a reader never parses half a record.
        marker = self._dropped_marker(table, asset, business_date)
        hidden = f"{os.path.dirname(marker)}/.{os.path.basename(marker)}.{self._token}.tmp"
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(hidden, "w", encoding="utf-8") as stream:
            stream.write(json.dumps(record) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.rename(hidden, marker)
        _fsync_folder(os.path.dirname(marker))

    def _forget_dropped(self, table: str, asset: str, business_dates: list[str]) -> None:
        """A date written again is no longer a dropped one (one listing per write; usually nothing there)."""
        folder = f"{self.root}/{table}/{RETENTION_FOLDER}/{asset}"
        recorded = set(self.list_names(folder))
        for day in business_dates:
            if f"{BUSINESS_DATE}={day}.json" in recorded:
                self._delete(self._dropped_marker(table, asset, day))

    # -- reading: no lock, no write ---------------------------------------------------------------------
    def _resolve(self, table: str, asset: str, business_date: str) -> str | None:
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

    def stored_path(self, table: str, asset: str, business_date: str) -> str:
        """The folder of the date's current version, resolved once: read it, not the pointer, and a
        commit that replaces the date meanwhile changes nothing under the reader.

        Raises :class:`MissingPartitionError` if the date was never written, and
        :class:`DroppedPartitionError` (naming ``retention.current_days``) if retention dropped it.
        Takes no lock and changes nothing: a date that a killed commit of an earlier release left
        without a folder is read where that commit left it, and put back by the next writer.
        """
        version = self._resolve(table, asset, business_date)
        if version is not None:
            return version
        retired = self._retired_by_earlier_release(table, asset, business_date)
        if retired is not None:
            return retired
        dropped = self.dropped_partition(table, asset, business_date)
        if dropped is not None:
            raise DroppedPartitionError(
                f"{table}/{asset} has no partition for {business_date}: retention.current_days "
                f"({dropped['current_days']}, in the table config of {table}) dropped it when the newest stored date "
                f"was {dropped['newest']} (run {dropped['run_id']}). What needs the state as of {business_date}, "
                "such as a run of the date after it, cannot run; raise retention.current_days to keep more dates."
            )
        raise MissingPartitionError(
            f"{table}/{asset} has no partition for {business_date} (looked in "
            f"{self.partition_path(table, asset, business_date)}). "
            "Materialize the dates in order: each date needs the previous date's outputs."
        )

    def _retired_by_earlier_release(self, table: str, asset: str, business_date: str) -> str | None:
        folder = self._staging(table, asset)
        for name in sorted(self.list_names(folder)):
            if name.startswith(f"{BUSINESS_DATE}={business_date}.") and name.endswith(".old"):
                return f"{folder}/{name}"
        return None

    def runs_log_path(self) -> str:
        return f"{self.root}/{RUNS_FOLDER}"

    def catalog_path(self) -> str:
        """Where the SQL catalog keeps its metastore."""
        return f"{self.root}/{CATALOG_FOLDER}"

    def append_to_runs_log(self, rows: pa.Table, table: str) -> str:
        """Add ``rows`` to the runs log as a new file (never rewriting one); returns its path.

        Written under a hidden name and renamed, so a reader never sees half a file.
        """
        folder = self.runs_log_path()
        name = f"{table}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{self.run_id[:8]}-{uuid.uuid4().hex[:8]}.parquet"
        os.makedirs(folder, exist_ok=True)
        hidden = f"{folder}/.{name}.tmp"
        pq.write_table(rows, hidden)
        os.rename(hidden, f"{folder}/{name}")
        return f"{folder}/{name}"

    def stored_dates(self, table: str, asset: str) -> list[str]:
        """The business dates the asset has a committed partition for, oldest first (no Spark job)."""
        prefix = f"{BUSINESS_DATE}="
        return sorted(name[len(prefix) :] for name in self.list_names(self.asset_path(table, asset)) if name.startswith(prefix))

    def has_partition(self, table: str, asset: str, business_date: str) -> bool:
        """Whether the partition is stored, so :meth:`stored_path` finds it: committed, or left aside by a
        killed commit of an earlier release (no Spark read, nothing restored)."""
        if self._resolve(table, asset, business_date) is not None:
            return True
        return self._retired_by_earlier_release(table, asset, business_date) is not None

    def state_layout(self, table: str, asset: str, as_of: str) -> StateLayout:
        """Where the state of ``as_of`` is stored: the newest full copy on or before it and the dates of
        changes after it (see ``cdc_assets/core/state.py``). A state stored as a snapshot per date is
        its own full copy. Raises :class:`MissingPartitionError` (or :class:`DroppedPartitionError`)
        naming the first date that is needed and not stored. Reads folder names only."""
        changes_asset = state_changes_asset(asset)
        if self.has_partition(table, asset, as_of):
            return StateLayout(as_of, [])
        if not self.has_partition(table, changes_asset, as_of):
            # Raises, naming the date, and retention if it dropped the date's changes or its full copy.
            self.stored_path(table, changes_asset if self.dropped_partition(table, changes_asset, as_of) else asset, as_of)
        fulls = [day for day in self.stored_dates(table, asset) if day < as_of]
        if not fulls:
            raise MissingPartitionError(
                f"{table}/{asset}: the state as of {as_of} is stored as changes, and no full copy of it on an "
                f"earlier date is stored (looked in {self.asset_path(table, asset)}). Materialize the dates in order."
            )
        full = date.fromisoformat(fulls[-1])
        days = [(full + timedelta(days=n)).isoformat() for n in range(1, (date.fromisoformat(as_of) - full).days + 1)]
        for day in days:
            if not self.has_partition(table, changes_asset, day):
                self.stored_path(table, changes_asset, day)  # raises
        return StateLayout(fulls[-1], days)

    def read(
        self, spark: SparkSession, table: str, asset: str, business_dates: list[str], schema: StructType | str | None = None
    ) -> DataFrame:
        """Stored partitions as one DataFrame with a ``business_date`` column (a date), in one scan.

        Raises :class:`MissingPartitionError` naming the first date that was never written. Versions
        this run committed are read with the schema they were written with (no inference job). With
        ``schema`` (the columns without ``business_date``), every date is read with it: a column a
        date's files lack reads as NULL there, and stored columns it does not name are not read.
        """
        paths = [self.stored_path(table, asset, day) for day in business_dates]
        self._in_use.update((table, asset, day) for day in business_dates)
        base = self._versions(table, asset)
        if schema is None:
            schemas = {self._committed_schema(path) for path in paths}
            schema = schemas.pop() if len(schemas) == 1 and None not in schemas else None
        if all(os.path.dirname(os.path.dirname(path)) == base for path in paths):
            reader = spark.read.option("basePath", base)
            if schema is not None:
                reader = reader.schema(schema)  # business_date still comes from the folder names
            return reader.parquet(*paths).drop(VERSION_KEY)
        # Folders of an earlier release among them: each read on its own, dated by hand.
        frames = []
        for day, path in zip(business_dates, paths):
            reader = spark.read if schema is None else spark.read.schema(schema)
            frames.append(reader.parquet(path).withColumn(BUSINESS_DATE, F.lit(day).cast("date")))
        combined = frames[0]
        for frame in frames[1:]:
            combined = combined.unionByName(frame, allowMissingColumns=True)
        return combined

    def read_one(self, spark: SparkSession, table: str, asset: str, business_date: str) -> DataFrame:
        """One stored partition, without the ``business_date`` column."""
        path = self.stored_path(table, asset, business_date)
        self._in_use.add((table, asset, business_date))
        schema = self._committed_schema(path)
        return (spark.read.schema(schema) if schema is not None else spark.read).parquet(path)

    def _committed_schema(self, path: str) -> StructType | None:
        committed = self._committed.get(path)
        return None if committed is None else StructType(list(committed.fields))

    def _staged_counts(self, staged: str, business_dates: list[str]) -> tuple[int, dict[str, int]]:
        """Rows in a staged write, in all and per date of ``business_dates``, from the Parquet footers.

        Every ``business_date=`` folder counts towards the total, those of other dates (NULL's
        ``__HIVE_DEFAULT_PARTITION__`` included) too, so the caller's check of rows dated elsewhere holds.
        """
        per_folder = {}
        for name in self.list_names(staged):
            if name.startswith(f"{BUSINESS_DATE}="):
                folder = f"{staged}/{name}"
                per_folder[name.split("=", 1)[1]] = sum(
                    pq.ParquetFile(f"{folder}/{part}").metadata.num_rows for part in self.list_names(folder) if part.endswith(".parquet")
                )
        return sum(per_folder.values()), {day: per_folder.get(day, 0) for day in business_dates}

    def row_counts(self, table: str, asset: str, business_dates: Iterable[str]) -> dict[str, int]:
        """Rows per stored partition, from the Parquet footers (no Spark job, no row read)."""
        counts = {}
        for day in business_dates:
            folder = self.stored_path(table, asset, day)
            counts[day] = sum(
                pq.ParquetFile(f"{folder}/{name}").metadata.num_rows
                for name in self.list_names(folder)
                if name.endswith(".parquet")
            )
        return counts


def _fsync_folder(path: str) -> None:
    """Make the folder's entries (a rename into it, a new file) survive a power loss."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(folder: str) -> None:
    """fsync every file under ``folder`` and the folders themselves: Spark's local writes are not synced."""
    for current, _, files in os.walk(folder):
        for name in files:
            descriptor = os.open(os.path.join(current, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        _fsync_folder(current)


def _mark_retired(version: str) -> None:
    """Record that ``version`` stops being current now: the sweep keeps it for the grace period from here.

    Written before the pointer moves away from it, so a retired version is never without its mark.
    """
    with open(f"{version}{RETIRED_SUFFIX}", "w", encoding="utf-8") as stream:
        stream.write(datetime.now(timezone.utc).isoformat(timespec="seconds") + "\n")
    os.utime(f"{version}{RETIRED_SUFFIX}")


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _exchange(first: str, second: str) -> bool:
    """Swap two paths atomically with Linux's renameat2(RENAME_EXCHANGE); False where it is unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), second)


def _on(business_date: str):
    return F.col(BUSINESS_DATE) == F.lit(business_date).cast("date")


def as_stored(schema: StructType) -> StructType:
    """The schema as Parquet files written by Spark declare it: every column nullable."""
    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])


PAUSE_ENV, PAUSE_MARKER_ENV, PAUSE_SECONDS_ENV = "CDC_PAUSE_BEFORE_COMMIT", "CDC_PAUSE_MARKER", "CDC_PAUSE_SECONDS"
PAUSE_IN_COMMIT_ENV = "CDC_PAUSE_IN_COMMIT"
PAUSE_RELEASE_ENV = "CDC_PAUSE_RELEASE"


def _pause_if_requested(variable: str, table: str, asset: str) -> None:
    """Fault-injection hook for tests: hold a commit at a chosen point so a test can kill -9 the run.

    Set ``CDC_PAUSE_BEFORE_COMMIT=<table>/<asset>`` (after the staged write, before any commit) or
    ``CDC_PAUSE_IN_COMMIT=<table>/<asset>`` (the first date's new version is in place, its pointer not
    yet switched), and ``CDC_PAUSE_MARKER=<file>``; the run writes its pid to the marker and waits
    there (``CDC_PAUSE_SECONDS``, default 600). With ``CDC_PAUSE_RELEASE=<file>`` it goes on as soon as
    that file exists, so a test can order two runs without guessing at timings. Unset, it does nothing.
    """
    if os.environ.get(variable) != f"{table}/{asset}":
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if marker:
        with open(marker, "w") as handle:
            handle.write(str(os.getpid()))
    release = os.environ.get(PAUSE_RELEASE_ENV)
    deadline = time.monotonic() + float(os.environ.get(PAUSE_SECONDS_ENV, "600"))
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        time.sleep(0.2)
