"""The warehouse as one run sees it: the facade over the Iceberg tables, the writer lock, retention and
the erase ledger.

Every asset is an Iceberg table in the warehouse's catalog (resources/storage/tables.py). Spark
writes and reads the rows; Iceberg commits them, one commit per table and write. The run's Python
process reads the tables' metadata (stored dates, rows per date, schemas) through pyiceberg and keeps
the project's own records (the erase ledger, retention records, the runs log) as files, so the same
code runs through a classic session and through Spark Connect. Readers take no lock and write nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import cast
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.model.config import StateForm
from cdc_assets.model.names import CURRENT
from resources.storage import erasure, fault_injection, retention
from resources.storage.files import files_for
from resources.storage.lake import LakeCatalog
from resources.storage.layout import WarehouseLayout, warehouse_location
from resources.storage.lease import DEFAULT_LEASE_SECONDS, WriterLeases
from resources.storage.lock import DEFAULT_LOCK_TIMEOUT_SECONDS, WriterLocks
from resources.storage.merged import STORED_AS, MergedStates, StateOrderError
from resources.storage.tables import (
    DROPPED_DATES,
    RUN_ID,
    STAGING_PREFIX,
    TAG_FOREVER,
    WRITTEN_DATES,
    LakeTables,
    as_read_now,
    as_stored,
    renamed_columns,
)
from resources.storage.reading import MissingPartitionError, StateLayout, missing_partition_error

# Routine maintenance deletes a file no table metadata names once it is this old (see
# WarehouseStorage.remove_unreferenced_files); an erase deletes them at once.
UNREFERENCED_FILE_AGE = timedelta(days=1)


def staging_branch(run_id: str) -> str:
    """The Iceberg branch a run stages its writes on (docs/publishing.md)."""
    return f"{STAGING_PREFIX}{run_id}"


class StorageModeError(RuntimeError):
    """A write in the other storage mode than the asset's table was created in (snapshot or incremental)."""


