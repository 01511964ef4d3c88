"""Erase keys from every stored partition of a table, record it in the ledger, and verify it (no Dagster here).

:func:`erase_keys` is what ``cdc-erase`` and the table's erase job run; ``cdc_assets/defs/erasure_events.py``
tells Dagster about it. The order makes a kill harmless: the ledger's record comes first (so the next
date's intake already sets the keys aside), then each asset's partitions that hold the keys are
rewritten (one Iceberg commit per asset and schema) under the table's writer lock, the record growing
as they commit; then the snapshots that still reference the removed rows are expired and every file
no snapshot references is deleted. Run again with the same keys, an erase killed
part-way finds the partitions it had not finished and completes the same request.

A merged state (an incremental ``current_table``) is searched in its data files, not through its
states: a row a later date deleted or replaced is masked by a position delete, so no state shows it,
while its file, which a later tag still reads, holds it. Last, the erase verifies itself as
``cdc-erase --verify`` does (:func:`verify_erased`): the request is ``complete`` only when that passes;
otherwise it is ``incomplete``, with what is left, and the same command again resumes it.
"""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from cdc_assets.model.config import LoadType, TableConfig
from cdc_assets.core.capture.changes import OPERATION
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.capture.erasure import (
    RAW_FIELDS,
    RAW_KEY_HASH,
    RAW_RECORD,
    erased_key_values,
    erased_keys_for_rejects,
    key_hashes_of,
    keys_file_options,
    reject_holds_key,
    reject_may_hold_key,
    reject_separator,
    with_raw_fields,
    with_raw_key_hash,
    without,
)
from cdc_assets.core.hashing import KEY_HASH
from cdc_assets.model.names import CLASSIFICATION, CURRENT, REJECTS
from resources.storage.state import state_rows
from resources.storage.object_store import compact_deleted_objects
from resources.storage import MissingPartitionError, WarehouseStorage
from resources.storage.erasure import TORN
from resources.storage.rollback import forget_undo_points

# A request's status: being erased; erased and verified; erased as far as it could be, with what is left
# (``left``) listed. The same command again resumes an erasing or incomplete request.
ERASING, COMPLETE, INCOMPLETE = "erasing", "complete", "incomplete"
RESUMABLE = (ERASING, INCOMPLETE)
# An erased key's columns in a join with rejects, beside the rejects' own.
_KEY_PREFIX = "__cdc_erased_key_"
# Why a reject is listed as not checked (it may hold a key).
MAY_HOLD = "its key cannot be parsed and its text holds an erased key's value"
_ERASED = "__cdc_erased"
_FILE = "__cdc_file"
_BY_VALUE = "__cdc_erased_by_value"


@dataclass
class ErasureResult:
    """What an erase did: the request, the rows it removed per partition, and the figures that changed."""

    request_id: str
    keys: int
    resumed: bool
    # (asset, date) -> rows removed; the asset as stored (an incremental state's changes apart).
    removed: dict[tuple[str, str], int] = field(default_factory=dict)
    # date -> operation -> rows removed from hash_join_classification.
    removed_operations: dict[str, dict[str, int]] = field(default_factory=dict)
    # date -> rows of the state as of the date, before and after the erase (delta and change-set loads).
    state_rows_before: dict[str, int] = field(default_factory=dict)
    state_rows_after: dict[str, int] = field(default_factory=dict)
    # date -> rejects that may hold a key and could not be checked (MAY_HOLD): kept, and reported.
    unverifiable_rejects: dict[str, int] = field(default_factory=dict)
    # asset -> rows of the keys in the data files a merged state's tags or head read, masked or not.
    stored_copies: dict[str, int] = field(default_factory=dict)
    bytes_rewritten: int = 0  # of the versions replaced
    bytes_stored: int = 0  # of every current version of the table, before the erase
    # What the erase's own verification still found (each a line, as --verify lists it); empty: complete.
    left: list[str] = field(default_factory=list)
    # Rollbacks that can no longer be undone: their undo points (tagged snapshots) held the keys.
    undo_points_dropped: list[str] = field(default_factory=list)
    # Staging branches of runs that never published (docs/publishing.md): their rows hold the keys too.
    staging_branches_dropped: list[str] = field(default_factory=list)
    # Date tags of the outputs stored per date (``<asset>@<date>``): their snapshots hold the keys too.
    date_tags_dropped: list[str] = field(default_factory=list)

    @property
    def rows_removed(self) -> int:
        return sum(self.removed.values())


