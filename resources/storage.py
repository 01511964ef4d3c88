"""The warehouse: every path, the one commit path, crash recovery, the writer lock and the schema memo.

Layout, per table::

    {root}/{table}/{asset}/business_date=YYYY-MM-DD/part-*.parquet   what readers see
    {root}/{table}/_staging/{asset}/{write}/...                       a write in progress (unique per write)
    {root}/{table}/_staging/{asset}/business_date=D.{write}.old       a version being replaced
    {root}/{table}/_staging/{asset}/business_date=D.{write}.dropped   a partition retention is deleting
    {root}/{table}/_retention/{asset}/business_date=D.json            a partition retention dropped (when, why)
    {root}/{table}/_writer.lock                                       who is writing the table
    {root}/_runs/{table}-{time}-{run}-{id}.parquet                    the runs log, a file per append
    {root}/_catalog/                                                  the SQL catalog's metastore (cdc_assets.catalog)

Spark writes the files; everything else (listing, renaming, deleting, the lock, row counts from
Parquet footers) happens on the client through pyarrow's file system for the warehouse URI. So the
same code commits through a classic session and through Spark Connect, where there is no JVM handle.
Client and Spark must therefore see the same warehouse: a local or shared path, or an object store
with a connector on each side (README, "Storage").

A write of one date or of many goes the same way: Spark writes every date's rows into a staging
folder unique to that write, rows dated outside the write fail it before anything is committed, and
then each date's folder is committed on its own: the stored version is renamed aside ("retired"),
the staged one renamed into place, the retired one deleted. A run killed between the two renames
leaves the date without a folder and its retired version in staging; the next writer, or a reader
that finds the folder missing, renames it back.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import IO

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc_assets.core.columns import BUSINESS_DATE

WAREHOUSE_ENV = "CDC_WAREHOUSE"
LOCK_TIMEOUT_ENV = "CDC_WRITER_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_SECONDS = 900.0
STAGING_FOLDER = "_staging"
LOCK_FILE = "_writer.lock"
# The runs log's folder, beside the tables (no table name starts with "_").
RUNS_FOLDER = "_runs"
# Per table, one small file per partition dropped by retention: what tells "dropped" from "never written".
RETENTION_FOLDER = "_retention"
# The SQL catalog's own state (Derby metastore, server state), beside the tables.
CATALOG_FOLDER = "_catalog"
_ROWS = "rows"
_log = logging.getLogger(__name__)
_OTHER_DATES = "rows_of_other_dates"


def warehouse_root(configured: str | None = None) -> str:
    """``configured``, else ``CDC_WAREHOUSE`` (a path, or a URI such as s3a://bucket/cdc), else ``./warehouse``.

    Made absolute, because a Spark Connect server resolves a relative path in its own working directory.
    """
    configured = (configured or os.environ.get(WAREHOUSE_ENV, "")).strip()
    if not configured:
        return os.path.abspath("warehouse")
    return configured.rstrip("/") if "://" in configured else os.path.abspath(configured)


def lock_timeout_seconds() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    return float(raw) if raw else DEFAULT_LOCK_TIMEOUT_SECONDS


class MissingPartitionError(RuntimeError):
    """An upstream partition the step needs has never been written."""


class DroppedPartitionError(MissingPartitionError):
    """The partition was stored, then dropped by the table's retention setting (``retention.current_days``)."""


class WriterLockTimeout(RuntimeError):
    """Another run held the table's writer lock for longer than this run was willing to wait."""


def _client_filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for the warehouse root, and the root as a path on it.

    Spark's Hadoop connectors name S3 ``s3a://``; pyarrow names the same bucket ``s3://``.
    """
    if "://" not in root:
        return pafs.LocalFileSystem(), root
    scheme, rest = root.split("://", 1)
    if scheme in ("s3a", "s3n"):
        root = f"s3://{rest}"
    return pafs.FileSystem.from_uri(root)


@dataclass
class _HeldLock:
    handle: IO[str] | None  # the open, flock-ed lock file (local warehouses)
    path: str


@dataclass
class WarehouseStorage:
    """The warehouse under ``root`` as one run sees it. Create one per run (``run_id`` names its writes).

    Not safe for two runs at once by itself: the writer lock (:meth:`hold_writer_lock`) makes one run
    at a time write a table, in this process or any other on the machine.
    """

    root: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lock_timeout: float = field(default_factory=lock_timeout_seconds)
    # Partitions this run committed: folder -> (schema written, file names). Reading one back skips
    # Spark's schema inference (a job per read) while the folder still holds exactly those files.
    _committed: dict[str, tuple[StructType, frozenset[str]]] = field(default_factory=dict)
    _locks: dict[str, _HeldLock] = field(default_factory=dict)
    _writes: int = 0
    # Partitions this run has read or committed, as (table, asset, date): retention leaves them alone,
    # since the run's later writes and checks may still scan them (DataFrames are read lazily).
    _in_use: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.root = self.root.rstrip("/")
        self._fs, self._client_root = _client_filesystem(self.root)
        self._token = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{self.run_id[:8]}-{uuid.uuid4().hex[:6]}"

    # -- paths: Spark's (under root) and the client's (under the file system's root) -------------------
    def asset_path(self, table: str, asset: str) -> str:
        return f"{self.root}/{table}/{asset}"

    def partition_path(self, table: str, asset: str, business_date: str) -> str:
        return f"{self.asset_path(table, asset)}/{BUSINESS_DATE}={business_date}"

    def _client(self, spark_path: str) -> str:
        return self._client_root + spark_path[len(self.root) :]

    def _staging(self, table: str, asset: str | None = None) -> str:
        base = f"{self.root}/{table}/{STAGING_FOLDER}"
        return base if asset is None else f"{base}/{asset}"

    # -- client-side file operations ------------------------------------------------------------------
    def exists(self, spark_path: str) -> bool:
        return self._fs.get_file_info(self._client(spark_path)).type != pafs.FileType.NotFound

    def list_names(self, spark_path: str) -> list[str]:
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._client(spark_path), allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [info.base_name for info in infos]

    def _rename(self, source: str, target: str) -> None:
        self._fs.create_dir(self._client(target.rsplit("/", 1)[0]), recursive=True)
        self._fs.move(self._client(source), self._client(target))

    def _delete(self, spark_path: str) -> None:
        info = self._fs.get_file_info(self._client(spark_path))
        if info.type == pafs.FileType.Directory:
            self._fs.delete_dir(self._client(spark_path))
        elif info.type == pafs.FileType.File:
            self._fs.delete_file(self._client(spark_path))

    def _copy_parquet_files(self, source: str, target: str) -> None:
        self._fs.create_dir(self._client(target), recursive=True)
        for name in self.list_names(source):
            if name.endswith(".parquet"):
                self._fs.copy_file(self._client(f"{source}/{name}"), self._client(f"{target}/{name}"))

    # -- the writer lock -------------------------------------------------------------------------------
    def hold_writer_lock(self, table: str) -> None:
        """Make this run the table's only writer until :meth:`release`; wait for another holder first.

        On a local (or shared POSIX) warehouse the lock is an ``flock`` on ``{table}/_writer.lock``:
        the kernel releases it when the holding process ends, however it ends, so a killed run's lock
        is stale the moment it is gone. The file names the holder (run id, host, pid) for the message
        of a writer that gives up after ``lock_timeout`` seconds. Taking the lock sweeps what earlier
        holders left in the table's staging folder (they are all gone: only the holder writes there).
        """
        if table in self._locks:
            return
        path = f"{self.root}/{table}/{LOCK_FILE}"
        holder = {"run_id": self.run_id, "host": socket.gethostname(), "pid": os.getpid(),
                  "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if isinstance(self._fs, pafs.LocalFileSystem):
            held = self._flock(table, self._client(path), holder)
        else:
            held = self._object_store_lock(table, path, holder)
        self._locks[table] = held
        self._recover_and_sweep(table)

    def _flock(self, table: str, path: str, holder: dict) -> _HeldLock:
        import fcntl  # POSIX only, like the rest of the local-path support

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
        return _HeldLock(handle=handle, path=path)

    def _object_store_lock(self, table: str, path: str, holder: dict) -> _HeldLock:
        # Object stores offer no create-if-absent through pyarrow: the lock is a file that names its
        # holder, checked and written (not atomic: two writers starting at the same instant can both
        # pass). A holder that died leaves it behind; delete it by hand once that run is gone.
        deadline = time.monotonic() + self.lock_timeout
        while self.exists(path):
            with self._fs.open_input_stream(self._client(path)) as stream:
                current = stream.read().decode("utf-8").strip()
            if time.monotonic() >= deadline:
                raise WriterLockTimeout(self._timeout_message(table, path, current))
            time.sleep(2.0)
        with self._fs.open_output_stream(self._client(path)) as stream:
            stream.write((json.dumps(holder) + "\n").encode("utf-8"))
        return _HeldLock(handle=None, path=path)

    def _timeout_message(self, table: str, path: str, current: str) -> str:
        return (
            f"table {table}: another run is writing it (writer lock {path} held by {current}); waited "
            f"{self.lock_timeout:.0f}s ({LOCK_TIMEOUT_ENV}). Wait for that run to finish, or stop it."
        )

    def release(self) -> None:
        """Give up every writer lock this run holds (at the end of the run, however it ended)."""
        for held in self._locks.values():
            if held.handle is not None:
                held.handle.close()  # closing the file releases the flock
            else:
                self._delete(held.path)
        self._locks.clear()

    def _recover_and_sweep(self, table: str) -> None:
        """Put back versions a killed commit retired, then delete every other leftover in staging."""
        for asset in self.list_names(self._staging(table)):
            folder = self._staging(table, asset)
            for name in self.list_names(folder):
                if name.endswith(".old"):
                    self._restore(table, asset, name.split(".", 1)[0].removeprefix(f"{BUSINESS_DATE}="))
            for name in self.list_names(folder):
                self._delete(f"{folder}/{name}")

    def _restore(self, table: str, asset: str, business_date: str) -> bool:
        """Undo a commit killed between its two renames: put the retired version back. True if it did."""
        final = self.partition_path(table, asset, business_date)
        if self.exists(final):
            return False
        folder = self._staging(table, asset)
        for name in self.list_names(folder):
            if name.startswith(f"{BUSINESS_DATE}={business_date}.") and name.endswith(".old"):
                self._rename(f"{folder}/{name}", final)
                return True
        return False

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
        total = int(figures[_ROWS])
        rows = {day: int(figures[day]) for day in business_dates} if dated else {business_dates[0]: total}
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
                self._copy_parquet_files(empty, f"{staged}/{BUSINESS_DATE}={day}")
        _pause_if_requested(table, asset)
        schema = as_stored(frame.drop(BUSINESS_DATE).schema)
        for day in business_dates:
            self._commit(table, asset, day, f"{staged}/{BUSINESS_DATE}={day}", schema)
        self._delete(staged)
        self._forget_dropped(table, asset, business_dates)
        return rows

    def _commit(self, table: str, asset: str, business_date: str, staged: str, schema: StructType) -> None:
        final = self.partition_path(table, asset, business_date)
        retired = f"{self._staging(table, asset)}/{BUSINESS_DATE}={business_date}.{self._token}.old"
        self._committed.pop(final, None)
        if self.exists(final):
            self._rename(final, retired)
        self._rename(staged, final)
        self._delete(retired)
        self._committed[final] = (schema, frozenset(self.list_names(final)))
        self._in_use.add((table, asset, business_date))

    # -- retention -------------------------------------------------------------------------------------
    def drop_outside_retention(self, table: str, asset: str, current_days: int) -> list[str]:
        """Apply ``retention.current_days``: drop the asset's partitions older than its newest ``current_days``
        business dates; returns the dates dropped, oldest first.

        The window is counted in calendar days back from the newest stored date: it keeps that date and
        the ``current_days - 1`` days before it (dates are materialized in order, so these are the
        newest ``current_days`` partitions). A partition this run has read or committed stays whatever
        its date, because the run's later writes and its checks may still scan it; the table's next run
        drops it. Each date is first recorded under ``_retention`` (so that a later read can say why it
        is missing), then its folder is renamed into staging and deleted: readers listing the asset see
        the whole partition or none of it, as with a commit, and a drop killed half-way is finished by
        the next writer's sweep. Holds the table's writer lock.
        """
        if current_days < 1:
            raise ValueError(f"{table}/{asset}: retention.current_days must be at least 1, got {current_days}")
        self.hold_writer_lock(table)
        stored = self.stored_dates(table, asset)
        if not stored:
            return []
        oldest_kept = (date.fromisoformat(stored[-1]) - timedelta(days=current_days - 1)).isoformat()
        expired = [day for day in stored if day < oldest_kept and (table, asset, day) not in self._in_use]
        for day in expired:
            self._record_dropped(
                table,
                asset,
                day,
                {
                    "current_days": current_days,
                    "newest": stored[-1],
                    "run_id": self.run_id,
                    "dropped_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                },
            )
            final = self.partition_path(table, asset, day)
            retiring = f"{self._staging(table, asset)}/{BUSINESS_DATE}={day}.{self._token}.dropped"
            self._committed.pop(final, None)
            self._rename(final, retiring)
            self._delete(retiring)
        return expired

    def dropped_partition(self, table: str, asset: str, business_date: str) -> dict | None:
        """What retention recorded when it dropped the partition (``current_days``, ``newest``, ``run_id``,
        ``dropped_at``), or None if it never dropped it. Reads one small file; no lock, no Spark."""
        path = self._dropped_marker(table, asset, business_date)
        if not self.exists(path):
            return None
        with self._fs.open_input_stream(self._client(path)) as stream:
            return json.loads(stream.read().decode("utf-8"))

    def _dropped_marker(self, table: str, asset: str, business_date: str) -> str:
        return f"{self.root}/{table}/{RETENTION_FOLDER}/{asset}/{BUSINESS_DATE}={business_date}.json"

    def _record_dropped(self, table: str, asset: str, business_date: str, record: dict) -> None:
        # Written under a hidden name and renamed, so a reader never parses half a record.
        marker = self._dropped_marker(table, asset, business_date)
        hidden = f"{marker.rsplit('/', 1)[0]}/.{marker.rsplit('/', 1)[1]}.{self._token}.tmp"
        self._fs.create_dir(self._client(hidden.rsplit("/", 1)[0]), recursive=True)
        with self._fs.open_output_stream(self._client(hidden)) as stream:
            stream.write((json.dumps(record) + "\n").encode("utf-8"))
        self._fs.move(self._client(hidden), self._client(marker))

    def _forget_dropped(self, table: str, asset: str, business_dates: list[str]) -> None:
        """A date written again is no longer a dropped one (one listing per write; usually nothing there)."""
        folder = f"{self.root}/{table}/{RETENTION_FOLDER}/{asset}"
        recorded = set(self.list_names(folder))
        for day in business_dates:
            if f"{BUSINESS_DATE}={day}.json" in recorded:
                self._delete(self._dropped_marker(table, asset, day))

    # -- reading ---------------------------------------------------------------------------------------
    def stored_path(self, table: str, asset: str, business_date: str) -> str:
        """The partition's folder; raises :class:`MissingPartitionError` if it was never written, and
        :class:`DroppedPartitionError` (naming ``retention.current_days``) if retention dropped it.

        A folder missing because a commit was killed half-way is restored first, unless another
        run holds the table's lock (its commit may be in flight).
        """
        path = self.partition_path(table, asset, business_date)
        if self.exists(path):
            return path
        self._restore_if_unheld(table, asset, business_date)
        if self.exists(path):
            return path
        dropped = self.dropped_partition(table, asset, business_date)
        if dropped is not None:
            raise DroppedPartitionError(
                f"{table}/{asset} has no partition for {business_date}: retention.current_days "
                f"({dropped['current_days']}, in the table config of {table}) dropped it when the newest stored date "
                f"was {dropped['newest']} (run {dropped['run_id']}). What needs the state as of {business_date}, "
                "such as a run of the date after it, cannot run; raise retention.current_days to keep more dates."
            )
        raise MissingPartitionError(
            f"{table}/{asset} has no partition for {business_date} (looked in {path}). "
            "Materialize the dates in order: each date needs the previous date's outputs."
        )

    def _restore_if_unheld(self, table: str, asset: str, business_date: str) -> None:
        if table in self._locks:
            self._restore(table, asset, business_date)
            return
        try:
            with self._brief_lock(table):  # taking the lock recovers the table's retired versions
                pass
        except WriterLockTimeout:
            pass  # a live writer holds the table: its commit may be in flight, leave it alone

    @contextmanager
    def _brief_lock(self, table: str) -> Iterator[None]:
        probe = WarehouseStorage(self.root, run_id=self.run_id, lock_timeout=0.0)
        probe.hold_writer_lock(table)
        try:
            yield
        finally:
            probe.release()

    def runs_log_path(self) -> str:
        return f"{self.root}/{RUNS_FOLDER}"

    def catalog_path(self) -> str:
        """Where the SQL catalog keeps its metastore: a local folder, since Derby needs one."""
        if "://" in self.root:
            raise ValueError(
                f"the warehouse {self.root} is not a local folder, so the SQL catalog cannot keep its Derby "
                "metastore in it: set CDC_CATALOG_DIR to a local folder"
            )
        return f"{self.root}/{CATALOG_FOLDER}"

    def append_to_runs_log(self, rows: pa.Table, table: str) -> str:
        """Add ``rows`` to the runs log as a new file (never rewriting one); returns its path.

        Written under a hidden name and renamed, so a reader never sees half a file.
        """
        folder = self.runs_log_path()
        name = f"{table}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{self.run_id[:8]}-{uuid.uuid4().hex[:8]}.parquet"
        self._fs.create_dir(self._client(folder), recursive=True)
        hidden = f"{folder}/.{name}.tmp"
        pq.write_table(rows, self._client(hidden), filesystem=self._fs)
        self._fs.move(self._client(hidden), self._client(f"{folder}/{name}"))
        return f"{folder}/{name}"

    def stored_dates(self, table: str, asset: str) -> list[str]:
        """The business dates the asset has a committed partition for, oldest first (no Spark job)."""
        prefix = f"{BUSINESS_DATE}="
        return sorted(name[len(prefix) :] for name in self.list_names(self.asset_path(table, asset)) if name.startswith(prefix))

    def has_partition(self, table: str, asset: str, business_date: str) -> bool:
        """Whether the partition is stored (no Spark read, nothing restored)."""
        return self.exists(self.partition_path(table, asset, business_date))

    def read(self, spark: SparkSession, table: str, asset: str, business_dates: list[str]) -> DataFrame:
        """Stored partitions as one DataFrame with a ``business_date`` column (a date), in one scan.

        Raises :class:`MissingPartitionError` naming the first date that was never written. Folders
        this run committed are read with the schema they were written with (no inference job).
        """
        paths = [self.stored_path(table, asset, day) for day in business_dates]
        self._in_use.update((table, asset, day) for day in business_dates)
        reader = spark.read.option("basePath", self.asset_path(table, asset))
        schemas = {self._committed_schema(path) for path in paths}
        if len(schemas) == 1 and None not in schemas:
            reader = reader.schema(schemas.pop())  # business_date still comes from the folder names
        return reader.parquet(*paths)

    def read_one(self, spark: SparkSession, table: str, asset: str, business_date: str) -> DataFrame:
        """One stored partition, without the ``business_date`` column."""
        path = self.stored_path(table, asset, business_date)
        self._in_use.add((table, asset, business_date))
        schema = self._committed_schema(path)
        return (spark.read.schema(schema) if schema is not None else spark.read).parquet(path)

    def _committed_schema(self, path: str) -> StructType | None:
        committed = self._committed.get(path)
        if committed is None or frozenset(self.list_names(path)) != committed[1]:
            return None
        return StructType(list(committed[0].fields))

    def row_counts(self, table: str, asset: str, business_dates: Iterable[str]) -> dict[str, int]:
        """Rows per stored partition, from the Parquet footers (no Spark job, no row read)."""
        counts = {}
        for day in business_dates:
            folder = self.stored_path(table, asset, day)
            rows = 0
            for name in self.list_names(folder):
                if name.endswith(".parquet"):
                    with self._fs.open_input_file(self._client(f"{folder}/{name}")) as source:
                        rows += pq.ParquetFile(source).metadata.num_rows
            counts[day] = rows
        return counts


def _on(business_date: str):
    return F.col(BUSINESS_DATE) == F.lit(business_date).cast("date")


def as_stored(schema: StructType) -> StructType:
    """The schema as Parquet files written by Spark declare it: every column nullable."""
    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])


PAUSE_ENV, PAUSE_MARKER_ENV, PAUSE_SECONDS_ENV = "CDC_PAUSE_BEFORE_COMMIT", "CDC_PAUSE_MARKER", "CDC_PAUSE_SECONDS"
PAUSE_RELEASE_ENV = "CDC_PAUSE_RELEASE"


def _pause_if_requested(table: str, asset: str) -> None:
    """Fault-injection hook for tests: hold a staged, uncommitted write so a test can kill -9 the run.

    Set ``CDC_PAUSE_BEFORE_COMMIT=<table>/<asset>`` and ``CDC_PAUSE_MARKER=<file>``; the run touches
    the marker and waits there (``CDC_PAUSE_SECONDS``, default 600), between the staged write and its
    commit. With ``CDC_PAUSE_RELEASE=<file>`` it goes on as soon as that file exists, so a test can
    order two runs without guessing at timings. Unset, it does nothing.
    """
    if os.environ.get(PAUSE_ENV) != f"{table}/{asset}":
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if marker:
        with open(marker, "w") as handle:
            handle.write(str(os.getpid()))
    release = os.environ.get(PAUSE_RELEASE_ENV)
    deadline = time.monotonic() + float(os.environ.get(PAUSE_SECONDS_ENV, "600"))
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        time.sleep(0.2)
