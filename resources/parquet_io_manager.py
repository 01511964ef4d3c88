"""The Parquet IO manager: loads and stores daily partitions through the warehouse storage, and describes them.

Paths, the commit, crash recovery, the writer lock and retention live in :mod:`resources.storage`; this module
only maps Dagster's inputs and outputs onto it and adds the metadata the UI shows (row count, schema,
a preview, the path).
"""


import json
import os
import uuid
from contextlib import nullcontext
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from dagster import (
    AssetKey,
    AssetMaterialization,
    ConfigurableIOManager,
    InitResourceContext,
    InputContext,
    MetadataValue,
    OutputContext,
    ResourceDependency,
    TableColumn,
    TableSchema,
)
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_assets.model.config import CHANGESET_COLUMNS, LoadType, Retention, reserved_name_problem
from cdc_assets.model.masking import ValueMask
from cdc_assets.core.columns import BUSINESS_DATE
from resources.fields import env_or_default, resolved_field, seconds_field
from resources.session.spark_session import side_by_side
from resources.storage.state import read_state
from resources.storage.writes import DatedRows, StateRows
from resources.storage import (
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_WAREHOUSE,
    LOCK_TIMEOUT_ENV,
    LEASE_SECONDS_ENV,
    DEFAULT_LEASE_SECONDS,
    WAREHOUSE_ENV,
    WarehouseStorage,
    as_stored,
    warehouse_location,
)
from resources.storage.lake import CATALOG_SIGNING_NAME_ENV, CATALOG_URI_ENV, CATALOG_WAREHOUSE_ENV, LakeCatalog
from resources.storage.object_store import (
    ACCESS_KEY_ENV,
    DEFAULT_REGION,
    REGION_ENV,
    S3_ENDPOINT_ENV,
    SECRET_KEY_ENV,
    ObjectStore,
)

PREVIEW_ROWS = 5


# The asset definition metadata that makes an asset a state, read through resources/storage/state.py: the
# table's load type, which says what a date did to a key it did not touch.
STATE_LOAD_TYPE = "cdc/state_load_type"
# An asset's definition metadata: the table config's renamed columns as JSON ({new name: [former names]}),
# which a write renames in the asset's Iceberg table first (WarehouseStorage.write).
RENAMED_COLUMNS = "cdc/renamed_columns"
# An asset's definition metadata: every name the table config may store a column under (its columns and
# their former names) as JSON; a stored column of none of them, that the pipeline does not name either,
# was dropped from the config and is dropped from the asset's Iceberg table before a write.
CONFIGURED_COLUMNS = "cdc/configured_columns"
# An asset's definition metadata: the configured columns whose values a preview may show, as JSON
# (cdc_assets/model/masking.py). Without it a preview shows the pipeline's own columns' values only.
SHOWN_COLUMNS = "cdc/shown_columns"


class LazyPartitions(Mapping[str, DataFrame]):
    """``{business_date: DataFrame}`` over stored partitions; a partition is read only when looked up."""

    def __init__(
        self, manager: "PartitionedParquetIOManager", table: str, asset: str, dates: list[str], load_type: LoadType | None = None
    ):
        self._manager, self._table, self._asset, self._dates = manager, table, asset, list(dates)
        self._load_type = load_type  # a state: each date read as the state as of it (resources/storage/state.py)

    def __getitem__(self, business_date: str) -> DataFrame:
        if business_date not in self._dates:
            raise KeyError(business_date)
        if self._load_type is not None:
            return self._manager.read_state(self._table, self._asset, business_date)
        return self._manager.read_partition(self._table, self._asset, business_date)

    def __contains__(self, business_date: object) -> bool:
        return business_date in self._dates  # membership reads nothing

    def __iter__(self) -> Iterator[str]:
        return iter(self._dates)

    def __len__(self) -> int:
        return len(self._dates)

    def read_all(self) -> DataFrame:
        """Every date's rows in one DataFrame with a ``business_date`` column, read in one scan."""
        return self._manager.read_partitions(self._table, self._asset, self._dates)