@dataclass
class Verification:
    """Where the keys still are: (asset, date, file, live, rows) per data file holding them (``live``: a
    table's current snapshot reads it; otherwise it is a replaced snapshot's, or a killed write's), and
    the rejects that name no parseable key, per date. ``by_value_only``: per file of ``holding``, the rows
    found by their key values alone, their ``key_hash`` not the one the keys hash to (a hash computed
    otherwise, e.g. under an earlier key definition): an erase, which matches hashes, leaves them."""

    holding: list[tuple[str, str, str, bool, int]]
    unverifiable_rejects: dict[str, int]
    by_value_only: dict[str, int] = field(default_factory=dict)
    # (asset, date, file, live, rows) per file of rejects that may hold a key and could not be checked (MAY_HOLD).
    unchecked: list[tuple[str, str, str, bool, int]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No stored file holds the keys, and nothing that may hold them went unchecked."""
        return not self.holding and not self.unchecked

    def left(self) -> list[str]:
        """What still holds the keys or could not be checked, a line each (file, and why)."""
        return [
            *(f"{asset} {day or '(undated)'}: {rows} row(s) holding the keys in {'a live' if live else 'a replaced'} file {path}"
              for asset, day, path, live, rows in self.holding),
            *(f"{asset} {day or '(undated)'}: {rows} record(s) not checked in {'a live' if live else 'a replaced'} file {path}: {MAY_HOLD}"
              for asset, day, path, live, rows in self.unchecked),
        ]


def key_columns(config: TableConfig) -> list[tuple[str, str]]:
    return [(column.name, column.type) for column in config.keys]


def read_key_values(spark: SparkSession, config: TableConfig, path: str) -> DataFrame:
    """The keys file (CSV with a header naming the key columns) as its distinct keys, typed as the intake
    types them (:func:`cdc_assets.core.capture.erasure.erased_key_values`)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"keys file {path} does not exist (a CSV with a header naming the key columns of {config.name})")
    # Every value as text, exactly as written (keys_file_options); a Connect server resolves the absolute path.
    keys = spark.read.options(**keys_file_options(config)).csv(os.path.abspath(path))
    return erased_key_values(keys, key_columns(config), config.name, path)


def read_keys_file(spark: SparkSession, config: TableConfig, path: str) -> DataFrame:
    """The keys file (CSV with a header naming the key columns) as their ``key_hash`` values."""
    return key_hashes_of(read_key_values(spark, config, path), key_columns(config))


def erased_keys(spark: SparkSession, storage: WarehouseStorage, table: str) -> DataFrame | None:
    """Every key the table's ledger has erased, as ``key_hash`` values; None when none was."""
    folders = storage.erased_key_folders(table)
    if not folders:
        return None
    return spark.read.schema(StructType([StructField(KEY_HASH, StringType())])).parquet(*folders)


