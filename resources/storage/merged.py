"""A table's state as one Iceberg table changed by each date's changes, with a tag per business date
(issue 34, point 3; the layout and its figures: ``docs/design/iceberg-current-table.md``).

Where a snapshot table stores the whole state once per date, this stores it once: each date's run
applies the rows of the keys it touched with one ``MERGE`` (merge-on-read: a small data file and
position deletes, not a rewrite), then tags the snapshot with the date. The state as of D is the
table at tag D. Each row keeps the operation of the date that last touched it, ``last_operation``,
and that date, ``operation_date``; as of D a row's ``operation`` is its last one when D touched it,
and otherwise the operation of a key D did not touch (N after a full load, X after a delta or change
set): the labels a snapshot of D holds. The stored column is not named ``operation`` because it is not
D's label: a reader of the raw table at a tag (Trino, DuckDB, pyiceberg, which read no view of the
project's) would take it for one. A table written before the column had this name keeps ``operation``
(:meth:`MergedStates.operation_column`).

A date can also replace the whole state (the table's first date, or a date that changed most rows):
one overwrite, tagged the same way. The tables are partitioned by ``bucket(N, key_hash)``, so an
erase finds a key's files by its bucket. Nothing here knows Dagster; the caller holds the table's
writer lock.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import date
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_assets.core.capture.changes import DELETE, OPERATION
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.hashing import KEY_HASH
from cdc_assets.core.views.scd2 import Dialect, date_literal, quote_identifier
from resources.storage.lake import CATALOG_NAME, table_identifier
from resources.storage.tables import (
    DROPPED_DATES, TABLE_PROPERTIES, VERSION_AS_OF, LakeTables, create_table, hand_over, project_columns, release_hand_over, staging_record,
)

# The business date whose run set a row's ``last_operation``.
OPERATION_DATE = "operation_date"
# The stored operation of a row: what the date of ``operation_date`` did to its key, which readers label
# as of a date (label_as_of). Tables written before the name (December 2026) store it as ``operation``.
LAST_OPERATION = "last_operation"
# Buckets of ``key_hash``: a bucket's files hold the keys an erase must rewrite.
DEFAULT_BUCKETS = 16
# A MERGE adds rows and position deletes; an erase's DELETE must rewrite the files holding the key.
STATE_TABLE_PROPERTIES = {
    # Not write.spark.accept-any-schema: with it, Spark 4.0 resolves no column of the table in a MERGE
    # ("UNRESOLVED_COLUMN ... Did you mean `t`.`key_hash`"); a new column is added before the MERGE.
    **{key: value for key, value in TABLE_PROPERTIES.items() if key != "write.spark.accept-any-schema"},
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "copy-on-write",
    # What makes the table a merged state to the project's readers (WarehouseStorage dispatches on it).
    "cdc.state-layout": "merged",
}
LAYOUT_PROPERTY = "cdc.state-layout"
# The operation of a row a date did not touch (N after a full load, X otherwise): a reader without the
# table's config labels a date's rows with it.
UNTOUCHED_PROPERTY = "cdc.untouched-operation"
# + a business date: the project's record of the Spark schema (with its columns' hash spec) of that date.
SCHEMA_PROPERTY = "cdc.schema."
# What a date's commit stored: "full" (the whole state) or "changes" (a MERGE), in its snapshot summary.
STORED_AS = "cdc.stored-as"
# Spark's session conf that puts a key into the summary of the snapshots a SQL statement commits.
_SNAPSHOT_PROPERTY_CONF = "spark.sql.iceberg.snapshot-property."


class StateOrderError(RuntimeError):
    """A date applied out of order: the table's newest date is not the date before."""