@dataclass(frozen=True)
class StoredOutput:
    """What :meth:`PartitionedParquetIOManager.store` stored of one output: each date's metadata (the run's
    dates, then any a correction carried forward) and what to say in the run's log. A step that stored its
    outputs itself yields this as an output's value; ``handle_output`` then only describes it."""

    run_dates: list[str]
    metadata: dict[str, dict[str, Any]]
    said: list[str]


def _describe_date(context: OutputContext, run_dates: list[str], day: str, metadata: dict[str, Any]) -> None:
    """The metadata of one date an output wrote: the output's own when the run has one date; a date's
    materialization among the run's; for a date beyond the run's (a correction carried forward) a
    materialization of its own, since Dagster's run does not target it."""
    if day not in run_dates:
        context.log_event(AssetMaterialization(asset_key=context.asset_key, partition=day, metadata=metadata,
                                               description="recomputed by a correction of an earlier date"))
    elif len(run_dates) == 1:
        context.add_output_metadata(metadata)
    else:
        # One materialization per date, each with its own figures.
        context.step_context.add_asset_metadata(metadata, asset_key=context.asset_key, partition_key=day)


class PartitionedParquetIOManager(ConfigurableIOManager):
    """Stores each daily partition of a ``[table, asset]`` asset as a Parquet folder under the warehouse root.

    ``handle_output`` takes :class:`DatedRows` (any number of partitions) or a DataFrame (one
    partition); ``load_input`` returns :class:`LazyPartitions`, or ``None`` when no upstream partition
    exists (the day before ``start_date``). Loading or storing a table's partitions makes the run that
    table's writer (``WarehouseStorage.hold_writer_lock``) until the run ends.

    Its fields (the UI's resource page shows them) say where the warehouse is and how its writers
    behave; definitions.py feeds each from its environment variable when that is set.
    """

    pyspark: ResourceDependency[LazyPySparkResource]
    warehouse_root: str = Field(
        default=DEFAULT_WAREHOUSE,
        description=(
            f"The warehouse ({WAREHOUSE_ENV}): a local or mounted POSIX path, a file:// URI, or s3://bucket/prefix "
            "beside a REST catalog; a relative path is taken from the run's working directory."
        ),
    )
    catalog_uri: str = Field(
        default="",
        description=f"The Iceberg REST catalog's URL ({CATALOG_URI_ENV}); empty: the embedded catalog in the warehouse folder.",
    )
    catalog_warehouse: str = Field(
        default="", description=f"The REST catalog's warehouse ({CATALOG_WAREHOUSE_ENV}), e.g. s3://lake."
    )
    catalog_signing_name: str = Field(
        default="",
        description=(
            f"The AWS SigV4 signing name of the REST catalog's requests ({CATALOG_SIGNING_NAME_ENV}): s3tables for "
            "S3 Tables and SeaweedFS, glue for AWS Glue; empty: unsigned."
        ),
    )
    s3_endpoint: str = Field(
        default="", description=f"The S3 API's URL ({S3_ENDPOINT_ENV}) for a store other than AWS's, e.g. http://127.0.0.1:8333."
    )
    s3_region: str = Field(default=DEFAULT_REGION, description=f"The S3 region ({REGION_ENV}).")
    s3_access_key_id: str = Field(
        default="",
        description=(
            f"The S3 and catalog access key ({ACCESS_KEY_ENV}). Set it from the environment only: empty, every "
            "client takes its keys from its own environment, a profile or an instance role."
        ),
    )
    s3_secret_access_key: str = Field(
        default="",
        description=f"The secret key ({SECRET_KEY_ENV}): from the environment only, never in run config.",
    )
    lock_timeout_seconds: str = Field(
        default=f"{DEFAULT_LOCK_TIMEOUT_SECONDS:g}",
        description=f"How long a run waits for another run's writer lock on a table, in seconds ({LOCK_TIMEOUT_ENV}).",
    )
    writer_lease_seconds: str = Field(
        default=f"{DEFAULT_LEASE_SECONDS:g}",
        description=(
            f"A warehouse in a bucket: how long a run's writer lease on a table lasts unrenewed, in seconds "
            f"({LEASE_SECONDS_ENV}); the run renews it every third. A killed run's lease blocks other hosts that long."
        ),
    )

    _storage: WarehouseStorage | None = PrivateAttr(default=None)

    @classmethod
    def from_environment(cls, pyspark: LazyPySparkResource) -> "PartitionedParquetIOManager":
        """The IO manager with each field fed by its variable (an ``EnvVar`` the UI shows by name) where it
        is set, else the field's default: what the code location and the command-line tools use."""
        return cls(
            pyspark=pyspark,
            warehouse_root=env_or_default(WAREHOUSE_ENV, DEFAULT_WAREHOUSE),
            lock_timeout_seconds=env_or_default(LOCK_TIMEOUT_ENV, f"{DEFAULT_LOCK_TIMEOUT_SECONDS:g}"),
            writer_lease_seconds=env_or_default(LEASE_SECONDS_ENV, f"{DEFAULT_LEASE_SECONDS:g}"),
            catalog_uri=env_or_default(CATALOG_URI_ENV, ""),
            catalog_warehouse=env_or_default(CATALOG_WAREHOUSE_ENV, ""),
            catalog_signing_name=env_or_default(CATALOG_SIGNING_NAME_ENV, ""),
            s3_endpoint=env_or_default(S3_ENDPOINT_ENV, ""),
            s3_region=env_or_default(REGION_ENV, DEFAULT_REGION),
            # Shown by the variable's name only; never a value in run config.
            s3_access_key_id=env_or_default(ACCESS_KEY_ENV, ""),
            s3_secret_access_key=env_or_default(SECRET_KEY_ENV, ""),
        )

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._share_credentials()
        self._storage = self._new_storage(context.run_id or uuid.uuid4().hex)

    def _share_credentials(self) -> None:
        """Hand the key fields to every client of this process the way they all read keys: the process's
        environment (a field fed by the same variable changes nothing). The JVM a run starts inherits them."""
        for name, value in ((ACCESS_KEY_ENV, self.s3_access_key_id), (SECRET_KEY_ENV, self.s3_secret_access_key)):
            resolved = resolved_field(value).strip()
            if resolved and os.environ.get(name) != resolved:
                os.environ[name] = resolved

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._storage is not None:
            self._storage.release()

    @property
    def root(self) -> str:
        """The warehouse folder, as an absolute path."""
        return warehouse_location(resolved_field(self.warehouse_root))

    @property
    def storage(self) -> WarehouseStorage:
        if self._storage is None:  # used outside a run (tests, scripts)
            self._storage = self._new_storage(uuid.uuid4().hex)
        return self._storage

    def lake(self) -> LakeCatalog:
        """The catalog the fields describe."""
        store = ObjectStore(endpoint=resolved_field(self.s3_endpoint).strip(), region=resolved_field(self.s3_region).strip() or DEFAULT_REGION)
        return LakeCatalog(
            root=self.root,
            uri=resolved_field(self.catalog_uri).strip(),
            warehouse=resolved_field(self.catalog_warehouse).strip(),
            signing_name=resolved_field(self.catalog_signing_name).strip(),
            store=store,
        )

    def _new_storage(self, run_id: str) -> WarehouseStorage:
        return WarehouseStorage(
            self.root,
            lake=self.lake(),
            run_id=run_id,
            lock_timeout=seconds_field(self.lock_timeout_seconds, "lock_timeout_seconds", LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT_SECONDS),
            lease_seconds=seconds_field(self.writer_lease_seconds, "writer_lease_seconds", LEASE_SECONDS_ENV, DEFAULT_LEASE_SECONDS),
        )

    def partition_path(self, table: str, asset: str, business_date: str) -> str:
        return self.storage.partition_path(table, asset, business_date)

    # -- reading -------------------------------------------------------------------------------
    def read_partition(self, table: str, asset: str, business_date: str) -> DataFrame:
        return self.storage.read_one(self.pyspark.spark_session, table, asset, business_date)

    def read_partitions(self, table: str, asset: str, business_dates: list[str]) -> DataFrame:
        """Several stored partitions as one DataFrame with a ``business_date`` column, in one scan."""
        return self.storage.read(self.pyspark.spark_session, table, asset, business_dates)

    def read_state(self, table: str, asset: str, business_date: str) -> DataFrame:
        """The state as of the date, whether stored as a snapshot or as a full copy and changes."""
        return read_state(self.storage, self.pyspark.spark_session, table, asset, business_date)

    def row_counts(self, table: str, asset: str, business_dates: list[str]) -> dict[str, int]:
        """Rows per stored partition, from the Parquet footers."""
        return self.storage.row_counts(table, asset, business_dates)

    def load_input(self, context: InputContext) -> LazyPartitions | None:
        table, asset = _table_and_asset(context.asset_key.path)
        if not context.has_asset_partitions:
            raise ValueError(f"{table}/{asset}: this IO manager stores daily partitions only")
        # The step reading a table's partitions is about to write that table's next ones: become
        # its writer before anything is read, so no other run replaces them underneath.
        self.storage.hold_writer_lock(table)
        dates = list(context.asset_partition_keys)
        if not dates:
            return None  # the date before start_date: there is no previous state
        upstream = context.upstream_output.definition_metadata if context.upstream_output is not None else {}
        load_type = upstream.get(STATE_LOAD_TYPE) if upstream else None
        return LazyPartitions(self, table, asset, dates, LoadType(_plain(load_type)) if load_type else None)

    # -- writing -------------------------------------------------------------------------------
    def handle_output(self, context: OutputContext, obj: DataFrame | DatedRows | StateRows | StoredOutput) -> None:
        if not isinstance(obj, StoredOutput):  # a step that stored its outputs side by side hands over what it stored
            with server_loss_explained(self.pyspark):
                obj = self.store(context.asset_key, sorted(context.asset_partition_keys), context.definition_metadata or {}, obj)
        for line in obj.said:
            context.log.info(line)
        for business_date, metadata in obj.metadata.items():
            _describe_date(context, obj.run_dates, business_date, metadata)

    def store_side_by_side(self, outputs: Sequence[tuple[AssetKey, list[str], Mapping[str, Any], DatedRows]]) -> list[StoredOutput]:
        """Store several outputs at once, each ``(asset key, run dates, definition metadata, rows)``, each its
        own table and commit; what each stored, in argument order (the step yields it as the output's value).

        A small date's write is mostly fixed cost (planning, the commit, the catalog), which overlaps across
        tables (``side_by_side``). A failed write is raised once every other has finished: those commit as
        they would have one after another (to the run's staging branch, when it stages). The tables' writer
        locks are taken first, one after another: a lock is the process's, not a thread's.

        When a write changes its table's columns (adds, renames or drops one: a config's schema change), the
        outputs are stored one after another, in argument order: a Spark Connect plan is analyzed again when
        it runs, so a plan reading that table must run before the change, not beside it."""
        for table in dict.fromkeys(_table_and_asset(key.path)[0] for key, *_ in outputs):
            self.storage.hold_writer_lock(table)
        with server_loss_explained(self.pyspark):
            columns = [self._column_changes(key, definition, rows) for key, _, definition, rows in outputs]
            writes = [
                partial(self.store, key, dates, definition, rows, dropped_columns=dropped)
                for (key, dates, definition, rows), (_, dropped) in zip(outputs, columns)
            ]
            if any(added or dropped for added, dropped in columns):
                return [write() for write in writes]
            return side_by_side(*writes)

    def _column_changes(self, asset_key: AssetKey, definition: Mapping[str, Any], obj: DataFrame | DatedRows) -> tuple[bool, list[str]]:
        """Whether writing ``obj`` adds a column to its asset's table (or renames one: the table has its former
        name), and the columns it drops (:meth:`_dropped_from_config`)."""
        table, asset = _table_and_asset(asset_key.path)
        loaded = self.storage.tables.load(table, asset)
        if loaded is None:  # a new table: nothing reads it yet
            return False, []
        frame = obj.frame if isinstance(obj, DatedRows) else obj
        stored = {field.name.lower() for field in loaded.schema().fields}
        configured = json.loads(_plain(definition[CONFIGURED_COLUMNS])) if CONFIGURED_COLUMNS in definition else None
        dropped = self._dropped_from_config(loaded, frame.columns, configured) if configured is not None else []
        return any(name.lower() not in stored for name in frame.columns), dropped

    def store(
        self, asset_key: AssetKey, dates: list[str], definition: Mapping[str, Any], obj: DataFrame | DatedRows | StateRows,
        dropped_columns: list[str] | None = None,
    ) -> StoredOutput:
        """Write one output's rows for the run's ``dates`` (``definition``: its asset's definition metadata);
        what it stored. ``dropped_columns``: the table's columns the config dropped, when the caller found
        them already (None: found here). No Dagster context: a step may store several outputs at once
        (:meth:`store_side_by_side`)."""
        table, asset = _table_and_asset(asset_key.path)
        if isinstance(obj, StateRows):
            return self._store_state(table, asset, dates, obj)
        frame = obj.frame if isinstance(obj, DatedRows) else obj
        if not isinstance(frame, DataFrame) or (not isinstance(obj, DatedRows) and len(dates) != 1):
            raise ValueError(
                f"{table}/{asset}: expected DatedRows for the partitions {dates} (or a DataFrame for a single "
                f"partition), got {type(obj).__name__}"
            )
        said = []
        later = self._later_dates(table, asset, obj.drop_stored_after if isinstance(obj, DatedRows) else None)
        if later:
            said.append(f"{table}/{asset}: this re-run drops {', '.join(later)}, computed from the state it replaces")
        renamed = json.loads(_plain(definition[RENAMED_COLUMNS])) if RENAMED_COLUMNS in definition else None
        configured = json.loads(_plain(definition[CONFIGURED_COLUMNS])) if CONFIGURED_COLUMNS in definition else None
        drop: list[str] = []
        if dropped_columns is not None:
            drop = dropped_columns
        elif configured is not None:
            loaded = self.storage.tables.load(table, asset)
            drop = self._dropped_from_config(loaded, frame.columns, configured) if loaded is not None else []
        carried = list(obj.carried) if isinstance(obj, DatedRows) else []
        if carried:
            said.append(f"{table}/{asset}: this correction also writes {', '.join(carried)}, recomputed from it")
        # A date published by this write (not staged) is tagged with its name for retention.snapshot_days.
        tag_days = obj.retention_snapshot_days if isinstance(obj, DatedRows) else Retention().snapshot_days
        rows_written = self.storage.write(
            frame, table, asset, dates + carried, dropped=later, renamed_from=renamed, drop_columns=drop, tag_days=tag_days,
        )
        stored_schema = as_stored(frame.drop(BUSINESS_DATE).schema)
        mask = ValueMask.for_columns(json.loads(_plain(definition[SHOWN_COLUMNS])) if SHOWN_COLUMNS in definition else ())
        previews = self._previews(table, asset, rows_written) if mask.shows_rows else {day: [] for day in rows_written}
        retention = self._apply_retention(said, table, asset, obj)
        described = {}
        for business_date in dates + carried:
            path = self.partition_path(table, asset, business_date)
            metadata = describe_partition(stored_schema, path, rows_written[business_date], previews[business_date], mask)
            metadata.update(retention)
            if isinstance(obj, DatedRows):
                metadata.update(obj.carried_metadata.get(business_date, {}))
            described[business_date] = metadata
        return StoredOutput(dates, described, said)

    @staticmethod
    def _dropped_from_config(loaded, written: list[str], configured: list[str]) -> list[str]:
        """The stored columns of ``loaded`` (the asset's table) the config no longer names (nor as a former
        name), that the write lacks and that are none of the pipeline's own: columns the config dropped."""
        kept = {name.lower() for name in (*written, *configured)} | CHANGESET_COLUMNS
        return [f.name for f in loaded.schema().fields if f.name.lower() not in kept and reserved_name_problem(f.name) is None]

    def _store_state(self, table: str, asset: str, dates: list[str], obj: StateRows) -> StoredOutput:
        """Write each date of a merged state, oldest first: its whole state or its changes, each date a
        commit and a tag; what it stored."""
        said = []
        later = self._later_dates(table, asset, obj.drop_stored_after)
        if later:
            said.append(f"{table}/{asset}: this re-run drops {', '.join(later)}, computed from the state it replaces")
        described = {}
        run_dates, dates = dates, dates + list(obj.carried)
        for day in dates:
            whole = day in obj.full_dates
            rows_of = obj.full if whole else obj.changes
            if rows_of is None:
                raise ValueError(f"{table}/{asset} {day}: a full copy without its rows")
            frame = rows_of.filter(F.col(BUSINESS_DATE) == F.lit(day).cast("date"))
            rows = self.storage.write_state(
                frame, table, asset, day, whole, obj.untouched, properties=dict(obj.properties.get(day, {})),
                rerun_of=dates, dropped=later if day == dates[0] else (),
            )
            schema = self.storage.stored_schema(table, asset, day)
            described[day] = {
                "dagster/row_count": MetadataValue.int(rows),
                "dagster/column_schema": column_schema(schema),
                "path": MetadataValue.path(self.storage.asset_path(table, asset)),
                "tag": MetadataValue.text(day),
                "snapshot_id": MetadataValue.text(str(self.storage.merged.tag_snapshot(table, asset, day))),
            }
        retention = {}
        if obj.retention_current_days is not None:
            dropped = self.storage.drop_outside_retention(table, asset, obj.retention_current_days)
            said.append(
                f"{table}/{asset}: retention.current_days={obj.retention_current_days} dropped "
                + (f"the states of {len(dropped)} date(s): {', '.join(dropped)}" if dropped else "nothing")
            )
            retention = {
                "retention_current_days": MetadataValue.int(obj.retention_current_days),
                "dropped_current_partitions": MetadataValue.json(dropped),
            }
        retention.update(self._expire_snapshots(said, table, [asset], obj.retention_snapshot_days))
        for day in dates:
            described[day] = {**described[day], **retention, **obj.metadata.get(day, {})}
            described[day]["stored_as"] = MetadataValue.text("full copy" if day in obj.full_dates else "changes")
        return StoredOutput(run_dates, described, said)

    def _later_dates(self, table: str, asset: str, after: str | None) -> list[str]:
        """The asset's stored dates after ``after`` (none when ``after`` is None)."""
        if after is None:
            return []
        return [day for day in self.storage.stored_dates(table, asset) if day > after]

    def _apply_retention(self, said: list[str], table: str, asset: str, obj: DataFrame | DatedRows) -> dict:
        """Drop what ``retention.current_days`` or ``retention.staging_days`` no longer keeps; metadata for
        each date this run wrote (``retention_<setting>``, ``dropped_<current|staging>_partitions``), and
        what to say of it in ``said``."""
        if not isinstance(obj, DatedRows):
            return {}
        metadata = {}
        for setting, days, dropped_key in (
            ("current_days", obj.retention_current_days, "dropped_current_partitions"),
            ("staging_days", obj.retention_staging_days, "dropped_staging_partitions"),
        ):
            if days is None:
                continue
            dropped = self.storage.drop_outside_retention(table, asset, days, setting)
            said.append(
                f"{table}/{asset}: retention.{setting}={days} dropped "
                + (f"{len(dropped)} partition(s): {', '.join(dropped)}" if dropped else "nothing")
            )
            metadata.update({f"retention_{setting}": MetadataValue.int(days), dropped_key: MetadataValue.json(dropped)})
        metadata.update(self._expire_snapshots(said, table, [asset], obj.retention_snapshot_days))
        return metadata

    def _expire_snapshots(self, said: list[str], table: str, assets: list[str], days: int | None) -> dict:
        """``retention.snapshot_days``: expire the assets' table versions older than ``days`` days. A staged write
        leaves it to the run's publication (cdc_assets/usecases/publishing.py): until then the version readers
        see is one the run replaces, and the staging branch keeps it from expiring."""
        if days is None or self.storage.staging:
            return {}
        expired = removed = 0
        for asset in assets:
            expired_here = self.storage.expire_snapshots(table, asset, days)
            expired += expired_here
            # What killed writes left is swept when versions age out, not at every run: the sweep reads
            # the manifests of every version kept.
            if expired_here:
                removed += len(self.storage.remove_unreferenced_files(table, asset))
        if expired:
            said.append(f"{table}/{', '.join(assets)}: retention.snapshot_days={days} expired {expired} table version(s)")
        if removed:
            said.append(f"{table}/{', '.join(assets)}: removed {removed} file(s) no table version names (left by killed writes)")
        return {
            "retention_snapshot_days": MetadataValue.int(days),
            "expired_snapshots": MetadataValue.int(expired),
            "removed_unreferenced_files": MetadataValue.int(removed),
        }

    def _previews(self, table: str, asset: str, rows: dict[str, int]) -> dict[str, list[tuple]]:
        """Up to ``PREVIEW_ROWS`` stored rows of each date, read back from the committed partitions by
        pyiceberg (``Row`` objects: tuples with names). A date without rows needs no read; the others run no
        Spark job: a preview is a metadata entry, which was 7 Spark jobs and a second a date."""
        previews: dict[str, list[tuple]] = {day: [] for day in rows}
        previews.update({day: self.storage.tables.preview(table, asset, day, PREVIEW_ROWS) for day, count in rows.items() if count})
        return previews