def erase_keys(
    spark: SparkSession, storage: WarehouseStorage, config: TableConfig, keys_path: str, reason: str, requested_by: str
) -> ErasureResult:
    """Remove the keys of ``keys_path`` from every stored partition of the table; see the module's docstring.

    ``requested_by`` names the process or run in the ledger. Holds the table's writer lock (through
    ``storage``) until the caller releases it.
    """
    spark = storage.tables.session_for(spark)  # the warehouse's session: it reaches the lake's files
    table = config.name
    hashes = read_keys_file(spark, config, keys_path)
    summary = hashes.agg(F.md5(F.concat_ws(",", F.array_sort(F.collect_list(KEY_HASH)))), F.count(F.lit(1))).first()
    assert summary is not None  # an aggregate without grouping returns one row
    fingerprint, count = summary
    storage.hold_writer_lock(table)
    # A request of the same keys not finished, or torn (its key hashes lost or damaged): this erase completes it.
    unfinished = [
        r for r in storage.erasure_requests(table) if _same_keys(r, fingerprint) and (r.get(TORN) or r.get("status") in RESUMABLE)
    ]
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    fresh = {
        "table": table,
        "status": ERASING,
        "fingerprint": fingerprint,
        "keys": count,
        "requested_at": now,
        "requested_by": requested_by,
        "host": socket.gethostname(),
        "reason": reason,
        "partitions": {},
    }
    if unfinished:
        previous = unfinished[-1]
        request_id = previous["request_id"]
        record = {key: value for key, value in previous.items() if key not in ("request_id", "key_hashes", TORN)}
        record["resumed_at"] = [*record.get("resumed_at", []), now]
        record["resumed_by"] = [*record.get("resumed_by", []), requested_by]
        if previous.get(TORN):
            # What an unreadable record lost is filled in; a complete request is erased again, as it
            # may have been complete on a disk that lost the key hashes it recorded.
            record = {**fresh, **record, "status": ERASING, "repaired_at": [*record.get("repaired_at", []), now]}
            storage.repair_erasure(hashes, table, request_id, record)
        else:
            storage.record_erasure(table, request_id, record)
    else:
        request_id = storage.start_erasure(hashes, table, fingerprint, fresh)
    stored = next(r for r in storage.erasure_requests(table) if r["request_id"] == request_id)
    record = {key: value for key, value in stored.items() if key not in ("request_id", "key_hashes")}
    erased = spark.read.parquet(stored["key_hashes"])
    for_rejects = _keys_for_rejects(read_key_values(spark, config, keys_path), config)
    result = ErasureResult(request_id=request_id, keys=count, resumed=bool(unfinished))
    # First: a rollback's undo point keeps snapshots that hold the keys, which the expiry below must reach.
    result.undo_points_dropped = forget_undo_points(spark, storage, table, f"dropped by erase request {request_id}")
    result.staging_branches_dropped = storage.drop_staging_branches(table)
    result.date_tags_dropped = storage.drop_date_tags(table)
    rewritten_before = record.get("bytes_rewritten", 0)  # by an attempt that was killed
    tracks_state = config.load_type is not LoadType.full and CURRENT in storage.stored_assets(table)
    current_dates = storage.stored_dates(table, CURRENT)
    if tracks_state:
        result.state_rows_before = _state_rows(storage, table, current_dates)
    for asset in storage.stored_assets(table):
        dates = storage.stored_dates(table, asset)
        if not dates:
            continue
        result.bytes_stored += sum(storage.bytes_stored(table, asset, dates).values())
        hits, unverifiable, by_operation = _rows_of_erased_keys(spark, storage, config, asset, dates, erased, for_rejects)
        if asset == REJECTS:
            result.unverifiable_rejects = unverifiable
        if asset == CLASSIFICATION:
            result.removed_operations = by_operation
        affected = sorted(day for day, rows in hits.items() if rows)
        if storage.merged.holds(table, asset):
            # Searched in its data files (deletes not applied): a row a later date masked is in no state,
            # and still in a file a tag reads.
            copies, anywhere = _stored_copies(spark, storage, table, asset, erased)
            if copies:
                result.stored_copies[asset] = copies
            if affected or anywhere:
                # Every tag and the table's head rewritten without the keys (merged.py).
                result.bytes_rewritten += sum(storage.bytes_stored(table, asset, affected or dates).values())
                storage.erase_from_state(spark, table, asset, erased, request_id)
            affected = []
        for group in _same_schema(storage, table, asset, affected):
            result.bytes_rewritten += sum(storage.bytes_stored(table, asset, group).values())
            _rewrite_without(spark, storage, config, asset, group, erased, for_rejects)
        for day in sorted(d for d, rows in hits.items() if rows):
            result.removed[(asset, day)] = hits[day]
        record["partitions"] = {**record.get("partitions", {}), **{f"{a}/{d}": n for (a, d), n in result.removed.items()}}
        record["stored_copies_removed"] = {**record.get("stored_copies_removed", {}), **result.stored_copies}
        record["bytes_rewritten"] = rewritten_before + result.bytes_rewritten
        storage.record_erasure(table, request_id, record)
    storage.purge_unreferenced_files(table)
    # The store's own copies of the deleted files' bytes: compacted where it can be asked (a versioned bucket refuses).
    compact_deleted_objects(storage.lake.store, [storage.root, storage.lake.warehouse])
    if tracks_state:
        result.state_rows_after = _state_rows(storage, table, current_dates)
    # Complete only when --verify would pass: the same scan of every data file, by key hash and by key value.
    result.left = verify_erased(spark, storage, config, keys_path).left()
    record.update(
        status=INCOMPLETE if result.left else COMPLETE,
        rows_removed=sum(record["partitions"].values()),
        unverifiable_rejects=result.unverifiable_rejects,
        left=result.left,
    )
    record["incomplete_at" if result.left else "completed_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    storage.record_erasure(table, request_id, record)
    return result


def _keys_for_rejects(values: DataFrame, config: TableConfig) -> DataFrame:
    """The erased keys as the rejects are matched with them (:func:`reject_holds_key`), prefixed apart."""
    keys = erased_keys_for_rejects(values, key_columns(config))
    return keys.select(*(F.col(f"`{name}`").alias(f"{_KEY_PREFIX}{name}") for name in keys.columns))


def _rejects_parsed(frame: DataFrame, config: TableConfig) -> DataFrame:
    """Rejects with their raw record's key hash and fields (a CSV line's), for :func:`reject_holds_key`."""
    return with_raw_fields(with_raw_key_hash(frame, key_columns(config)), config)


def _stored_copies(spark, storage: WarehouseStorage, table: str, asset: str, erased: DataFrame) -> tuple[int, bool]:
    """Rows of the erased keys in the data files of a merged state, read as Parquet (position deletes not
    applied): (those in the files a tag or the head reads, whether any file on disk holds one)."""
    files = [path for stored_asset, _, path, _ in storage.data_files(table) if stored_asset == asset]
    if not files:
        return 0, False
    read = spark.read.schema(StructType([StructField(KEY_HASH, StringType())])).parquet(*files)
    # The file of each row is taken before the join, where a scan's metadata column resolves.
    read = read.withColumn(_FILE, F.col("_metadata.file_path"))
    held = read.join(F.broadcast(erased.select(KEY_HASH).distinct()), on=KEY_HASH, how="left_semi")
    by_file = held.groupBy(_FILE).count().collect()  # a row per file holding a key
    referenced = {_bare(path) for path in storage.merged.data_files(table, asset)}
    return sum(row["count"] for row in by_file if _bare(_local_path(row[_FILE])) in referenced), bool(by_file)


def _bare(path: str) -> str:
    """A file's path without its scheme (``file:``, ``s3://``, ``s3a://``), to compare a listing with Iceberg's."""
    for scheme in ("s3a://", "s3://", "file://", "file:"):
        if path.startswith(scheme):
            return path[len(scheme):].lstrip("/")
    return path.lstrip("/")


def _same_keys(request: dict, fingerprint: str) -> bool:
    """Whether a ledger request is of the keys with ``fingerprint``; a request whose record cannot be read
    is known by its folder's name, which ends with the fingerprint's first 16 digits."""
    if "fingerprint" in request:
        return request["fingerprint"] == fingerprint
    return bool(request.get(TORN)) and request["request_id"].endswith(f"-{fingerprint[:16]}")


def verify_erased(spark: SparkSession, storage: WarehouseStorage, config: TableConfig, keys_path: str) -> Verification:
    """Scan every data file under the table's Iceberg tables, live or not (a file a killed write left, one an
    expired snapshot referenced), for the keys:
    by ``key_hash`` and by the key values themselves, so a row whose hash was computed otherwise is
    found too. Rejects are matched by the key parsed from their raw record.

    A reject is matched as the erase matches it (:func:`reject_holds_key`); one that may hold a key but
    cannot be checked (:func:`reject_may_hold_key`) is listed in ``unchecked``, with its file: the
    verification does not pass while one is left.

    Reads only: takes no lock and writes nothing.
    """
    spark = storage.tables.session_for(spark)  # the warehouse's session: it reaches the lake's files
    columns = key_columns(config)
    values = read_key_values(spark, config, keys_path)
    erased = key_hashes_of(values, columns)
    holding: list[tuple[str, str, str, bool, int]] = []
    unchecked: list[tuple[str, str, str, bool, int]] = []
    unverifiable: dict[str, int] = {}
    by_value_only: dict[str, int] = {}
    by_asset: dict[str, dict[str, tuple[str, bool]]] = defaultdict(dict)
    for asset, day, path, live in storage.data_files(config.name):
        by_asset[asset][path] = (day, live)
    for asset, files in sorted(by_asset.items()):
        if asset == REJECTS:
            for path, held, may_hold in _rejects_holding(spark, config, sorted(files), _keys_for_rejects(values, config)):
                day, live = files[path]
                if held:
                    holding.append((asset, day, path, live, held))
                if may_hold:
                    unchecked.append((asset, day, path, live, may_hold))
                    if live:
                        unverifiable[day] = unverifiable.get(day, 0) + may_hold
            continue
        read = _keys_as_stored(spark, storage, config, asset, sorted(files))
        marked = read.join(F.broadcast(erased.withColumn(_ERASED, F.lit(True))), on=KEY_HASH, how="left").join(
            F.broadcast(values.withColumn(_BY_VALUE, F.lit(True))), on=[name for name, _ in columns], how="left"
        )
        by_hash, by_value = F.coalesce(F.col(_ERASED), F.lit(False)), F.coalesce(F.col(_BY_VALUE), F.lit(False))
        counts = marked.groupBy(_FILE).agg(
            F.count_if(by_hash | by_value).alias("erased"),
            F.count_if(by_value & ~by_hash).alias("by_value_only"),
            F.count_if(F.col(KEY_HASH).isNull()).alias("unparsed"),
        )
        for row in counts.collect():  # a row per file
            path = _local_path(row[_FILE])
            day, live = files[path]
            if row["erased"]:
                holding.append((asset, day, path, live, row["erased"]))
            if row["by_value_only"]:
                by_value_only[path] = row["by_value_only"]
    return Verification(holding=sorted(holding), unverifiable_rejects=unverifiable, by_value_only=by_value_only, unchecked=sorted(unchecked))


def _rejects_holding(spark: SparkSession, config: TableConfig, files: list[str], keys: DataFrame) -> list[tuple[str, int, int]]:
    """Per rejects data file holding or maybe holding a key: (local path, records holding one, records that
    may hold one and cannot be checked). Two semi joins of the few rejects with the broadcast keys."""
    read = spark.read.schema(StructType([StructField(RAW_RECORD, StringType())])).parquet(*files)
    parsed = _rejects_parsed(read.withColumn(_FILE, F.col("_metadata.file_path")), config)
    columns = key_columns(config)
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for index, condition in enumerate((reject_holds_key(columns, _KEY_PREFIX), reject_may_hold_key(columns, _KEY_PREFIX, reject_separator(config)))):
        matched = parsed.join(F.broadcast(keys), on=condition, how="left_semi").groupBy(_FILE).count()
        for row in matched.collect():  # a row per file
            found[_local_path(row[_FILE])][index] = row["count"]
    return [(path, held, may_hold) for path, (held, may_hold) in sorted(found.items())]


def _keys_as_stored(spark: SparkSession, storage: WarehouseStorage, config: TableConfig, asset: str, files: list[str]) -> DataFrame:
    """Every row of the asset's data ``files`` as its ``key_hash``, its key columns (NULL where a file does
    not store them with their configured types) and its file. Rejects: the key parsed from the raw record."""
    columns = key_columns(config)
    stores_keys = {path: _stores_keys(storage.parquet_schema(path), columns) for path in files}
    with_keys = [path for path in files if stores_keys[path]]
    without_keys = [path for path in files if not stores_keys[path]]
    parts = []
    if with_keys:
        schema = ", ".join([f"`{KEY_HASH}` string", *(f"`{name}` {spark_type}" for name, spark_type in columns)])
        parts.append(spark.read.schema(schema).parquet(*with_keys))
    if without_keys:
        read = spark.read.schema(StructType([StructField(KEY_HASH, StringType())])).parquet(*without_keys)
        parts.append(read.withColumns({name: F.lit(None).cast(spark_type) for name, spark_type in columns}))
    # The file of each row is taken before the union, where a scan's metadata column resolves.
    parts = [part.withColumn(_FILE, F.col("_metadata.file_path")) for part in parts]
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def _stores_keys(arrow_schema, columns: list[tuple[str, str]]) -> bool:
    """Whether a Parquet file's schema (its footer's) holds every key column with its configured type."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(arrow_schema.remove_metadata(), prefer_timestamp_ntz=True)
    stored = {field.name: field.dataType.simpleString() for field in schema.fields}
    return all(stored.get(name) == spark_type for name, spark_type in columns)


def _state_rows(storage: WarehouseStorage, table: str, days: list[str]) -> dict[str, int]:
    """Rows of the state as of each of ``days`` that can still be read (retention may have dropped a base)."""
    rows = {}
    for day in sorted(set(days)):
        try:
            rows[day] = state_rows(storage, table, CURRENT, day)
        except MissingPartitionError:
            continue
    return rows


def _rows_of_erased_keys(
    spark, storage: WarehouseStorage, config: TableConfig, asset: str, dates: list[str], erased: DataFrame, for_rejects: DataFrame
):
    """Per date: rows of erased keys; rejects that may hold one and cannot be checked; rows of erased keys
    by operation (hash_join_classification only). One scan of the key column over every date of the asset
    (rejects: of the raw record, matched by :func:`reject_holds_key` with ``for_rejects``)."""
    if asset == REJECTS:
        frame = _rejects_parsed(storage.read(spark, config.name, asset, dates, schema=StructType([StructField(RAW_RECORD, StringType())])), config)
        columns = key_columns(config)
        found: list[dict[str, int]] = []
        for condition in (reject_holds_key(columns, _KEY_PREFIX), reject_may_hold_key(columns, _KEY_PREFIX, reject_separator(config))):
            matched = frame.join(F.broadcast(for_rejects), on=condition, how="left_semi").groupBy(BUSINESS_DATE).count()
            found.append({str(row[BUSINESS_DATE]): row["count"] for row in matched.collect()})  # a row per date
        return defaultdict(int, found[0]), found[1], {}
    fields = [StructField(KEY_HASH, StringType())]
    if asset == CLASSIFICATION:
        fields.append(StructField(OPERATION, StringType()))
    frame = storage.read(spark, config.name, asset, dates, schema=StructType(fields))
    marked = frame.join(F.broadcast(erased.withColumn(_ERASED, F.lit(True))), on=KEY_HASH, how="left")
    grouping = [BUSINESS_DATE, OPERATION] if asset == CLASSIFICATION else [BUSINESS_DATE]
    counts = marked.groupBy(*grouping).agg(F.count_if(F.col(_ERASED)).alias("erased"))
    hits: dict[str, int] = defaultdict(int)
    unverifiable: dict[str, int] = {}
    by_operation: dict[str, dict[str, int]] = defaultdict(dict)
    for row in counts.collect():  # a row per date (and operation)
        day = str(row[BUSINESS_DATE])
        hits[day] += row["erased"]
        if asset == CLASSIFICATION and row["erased"]:
            by_operation[day][row[OPERATION]] = row["erased"]
    return hits, unverifiable, dict(by_operation)


def _same_schema(storage: WarehouseStorage, table: str, asset: str, dates: list[str]) -> list[list[str]]:
    """``dates`` in groups stored with one schema (a schema change splits them), each rewritten in one write."""
    groups: dict[str, list[str]] = defaultdict(list)
    for day in dates:
        groups[storage.stored_schema(table, asset, day).json()].append(day)
    return list(groups.values())


def _rewrite_without(
    spark, storage: WarehouseStorage, config: TableConfig, asset: str, dates: list[str], erased: DataFrame, for_rejects: DataFrame
) -> None:
    """Commit ``dates`` of the asset again without the erased keys' rows, with the schema they were stored
    with (its metadata included: current_table's record of what its hashes cover)."""
    table = config.name
    schema = storage.stored_schema(table, asset, dates[0])
    stored = storage.read(spark, table, asset, dates, schema=schema)
    if asset == REJECTS:
        # The rejects holding a key (reject_holds_key: its parsed key, or a CSV line's fields) go.
        holds = reject_holds_key(key_columns(config), _KEY_PREFIX)
        kept = _rejects_parsed(stored, config).join(F.broadcast(for_rejects), on=holds, how="left_anti")
        kept = kept.drop(RAW_KEY_HASH, RAW_FIELDS)
    else:
        kept = without(stored, erased)
    # In the Iceberg table's column order (Spark's Iceberg writer refuses a frame whose columns are ordered otherwise).
    ordered = [f.name for f in storage.tables.load(table, asset).schema().fields if f.name in {*schema.names, BUSINESS_DATE}]
    rest = [name for name in [*schema.names, BUSINESS_DATE] if name not in ordered]
    storage.write(kept.select(*ordered, *rest), table, asset, dates)


def _local_path(uri: str) -> str:
    """A file path as Spark's ``_metadata.file_path`` gives it (``file:/...`` or ``file:///...``), as a local path."""
    if uri.startswith("file:"):
        uri = "/" + uri[len("file:"):].lstrip("/")
    return unquote(uri)
