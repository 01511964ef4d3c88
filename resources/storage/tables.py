"""Each asset of a table is one Iceberg table, ``lake.<table>.<asset>``, partitioned by ``business_date``.

Spark writes the rows; Iceberg commits them. A write replaces its dates in one commit per table
(``overwrite`` by a filter on the dates), so a reader sees a date's old rows or its new ones, never a
mix, and a killed write leaves the table at the snapshot it had before. Everything that is not rows
is read from the table's metadata in the run's Python process through pyiceberg (no Spark job), so
the same code runs through a classic session and through Spark Connect.

What Iceberg does not record, each commit carries in its snapshot summary:

- ``cdc.stored-dates``: every date the table holds after the commit, dates without rows included,
  grouped by the Spark schema they were written with (``{schema id: "D1..D2,D3"}``); the schema
  itself, with the columns' metadata (the hash spec), is a small file under ``{table}/_schemas``;
- ``cdc.run-id`` and ``cdc.business-dates``: who wrote which dates; Iceberg adds the rows and files
  added and removed per date (``partitions.business_date=D``), so
  ``SELECT * FROM lake.<table>.<asset>.snapshots`` is the audit.

One writer per table at a time: a date's update spans several tables, which Iceberg does not commit
together (the table's writer lock, resources/storage/lock.py, serialises runs). Where that lock does
not reach (another host, a file system without locks), every write is also serializable: it commits
only if no other commit since the snapshot its run started from wrote the same dates; otherwise it
fails with :class:`ConcurrentWriteError` and commits nothing (never a lost update, never a mixed date).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from itertools import takewhile
from typing import Any
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from cdc_assets.model import settings
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.dates import date_runs
from cdc_assets.core.errors import SummarizedError
from cdc_assets.core.hashing import NON_KEY_HASH
from cdc_assets.core.capture.schema import HASH_SPEC_METADATA
from resources.storage.files import Files, files_for
from resources.storage.lake import CATALOG_NAME, LakeCatalog, table_identifier

# A read pinned to a snapshot names it as Spark's time travel (the read option ``versionAsOf``), not as
# Iceberg's ``snapshot-id`` option: Spark resolves each table once per query, keyed by name and time
# travel only, so through Spark Connect (which analyzes a whole query at once) two reads of one table at
# two snapshots joined in one query read the first snapshot twice (measured: 6 + 7 rows counted 12).
VERSION_AS_OF = "versionAsOf"


STORED_DATES = "cdc.stored-dates"
RUN_ID = "cdc.run-id"
WRITTEN_DATES = "cdc.business-dates"
# On a commit that removed dates (a re-run's later dates, retention, a rollback): the dates it removed.
DROPPED_DATES = "cdc.dropped-dates"
SCHEMAS_FOLDER = "_schemas"
# A run's staging branch is this prefix and its Dagster run id (docs/publishing.md).
STAGING_PREFIX = "cdc_run_"
# On each staged commit: the snapshot of main the run's branch was made from ("" for none).
STAGED_FROM = "cdc.staged-from"
# How Iceberg names a failed validation of a serializable write; the exception's Python class differs
# (classic: Py4JJavaError; Spark Connect: UnknownException), its text names the Java class in both.
VALIDATION_EXCEPTION = "org.apache.iceberg.exceptions.ValidationException"


class ConcurrentWriteError(SummarizedError, RuntimeError):
    """Another writer committed the same dates of a table after this run read it: nothing was committed."""

# Every table the project creates. Format v2; Parquet data files (the project was specified so) with
# Spark's default codec; a write may add columns and widen types (schema evolution), and a column a
# write lacks reads as NULL in its dates.
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.format.default": "parquet",
    "write.parquet.compression-codec": "snappy",
    "write.spark.accept-any-schema": "true",
    # Manifests keep each column's value and null counts but no lower/upper bounds: a bound is a stored
    # value (a key, its hash) that an erase could not reach without rewriting metadata.
    "write.metadata.metrics.default": "counts",
    # A commit that lost a race for the catalog is retried on the new base (the writer lock keeps writers
    # of a table apart; readers' and maintenance commits are what it races).
    "commit.retry.num-retries": "10",
    # Each commit writes a metadata file: keep the newest 100 (a reader opens the newest), not all of them.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
    # Each snapshot's summary counts the rows and files added and removed per business date (up to a
    # range of 400 dates per write): who wrote what, in the table itself.
    "write.summary.partition-limit": "400",
}


def as_stored(schema: StructType) -> StructType:
    """The schema as stored: every column and every nested field nullable (the tables' columns are all optional)."""
    return StructType([StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in schema.fields])


def _nullable(data_type: DataType) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    return data_type


def encode_dates(days: Iterable[str]) -> str:
    """Dates as runs of consecutive days: ``2024-01-01..2024-01-03,2024-01-05``."""
    return date_runs(days)


def decode_dates(encoded: str) -> list[str]:
    days = []
    for part in filter(None, encoded.split(",")):
        first, _, last = part.partition("..")
        start, end = date.fromisoformat(first), date.fromisoformat(last or first)
        days += [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]
    return days


def schema_id(schema: StructType) -> str:
    return hashlib.sha256(schema.json().encode()).hexdigest()[:16]


@dataclass
class LakeTables:
    """The Iceberg tables of the warehouse under ``root`` (an absolute local path, or ``s3://bucket/prefix``
    beside a REST catalog), in ``lake``'s catalog (default: the embedded one in ``root``)."""

    root: str
    lake: LakeCatalog = None  # type: ignore[assignment]  # None: the default catalog, set in __post_init__
    _catalog: object | None = field(default=None, repr=False)
    _schemas: dict[str, StructType] = field(default_factory=dict, repr=False)
    # Sessions of this warehouse derived from sessions that opened another one (see :meth:`session_for`).
    _derived: dict[int, SparkSession] = field(default_factory=dict, repr=False)
    _catalog_ready: bool = field(default=False, repr=False)
    # A step stores its outputs side by side (threads): opening the catalog or a session is done once.
    _opening: threading.RLock = field(default_factory=threading.RLock, repr=False)
    # Write-audit-publish (docs/publishing.md): the run's staging branch. Every read of a table where the
    # branch exists reads it (the run's own staged dates over what main published); with ``stage_writes``,
    # every write goes to it, and main changes only when :meth:`publish` moves it there.
    branch: str | None = None
    stage_writes: bool = False

    def __post_init__(self) -> None:
        if self.lake is None:
            self.lake = LakeCatalog(self.root)
        self.files: Files = files_for(self.root, self.lake.store)

    def session_for(self, spark: SparkSession) -> SparkSession:
        """``spark``, with this warehouse's catalog opened in it; or, when ``spark`` opened another
        warehouse's catalog (a session keeps the first it opens: a test session serving many
        warehouses), a new session on the same Spark that opens this one."""
        with self._opening:
            return self._session_for(spark)

    def _session_for(self, spark: SparkSession) -> SparkSession:
        if self.lake.opened_in(spark) is not False:
            self.lake.use(spark)
            session = spark
        else:
            derived = self._derived.get(id(spark))
            if derived is None:
                derived = _another_session(spark)
                self.lake.use(derived)
                self._derived[id(spark)] = derived
            session = derived
        if not self._catalog_ready:
            self.lake.open_once(lambda: session.sql(f"SHOW NAMESPACES IN {CATALOG_NAME}").collect())
            self._catalog_ready = True
        return session

    # -- the catalog -----------------------------------------------------------------------------------
    @property
    def catalog(self):
        """pyiceberg's view of the catalog (opened once; every table load reads the catalog afresh)."""
        with self._opening:
            return self._opened_catalog()

    def _opened_catalog(self):
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            properties = self.lake.pyiceberg_properties()
            # pyiceberg creates the catalog's tables too when they are missing: not at once with Spark.
            self.lake.open_once(lambda: setattr(self, "_catalog", load_catalog(CATALOG_NAME, **properties)))
            if self._catalog is None:
                self._catalog = load_catalog(CATALOG_NAME, **properties)
        return self._catalog

    def load(self, table: str, asset: str):
        """The asset's Iceberg table as committed now (pyiceberg), or None if it was never written."""
        if not self.lake.may_hold_tables():
            return None
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table((table, asset))
        except NoSuchTableError:
            return None

    def assets(self, table: str) -> list[str]:
        """The assets the table stores (the tables of its namespace)."""
        if not self.lake.may_hold_tables():
            return []
        from pyiceberg.exceptions import NoSuchNamespaceError

        try:
            return sorted(name for _, name in self.catalog.list_tables(table))
        except NoSuchNamespaceError:
            return []

    def head(self, loaded):
        """The snapshot this run reads of a loaded table: its staging branch's where the branch exists,
        else ``main``'s (None: no snapshot)."""
        if loaded is None:
            return None
        if self.branch is not None and self.branch in loaded.metadata.refs:
            return loaded.snapshot_by_name(self.branch)
        return loaded.current_snapshot()

    def location(self, table: str, asset: str) -> str:
        """Where the asset's files are (its Iceberg table's location, as a local path)."""
        loaded = self.load(table, asset)
        if loaded is None:
            return f"{self.root}/{table}/{asset}"
        return _local(loaded.location())

    # -- what a table holds ----------------------------------------------------------------------------
    def stored(self, table: str, asset: str, snapshot=None) -> dict[str, str]:
        """Every stored date of the asset and the id of the schema it was written with."""
        if snapshot is None:
            loaded = self.load(table, asset)
            snapshot = self.head(loaded)
        if snapshot is None or snapshot.summary is None:
            return {}
        raw = snapshot.summary.get(STORED_DATES)
        if not raw:
            return {}
        return {day: sid for sid, encoded in json.loads(raw).items() for day in decode_dates(encoded)}

    def schema(self, table: str, asset: str, sid: str) -> StructType:
        """The Spark schema (with its columns' metadata) that dates of ``sid`` were written with."""
        key = f"{table}/{asset}/{sid}"
        if key not in self._schemas:
            self._schemas[key] = StructType.fromJson(json.loads(self.files.read_bytes(self._schema_path(table, asset, sid))))
        return self._schemas[key]

    def _schema_path(self, table: str, asset: str, sid: str) -> str:
        return f"{self.root}/{table}/{SCHEMAS_FOLDER}/{asset}/{sid}.json"

    def record_schema(self, table: str, asset: str, schema: StructType) -> str:
        """Store ``schema`` (content-addressed, so before the commit that names it: never torn)."""
        sid = schema_id(schema)
        path = self._schema_path(table, asset, sid)
        if not self.files.exists(path):
            self.files.write_atomically(path, schema.json().encode("utf-8"))
        self._schemas[f"{table}/{asset}/{sid}"] = schema
        return sid

    def row_counts(self, table: str, asset: str, days: Iterable[str]) -> dict[str, int]:
        """Rows per date, from the table's manifests (no Spark job, no row read)."""
        wanted = list(days)
        counts = {day: 0 for day in wanted}
        loaded = self.load(table, asset)
        head = self.head(loaded)
        if head is None or not wanted:
            return counts
        for task in loaded.scan(row_filter=_on_dates(wanted), snapshot_id=head.snapshot_id).plan_files():
            key = _partition_date(task.file.partition[0])
            if key in counts:
                deleted = sum(delete.record_count for delete in task.delete_files)
                counts[key] += task.file.record_count - deleted
        return counts

    def column(self, table: str, asset: str, days: list[str], name: str):
        """One column of the dates' rows as an Arrow array, read in this process (a small table's only)."""
        import pyarrow as pa

        loaded = self.load(table, asset)
        head = self.head(loaded)
        if head is None:
            return pa.array([], pa.string())
        rows = loaded.scan(row_filter=_on_dates(days), selected_fields=(name,), snapshot_id=head.snapshot_id).to_arrow()
        return rows.column(name).combine_chunks() if rows.num_rows else pa.array([], pa.string())

    def live_files(self, table: str, asset: str, days: Iterable[str] | None = None) -> dict[str, tuple[str, int]]:
        """The data files the current snapshot reads (of ``days`` only, if given): local path -> (date, bytes)."""
        loaded = self.load(table, asset)
        head = self.head(loaded)
        if head is None:
            return {}
        from pyiceberg.expressions import AlwaysTrue

        row_filter = AlwaysTrue() if days is None else _on_dates(days)
        found = {}
        for task in loaded.scan(row_filter=row_filter, snapshot_id=head.snapshot_id).plan_files():
            day = _partition_date(task.file.partition[0])
            for data_file in (task.file, *task.delete_files):
                found[_local(data_file.file_path)] = (day, data_file.file_size_in_bytes)
        return found

    def expire_all_but_current(self, spark: SparkSession, table: str, asset: str) -> None:
        """Expire every snapshot of the asset but the current one (Iceberg deletes the files only they
        referenced), then delete every file under the asset that no metadata names: what killed writes left."""
        spark = self.session_for(spark)
        loaded = self.load(table, asset)
        if loaded is None or loaded.current_snapshot() is None:
            return
        newest = max(snapshot.timestamp_ms for snapshot in loaded.snapshots())
        spark.sql(
            f"CALL {CATALOG_NAME}.system.expire_snapshots(table => '{table_identifier(table, asset)}', "
            f"older_than => TIMESTAMP_MILLIS({newest + 1}), retain_last => 1)"
        ).collect()
        self.remove_unreferenced_files(table, asset)

    def set_current_snapshot(self, spark: SparkSession, table: str, asset: str, snapshot_id: int) -> None:
        """Point the asset's ``main`` at ``snapshot_id`` (Iceberg's procedure: a metadata commit, no data written)."""
        self.session_for(spark).sql(
            f"CALL {CATALOG_NAME}.system.set_current_snapshot(table => '{table_identifier(table, asset)}', snapshot_id => {snapshot_id})"
        ).collect()

    # -- write, audit, publish (docs/publishing.md) -----------------------------------------------------
    def make_branch(self, spark: SparkSession, table: str, asset: str) -> None:
        """Make the run's staging branch of the asset's table (which exists) unless it has it: at main's
        snapshot, or an empty one on a table with none (Iceberg's own ``CREATE BRANCH``, a metadata commit)."""
        loaded = self.load(table, asset)
        if self.branch is not None and loaded is not None and self.branch not in loaded.metadata.refs:
            self.session_for(spark).sql(f"ALTER TABLE {table_identifier(table, asset)} CREATE BRANCH IF NOT EXISTS `{self.branch}`").collect()

    def publish(self, table: str, asset: str, tag_days: int | None = None) -> int | None:
        """Make the run's staged snapshot of the asset what ``main`` reads, tag each date the run wrote
        (:meth:`_retag`: the run's newest commit of the date, kept ``tag_days`` days), and drop the staging
        branch, in one metadata commit (no data written); returns the snapshot published, None when the run
        staged nothing there. Refused with :class:`ConcurrentWriteError` when ``main`` moved since the branch
        was made from it (a commit the branch does not hold would be lost). The caller holds the writer lock."""
        loaded = self.load(table, asset)
        if loaded is None or self.branch is None or self.branch not in loaded.metadata.refs:
            return None
        staged = loaded.snapshot_by_name(self.branch)
        main = loaded.current_snapshot()
        staged_from = staged.summary.get(STAGED_FROM) if staged.summary is not None else None
        if staged_from is not None:
            moved = staged_from != ("" if main is None else str(main.snapshot_id))
        else:  # a branch staged by hand or by an older version: main must be among its ancestors
            moved = main is not None and main.snapshot_id not in self._ancestors(loaded, staged)
        if moved:
            raise ConcurrentWriteError(
                f"{table}/{asset}: not published: main moved to snapshot {main.snapshot_id} after this run staged its "
                f"dates on branch {self.branch} (another writer or a rollback); nothing was published. Run the dates again.",
            )
        with loaded.manage_snapshots() as snapshots:
            snapshots.set_current_snapshot(snapshot_id=staged.snapshot_id)
            self._retag(loaded, snapshots, self._staged_commits(loaded, staged, staged_from), tag_days)
            snapshots.remove_branch(self.branch)
        return staged.snapshot_id

    @staticmethod
    def _staged_commits(loaded, staged, staged_from: str | None) -> list:
        """The branch's own commits, newest first: back from its head to the snapshot of main it was made from
        (or to the first one whose parent is expired or main's, or one a tag names or staged from another
        snapshot of main: a published date's commit, where a merged state's branch was set back to re-run the
        date after it)."""
        main = loaded.current_snapshot()
        stop = {int(staged_from)} if staged_from else set()
        if main is not None:
            stop.add(main.snapshot_id)
        stop.update(ref.snapshot_id for ref in loaded.metadata.refs.values() if ref.snapshot_ref_type == "tag")

        def own(snapshot) -> bool:
            recorded = (snapshot.summary or {}).get(STAGED_FROM)
            return snapshot.snapshot_id not in stop and (staged_from is None or recorded is None or recorded == staged_from)

        return list(takewhile(own, _lineage(loaded, staged)))

    def branch_dates(self, table: str, asset: str, branch: str | None = None) -> tuple[dict[str, int], set[str]]:
        """What a staging branch of the asset (default: this run's) holds of its own: each date its commits
        wrote -> the newest such commit, and the dates a commit dropped that no later one wrote again; nothing
        without the branch. What publication tags and untags (:meth:`_retag`), and what the run reads over
        main's tags."""
        branch = branch or self.branch
        loaded = self.load(table, asset)
        if loaded is None or branch is None or branch not in loaded.metadata.refs:
            return {}, set()
        staged = loaded.snapshot_by_name(branch)
        staged_from = staged.summary.get(STAGED_FROM) if staged.summary is not None else None
        return _dates_of(self._staged_commits(loaded, staged, staged_from))

    # -- a tag per published date (docs/publishing.md, Time travel by date) -----------------------------
    @staticmethod
    def _retag(loaded, snapshots, commits: list, tag_days: int | None) -> bool:
        """Add to ``snapshots`` (a pyiceberg ``manage_snapshots()``) the date tags that ``commits`` (newest
        first, now published) make; returns whether it added any change. Each date a commit wrote is tagged
        with its name at the newest such commit, ``RETAIN`` ``tag_days`` days (Iceberg's expiry then drops
        the tag with its snapshot, as ``retention.snapshot_days`` does the snapshot); each date a commit
        dropped (retention, a re-run's later dates, a rollback) loses its tag. With no ``tag_days`` (None
        or 0), a written date's older tag is dropped and none is made: no tag names what the date no longer is;
        with ``TAG_FOREVER`` the tags have no ``RETAIN`` (a merged state's: its dates' states)."""
        written, dropped = _dates_of(commits)
        changed = False
        for day in sorted(dropped | (set() if tag_days else set(written))):
            if _is_date_tag(loaded, day):
                snapshots.remove_tag(day)
                changed = True
        if not tag_days:
            return changed
        for day, snapshot in sorted(written.items()):
            snapshots.create_tag(snapshot, day, max_ref_age_ms=None if tag_days == TAG_FOREVER else tag_days * DAY_MS)
            changed = True
        return changed

    def date_tags(self, table: str, asset: str) -> dict[str, int]:
        """The asset's date tags (a published date -> the snapshot that published it)."""
        loaded = self.load(table, asset)
        if loaded is None:
            return {}
        return {name: ref.snapshot_id for name, ref in loaded.metadata.refs.items() if _is_date_tag(loaded, name)}

    def drop_date_tags(self, table: str, asset: str) -> list[str]:
        """Remove every date tag of the asset in one metadata commit (an erase: their snapshots hold the
        keys); returns the tags removed."""
        loaded = self.load(table, asset)
        tags = sorted(self.date_tags(table, asset))
        if tags:
            with loaded.manage_snapshots() as snapshots:
                for name in tags:
                    snapshots.remove_tag(name)
        return tags

    @staticmethod
    def _ancestors(loaded, snapshot) -> set[int]:
        return {ancestor.snapshot_id for ancestor in _lineage(loaded, snapshot)}

    def staging_branches(self, table: str, asset: str) -> dict[str, int]:
        """Every staging branch of the asset (``cdc_run_<run id>``) -> when its newest snapshot was committed (ms)."""
        loaded = self.load(table, asset)
        if loaded is None:
            return {}
        return {
            name: loaded.snapshot_by_id(ref.snapshot_id).timestamp_ms
            for name, ref in loaded.metadata.refs.items()
            if name.startswith(STAGING_PREFIX) and ref.snapshot_ref_type == "branch" and loaded.snapshot_by_id(ref.snapshot_id) is not None
        }

    def drop_branches(self, table: str, asset: str, names: Iterable[str]) -> None:
        """Remove those of ``names`` the asset has, in one metadata commit (the snapshots only they kept go at
        the next expiry); none of them: no commit."""
        loaded = self.load(table, asset)
        present = [] if loaded is None else [name for name in names if name in loaded.metadata.refs]
        if not present:
            return
        with loaded.manage_snapshots() as snapshots:
            for name in present:
                snapshots.remove_branch(name)

    def unreferenced_files(self, table: str, asset: str) -> list[str]:
        """Every file under the asset's location that neither the table's metadata files (the current one
        and those it lists as previous) nor any of its snapshots name: what a write killed before or
        inside its commit left (data files, manifests, a manifest list, a metadata file never committed),
        with the checksum files (``.name.crc``) the local file system writes beside each. None of them is
        ever read; reading every retained snapshot's manifests, this costs a read of the table's metadata."""
        loaded = self.load(table, asset)
        if loaded is None:
            return []
        metadata = loaded.metadata
        named = {loaded.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
        named |= {stats.statistics_path for stats in (*metadata.statistics, *metadata.partition_statistics)}
        manifests: dict[str, Any] = {}
        for snapshot in loaded.snapshots():
            named.add(snapshot.manifest_list)
            manifests.update((manifest.manifest_path, manifest) for manifest in snapshot.manifests(loaded.io))
        for path, manifest in manifests.items():
            named.add(path)
            named |= {entry.data_file.file_path for entry in manifest.fetch_manifest_entry(loaded.io, discard_deleted=True)}
        referenced = {_local(uri) for uri in named}
        found = []
        for path in self._files_at(loaded.location()).files_under(_local(loaded.location())):
            folder, name = path.rsplit("/", 1)
            checksum_of = name[1:-len(".crc")] if name.startswith(".") and name.endswith(".crc") else None
            if f"{folder}/{checksum_of or name}" not in referenced:
                found.append(path)
        return sorted(found)

    def _files_at(self, location: str) -> Files:
        """The file operations for a table's location (the catalog's warehouse may be another store than the root)."""
        return files_for(location, self.lake.store)

    def remove_unreferenced_files(self, table: str, asset: str, older_than: float | None = None) -> list[str]:
        """Delete :meth:`unreferenced_files` (last modified before ``older_than``, seconds since the
        epoch, if given); returns the paths deleted. The caller holds the table's writer lock: a file of a
        write still in progress is unreferenced too, until it commits."""
        removed = []
        unreferenced = self.unreferenced_files(table, asset)
        files = self._files_at(unreferenced[0]) if unreferenced else self.files
        for path in unreferenced:
            try:
                if older_than is None or files.modified(path) < older_than:
                    files.delete(path)
                    removed.append(path)
            except FileNotFoundError:  # a checksum file whose file went first, or removed meanwhile
                pass
        return removed

    # Procedures take the table with its catalog (``lake.t.a``): given ``t.a``, Iceberg first tries ``t`` as a
    # catalog and logs a CatalogNotFoundException with its stack trace on every call, into the run's log.
    def expire_snapshots_before(self, spark: SparkSession, table: str, asset: str, cutoff_ms: int) -> int:
        """Expire the asset's snapshots committed before ``cutoff_ms`` (ms since the epoch), never the
        current one nor one a tag or branch names (a merged state's dates); Iceberg deletes the files
        only they read. Returns how many were expired: none to expire costs a metadata read, no Spark job."""
        loaded = self.load(table, asset)
        current = None if loaded is None else loaded.current_snapshot()
        if current is None:
            return 0
        # A ref keeps its snapshot unless its own retention (``RETAIN``: a rollback's undo tag) has passed:
        # Iceberg's procedure then removes the ref and expires the snapshot with the others.
        now_ms = time.time() * 1000
        by_id = {snapshot.snapshot_id: snapshot for snapshot in loaded.snapshots()}
        aged = {
            name for name, ref in loaded.metadata.refs.items()
            if ref.max_ref_age_ms is not None and ref.snapshot_id in by_id and now_ms - by_id[ref.snapshot_id].timestamp_ms > ref.max_ref_age_ms
        }
        kept = {current.snapshot_id} | {ref.snapshot_id for name, ref in loaded.metadata.refs.items() if name not in aged}
        expired = [s for s in loaded.snapshots() if s.timestamp_ms < cutoff_ms and s.snapshot_id not in kept]
        if not expired and not aged:
            return 0
        self.session_for(spark).sql(
            f"CALL {CATALOG_NAME}.system.expire_snapshots(table => '{table_identifier(table, asset)}', "
            f"older_than => TIMESTAMP_MILLIS({cutoff_ms}), retain_last => 1)"
        ).collect()
        return len(expired)

    def data_file_paths(self, table: str, asset: str) -> list[str]:
        """Every Parquet file under the asset's data folder, live or not."""
        folder = f"{self.location(table, asset)}/data"
        return [path for path in self._files_at(folder).files_under(folder) if path.endswith(".parquet")]

    # -- writing ---------------------------------------------------------------------------------------
    def write(
        self,
        frame: DataFrame,
        table: str,
        asset: str,
        business_dates: list[str],
        properties: dict[str, str],
        dropped: Iterable[str] = (),
        read_snapshot: int | None = None,
        tag_days: int | None = None,
    ) -> int:
        """Replace the dates ``business_dates`` of the asset with ``frame``'s rows in one commit (a frame
        with a ``business_date`` column), and forget the dates ``dropped`` (their rows go in the same commit);
        returns the id of the snapshot committed.

        Written to ``main`` (not staged), the commit is published at once: each date written is then tagged
        with its name (kept ``tag_days`` days; None or 0: no tag) and each date dropped loses its tag
        (:meth:`_retag`). A staged commit is tagged when it is published (:meth:`publish`).

        The caller holds the table's writer lock. ``properties`` go into the snapshot summary (with
        ``WRITTEN_DATES`` and ``DROPPED_DATES``, which this sets); ``RUN_ID`` among them finds the commit
        afterwards. The write is serializable from ``read_snapshot``, the
        snapshot the caller's run found (None: it found none): if another commit since then wrote any of
        the dates, nothing is committed and :class:`ConcurrentWriteError` says so.
        """
        spark = self.session_for(frame.sparkSession)
        frame, hop = hand_over(frame, spark)
        identifier = table_identifier(table, asset)
        schema = as_stored(frame.drop(BUSINESS_DATE).schema)
        sid = self.record_schema(table, asset, schema)
        loaded = self.load(table, asset)
        if loaded is None:
            self._create(spark, table, asset, frame)
            loaded = self.load(table, asset)
        # Iceberg's writer takes the table's columns in the table's order (new ones after them).
        table_columns = [column.name for column in loaded.schema().fields]
        ordered = [name for name in table_columns if name in frame.columns]
        frame = frame.select(*[f"`{name}`" for name in ordered + [name for name in frame.columns if name not in table_columns]])
        stored = self.stored(table, asset, self.head(loaded))
        for day in dropped:
            stored.pop(day, None)
        stored.update({day: sid for day in business_dates})
        grouped: dict[str, list[str]] = {}
        for day, day_sid in stored.items():
            grouped.setdefault(day_sid, []).append(day)
        summary = {STORED_DATES: json.dumps({key: encode_dates(days) for key, days in sorted(grouped.items())}), **properties}
        # What the commit wrote and removed, by date: what finds a date's commit (its tag) and what reads its history.
        if business_dates:
            summary[WRITTEN_DATES] = ",".join(business_dates)
        if dropped:
            summary[DROPPED_DATES] = ",".join(sorted(dropped))
        replaced = sorted(set(business_dates) | set(dropped))
        # Serializable: Iceberg checks, at the commit (and again at each retry of it), that no snapshot
        # after ``read_snapshot`` added files of these dates. With no snapshot read, every snapshot is
        # after it: validating from the table's first one is the same check.
        staged = self.stage_writes and self.branch is not None
        if staged:
            # Staged: readers of main do not see it until publish(); a write names the branch ``branch_<name>``
            # after the table. Each staged commit records the main snapshot the branch was made from: publish()
            # moves main only from there (the branch's own earlier snapshots may be expired meanwhile).
            self.make_branch(spark, table, asset)
            loaded = self.load(table, asset)
            summary.update(staging_record(loaded, loaded.snapshot_by_name(self.branch)))
            identifier = f"{identifier}.`branch_{self.branch}`"
        writer = frame.writeTo(identifier).option("mergeSchema", "true").option("isolation-level", "serializable")
        if len(business_dates) == 1:
            # One date is one partition: the rows need no shuffle to cluster them by it (Iceberg's default
            # `hash` distribution adds one: a Spark job and a full exchange of the rows per write). A range
            # run's write of several dates keeps it, so that no task holds a file open per date.
            writer = writer.option("distribution-mode", "none")
        if read_snapshot is not None:
            writer = writer.option("validate-from-snapshot-id", str(read_snapshot))
        for key, value in summary.items():
            writer = writer.option(f"snapshot-property.{key}", value)
        from pyspark.sql import functions as F

        try:
            writer.overwrite(F.col(BUSINESS_DATE).isin(*[F.lit(day).cast("date") for day in replaced]))
        except Exception as error:  # noqa: BLE001 - Py4JJavaError or Connect's UnknownException: told apart by their text
            if VALIDATION_EXCEPTION not in str(error):
                raise
            raise _conflict(table, asset, replaced, read_snapshot, error) from error
        finally:
            release_hand_over(spark, hop)
        committed = self._committed_by(table, asset, properties.get(RUN_ID))
        if not staged:  # published at once: its dates' tags, in a metadata commit of their own
            loaded = self.load(table, asset)
            snapshots = loaded.manage_snapshots()
            if self._retag(loaded, snapshots, [loaded.snapshot_by_id(committed)], tag_days):
                snapshots.commit()
        return committed

    def _committed_by(self, table: str, asset: str, run_id: str | None) -> int:
        """The newest snapshot of the asset's ``main`` history that ``run_id`` committed (the one this
        process just committed: a run writes each asset from one step at a time)."""
        loaded = self.load(table, asset)
        newest = self.head(loaded)
        for snapshot in _lineage(loaded, newest) if run_id is not None else ():
            if snapshot.summary is not None and snapshot.summary.get(RUN_ID) == run_id:
                return snapshot.snapshot_id
        return newest.snapshot_id

    def drop_dates(
        self, spark: SparkSession, table: str, asset: str, days: list[str], properties: dict[str, str], read_snapshot: int | None = None
    ) -> int:
        """Remove the dates ``days`` (their rows and their record) in one commit, serializable from
        ``read_snapshot`` (see :meth:`write`); returns the snapshot committed."""
        spark = self.session_for(spark)
        empty = spark.read.table(table_identifier(table, asset)).limit(0)
        return self.write(empty, table, asset, [], properties, dropped=days, read_snapshot=read_snapshot)

    def _create(self, spark: SparkSession, table: str, asset: str, frame: DataFrame) -> None:
        """Create the asset's table, partitioned by ``business_date``, with no snapshot yet."""
        create_table(spark, table, asset, frame, f"`{BUSINESS_DATE}`", TABLE_PROPERTIES)

    def rename_columns(self, spark: SparkSession, table: str, asset: str, renamed_from: dict[str, list[str]]) -> list[tuple[str, str]]:
        """Rename the asset's columns a config renamed (``renamed_from``: each new name's former names,
        newest first) that the table still has under a former name: Iceberg's ``RENAME COLUMN``, by field
        id, so every stored date reads under the new name and no data file is rewritten. A column whose
        new name the table has already is left alone (a re-run; or a table from before this rename,
        whose older dates keep the former name as a column of its own). Returns the (former, new) pairs
        renamed. The caller holds the table's writer lock."""
        loaded = self.load(table, asset)
        if loaded is None or not renamed_from:
            return []
        present = {field.name.lower(): field.name for field in loaded.schema().fields}
        renamed = []
        for new, formers in renamed_from.items():
            former = next((present[name.lower()] for name in formers if name.lower() in present), None)
            if new.lower() in present or former is None:
                continue
            self.session_for(spark).sql(f"ALTER TABLE {table_identifier(table, asset)} RENAME COLUMN `{former}` TO `{new}`")
            present[new.lower()] = new
            del present[former.lower()]
            renamed.append((former, new))
        return renamed

    def drop_columns(self, spark: SparkSession, table: str, asset: str, names: Iterable[str]) -> list[str]:
        """Drop the asset's columns ``names`` (those the table has): Iceberg's ``DROP COLUMN``, by field id,
        so no data file is rewritten and no engine shows the column any more (time travel to an earlier
        snapshot still does). Returns the columns dropped. The caller holds the table's writer lock."""
        loaded = self.load(table, asset)
        present: dict[str, str] = {} if loaded is None else {f.name.lower(): f.name for f in loaded.schema().fields}
        dropped = [present[name.lower()] for name in names if name.lower() in present]
        for name in dropped:
            self.session_for(spark).sql(f"ALTER TABLE {table_identifier(table, asset)} DROP COLUMN `{name}`")
        return dropped

    def renamed(self, table: str, asset: str) -> dict[str, str]:
        """Each name a column of the asset's table had in an earlier Iceberg schema and has no longer ->
        its name now (the renames :meth:`rename_columns` made): a date recorded before a rename has the
        former name, and reads under the new one."""
        loaded = self.load(table, asset)
        return {} if loaded is None else renamed_columns(loaded)

    # -- reading ---------------------------------------------------------------------------------------
    def preview(self, table: str, asset: str, business_date: str, limit: int) -> list:
        """Up to ``limit`` rows of a stored date as Spark ``Row`` objects without ``business_date``, read by
        pyiceberg at the snapshot :meth:`read` reads (no Spark job: the UI's preview is a metadata entry).
        A timestamp reads as Spark shows it in its UTC session: UTC, without a zone."""
        from pyspark.sql import Row

        loaded = self.load(table, asset)
        snapshot = self.head(loaded)
        if snapshot is None:
            return []
        scanned = loaded.scan(row_filter=f"{BUSINESS_DATE} = '{business_date}'", snapshot_id=snapshot.snapshot_id, limit=limit).to_arrow()
        names = [name for name in scanned.column_names if name != BUSINESS_DATE]
        return [Row(**{name: _as_spark_shows(record[name]) for name in names}) for record in scanned.select(names).to_pylist()]

    def read(self, spark: SparkSession, table: str, asset: str, business_dates: list[str], schema: StructType) -> DataFrame:
        """The dates' rows as one DataFrame with a ``business_date`` column, at the snapshot committed now
        (pinned: a commit meanwhile changes nothing under the reader), with ``schema``'s columns."""
        from pyspark.sql import functions as F

        spark = self.session_for(spark)
        loaded = self.load(table, asset)
        snapshot = self.head(loaded)
        frame = spark.read.option(VERSION_AS_OF, str(snapshot.snapshot_id)).table(table_identifier(table, asset))
        frame = frame.where(F.col(BUSINESS_DATE).isin(*[F.lit(day).cast("date") for day in business_dates]))
        return frame.select(*project_columns(frame, schema), F.col(BUSINESS_DATE))


def _as_spark_shows(value):
    """A value pyarrow read as Spark's ``collect`` gives it: a zoned timestamp as naive UTC (the session's zone)."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def staging_record(loaded, head) -> dict[str, str]:
    """The ``STAGED_FROM`` of the next staged commit on a branch whose head is ``head``: main's snapshot while
    the branch still points at it (nothing staged on it yet), else the head's own record (a table whose main
    has no snapshot: none); else unknown (nothing: publication then checks the branch's ancestry)."""
    main = loaded.current_snapshot()
    if head is not None and main is not None and head.snapshot_id == main.snapshot_id:
        return {STAGED_FROM: str(main.snapshot_id)}
    recorded = head.summary.get(STAGED_FROM) if head is not None and head.summary is not None else None
    if recorded is None and main is None:
        recorded = ""
    return {} if recorded is None else {STAGED_FROM: recorded}


DAY_MS = 24 * 60 * 60 * 1000
# ``tag_days`` of a date tag kept until it is dropped (a merged state's: the tag is the date's state).
TAG_FOREVER = -1


def _lineage(loaded, snapshot) -> Iterator:
    """``snapshot`` and its ancestors, newest first, as far as they are kept (an expired parent ends it)."""
    while snapshot is not None:
        yield snapshot
        snapshot = loaded.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None


def _dates_of(commits: Iterable) -> tuple[dict[str, int], set[str]]:
    """Of ``commits`` (newest first): each date one wrote -> the newest commit writing it, and the dates one
    dropped that no later commit wrote again (``WRITTEN_DATES``, ``DROPPED_DATES`` of their summaries)."""
    written: dict[str, int] = {}
    dropped: set[str] = set()
    for commit in commits:
        summary = commit.summary or {}
        gone = [day for day in _listed(summary.get(DROPPED_DATES)) if day not in written and day not in dropped]
        dropped.update(gone)
        for day in _listed(summary.get(WRITTEN_DATES)):
            if day not in written and day not in dropped:
                written[day] = commit.snapshot_id
    return written, dropped


def _listed(dates: str | None) -> list[str]:
    """A summary's comma-separated dates."""
    return [day for day in (dates or "").split(",") if day]


def _is_date_tag(loaded, name: str) -> bool:
    """Whether ``name`` is a tag of ``loaded`` named by a business date."""
    ref = loaded.metadata.refs.get(name)
    if ref is None or not str(ref.snapshot_ref_type).lower().endswith("tag"):
        return False
    try:
        date.fromisoformat(name)
    except ValueError:
        return False
    return True


def _on_dates(days: Iterable[str]):
    """A pyiceberg row filter: the rows of these dates."""
    from pyiceberg.expressions import In

    return In(BUSINESS_DATE, set(days))  # type: ignore[misc, call-arg, arg-type]  # pyiceberg's hints are its model's fields, not In(name, values)


def renamed_columns(loaded) -> dict[str, str]:
    """A pyiceberg table's renamed top-level columns: each former name -> the name its field id has now.
    A former name that a column of the current schema has again (dropped, then added anew) is not one."""
    now = {field.field_id: field.name for field in loaded.schema().fields}
    taken = {name.lower() for name in now.values()}
    renamed = {}
    for schema in sorted(loaded.schemas().values(), key=lambda each: each.schema_id):
        for column in schema.fields:
            name = now.get(column.field_id)
            if name is not None and name != column.name and column.name.lower() not in taken:
                renamed[column.name] = name
    return renamed


def as_read_now(schema: StructType, renamed: dict[str, str], present: Iterable[str] | None = None) -> StructType:
    """A date's recorded schema as the table reads it now: each renamed column under its new name, in
    the hash spec too (the spec names the columns; the hashes are of their values, so unchanged), and
    without a column the table dropped since (``present``: the table's columns now). The hash spec keeps
    naming a dropped column: the date's hashes were computed over it."""
    kept = None if present is None else {name.lower() for name in present}
    if not renamed and (kept is None or all(f.name.lower() in kept for f in schema.fields)):
        return schema
    fields = []
    for f in schema.fields:
        if kept is not None and renamed.get(f.name, f.name).lower() not in kept:
            continue
        metadata = f.metadata
        if f.name == NON_KEY_HASH and HASH_SPEC_METADATA in (metadata or {}):
            spec = json.loads(metadata[HASH_SPEC_METADATA])
            for group in ("keys", "non_keys", "untracked"):
                spec[group] = [[renamed.get(name, name), kind] for name, kind in spec.get(group, [])]
            metadata = {**metadata, HASH_SPEC_METADATA: json.dumps(spec, separators=(",", ":"))}
        fields.append(StructField(renamed.get(f.name, f.name), f.dataType, f.nullable, metadata))
    return StructType(fields)


def project_columns(frame: DataFrame, schema: StructType) -> list:
    """``schema``'s columns but ``business_date``, as stored (nullable), from ``frame``: each cast to its
    type, and NULL where ``frame`` lacks it (a date written before the column was added)."""
    from pyspark.sql import functions as F

    present = set(frame.columns)
    return [
        (F.col(f"`{f.name}`").cast(f.dataType) if f.name in present else F.lit(None).cast(f.dataType)).alias(f.name, metadata=f.metadata)
        for f in as_stored(schema).fields
        if f.name != BUSINESS_DATE
    ]


def _partition_date(value) -> str:
    """A ``business_date`` partition value as pyiceberg gives it (a date, or days since 1970-01-01) in ISO form."""
    return value.isoformat() if hasattr(value, "isoformat") else (date(1970, 1, 1) + timedelta(days=int(value))).isoformat()


def _conflict(table: str, asset: str, days: list[str], read_snapshot: int | None, error: Exception) -> ConcurrentWriteError:
    """The error of a write that lost to another writer of the same dates (Iceberg's validation failed)."""
    text = str(error)
    found = text[text.index(VALIDATION_EXCEPTION) + len(VALIDATION_EXCEPTION):].lstrip(") :").splitlines()[0]
    read = f"snapshot {read_snapshot}" if read_snapshot is not None else "no snapshot (the table was empty)"
    return ConcurrentWriteError(
        f"{table}/{asset}: conflicting write of {', '.join(days) or 'no date'}: another writer committed "
        f"{'that date' if len(days) == 1 else 'those dates'} after this run read the table at {read}; "
        f"nothing of this write was committed. Re-run the date(s) once the other run is done.",
        f"Iceberg's ValidationException: {found}",
    )


# Held while a table (and its namespace) is created: see create_table.
_CREATING = threading.Lock()


def create_table(spark: SparkSession, table: str, asset: str, frame: DataFrame, partitioning: str, properties: dict[str, str]) -> None:
    """Create the asset's Iceberg table (and its namespace) with ``frame``'s columns, unless it exists."""
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in frame.schema.fields)
    listed = ", ".join(f"'{key}'='{value}'" for key, value in properties.items())
    # A step writes its outputs side by side: "IF NOT EXISTS" is no guard against another thread creating
    # the same namespace at the same moment (the catalog refuses the second insert of its row).
    with _CREATING:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG_NAME}.`{table}`")
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {table_identifier(table, asset)} ({columns}) USING iceberg "
            f"PARTITIONED BY ({partitioning}) TBLPROPERTIES ({listed})"
        )