def column_schema(schema: StructType) -> TableSchema:
    """The columns as the UI lists them."""
    return TableSchema(columns=[TableColumn(name=field.name, type=field.dataType.simpleString()) for field in schema.fields])


def describe_partition(schema: StructType, path: str, row_count: int, preview: list[tuple], mask: ValueMask) -> dict:
    """What the UI shows for a stored partition: row count (plotted across partitions), schema, preview, path.

    Dagster keeps the preview in its event log, beyond an erase: each value passes through ``mask``
    (cdc_assets/model/masking.py), so by default keys, ``sensitive: true`` columns and raw records are masked."""
    header = "| " + " | ".join(schema.names) + " |\n|" + "---|" * len(schema.names)
    shown = preview if mask.shows_rows else []
    body = "\n".join("| " + " | ".join(_cell(text) for text in _masked_row(schema.names, row, mask)) + " |" for row in shown)
    return {
        "dagster/row_count": MetadataValue.int(row_count),
        "dagster/column_schema": column_schema(schema),
        "preview": MetadataValue.md(header + ("\n" + body if body else "")),
        "path": MetadataValue.path(path),
    }


def _masked_row(names: list[str], row: tuple, mask: ValueMask) -> list[str]:
    """A preview row's values in the header's order, masked: a Row is matched by its fields' names, a
    plain tuple by position."""
    by_name = dict(zip(getattr(row, "__fields__", None) or names, row))
    return [mask.value(name, by_name.get(name)) for name in names]


def _cell(text: str) -> str:
    """A value as a Markdown table cell: a | or a line break would end the cell or the row."""
    return text.replace("|", "\\|").replace("\n", " ")


def server_loss_explained(pyspark: LazyPySparkResource):
    """The Spark resource's explanation of a dead Connect server, when it has one (the project's resource)."""
    explain = getattr(pyspark, "server_loss_explained", None)
    return explain() if explain is not None else nullcontext()


def _plain(value) -> str:
    """A definition metadata value as a string (Dagster may wrap it in a MetadataValue)."""
    return str(getattr(value, "value", value))


def _table_and_asset(path: Sequence[str]) -> tuple[str, str]:
    if len(path) != 2:
        raise ValueError(f"asset key {path} must be [table, asset] to map onto the warehouse layout")
    return path[0], path[1]