@dataclass
class WarehouseStorage:
    """The warehouse under ``root`` as one run sees it. Create one per run (``run_id`` names its writes).

    ``lock_timeout`` is how long a writer waits for another run's lock on a table, in seconds. The
    writer lock (:meth:`hold_writer_lock`) makes one run at a time write a table, in this process or
    any other on the machine, or with a warehouse in a bucket on any host (a lease, ``lease.py``): a
    date's update spans several Iceberg tables. Reading needs no lock.
    """

    root: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS
    # A warehouse in a bucket: how long a writer lease lasts unrenewed (lease.py); the holder renews it every third.
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    # The catalog; None: from the environment (LakeCatalog.from_environment), the embedded one by default.
    lake: LakeCatalog = None  # type: ignore[assignment]  # None: the default catalog, set in __post_init__
    # Partitions this run has read or committed, as (table, asset, date): retention leaves them alone,
    # since the run's later writes and checks may still scan them (DataFrames are read lazily).
    _in_use: set[tuple[str, str, str]] = field(default_factory=set)
    # The session of this run's reads and writes: retention's commits go through it too.
    _spark: SparkSession | None = None
    # Each asset's snapshot when this run became its table's writer (None: no snapshot yet), then the
    # run's own latest commit: every write is serializable from it (see :meth:`hold_writer_lock`).
    _read_snapshots: dict[tuple[str, str], int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = warehouse_location(self.root)
        if self.lake is None:
            self.lake = LakeCatalog.from_environment(self.root)
        elif self.lake.root != self.root:
            self.lake = replace(self.lake, root=self.root)
        self.layout = WarehouseLayout(self.root, files_for(self.root, self.lake.store))
        self.tables = LakeTables(self.root, self.lake, branch=staging_branch(self.run_id))
        self.merged = MergedStates(self.tables)
        # A bucket has no flock: its writer lock is a lease object there, which every host sees.
        self._locks: WriterLocks | WriterLeases = (
            WriterLeases(self.run_id, self.lake.store, self.lock_timeout, self.lease_seconds)
            if self.layout.files.remote
            else WriterLocks(self.run_id, self.lock_timeout)
        )

    # -- paths -----------------------------------------------------------------------------------------
    def asset_path(self, table: str, asset: str) -> str:
        """Where the asset's Iceberg table keeps its files."""
        return self.tables.location(table, asset)

    def partition_path(self, table: str, asset: str, business_date: str) -> str:
        """Where Iceberg writes the date's data files (``{table location}/data/business_date=D``)."""
        return f"{self.asset_path(table, asset)}/data/{BUSINESS_DATE}={business_date}"

    def runs_log_path(self) -> str:
        return self.layout.runs_log_path()

    def catalog_path(self) -> str:
        """Where the SQL catalog keeps its metastore."""
        return self.layout.catalog_path()

    def exists(self, path: str) -> bool:
        return self.layout.files.exists(path)

    def list_names(self, path: str) -> list[str]:
        return self.layout.files.list_names(path)

    def parquet_schema(self, path: str):
        """The Arrow schema of one of the tables' data files (a footer read, wherever the file is)."""
        return files_for(path, self.lake.store).parquet_schema(path)

    def _session(self) -> SparkSession:
        """The session of this run's reads and writes, else the process's active one (a commit of metadata
        only, such as retention's, goes through Spark too)."""
        session = self._spark or SparkSession.getActiveSession()
        if session is None:
            raise RuntimeError("the warehouse's commits need a Spark session: none is active in this process")
        return session

    # -- the writer lock -------------------------------------------------------------------------------
    def hold_writer_lock(self, table: str) -> None:
        """Make this run the table's only writer until :meth:`release`; wait for another holder first.

        Waits up to ``lock_timeout`` seconds, then raises ``WriterLockTimeout`` naming the holder.

        Once the lock is taken, records each of the table's assets' current snapshot: what this run
        reads and writes from (a run takes the lock before it reads, and a run that waited for it starts
        from the snapshots the previous writer left). The run's writes commit only if no other writer
        (one the lock does not reach: another host, a file system without locks) committed the same dates
        since; otherwise they fail with ``ConcurrentWriteError``.
        """
        if self._locks.holds(table):
            self._locks.confirm(table)  # a lease another host took over fails the write before it commits
        else:
            self._locks.take(table, self.layout.lock_path(table))
            for asset in self.tables.assets(table):
                loaded = self.tables.load(table, asset)
                current = None if loaded is None else loaded.current_snapshot()
                self._read_snapshots[(table, asset)] = None if current is None else current.snapshot_id

    def release(self) -> None:
        """Give up every writer lock this process holds (at the end of the run, however it ended)."""
        self._locks.release()
        self._read_snapshots.clear()

    # -- write, audit, publish -------------------------------------------------------------------------
    @property
    def branch(self) -> str:
        """This run's staging branch: where its writes go while :meth:`stage` is on, and what its reads see first."""
        return staging_branch(self.run_id)

    def stage(self) -> None:
        """From now on, write every date-partitioned output to this run's staging branch: readers of the
        tables (their ``main``) see nothing of this run until :meth:`publish`. This run's own reads (its
        later steps and its checks, in any process) read the branch where it exists."""
        self.tables.stage_writes = True

    @property
    def staging(self) -> bool:
        return self.tables.stage_writes

    def staged_assets(self, table: str) -> list[str]:
        """The table's assets this run staged a write of (its branch exists there)."""
        return [asset for asset in self.stored_assets(table) if self.branch in self.tables.staging_branches(table, asset)]

    def publish(self, table: str, last: str, tag_days: int | None = None) -> dict[str, int]:
        """Publish what this run staged of the table: each output's ``main`` moved to the run's branch, each
        date it wrote tagged with its name (kept ``tag_days`` days) and the branch dropped (a metadata commit
        per output, no data written), ``last`` (``current_table``) last, so a reader of the current state
        never sees a date whose other outputs are not published yet. Returns the snapshot published per
        output. Holds the table's writer lock."""
        self.hold_writer_lock(table)
        staged = self.staged_assets(table)
        published = {}
        for asset in sorted(staged, key=lambda name: (name == last, name)):
            fault_injection.pause_point(fault_injection.BEFORE_PUBLISH, table, asset)
            self._locks.confirm(table)
            # A merged state's tags are its dates' states: kept until retention or a rollback drops them.
            snapshot = self.tables.publish(table, asset, TAG_FOREVER if self.merged.holds(table, asset) else tag_days)
            if snapshot is not None:
                published[asset] = snapshot
        return published

    def drop_date_tags(self, table: str) -> list[str]:
        """Remove the date tags of the table's outputs stored per date (an erase: their snapshots hold the
        keys; a merged state's tags are its dates, rewritten instead). Returns ``<asset>@<date>`` for each.
        Holds the table's writer lock."""
        self.hold_writer_lock(table)
        dropped = []
        for asset in self.stored_assets(table):
            if not self.merged.holds(table, asset):
                dropped += [f"{asset}@{day}" for day in self.tables.drop_date_tags(table, asset)]
        return dropped

    def staging_branches(self, table: str) -> dict[str, int]:
        """Every staging branch of the table's outputs (any run's) -> its newest snapshot's time (ms)."""
        found: dict[str, int] = {}
        for asset in self.stored_assets(table):
            for name, at in self.tables.staging_branches(table, asset).items():
                found[name] = max(found.get(name, 0), at)
        return found

    def drop_staging_branches(self, table: str, older_than: datetime | None = None) -> list[str]:
        """Drop the table's staging branches (of every run but this one) whose newest snapshot is older than
        ``older_than`` (None: all of them; an erase does, since staged rows hold the keys): what failed
        checks and killed runs left. Returns the branches dropped. Holds the table's writer lock."""
        self.hold_writer_lock(table)
        cutoff = None if older_than is None else older_than.timestamp() * 1000
        dropped = sorted(
            name for name, at in self.staging_branches(table).items()
            if name != self.branch and (cutoff is None or at < cutoff)
        )
        for asset in self.stored_assets(table):
            self.tables.drop_branches(table, asset, dropped)
        return dropped

    # -- writing ---------------------------------------------------------------------------------------
    def write(
        self, frame: DataFrame, table: str, asset: str, business_dates: list[str], dropped: Iterable[str] = (),
        renamed_from: dict[str, list[str]] | None = None, drop_columns: Iterable[str] = (), tag_days: int | None = None,
    ) -> dict[str, int]:
        """Store ``frame`` as the partitions ``business_dates`` of ``[table, asset]`` in one Iceberg commit;
        rows per date.

        ``frame`` has a ``business_date`` (date) column whose values must be among ``business_dates``,
        or, for a single date, may have none. Rows dated elsewhere (NULL included) fail the write before
        it commits. A date without rows is stored all the same (the table records its dates).

        ``dropped``: later stored dates computed from the state these dates replace (a re-run inside a
        backfill, cdc_assets/core/capture/rerun.py). They leave the table in the same commit, each recorded
        first as dropped by this re-run, so a reader says so (:func:`missing_partition_error`).

        ``renamed_from``: the config's renamed columns (new name -> former names, newest first); a
        column the table still has under a former name is renamed first (:meth:`LakeTables.rename_columns`).
        ``drop_columns``: columns the config dropped, dropped from the table first (:meth:`LakeTables.drop_columns`).
        ``tag_days``: a write that is not staged publishes its dates: each is tagged with its name, kept
        that many days (``retention.snapshot_days``; None or 0: no tag). A staged one is tagged when published.
        """
        dropped = sorted(set(dropped))
        self.hold_writer_lock(table)
        if self.merged.holds(table, asset):
            raise StorageModeError(
                f"{table}/{asset} is stored as one table with a tag per date (storage: {{current: incremental}}), not "
                "per date: set storage.current back to incremental in the table's config, or move the table to a new "
                "warehouse (docs/incremental-state.md, Switching modes)"
            )
        dated = BUSINESS_DATE in frame.columns
        if not dated and len(business_dates) != 1:
            raise ValueError(f"{table}/{asset}: rows for {len(business_dates)} dates need a {BUSINESS_DATE} column")
        if dated:
            span = business_dates[0] if len(business_dates) == 1 else f"{business_dates[0]}..{business_dates[-1]}"
            allowed = F.col(BUSINESS_DATE).isin(*[F.lit(day).cast("date") for day in business_dates])
            # Checked row by row inside the write's own job: a stray date fails it before Iceberg commits.
            frame = frame.withColumn(
                BUSINESS_DATE,
                F.when(allowed, F.col(BUSINESS_DATE)).otherwise(
                    F.raise_error(F.lit(f"{table}/{asset}: a row is dated outside the write's partition(s) {span}; nothing was committed"))
                ),
            )
        else:
            frame = frame.withColumn(BUSINESS_DATE, F.lit(business_dates[0]).cast("date"))
        self._spark = frame.sparkSession
        if renamed_from:
            self.tables.rename_columns(frame.sparkSession, table, asset, renamed_from)
        if drop_columns:
            self.tables.drop_columns(frame.sparkSession, table, asset, drop_columns)
        if self.staging:  # its own metadata commit, before the write's (a new table's is made with the table)
            self.tables.make_branch(frame.sparkSession, table, asset)
        fault_injection.pause_point(fault_injection.BEFORE_COMMIT, table, asset)
        self._locks.confirm(table)
        properties = {RUN_ID: self.run_id}  # the dates written and dropped: LakeTables.write records them
        if dropped:
            self._record_dropped_by_rerun(table, asset, business_dates, dropped)
        self._read_snapshots[(table, asset)] = self.tables.write(
            frame, table, asset, business_dates, properties, dropped=dropped, read_snapshot=self._read_snapshots.get((table, asset)),
            tag_days=tag_days,
        )
        retention.forget_dropped(self.layout, table, asset, business_dates)
        self._in_use.update((table, asset, day) for day in business_dates)
        return self.row_counts(table, asset, business_dates)

    def drop_after_rerun(self, table: str, asset: str, rerun_dates: list[str], dropped: Iterable[str]) -> None:
        """Drop ``dropped`` (later dates computed from the state a re-run of ``rerun_dates`` replaces) from an
        asset the re-run writes no date of, in one commit, each recorded as :meth:`write` records them.
        Holds the table's writer lock."""
        dropped = sorted(set(dropped))
        if not dropped:
            return
        self.hold_writer_lock(table)
        self._record_dropped_by_rerun(table, asset, rerun_dates, dropped)
        self._drop_dates(table, asset, dropped, {RUN_ID: self.run_id})

    def write_state(
        self,
        frame: DataFrame,
        table: str,
        asset: str,
        business_date: str,
        whole: bool,
        untouched: str,
        properties: dict[str, str] | None = None,
        rerun_of: Sequence[str] = (),
        dropped: Iterable[str] = (),
    ) -> int:
        """Store the state of ``business_date`` in the asset's merged state (``merged.py``): ``frame`` is
        the whole state with ``whole``, else the date's changes (applied with one MERGE); then the date
        is tagged. Returns the state's rows.

        ``dropped``: stored dates after the date, computed from the state a re-run of ``rerun_of``
        replaces; their tags go first, each recorded as :meth:`write` records them. A date of the run
        itself that is stored already is replaced (its tag is moved). Holds the table's writer lock.
        """
        self.hold_writer_lock(table)
        if self.tables.load(table, asset) is not None and not self.merged.holds(table, asset):
            raise StorageModeError(
                f"{table}/{asset} is stored per date (storage: {{current: snapshot}}): set storage.current back to "
                "snapshot in the table's config, or move the table to a new warehouse to store it incrementally "
                "(docs/incremental-state.md, Switching modes)"
            )
        later = sorted(set(dropped))
        if later:
            self._record_dropped_by_rerun(table, asset, list(rerun_of) or [business_date], later)
        self._spark = frame.sparkSession
        stored = self._stored(table, asset)
        after = [day for day in stored if day > business_date]
        rewritten = [day for day in after if day in later or day in rerun_of]
        if rewritten and not self.staging:  # staged: the date's commit drops them (DROPPED_DATES), published with it
            self.merged.drop_dates(self._session(), table, asset, rewritten)
        if set(after) - set(rewritten):
            raise StateOrderError(
                f"{table}/{asset}: dates after {business_date} are stored ({', '.join(sorted(set(after) - set(rewritten)))}); "
                f"their states were computed from {business_date}'s"
            )
        earlier = [day for day in stored if day < business_date]
        if whole:
            sid = self.tables.record_schema(table, asset, as_stored(frame.drop(BUSINESS_DATE).schema))
        else:  # a date whose columns changed is stored whole: its changes have the columns of the date before
            sid = stored[max(earlier)] if earlier else ""
        fault_injection.pause_point(fault_injection.BEFORE_COMMIT, table, asset)
        self._locks.confirm(table)
        summary = {RUN_ID: self.run_id, WRITTEN_DATES: business_date, STORED_AS: "full" if whole else "changes", **(properties or {})}
        gone = sorted(set(later) | (set(rewritten) if self.staging else set()))
        if gone:
            summary[DROPPED_DATES] = ",".join(gone)
        write = self.merged.replace_state if whole else self.merged.apply_changes
        write(frame, table, asset, business_date, summary, sid=sid, untouched=untouched)
        retention.forget_dropped(self.layout, table, asset, [business_date])
        self._in_use.add((table, asset, business_date))
        return self.merged.rows(table, asset, business_date)

    def _record_dropped_by_rerun(self, table: str, asset: str, rerun_dates: list[str], dropped: list[str]) -> None:
        first, last = min(rerun_dates), max(rerun_dates)
        record = {
            "setting": retention.RERUN,
            retention.RERUN: first if first == last else f"{first}..{last}",
            "newest": dropped[-1],
            "run_id": self.run_id,
        }
        for day in dropped:
            stamped = {**record, "dropped_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            retention.record_dropped(self.layout, table, asset, day, stamped)

    def append_to_runs_log(self, rows: pa.Table, table: str) -> str:
        """Add ``rows`` to the runs log as a new file (never rewriting one); returns its path.

        Written under a hidden name and renamed, so a reader never sees half a file.
        """
        path = self.layout.runs_log_file(table, self.run_id)
        buffer = pa.BufferOutputStream()
        pq.write_table(rows, buffer)
        self.layout.files.write_atomically(path, buffer.getvalue().to_pybytes())
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

    def purge_unreferenced_files(self, table: str) -> None:
        """Make an erase final: expire every snapshot of the table's assets but the current one and delete
        every data file the current snapshots do not read. Holds the table's writer lock."""
        self.hold_writer_lock(table)
        for asset in self.stored_assets(table):
            self.tables.expire_all_but_current(self._session(), table, asset)

    def erase_from_state(self, spark: SparkSession, table: str, asset: str, key_hashes: DataFrame, request_id: str) -> dict[str, int]:
        """Remove the keys (a DataFrame of ``key_hash``, an erase request's: small) from every date of a
        merged state and from its head, then delete every file that held them (``MergedStates.erase``).
        Holds the table's writer lock."""
        self.hold_writer_lock(table)
        hashes = [row[0] for row in key_hashes.select("key_hash").distinct().collect()]
        return self.merged.erase(spark, table, asset, hashes, {RUN_ID: self.run_id, "cdc.erase-request": request_id})

    def data_files(self, table: str) -> list[tuple[str, str, str, bool]]:
        """Every data file under the table's assets, live or not, as (asset, date, path, live): all a
        verification of an erase must scan. No lock, no write."""
        found = []
        for asset in self.stored_assets(table):
            live = self.tables.live_files(table, asset)
            for path in self.tables.data_file_paths(table, asset):
                day = next((part.split("=", 1)[1] for part in path.split("/") if part.startswith(f"{BUSINESS_DATE}=")), "")
                found.append((asset, day, path, path in live))
        return found

    def bytes_stored(self, table: str, asset: str, business_dates: Iterable[str]) -> dict[str, int]:
        """Bytes of the dates' live data files (a merged state's: the files its tag reads)."""
        if self.merged.holds(table, asset):
            return {day: self.merged.bytes(table, asset, day) for day in business_dates}
        totals: dict[str, int] = {}
        for day, size in self.tables.live_files(table, asset, business_dates).values():
            totals[day] = totals.get(day, 0) + size
        return totals

    def stored_assets(self, table: str) -> list[str]:
        """Every asset the table stores partitions of, an incremental state's changes included."""
        return self.tables.assets(table)

    # -- retention -------------------------------------------------------------------------------------
    def drop_outside_retention(self, table: str, asset: str, days: int, setting: str = retention.CURRENT_DAYS) -> list[str]:
        """Apply ``retention.current_days`` (or, with ``setting="staging_days"``, ``retention.staging_days``):
        drop the asset's partitions older than its newest ``days`` business dates; returns the dates
        dropped, oldest first.

        The window is counted in calendar days back from the asset's newest stored date: it keeps that
        date and the ``days - 1`` days before it. A partition this run has read or committed stays
        whatever its date, because the run's later writes and its checks may still scan it; the table's
        next run drops it. Each date is first recorded under ``_retention`` (so that a later read can say
        why it is missing, naming ``setting``), then all of them leave the table in one commit. Holds the
        table's writer lock.
        """
        retention.check_days(table, asset, days, setting)
        self.hold_writer_lock(table)
        stored = self.stored_dates(table, asset)
        expired = self._not_in_use(table, asset, retention.outside_window(stored, days))
        if expired:
            self._drop(table, asset, expired, days, stored[-1], setting)
        return expired

    def _not_in_use(self, table: str, asset: str, days: list[str]) -> list[str]:
        return [day for day in days if (table, asset, day) not in self._in_use]

    def _drop(self, table: str, asset: str, expired: list[str], days: int, newest: str | None, setting: str = retention.CURRENT_DAYS) -> None:
        record = {"setting": setting, setting: days, "newest": newest, "run_id": self.run_id}
        for day in expired:
            stamped = {**record, "dropped_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            retention.record_dropped(self.layout, table, asset, day, stamped)
        self._drop_dates(table, asset, expired, {RUN_ID: self.run_id})

    def _drop_dates(self, table: str, asset: str, days: list[str], properties: dict[str, str]) -> None:
        """Remove the dates from the asset in one commit: a date-partitioned table's rows, a merged state's tags."""
        if self.merged.holds(table, asset):
            self.merged.drop_dates(self._session(), table, asset, days)
            return
        self._read_snapshots[(table, asset)] = self.tables.drop_dates(
            self._session(), table, asset, days, properties, read_snapshot=self._read_snapshots.get((table, asset))
        )

    def expire_snapshots(self, table: str, asset: str, days: int, now: datetime | None = None) -> int:
        """Apply ``retention.snapshot_days``: expire the asset's table versions (snapshots) older than
        ``days`` days, never the current one, so that the files only they read (what re-runs, drops and
        erases replaced) are deleted. Returns how many were expired. Holds the table's writer lock."""
        retention.check_days(table, asset, days, retention.SNAPSHOT_DAYS, minimum=0)
        self.hold_writer_lock(table)
        cutoff = (now or datetime.now(timezone.utc)) - timedelta(days=days)
        return self.tables.expire_snapshots_before(self._session(), table, asset, int(cutoff.timestamp() * 1000))

    def remove_unreferenced_files(self, table: str, asset: str, now: datetime | None = None) -> list[str]:
        """Delete the files under the asset that no table metadata names (what a killed write left) and
        that are older than ``UNREFERENCED_FILE_AGE``; returns their paths. Holds the table's writer lock.

        The age keeps the files of a write in progress that got past the lock (another host on a shared
        file system without locks) until it commits or fails: Iceberg's own ``remove_orphan_files``
        refuses a shorter one for the same reason."""
        self.hold_writer_lock(table)
        cutoff = (now or datetime.now(timezone.utc)) - UNREFERENCED_FILE_AGE
        return self.tables.remove_unreferenced_files(table, asset, older_than=cutoff.timestamp())

    def dropped_partition(self, table: str, asset: str, business_date: str) -> dict | None:
        """What retention recorded when it dropped the partition (``setting``, its value under the setting's
        name, ``newest``, ``run_id``, ``dropped_at``), or None if it never dropped it. Reads one small
        file; no lock, no Spark."""
        return retention.dropped_partition(self.layout, table, asset, business_date)

    # -- reading: no lock, no write ---------------------------------------------------------------------
    def stored_dates(self, table: str, asset: str) -> list[str]:
        """The business dates the asset has a committed partition for, oldest first (no Spark job)."""
        return sorted(self._stored(table, asset))

    def has_partition(self, table: str, asset: str, business_date: str) -> bool:
        """Whether the partition is stored (no Spark read)."""
        return business_date in self._stored(table, asset)

    def require(self, table: str, asset: str, business_date: str) -> None:
        """Raise :class:`MissingPartitionError` if the date was never written, and
        :class:`DroppedPartitionError` (naming the retention setting) if retention dropped it."""
        if not self.has_partition(table, asset, business_date):
            raise self._missing(table, asset, business_date)

    def _missing(self, table: str, asset: str, business_date: str) -> MissingPartitionError:
        """The error for a date the asset does not hold: dropped, never written, or staged by a run that did not
        publish it (a blocking check failed, or the run stopped before publishing)."""
        error = missing_partition_error(self.dropped_partition(table, asset, business_date), table, asset, business_date)
        if type(error) is not MissingPartitionError:
            return error
        staged = sorted(
            name for name in self.tables.staging_branches(table, asset)
            if name != self.branch and business_date in self.tables.branch_dates(table, asset, name)[0]
        )
        if not staged:
            return error
        return MissingPartitionError(
            f"{table}/{asset}: {business_date} is not published: run {staged[-1][len(STAGING_PREFIX):]} staged it (branch "
            f"{staged[-1]}) but did not publish it (a blocking check failed, or the run stopped before publishing; "
            f"docs/publishing.md). Fix what failed and run {business_date} again: each date needs the previous date published."
        )

    def stored_schema(self, table: str, asset: str, business_date: str) -> StructType:
        """The Spark schema (with its columns' metadata: the hash spec) the date was written with."""
        stored = self._stored(table, asset)
        if business_date not in stored:
            raise self._missing(table, asset, business_date)
        return self._recorded_schema(table, asset, stored[business_date])

    def _recorded_schema(self, table: str, asset: str, sid: str) -> StructType:
        """A schema record as the table reads it now. A date-partitioned table's dates all read through its
        current schema, so a column renamed since the date was written reads under its new name, and one
        dropped since is not there; a merged state's tag keeps its date's columns (they are added, never
        renamed nor dropped)."""
        schema = self.tables.schema(table, asset, sid)
        if self.merged.holds(table, asset):
            return schema
        loaded = self.tables.load(table, asset)
        return schema if loaded is None else as_read_now(schema, renamed_columns(loaded), [f.name for f in loaded.schema().fields])

    def stored_state_form(self, table: str, asset: str = CURRENT) -> StateForm | None:
        """The layout the asset's state is stored in: incremental (a merged state), snapshot (per date), or
        None when the table has none yet. A table keeps it for life (:meth:`write`, :meth:`write_state`)."""
        merged = self.merged.layout(table, asset)
        return None if merged is None else StateForm.incremental if merged else StateForm.snapshot

    def state_layout(self, table: str, asset: str, as_of: str) -> StateLayout:
        """Where the state of ``as_of`` is stored: a table stored per date holds it as the date's
        partition, a merged state as its tag. Raises :class:`MissingPartitionError` (or
        :class:`DroppedPartitionError`) when it is not stored. Reads metadata only."""
        self.require(table, asset, as_of)
        return StateLayout(as_of, [])

    def read(
        self, spark: SparkSession, table: str, asset: str, business_dates: list[str], schema: StructType | str | None = None
    ) -> DataFrame:
        """Stored partitions as one DataFrame with a ``business_date`` column (a date), in one scan, at the
        table's snapshot committed now.

        Raises :class:`MissingPartitionError` naming the first date that was never written. Without
        ``schema`` the newest date's columns are read as that date was written; with ``schema`` (the columns
        without ``business_date``), every date is read with it: a column a date lacks reads as NULL there.
        """
        stored = self._stored(table, asset)
        for day in business_dates:
            if day not in stored:
                raise self._missing(table, asset, day)
        read_as: StructType
        if isinstance(schema, str):
            read_as = cast(StructType, StructType.fromDDL(schema)) if hasattr(StructType, "fromDDL") else spark.createDataFrame([], schema).schema
        elif schema is None:
            read_as = self._recorded_schema(table, asset, stored[max(business_dates)])
        else:
            read_as = schema
        self._spark = spark
        if self.merged.holds(table, asset):
            frame = self.merged.read(spark, table, asset, business_dates, as_stored(read_as))
        else:
            frame = self.tables.read(spark, table, asset, business_dates, read_as)
        self._in_use.update((table, asset, day) for day in business_dates)
        return frame

    def read_one(self, spark: SparkSession, table: str, asset: str, business_date: str) -> DataFrame:
        """One stored partition, without the ``business_date`` column, with the columns it was written with."""
        return self.read(spark, table, asset, [business_date]).drop(BUSINESS_DATE)

    def row_counts(self, table: str, asset: str, business_dates: Iterable[str]) -> dict[str, int]:
        """Rows per stored partition, from the table's manifests (no Spark job, no row read); a merged
        state's from each date's tag."""
        if self.merged.holds(table, asset):
            return {day: self.merged.rows(table, asset, day) for day in business_dates}
        return self.tables.row_counts(table, asset, business_dates)

    def _stored(self, table: str, asset: str) -> dict[str, str]:
        """Every stored date of the asset and its schema record's id: a date-partitioned table's dates,
        or a merged state's tags."""
        if self.merged.holds(table, asset):
            return self.merged.stored(table, asset)
        return self.tables.stored(table, asset)

    def stored_as(self, table: str, asset: str, business_date: str) -> str | None:
        """How the state of the date is stored: ``"full"`` (a whole state: every date of a table stored
        per date), ``"changes"`` (a merged state's date written by a MERGE), or None if not stored."""
        if not self.has_partition(table, asset, business_date):
            return None
        if not self.merged.holds(table, asset):
            return "full"
        return self.merged.summary(table, asset, business_date).get(STORED_AS, "changes")