def hand_over(frame: DataFrame, spark: SparkSession) -> tuple[DataFrame, str | None]:
    """``frame`` as a DataFrame of ``spark``, and the name of the global view that carries it over (None
    when ``frame`` is of ``spark`` already). A frame of a session that opened another warehouse (see
    :meth:`LakeTables.session_for`) is handed over as a global view, which every session of the same
    Spark sees; drop it with :func:`release_hand_over` once the write is done."""
    if spark is frame.sparkSession:
        return frame, None
    hop = f"cdc_write_{uuid.uuid4().hex}"
    frame.createOrReplaceGlobalTempView(hop)
    return spark.table(f"global_temp.{hop}"), hop


def release_hand_over(spark: SparkSession, hop: str | None) -> None:
    if hop is not None:
        spark.catalog.dropGlobalTempView(hop)


def _local(uri: str) -> str:
    """A file URI as Iceberg records it (``file:/...``), as a local path."""
    return "/" + uri[len("file:"):].lstrip("/") if uri.startswith("file:") else uri


def _connection_string(builder: Any) -> str:
    """The ``sc://`` string a Connect client's channel builder was made from, its token included.

    pyspark keeps it parsed, with ``http`` for its scheme (``DefaultChannelBuilder.url``)."""
    parsed = getattr(builder, "url", None)
    if parsed is None or not hasattr(parsed, "geturl"):
        return settings.SPARK_REMOTE.value()
    return "sc" + parsed.geturl()[len(parsed.scheme):]


def _another_session(spark: SparkSession) -> SparkSession:
    """A new session on the same Spark as ``spark`` (its JVM, or its Connect server), with its SQL conf
    but no catalog opened yet. ``spark`` stays the process's default session."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        # pyspark's hints: `builder` is a property, and a Connect session (with its client) is no SparkSession.
        connect: Any = ConnectSession
        client: Any = getattr(spark, "client")
        created = connect.builder.remote(_connection_string(client._builder)).create()
        connect._set_default_and_active_session(spark)
    else:
        created = spark.newSession()
    for key, value in spark.conf.getAll.items():
        if key.startswith("spark.sql.") and not key.startswith(f"spark.sql.catalog.{CATALOG_NAME}"):
            try:
                created.conf.set(key, value)
            except Exception:  # noqa: BLE001 - a static conf the new session already has from the JVM
                pass
    return created
