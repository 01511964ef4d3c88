"""The warehouse as one run sees it: the facade over layout, commit, the writer lock and retention.

The warehouse is a local (or mounted POSIX) folder (the layout: resources/storage/layout.py). Spark
writes the files; everything else (listing, renaming, linking, the lock, row counts from Parquet
footers) happens in the run's Python process, so the same code commits through a classic session and
through Spark Connect. Writes go through the one commit path (commit.py); readers take no lock and
write nothing (reading.py); only a writer cleans up, when it takes the table's lock (lock.py): what
killed writers left (commit.py) and retired versions past the grace period (retention.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from cdc_assets.core.columns import BUSINESS_DATE
from resources.storage import commit, erasure, reading, retention
from resources.storage.commit import as_stored
from resources.storage.files import list_names
from resources.storage.layout import WarehouseLayout, local_warehouse_path, state_changes_asset
from resources.storage.lock import DEFAULT_LOCK_TIMEOUT_SECONDS, WriterLocks
from resources.storage.reading import StateLayout
from resources.storage.retention import DEFAULT_RETIRED_GRACE_SECONDS


@dataclass
class WarehouseStorage:
    """The warehouse under ``root`` as one run sees it. Create one per run (``run_id`` names its writes).

    ``lock_timeout`` is how long a writer waits for another run's lock on a table, in seconds;
    ``retired_grace`` how long a replaced or dropped version stays for readers that resolved it
    before. Not safe for two runs at once by itself: the writer lock (:meth:`hold_writer_lock`) makes
    one run at a time write a table, in this process or any other on the machine. Reading needs no lock.
    """

    root: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS
    retired_grace: float = DEFAULT_RETIRED_GRACE_SECONDS
    # Versions this run committed: folder -> schema written. Reading one back skips Spark's schema
    # inference (a job per read); a version folder never changes once committed.
    _committed: dict[str, StructType] = field(default_factory=dict)
    _writes: int = 0
    # Partitions this run has read or committed, as (table, asset, date): retention leaves them alone,
    # since the run's later writes and checks may still scan them (DataFrames are read lazily).
    _in_use: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.root = local_warehouse_path(self.root)
        self.layout = WarehouseLayout(self.root)
        self._locks = WriterLocks(self.run_id, self.lock_timeout)
        # Names this run's writes: unique across runs, sorting by time.
        self._token = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{self.run_id[:8]}-{uuid.uuid4().hex[:6]}"

    # -- paths -----------------------------------------------------------------------------------------
    def asset_path(self, table: str, asset: str) -> str:
        return self.layout.asset_path(table, asset)

    def partition_path(self, table: str, asset: str, business_date: str) -> str:
        """The date's pointer, ``{asset}/business_date=D``: what Spark, DuckDB and the catalog list."""
        return self.layout.partition_path(table, asset, business_date)

    def runs_log_path(self) -> str:
        return self.layout.runs_log_path()

    def catalog_path(self) -> str:
        """Where the SQL catalog keeps its metastore."""
        return self.layout.catalog_path()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_names(self, path: str) -> list[str]:
        return list_names(path)

    # -- the writer lock -------------------------------------------------------------------------------
    def hold_writer_lock(self, table: str) -> None:
        """Make this run the table's only writer until :meth:`release`; wait for another holder first.

        Waits up to ``lock_timeout`` seconds, then raises ``WriterLockTimeout`` naming the holder.
        Taking the lock cleans up what earlier holders left behind: they are all gone, since only the
        holder writes.
        """
        if self._locks.holds(table):
            return
        self._locks.take(table, self.layout.lock_path(table))
        commit.recover(self.layout, table)
        retention.sweep_retired(self.layout, table, self.retired_grace)

    def release(self) -> None:
        """Give up every writer lock this process holds (at the end of the run, however it ended)."""
        self._locks.release()

    # -- writing ---------------------------------------------------------------------------------------
    def write(self, frame: DataFrame, table: str, asset: str, business_dates: list[str]) -> dict[str, int]:
        """Store ``frame`` as the partitions ``business_dates`` of ``[table, asset]``; rows per date.

        ``frame`` has a ``business_date`` (date) column whose values must be among ``business_dates``,
        or, for a single date, may have none. Rows dated elsewhere (NULL included) fail the write before
        any commit. A date without rows gets a partition holding an empty file. Rows are counted while
        they are written (observed metrics), not by a second job.
        """
        self.hold_writer_lock(table)
        self._writes += 1
        schema = as_stored(frame.drop(BUSINESS_DATE).schema)

        def remember(day: str, version: str) -> None:
            self._committed[version] = schema
            self._in_use.add((table, asset, day))

        rows = commit.write(self.layout, frame, table, asset, business_dates, f"{self._token}-{self._writes}", remember)
        retention.forget_dropped(self.layout, table, asset, business_dates)
        return rows

    def append_to_runs_log(self, rows: pa.Table, table: str) -> str:
        """Add ``rows`` to the runs log as a new file (never rewriting one); returns its path.

        Written under a hidden name and renamed, so a reader never sees half a file.
        """
        path = self.layout.runs_log_file(table, self.run_id)
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        hidden = f"{folder}/.{name}.tmp"
        pq.write_table(rows, hidden)
        os.rename(hidden, path)
        return path

    # -- erasure ---------------------------------------------------------------------------------------
    def erasure_requests(self, table: str) -> list[dict]:
        """The table's recorded erase requests, oldest first (the ledger; no lock, no Spark)."""
        return erasure.requests(self.layout, table)

    def start_erasure(self, hashes: DataFrame, table: str, fingerprint: str, record: dict) -> str:
        """Record a new erase request of the keys ``hashes`` (a ``key_hash`` column); returns its id.

        Holds the table's writer lock. The hashes are stored and synced first and the record last, with
        the hash files' sizes and SHA-256, so the ledger never names keys it does not hold.
        """
        self.hold_writer_lock(table)
        erasure.discard_unrecorded(self.layout, table)
        request_id = erasure.new_request_id(fingerprint)
        files = erasure.store_key_hashes(hashes, self.layout, table, request_id)
        erasure.write_request(self.layout, table, request_id, {**record, erasure.KEY_HASH_FILES: files})
        return request_id

    def repair_erasure(self, hashes: DataFrame, table: str, request_id: str, record: dict) -> None:
        """Store a torn request's key hashes again (``hashes``: the same keys, by their fingerprint) and
        replace its record with ``record``. Holds the table's writer lock."""
        self.hold_writer_lock(table)
        files = erasure.store_key_hashes(hashes, self.layout, table, request_id)
        erasure.write_request(self.layout, table, request_id, {**record, erasure.KEY_HASH_FILES: files})

    def record_erasure(self, table: str, request_id: str, record: dict) -> None:
        """Replace the request's record (progress, then completion). Holds the table's writer lock."""
        self.hold_writer_lock(table)
        erasure.write_request(self.layout, table, request_id, record)

    def erased_key_folders(self, table: str) -> list[str]:
        """The ``key_hashes`` folders of every recorded erase request of ``table`` (read with Spark).

        Raises :class:`TornLedgerError` for a request whose key hashes are missing or damaged: a run
        must not go on without an erased key, nor fail on the broken file with a Spark error.
        """
        requests = self.erasure_requests(table)
        torn = next((request for request in requests if request.get(erasure.TORN)), None)
        if torn is not None:
            raise erasure.torn_ledger_error(self.layout, table, torn)
        return [request["key_hashes"] for request in requests]

    def purge_replaced_versions(self, table: str) -> None:
        """Delete every replaced or dropped version of ``table`` now, whatever the grace period (an erase is
        final when it commits). Holds the table's writer lock."""
        self.hold_writer_lock(table)
        erasure.purge_replaced_versions(self.layout, table)

    def stored_assets(self, table: str) -> list[str]:
        """Every asset the table stores partitions of, an incremental state's changes included (folder names only)."""
        return sorted(name for name in list_names(self.layout.table_path(table)) if not name.startswith(("_", ".")))

    def version_folders(self, table: str) -> list[tuple[str, str, str, bool]]:
        """Every stored version of the table's assets, current or replaced, and any staged write, as
        (asset, date, folder, current): all a verification of an erase must scan. No lock, no write."""
        return erasure.version_folders(self.layout, table)

    # -- retention -------------------------------------------------------------------------------------
    def drop_outside_retention(self, table: str, asset: str, days: int, setting: str = retention.CURRENT_DAYS) -> list[str]:
        """Apply ``retention.current_days`` (or, with ``setting="staging_days"``, ``retention.staging_days``):
        drop the asset's partitions older than its newest ``days`` business dates; returns the dates
        dropped, oldest first.

        The window is counted in calendar days back from the asset's newest stored date: it keeps that
        date and the ``days - 1`` days before it (dates are materialized in order, so these are the
        newest ``days`` partitions). A partition this run has read or committed stays whatever
        its date, because the run's later writes and its checks may still scan it; the table's next run
        drops it. Each date is first recorded under ``_retention`` (so that a later read can say why it
        is missing, naming ``setting``), then its pointer is removed (readers see the partition or
        nothing, never part of it) and its version retired, to be deleted by a writer after
        ``retired_grace`` seconds. Holds the table's writer lock.
        """
        retention.check_days(table, asset, days, setting)
        self.hold_writer_lock(table)
        stored = self.stored_dates(table, asset)
        expired = self._not_in_use(table, asset, retention.outside_window(stored, days))
        if expired:
            self._drop(table, asset, expired, days, stored[-1], setting)
        return expired

    def drop_state_outside_retention(self, table: str, asset: str, current_days: int) -> list[str]:
        """``retention.current_days`` for a state stored as full copies and changes (:meth:`state_layout`):
        keep what the states of the newest ``current_days`` dates need, the full copy the oldest of them
        is read from included; drop the rest of both. Returns the dates whose full copy or changes were
        dropped, oldest first."""
        retention.check_days(table, asset, current_days)
        self.hold_writer_lock(table)
        changes_asset = state_changes_asset(asset)
        fulls, changes, newest = retention.state_outside_window(
            self.stored_dates(table, asset), self.stored_dates(table, changes_asset), current_days
        )
        expired_fulls = self._not_in_use(table, asset, fulls)
        expired_changes = self._not_in_use(table, changes_asset, changes)
        self._drop(table, asset, expired_fulls, current_days, newest)
        self._drop(table, changes_asset, expired_changes, current_days, newest)
        return sorted(set(expired_fulls) | set(expired_changes))

    def _not_in_use(self, table: str, asset: str, days: list[str]) -> list[str]:
        return [day for day in days if (table, asset, day) not in self._in_use]

    def _drop(
        self, table: str, asset: str, expired: list[str], days: int, newest: str | None, setting: str = retention.CURRENT_DAYS
    ) -> None:
        record = {"setting": setting, setting: days, "newest": newest, "run_id": self.run_id}
        retention.drop(self.layout, table, asset, expired, record, self._token)

    def dropped_partition(self, table: str, asset: str, business_date: str) -> dict | None:
        """What retention recorded when it dropped the partition (``setting``, its value under the setting's
        name, ``newest``, ``run_id``, ``dropped_at``), or None if it never dropped it. Reads one small
        file; no lock, no Spark."""
        return retention.dropped_partition(self.layout, table, asset, business_date)

    # -- reading: no lock, no write ---------------------------------------------------------------------
    def stored_path(self, table: str, asset: str, business_date: str) -> str:
        """The folder of the date's current version, resolved once: read it, not the pointer, and a
        commit that replaces the date meanwhile changes nothing under the reader.

        Raises :class:`MissingPartitionError` if the date was never written, and
        :class:`DroppedPartitionError` (naming the retention setting) if retention dropped it.
        Takes no lock and changes nothing: a date that a killed commit of an earlier release left
        without a folder is read where that commit left it, and put back by the next writer.
        """
        return reading.stored_path(self.layout, table, asset, business_date)

    def stored_dates(self, table: str, asset: str) -> list[str]:
        """The business dates the asset has a committed partition for, oldest first (no Spark job)."""
        return reading.stored_dates(self.layout, table, asset)

    def has_partition(self, table: str, asset: str, business_date: str) -> bool:
        """Whether the partition is stored, so :meth:`stored_path` finds it: committed, or left aside by a
        killed commit of an earlier release (no Spark read, nothing restored)."""
        return reading.has_partition(self.layout, table, asset, business_date)

    def state_layout(self, table: str, asset: str, as_of: str) -> StateLayout:
        """Where the state of ``as_of`` is stored: the newest full copy on or before it and the dates of
        changes after it (see ``cdc_assets/core/state.py``). A state stored as a snapshot per date is
        its own full copy. Raises :class:`MissingPartitionError` (or :class:`DroppedPartitionError`)
        naming the first date that is needed and not stored. Reads folder names only."""
        return reading.state_layout(self.layout, table, asset, as_of)

    def read(
        self, spark: SparkSession, table: str, asset: str, business_dates: list[str], schema: StructType | str | None = None
    ) -> DataFrame:
        """Stored partitions as one DataFrame with a ``business_date`` column (a date), in one scan.

        Raises :class:`MissingPartitionError` naming the first date that was never written. Versions
        this run committed are read with the schema they were written with (no inference job). With
        ``schema`` (the columns without ``business_date``), every date is read with it: a column a
        date's files lack reads as NULL there, and stored columns it does not name are not read.
        """
        frame = reading.read(spark, self.layout, table, asset, business_dates, schema, self._committed)
        self._in_use.update((table, asset, day) for day in business_dates)
        return frame

    def read_one(self, spark: SparkSession, table: str, asset: str, business_date: str) -> DataFrame:
        """One stored partition, without the ``business_date`` column."""
        frame = reading.read_one(spark, self.layout, table, asset, business_date, self._committed)
        self._in_use.add((table, asset, business_date))
        return frame

    def row_counts(self, table: str, asset: str, business_dates: Iterable[str]) -> dict[str, int]:
        """Rows per stored partition, from the Parquet footers (no Spark job, no row read)."""
        return reading.row_counts(self.layout, table, asset, business_dates)