@dataclass
class MergedStates:
    """The merged state tables of the warehouse whose :class:`LakeTables` is ``tables``."""

    tables: LakeTables
    buckets: int = DEFAULT_BUCKETS
    # The layout of each table found written: a table keeps it for life (a write of the other layout is
    # refused, WarehouseStorage.write_state), so it is read once, not at every step of a date (a catalog
    # request each on a REST catalog). A table not written yet is looked up again.
    _layouts: dict[tuple[str, str], bool] = dataclass_field(default_factory=dict, repr=False)

    # -- what is stored ---------------------------------------------------------------------------------
    def holds(self, table: str, asset: str) -> bool:
        """Whether the asset is stored as a merged state (its table says so)."""
        return bool(self.layout(table, asset))

    def layout(self, table: str, asset: str) -> bool | None:
        """Whether the asset's table is a merged state; None when there is no table yet (one catalog load)."""
        if (table, asset) not in self._layouts:
            loaded = self.tables.load(table, asset)
            if loaded is None:
                return None
            self._layouts[(table, asset)] = loaded.properties.get(LAYOUT_PROPERTY) == "merged"
        return self._layouts[(table, asset)]

    def stored(self, table: str, asset: str) -> dict[str, str]:
        """Every date the table holds a state of (a tag) and the id of the project's schema record of it."""
        loaded = self.tables.load(table, asset)
        if loaded is None:
            return {}
        return {day: loaded.properties.get(f"{SCHEMA_PROPERTY}{day}", "") for day in self._tags(table, asset)}

    def summary(self, table: str, asset: str, day: str) -> dict[str, str]:
        """The snapshot summary of the tag ``day`` (after an erase: the erase's rewrite, without the date's figures)."""
        loaded = self.tables.load(table, asset)
        snapshot = None if loaded is None else self.tag_snapshot(table, asset, day)
        if snapshot is None:
            return {}
        return dict(loaded.snapshot_by_id(snapshot).summary.additional_properties)

    def dates(self, table: str, asset: str) -> list[str]:
        """The business dates the table holds a state of (its tags), oldest first."""
        return sorted(self._tags(table, asset))

    def tag_snapshot(self, table: str, asset: str, day: str) -> int | None:
        """The id of the snapshot tagged ``day``, or None."""
        return self._tags(table, asset).get(day)

    def rows(self, table: str, asset: str, day: str) -> int:
        """Rows of the state as of ``day``, without a scan of its rows: the rows of the tag's data files
        (its snapshot summary) less the rows its position deletes mask (one delete masks one row; no
        equality deletes). Without deletes that is the summary alone; with them, the delete files' column
        ``file_path`` is read (they are small), because a rewrite can leave a delete whose data file it
        replaced (a dangling delete, seen after an erase's rewrite with the 1.11 runtime): counted by the
        summary, it masks nothing."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        loaded = self.tables.load(table, asset)
        snapshot = self.tag_snapshot(table, asset, day)
        if loaded is None or snapshot is None:
            raise KeyError(f"{table}/{asset}: no state of {day} is stored")
        summary = loaded.snapshot_by_id(snapshot).summary.additional_properties
        records = int(summary.get("total-records", 0))
        if not int(summary.get("total-position-deletes", 0)):
            return records
        live: set[str] = set()
        deletes: set[str] = set()
        for task in loaded.scan(snapshot_id=snapshot).plan_files():
            live.add(task.file.file_path)
            deletes.update(delete.file_path for delete in task.delete_files)
        targets = pa.array(sorted(live), pa.string())
        masked = 0
        for path in deletes:
            with loaded.io.new_input(path).open() as stream:
                paths = pq.read_table(stream, columns=["file_path"]).column("file_path")
            masked += pc.sum(pc.is_in(paths, value_set=targets)).as_py() or 0
        return records - masked

    def data_files(self, table: str, asset: str) -> list[str]:
        """Every data file a tag or ``main`` reads, as Iceberg names it: the files an erase must leave without
        the keys. A file a position delete masks rows of is one of them, its masked rows included."""
        loaded = self.tables.load(table, asset)
        if loaded is None:
            return []
        snapshots = {ref.snapshot_id for ref in loaded.metadata.refs.values()}
        return sorted({task.file.file_path for snapshot in snapshots for task in loaded.scan(snapshot_id=snapshot).plan_files()})

    def bytes(self, table: str, asset: str, day: str) -> int:
        """Bytes of the data and delete files the state as of ``day`` reads (its tag's snapshot)."""
        loaded = self.tables.load(table, asset)
        snapshot = None if loaded is None else self.tag_snapshot(table, asset, day)
        if snapshot is None:
            return 0
        return sum(
            stored.file_size_in_bytes
            for task in loaded.scan(snapshot_id=snapshot).plan_files()
            for stored in (task.file, *task.delete_files)
        )

    def bytes_written(self, table: str, asset: str, day: str) -> int:
        """Bytes of the files the commit of ``day``'s tag added (data and position deletes): what the date
        wrote, from the snapshot summary."""
        return int(self.summary(table, asset, day).get("added-files-size", 0))

    def operations(self, table: str, asset: str, day: str):
        """The ``operation`` of every row of the state as of ``day``, labelled as of the date, as an Arrow
        array read by pyiceberg in this process (no Spark; two columns of the tag's files)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        loaded = self.tables.load(table, asset)
        snapshot = self.tag_snapshot(table, asset, day)
        stored = stored_operation_column(loaded.schema().column_names)
        rows = loaded.scan(snapshot_id=snapshot, selected_fields=(stored, OPERATION_DATE)).to_arrow()
        on_day = pc.equal(rows.column(OPERATION_DATE), pa.scalar(date.fromisoformat(day), pa.date32()))
        labelled = pc.if_else(pc.fill_null(on_day, False), rows.column(stored), pa.scalar(self.untouched(table, asset)))
        return labelled.combine_chunks() if rows.num_rows else pa.array([], pa.string())

    def operation_column(self, table: str, asset: str) -> str:
        """The table's stored operation column: ``last_operation``, or ``operation`` in a table written
        before that name, which keeps it (a rename would not reach its tags: Spark, Trino and pyiceberg
        read a tag with its snapshot's schema). A table not written yet gets ``last_operation``."""
        loaded = self.tables.load(table, asset)
        return stored_operation_column([] if loaded is None else loaded.schema().column_names)

    def _tags(self, table: str, asset: str) -> dict[str, int]:
        """The dates this run sees -> the snapshot of each date's state: the published dates (main's date
        tags) under the dates the run's staging branch wrote (a range run's earlier dates, the dates its
        checks read), less those the branch dropped. A reader without a branch sees the tags alone."""
        written, dropped = self.tables.branch_dates(table, asset)
        published = {day: snapshot for day, snapshot in self.tables.date_tags(table, asset).items() if day not in dropped}
        return {**published, **written}

    def _staging(self, spark: SparkSession, table: str, asset: str) -> dict[str, str] | None:
        """When this run stages its writes: make its branch (at main) and return what each staged commit
        records (``STAGED_FROM``); None when it writes to main."""
        if not (self.tables.stage_writes and self.tables.branch is not None):
            return None
        self.tables.make_branch(spark, table, asset)
        loaded = self.tables.load(table, asset)
        return staging_record(loaded, loaded.snapshot_by_name(self.tables.branch))

    def _target(self, table: str, asset: str, staging: dict[str, str] | None) -> str:
        """The identifier a date's commit writes: the run's staging branch while staging, else the table (main)."""
        identifier = table_identifier(table, asset)
        return identifier if staging is None else f"{identifier}.`branch_{self.tables.branch}`"

    # -- writing -----------------------------------------------------------------------------------------
    def apply_changes(
        self, changes: DataFrame, table: str, asset: str, day: str, properties: dict[str, str], sid: str = "", untouched: str = ""
    ) -> int:
        """Apply date ``day``'s changes and tag the result ``day``; returns the tagged snapshot's id.

        ``changes`` holds one row per key the date touched, with the state's columns and ``operation``:
        I, U and N rows are upserted with ``operation_date`` = ``day`` (``operation`` stored as
        ``last_operation``); a D row deletes its key. The
        table must hold the state of the date before ``day`` as its newest tag; a re-run of its newest
        date first sets the table back to the tag before it. ``properties`` go into the snapshot summary.
        """
        spark = self.tables.session_for(changes.sparkSession)
        identifier = table_identifier(table, asset)
        base = self._base_for(table, asset, day, ignoring=properties.get(DROPPED_DATES, "").split(","))
        if base is None:
            raise StateOrderError(f"{table}/{asset}: no state before {day} to apply its changes to; write the whole state")
        staging = self._staging(spark, table, asset)
        self._reset_to(spark, table, asset, base, staging)
        properties = {**properties, **(staging or {})}
        target = self._target(table, asset, staging)
        source = f"cdc_changes_{table}_{asset}_{day.replace('-', '_')}"
        changes, hop = hand_over(changes, spark)
        stored = self.operation_column(table, asset)
        dated = changes.drop(BUSINESS_DATE).withColumnRenamed(OPERATION, stored).withColumn(OPERATION_DATE, F.lit(day).cast("date"))
        dated = self._add_columns(spark, identifier, dated)
        self._describe_date(spark, identifier, day, sid, untouched)
        dated.createOrReplaceTempView(source)
        columns = [name for name in dated.columns]
        # Aliases no namespace is likely to be named (``t`` was: the table ``lake.t.current_table``).
        assignments = ", ".join(f"cdc_state.`{name}` = cdc_change.`{name}`" for name in columns)
        listed = ", ".join(f"`{name}`" for name in columns)
        values = ", ".join(f"cdc_change.`{name}`" for name in columns)
        statement = (
            f"MERGE INTO {target} cdc_state USING {source} cdc_change ON cdc_state.`{KEY_HASH}` = cdc_change.`{KEY_HASH}` "
            f"WHEN MATCHED AND cdc_change.`{stored}` = '{DELETE}' THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {assignments} "
            f"WHEN NOT MATCHED AND cdc_change.`{stored}` <> '{DELETE}' THEN INSERT ({listed}) VALUES ({values})"
        )
        try:
            self._with_snapshot_properties(spark, properties, lambda: spark.sql(statement).collect())
        finally:
            spark.catalog.dropTempView(source)
            release_hand_over(spark, hop)
        return self._tag_head(spark, table, asset, day, staging)

    def replace_state(
        self, state: DataFrame, table: str, asset: str, day: str, properties: dict[str, str], sid: str = "", untouched: str = ""
    ) -> int:
        """Replace the whole table with ``state`` (the state as of ``day``, its rows' operations as of
        ``day``) in one commit and tag it ``day``: the table's first date, or a date that changed most of
        its rows. Returns the tagged snapshot's id."""
        spark = self.tables.session_for(state.sparkSession)
        identifier = table_identifier(table, asset)
        state, hop = hand_over(state, spark)
        try:
            stored = self.operation_column(table, asset)
            dated = state.drop(BUSINESS_DATE).withColumnRenamed(OPERATION, stored).withColumn(OPERATION_DATE, F.lit(day).cast("date"))
            if self.tables.load(table, asset) is None:
                self._create(spark, table, asset, dated)
            else:
                dated = self._add_columns(spark, identifier, dated)
                # A column the table has and the state lacks (one a later date added) is NULL in its rows.
                missing = [f for f in spark.table(identifier).schema.fields if f.name not in dated.columns]
                if missing:  # Spark Connect refuses withColumns of no column
                    dated = dated.withColumns({f.name: F.lit(None).cast(f.dataType) for f in missing})
            self._describe_date(spark, identifier, day, sid, untouched)
            staging = self._staging(spark, table, asset)
            writer = dated.writeTo(self._target(table, asset, staging))
            for key, value in {**properties, **(staging or {})}.items():
                writer = writer.option(f"snapshot-property.{key}", value)
            writer.overwrite(F.lit(True))
        finally:
            release_hand_over(spark, hop)
        return self._tag_head(spark, table, asset, day, staging)

    def _base_for(self, table: str, asset: str, day: str, ignoring: Collection[str] = ()) -> str | None:
        """The tag a date's changes apply to: the newest date before ``day``, which must be the date
        before it when ``day`` is new, or ``day``'s own predecessor when ``day`` is the newest (a re-run).
        ``ignoring``: later dates the date's own commit drops (a staged re-run's)."""
        stored = [stored_day for stored_day in self.dates(table, asset) if stored_day not in ignoring]
        earlier = [stored_day for stored_day in stored if stored_day < day]
        later = [stored_day for stored_day in stored if stored_day > day]
        if later:
            raise StateOrderError(
                f"{table}/{asset}: dates after {day} are stored ({', '.join(later)}); their states were computed from {day}'s"
            )
        return earlier[-1] if earlier else None

    def _reset_to(self, spark: SparkSession, table: str, asset: str, day: str, staging: dict[str, str] | None) -> None:
        """Point the table's ``main`` (while staging: the run's branch) at the state of ``day`` unless it is
        there already (a re-run of the date after, or a run killed between its MERGE and its tag)."""
        snapshot = self.tag_snapshot(table, asset, day)
        if snapshot is None:
            raise StateOrderError(f"{table}/{asset}: no state of {day} is stored (no tag {day}) to set the table back to")
        loaded = self.tables.load(table, asset)
        head = loaded.current_snapshot() if staging is None else loaded.snapshot_by_name(self.tables.branch)
        if head is not None and head.snapshot_id == snapshot:
            return
        if staging is None:
            self.tables.set_current_snapshot(spark, table, asset, snapshot)
        else:  # the branch's next commit records the main it was made from (``staging``), not the published date's
            spark.sql(f"ALTER TABLE {table_identifier(table, asset)} CREATE OR REPLACE BRANCH `{self.tables.branch}` AS OF VERSION {snapshot}")

    def _tag_head(self, spark: SparkSession, table: str, asset: str, day: str, staging: dict[str, str] | None) -> int:
        """Tag the date's commit with the date, unless staged: publication tags it (``LakeTables.publish``).
        Returns the commit's snapshot."""
        loaded = self.tables.load(table, asset)
        if staging is not None:
            return loaded.snapshot_by_name(self.tables.branch).snapshot_id
        snapshot = loaded.current_snapshot().snapshot_id
        spark.sql(f"ALTER TABLE {table_identifier(table, asset)} CREATE OR REPLACE TAG `{day}` AS OF VERSION {snapshot}")
        return snapshot

    @staticmethod
    def _describe_date(spark: SparkSession, identifier: str, day: str, sid: str, untouched: str) -> None:
        """Record, before the date's commit, what a reader needs beside its rows: the project's schema
        record of the date and the operation of untouched rows (table properties: a metadata commit)."""
        described = {key: value for key, value in ((f"{SCHEMA_PROPERTY}{day}", sid), (UNTOUCHED_PROPERTY, untouched)) if value}
        if described:
            listed = ", ".join(f"'{key}'='{value}'" for key, value in described.items())
            spark.sql(f"ALTER TABLE {identifier} SET TBLPROPERTIES ({listed})")

    @staticmethod
    def _add_columns(spark: SparkSession, identifier: str, frame: DataFrame) -> DataFrame:
        """Add to the table the columns of ``frame`` it lacks, and widen those ``frame`` holds wider
        (Iceberg schema evolution: no data is rewritten; rows written before read an added column as NULL);
        returns ``frame``. The table takes no ``mergeSchema`` write: with ``accept-any-schema``, Spark 4.0
        resolves no column of it in a MERGE.

        ``frame`` reads earlier snapshots of the table (the previous state) lazily, planned with their
        types: after a widening Iceberg refuses to plan that read again (``Cannot project long to ...
        IntegerType``), so a frame that needs one is computed first (a local checkpoint; such dates are rare).
        """
        present = {field.name.lower(): field.dataType for field in spark.table(identifier).schema.fields}
        added = [field for field in frame.schema.fields if field.name.lower() not in present]
        widened = [field for field in frame.schema.fields if present.get(field.name.lower(), field.dataType) != field.dataType]
        if widened:
            frame = frame.localCheckpoint()
        for field in added:
            spark.sql(f"ALTER TABLE {identifier} ADD COLUMN `{field.name}` {field.dataType.simpleString()}")
        for field in widened:
            # int to bigint, float to double, a decimal's precision: Iceberg's type promotion, no data
            # rewritten; Iceberg refuses any other change of type.
            spark.sql(f"ALTER TABLE {identifier} ALTER COLUMN `{field.name}` TYPE {field.dataType.simpleString()}")
        return frame

    def _create(self, spark: SparkSession, table: str, asset: str, frame: DataFrame) -> None:
        create_table(spark, table, asset, frame, f"bucket({self.buckets}, `{KEY_HASH}`)", STATE_TABLE_PROPERTIES)

    def erase(self, spark: SparkSession, table: str, asset: str, key_hashes: list[str], properties: dict[str, str]) -> dict[str, int]:
        """Remove the keys ``key_hashes`` from the table's current state and from the state of every
        tagged date, so that no data file any tag or ``main`` reads holds them; returns the rows removed
        per date (``main`` under the key ``"main"``). Then expire every snapshot no tag or ``main``
        needs and delete every file no metadata names: the replaced files, which held the keys.

        A tag is re-pointed to a copy of its snapshot without the keys, made on a branch: a DELETE
        (copy-on-write: the files where a key is live are rewritten) and a rewrite of the keys'
        buckets (``rewrite-all``), which also rewrites the files where merge-on-read only masked a
        key's older version with a position delete. Holds no lock: the caller holds the table's."""
        spark = self.tables.session_for(spark)
        identifier = table_identifier(table, asset)
        listed = ", ".join(f"'{key_hash}'" for key_hash in sorted(set(key_hashes)))
        where = f"`{KEY_HASH}` IN ({listed})"
        removed = {}

        def erase_on(ref: str | None) -> int:
            target = identifier if ref is None else f"{identifier}.`branch_{ref}`"
            held = _first_value(spark.sql(f"SELECT count(*) FROM {target} WHERE {where}"))
            self._with_snapshot_properties(spark, properties, lambda: spark.sql(f"DELETE FROM {target} WHERE {where}").collect())
            branch = "" if ref is None else f", branch => '{ref}'"
            # The filter is a string argument holding quoted hashes: a double-quoted literal.
            spark.sql(
                f"CALL {CATALOG_NAME}.system.rewrite_data_files(table => '{table_identifier(table, asset)}'{branch}, "
                f'where => "{KEY_HASH} IN ({listed})", options => map(\'rewrite-all\', \'true\'))'
            ).collect()
            return held

        for day, snapshot in sorted(self.tables.date_tags(table, asset).items()):
            branch = f"cdc_erase_{day.replace('-', '_')}"
            spark.sql(f"ALTER TABLE {identifier} CREATE OR REPLACE BRANCH `{branch}` AS OF VERSION {snapshot}")
            try:
                removed[day] = erase_on(branch)
                head = _first_value(spark.sql(f"SELECT snapshot_id FROM {identifier}.refs WHERE name = '{branch}'"))
                spark.sql(f"ALTER TABLE {identifier} CREATE OR REPLACE TAG `{day}` AS OF VERSION {head}")
            finally:
                spark.sql(f"ALTER TABLE {identifier} DROP BRANCH IF EXISTS `{branch}`")
        removed["main"] = erase_on(None)
        self.tables.expire_all_but_current(spark, table, asset)
        return removed

    def drop_dates(self, spark: SparkSession, table: str, asset: str, days: list[str]) -> list[str]:
        """Forget the states of ``days`` (their tags); returns the tags dropped. Their files go when the
        snapshots only they kept expire (``retention.snapshot_days``): retention is tag removal."""
        spark = self.tables.session_for(spark)
        dropped = [day for day in sorted(days) if day in self._tags(table, asset)]
        for day in dropped:
            spark.sql(f"ALTER TABLE {table_identifier(table, asset)} DROP TAG IF EXISTS `{day}`")
        if dropped:
            listed = ", ".join(f"'{SCHEMA_PROPERTY}{day}'" for day in dropped)
            spark.sql(f"ALTER TABLE {table_identifier(table, asset)} UNSET TBLPROPERTIES IF EXISTS ({listed})")
        return dropped

    def compact(self, spark: SparkSession, table: str, asset: str) -> int:
        """Rewrite ``main``'s data files that have position deletes, with the deletes applied (with hashed
        keys a MERGE's deletes reach every bucket, so this is a copy of the table); returns the data files
        rewritten. Tags keep the files they read until they are dropped and expired."""
        spark = self.tables.session_for(spark)
        rewritten = _first_value(spark.sql(
            f"CALL {CATALOG_NAME}.system.rewrite_data_files(table => '{table_identifier(table, asset)}', "
            "options => map('delete-file-threshold', '1', 'remove-dangling-deletes', 'true'))"
        ), "rewritten_data_files_count")
        # The rewrite leaves a delete file whose data file it replaced (a dangling delete, seen with the
        # 1.11 runtime despite ``remove-dangling-deletes``): this removes it, so readers skip no deletes.
        spark.sql(
            f"CALL {CATALOG_NAME}.system.rewrite_position_delete_files(table => '{table_identifier(table, asset)}', "
            "options => map('rewrite-all', 'true'))"
        ).collect()
        return int(rewritten)

    def duckdb_sql(self, table: str, asset: str, day: str, untouched: str) -> str:
        """A DuckDB query of :meth:`state` (the state as of ``day`` with its labels, without
        ``operation_date``): ``iceberg_scan`` of the metadata file committed now, at the tag's snapshot,
        so it reads that snapshot whatever is committed meanwhile. The caller loads DuckDB's iceberg
        extension (``cdc_assets.engines.duckdb_iceberg``)."""
        loaded = self.tables.load(table, asset)
        snapshot = self.tag_snapshot(table, asset, day)
        if loaded is None or snapshot is None:
            raise KeyError(f"{table}/{asset}: no state of {day} is stored")
        metadata = "'" + loaded.metadata_location.replace("'", "''") + "'"
        duck = Dialect.duckdb
        stored = stored_operation_column(loaded.schema().column_names)
        if stored not in loaded.schema().column_names:  # a state without operations of its own
            return f"SELECT * EXCLUDE ({quote_identifier(OPERATION_DATE, duck)}) FROM iceberg_scan({metadata}, snapshot_from_id => {snapshot})"
        labelled = f"{operation_as_of_sql(day, untouched, duck, stored)} AS {quote_identifier(OPERATION, duck)}"
        if stored == OPERATION:
            stars = f"* EXCLUDE ({quote_identifier(OPERATION_DATE, duck)}) REPLACE ({labelled})"
        else:
            stars = f"* EXCLUDE ({quote_identifier(OPERATION_DATE, duck)}, {quote_identifier(stored, duck)}), {labelled}"
        return f"SELECT {stars} FROM iceberg_scan({metadata}, snapshot_from_id => {snapshot})"

    @staticmethod
    def _with_snapshot_properties(spark: SparkSession, properties: dict[str, str], statement):
        """Run ``statement`` with ``properties`` in the summary of the snapshot it commits (a SQL
        statement takes no write options: Iceberg reads them from the session conf)."""
        keys = [f"{_SNAPSHOT_PROPERTY_CONF}{key}" for key in properties]
        for key, value in zip(keys, properties.values()):
            spark.conf.set(key, value)
        try:
            return statement()
        finally:
            for key in keys:
                spark.conf.unset(key)

    # -- reading: no lock, no write -------------------------------------------------------------------------
    def state(self, spark: SparkSession, table: str, asset: str, day: str, untouched: str) -> DataFrame:
        """The state as of ``day`` (the table at tag ``day``) with ``day``'s operations: a row the date
        touched keeps its stored operation, any other row is ``untouched`` (N after a full load, X
        otherwise). Without ``operation_date``; lazily, pinned to the tag's snapshot."""
        spark = self.tables.session_for(spark)
        snapshot = self.tag_snapshot(table, asset, day)
        if snapshot is None:
            raise KeyError(f"{table}/{asset}: no state of {day} is stored (stored: {', '.join(self.dates(table, asset)) or 'none'})")
        frame = spark.read.option(VERSION_AS_OF, str(snapshot)).table(table_identifier(table, asset))
        return label_as_of(frame, day, untouched)


    def read(self, spark: SparkSession, table: str, asset: str, days: list[str], schema: StructType) -> DataFrame:
        """The states as of ``days`` as one DataFrame with a ``business_date`` column: what a table stored
        as a snapshot per date holds for them. Each date reads its tag, labelled (:meth:`state`), with
        ``schema``'s columns (a column a date's tag lacks reads as NULL)."""
        untouched = self.untouched(table, asset)
        parts = []
        for day in days:
            frame = self.state(spark, table, asset, day, untouched)
            parts.append(frame.select(*project_columns(frame, schema), F.lit(day).cast("date").alias(BUSINESS_DATE)))
        return reduce(DataFrame.unionByName, parts)

    def touched(self, spark: SparkSession, table: str, asset: str, day: str) -> DataFrame:
        """The rows date ``day`` wrote (its I, U and stored N rows, as of its tag, with their stored
        operation as ``operation``), with a ``business_date`` column: what a date's changes are once applied."""
        spark = self.tables.session_for(spark)
        snapshot = self.tag_snapshot(table, asset, day)
        frame = spark.read.option(VERSION_AS_OF, str(snapshot)).table(table_identifier(table, asset))
        frame = frame.where(F.col(OPERATION_DATE) == F.lit(day).cast("date")).drop(OPERATION_DATE)
        return frame.withColumnRenamed(self.operation_column(table, asset), OPERATION).withColumn(BUSINESS_DATE, F.lit(day).cast("date"))

    def untouched(self, table: str, asset: str) -> str:
        """The operation a date's untouched rows read with (N after a full load, X otherwise)."""
        loaded = self.tables.load(table, asset)
        return "" if loaded is None else loaded.properties.get(UNTOUCHED_PROPERTY, "")


def label_as_of(frame: DataFrame, day: str, untouched: str) -> DataFrame:
    """``frame`` (a merged state's rows) with the operations as of ``day`` as ``operation``, where its stored
    one (``last_operation``, or ``operation`` in an older table) was: the stored one on rows whose
    ``operation_date`` is ``day``, ``untouched`` on every other; without ``operation_date``."""
    stored = stored_operation_column(frame.columns)
    if stored not in frame.columns:  # a state without operations of its own
        return frame.drop(OPERATION_DATE)
    on_day = F.col(OPERATION_DATE) == F.lit(day).cast("date")
    labelled = F.when(on_day, F.col(stored)).otherwise(F.lit(untouched)).alias(OPERATION)
    return frame.select(*(labelled if name == stored else F.col(name) for name in frame.columns if name != OPERATION_DATE))


def stored_operation_column(names: Collection[str]) -> str:
    """Which of a merged state's columns ``names`` holds each row's stored operation: ``operation`` in a
    table written before ``last_operation`` was its name, else ``last_operation`` (also for a table not
    written yet, and for a state with no operations of its own, which has neither)."""
    return OPERATION if OPERATION in names and LAST_OPERATION not in names else LAST_OPERATION


def operation_as_of_sql(day: str, untouched: str, dialect: Dialect | str, stored: str = LAST_OPERATION) -> str:
    """:func:`label_as_of`'s operation in SQL (Spark, Trino or DuckDB): a merged state row's operation as of
    ``day``, from its stored column ``stored`` (:meth:`MergedStates.operation_column`)."""
    if not untouched.isalpha():  # N or X: the one literal put in the SQL text, and the dialects escape quotes differently
        raise ValueError(f"the operation of an untouched row must be a letter such as N or X, not {untouched!r}")
    return (
        f"CASE WHEN {quote_identifier(OPERATION_DATE, dialect)} = {date_literal(day)} "
        f"THEN {quote_identifier(stored, dialect)} ELSE '{untouched}' END"
    )


def _first_value(frame: DataFrame, column: int | str = 0) -> Any:
    """The first row's ``column`` of a query that always returns a row (a count, a ref, a procedure's result)."""
    row = frame.first()
    if row is None:
        raise RuntimeError("the query returned no row")
    return row[column]
