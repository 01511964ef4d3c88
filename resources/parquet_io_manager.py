"""The Parquet IO manager: owns every warehouse path, writes partitions atomically, reads them lazily.

Layout: ``{warehouse}/{table}/{asset}/business_date=YYYY-MM-DD/part-*.parquet``, the asset key being
``[table, asset]``. Reading ``{warehouse}/{table}/{asset}/`` as one dataset (Spark, DuckDB, pyarrow)
yields every date with a ``business_date`` column.

A partition is written to ``{warehouse}/{table}/_staging/`` first and renamed into place only once
Spark has finished writing it, so a killed run never leaves a half-written partition where readers
look; leftovers in ``_staging`` are invisible to readers (underscore folders are skipped by Spark's and
pyarrow's partition discovery, and they sit outside the asset folders) and are swept on the next write.
A range (:class:`DatedRows`) is written with one partitioned write into ``_staging`` and each date's
folder is then committed the same way, one date after another.
"""

import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from dagster import (
    ConfigurableIOManager,
    InitResourceContext,
    InputContext,
    MetadataValue,
    OutputContext,
    ResourceDependency,
    TableColumn,
    TableSchema,
)
from pydantic import PrivateAttr
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from resources.spark import SparkResource, map_dates

WAREHOUSE_ENV = "CDC_WAREHOUSE"
PARTITION_COLUMN = "business_date"
STAGING_FOLDER = "_staging"


def warehouse_root() -> str:
    """``CDC_WAREHOUSE`` (any Hadoop-FS URI, e.g. s3a://bucket/cdc) or ``./warehouse``."""
    configured = os.environ.get(WAREHOUSE_ENV, "").strip()
    if not configured:
        return os.path.abspath("warehouse")
    return configured if "://" in configured else os.path.abspath(configured)


class MissingPartitionError(RuntimeError):
    """An upstream partition the step needs has never been written."""


class HadoopFileSystem:
    """The few Hadoop FileSystem calls a commit needs, through the JVM the session already runs."""

    def __init__(self, spark: SparkSession, path: str):
        jvm = spark.sparkContext._jvm  # classic (non-Connect) sessions only; see _commit
        # Resolving a JVM class by name costs a py4j round trip per package level; a range commits
        # dozens of partitions, so the classes are looked up once.
        self._path_class = jvm.org.apache.hadoop.fs.Path
        self._file_util = jvm.org.apache.hadoop.fs.FileUtil
        self._fs = self._path_class(path).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def _path(self, path: str):
        return self._path_class(path)

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def rename(self, source: str, target: str) -> None:
        parent = self._path(target).getParent()
        if parent is not None and not self._fs.exists(parent):
            self._fs.mkdirs(parent)
        if not self._fs.rename(self._path(source), self._path(target)):
            raise OSError(f"could not rename {source} to {target}")

    def copy_files(self, source: str, target: str) -> None:
        """Copy the Parquet files of folder ``source`` into a new folder ``target``."""
        self._fs.mkdirs(self._path(target))
        for name in self.list_names(source):
            if name.endswith(".parquet"):
                self._file_util.copy(
                    self._fs, self._path(f"{source}/{name}"), self._fs, self._path(f"{target}/{name}"), False, self._fs.getConf()
                )

    def delete(self, path: str) -> None:
        self._fs.delete(self._path(path), True)

    def list_names(self, path: str) -> list[str]:
        if not self.exists(path):
            return []
        return [status.getPath().getName() for status in self._fs.listStatus(self._path(path))]


def _is_connect(spark: SparkSession) -> bool:
    return not hasattr(spark, "sparkContext") or type(spark).__module__.startswith("pyspark.sql.connect")


@dataclass(frozen=True)
class DatedRows:
    """A step's rows for every partition of its run in one DataFrame, dated by a ``business_date`` column.

    The IO manager writes it with one partitioned write instead of one write per date, and commits
    each date's folder on its own. A date without rows still gets a partition (with no rows).
    """

    frame: DataFrame


class LazyPartitions(Mapping[str, DataFrame]):
    """``{business_date: DataFrame}`` that reads a partition only when it is looked up."""

    def __init__(self, manager: "PartitionedParquetIOManager", table: str, asset: str, dates: list[str]):
        self._manager, self._table, self._asset, self._dates = manager, table, asset, list(dates)

    def __getitem__(self, business_date: str) -> DataFrame:
        if business_date not in self._dates:
            raise KeyError(business_date)
        return self._manager.read_partition(self._table, self._asset, business_date)

    def __iter__(self) -> Iterator[str]:
        return iter(self._dates)

    def __len__(self) -> int:
        return len(self._dates)

    def read_all(self) -> DataFrame:
        """Every date's rows in one DataFrame with a ``business_date`` column, read in one scan."""
        return self._manager.read_partitions(self._table, self._asset, self._dates)


class PartitionedParquetIOManager(ConfigurableIOManager):
    """Stores each daily partition of a ``[table, asset]`` asset as a Parquet folder under the warehouse root.

    ``handle_output`` takes a DataFrame (one partition) or :class:`DatedRows` (any number of partitions,
    as a single-run backfill produces); ``load_input`` returns a :class:`LazyPartitions` mapping, or
    ``None`` when no upstream partition exists (the day before ``start_date``).
    """

    pyspark: ResourceDependency[SparkResource]
    warehouse: str | None = None

    # Partitions this run committed: path -> (schema written, file names committed). Reading one of
    # them back (previews, checks, the next step's input) skips Spark's schema inference, a job per
    # read; a range run reads back dozens of partitions. See _committed_schema.
    _committed: dict[str, tuple[StructType, frozenset[str]]] = PrivateAttr(default_factory=dict)
    # The run's file-system handle: getting one costs several JVM round trips, and a range run
    # touches hundreds of paths (all under the warehouse root, so one file system).
    _filesystem: tuple[SparkSession, HadoopFileSystem] | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._committed = {}
        self._filesystem = None

    def _fs(self, spark: SparkSession) -> HadoopFileSystem:
        if self._filesystem is None or self._filesystem[0] is not spark:
            self._filesystem = (spark, HadoopFileSystem(spark, self.root))
        return self._filesystem[1]

    @property
    def root(self) -> str:
        return (self.warehouse or warehouse_root()).rstrip("/")

    def asset_path(self, table: str, asset: str) -> str:
        return f"{self.root}/{table}/{asset}"

    def partition_path(self, table: str, asset: str, business_date: str) -> str:
        return f"{self.asset_path(table, asset)}/{PARTITION_COLUMN}={business_date}"

    # -- reading -------------------------------------------------------------------------------
    def read_partition(self, table: str, asset: str, business_date: str) -> DataFrame:
        spark = self.pyspark.spark_session
        return self._read(spark, self._stored_path(spark, table, asset, business_date))

    def _stored_path(self, spark: SparkSession, table: str, asset: str, business_date: str) -> str:
        """The partition's folder, after undoing an interrupted commit; raises if it was never written."""
        path = self.partition_path(table, asset, business_date)
        if not _is_connect(spark):
            self._restore_retired(self._fs(spark), table, asset, business_date)
        if not self._exists(spark, path):
            raise MissingPartitionError(
                f"{table}/{asset} has no partition for {business_date} (looked in {path}). "
                "Materialize the dates in order: each date needs the previous date's outputs."
            )
        return path

    def read_partitions(self, table: str, asset: str, business_dates: list[str]) -> DataFrame:
        """Several stored partitions as one DataFrame with a ``business_date`` column (a DateType).

        One scan instead of one per date, so a range's figures come from one job. Raises
        :class:`MissingPartitionError` naming the first date that was never written.
        """
        if not business_dates:
            raise ValueError(f"{table}/{asset}: no dates to read")
        spark = self.pyspark.spark_session
        paths = [self._stored_path(spark, table, asset, business_date) for business_date in business_dates]
        reader = spark.read.option("basePath", self.asset_path(table, asset))
        schemas = {self._committed_schema(spark, path) for path in paths}
        if len(schemas) == 1 and None not in schemas:
            reader = reader.schema(schemas.pop())
        return reader.parquet(*paths)

    def _committed_schema(self, spark: SparkSession, path: str) -> StructType | None:
        """The schema this run wrote to ``path``, if the folder still holds exactly the files it committed."""
        committed = self._committed.get(path)
        if committed is None or _is_connect(spark):
            return None
        if frozenset(self._fs(spark).list_names(path)) != committed[1]:
            return None
        return committed[0]

    def _read(self, spark: SparkSession, path: str) -> DataFrame:
        """The stored partition; with the schema it was written with if this run committed exactly these files."""
        schema = self._committed_schema(spark, path)
        return (spark.read.schema(schema) if schema is not None else spark.read).parquet(path)

    def load_input(self, context: InputContext) -> LazyPartitions | DataFrame | None:
        table, asset = _table_and_asset(context.asset_key.path)
        if not context.has_asset_partitions:
            raise ValueError(f"{table}/{asset}: this IO manager stores daily partitions only")
        dates = list(context.asset_partition_keys)
        if not dates:
            return None  # the date before start_date: there is no previous state
        return LazyPartitions(self, table, asset, dates)

    # -- writing -------------------------------------------------------------------------------
    def handle_output(self, context: OutputContext, obj: DataFrame | DatedRows) -> None:
        table, asset = _table_and_asset(context.asset_key.path)
        dates = sorted(context.asset_partition_keys)
        spark = self.pyspark.spark_session
        if isinstance(obj, DatedRows):
            rows_written = self.write_dates(spark, obj.frame, table, asset, dates)
            stored_schema = _as_stored(obj.frame.drop(PARTITION_COLUMN).schema)
        elif isinstance(obj, DataFrame) and len(dates) == 1:
            rows_written = {dates[0]: self.write_partition(spark, obj, table, asset, dates[0])}
            stored_schema = _as_stored(obj.drop(PARTITION_COLUMN).schema)
        else:
            raise ValueError(
                f"{table}/{asset}: expected DatedRows for the partitions {dates} (or a DataFrame for a single "
                f"partition), got {type(obj).__name__}"
            )

        previews = self._previews(spark, table, asset, rows_written)
        for business_date in dates:
            path = self.partition_path(table, asset, business_date)
            metadata = describe_partition(stored_schema, path, rows_written[business_date], previews[business_date])
            if len(dates) == 1:
                context.add_output_metadata(metadata)
            else:
                # One materialization per date, each with its own figures.
                context.step_context.add_asset_metadata(metadata, asset_key=context.asset_key, partition_key=business_date)

    def _previews(self, spark: SparkSession, table: str, asset: str, rows: dict[str, int]) -> dict[str, list[tuple]]:
        """Up to ``PREVIEW_ROWS`` stored rows of each date, read back from the committed partitions.

        A date without rows needs no read. A range of small dates is read in one job that keeps
        each file's first rows by their position in the file (no sort, no shuffle; a ``limit`` per
        date would be a job per date). Beyond ``ONE_PREVIEW_SCAN_MAX_ROWS`` that scan would decode
        every row, so each date gets its own ``limit`` instead.
        """
        previews: dict[str, list[tuple]] = {day: [] for day in rows}
        with_rows = [day for day, count in rows.items() if count]
        if len(with_rows) > 1 and sum(rows[day] for day in with_rows) <= ONE_PREVIEW_SCAN_MAX_ROWS:
            stored = self.read_partitions(table, asset, with_rows)
            # A date written by several tasks has several files: up to PREVIEW_ROWS rows from each.
            for row in stored.filter(F.col("_metadata.row_index") < PREVIEW_ROWS).collect():
                day = str(row[PARTITION_COLUMN])
                if len(previews[day]) < PREVIEW_ROWS:
                    previews[day].append(tuple(row)[:-1])  # business_date is last
        else:

            def preview(day: str) -> list[tuple]:
                return [tuple(row) for row in self.read_partition(table, asset, day).limit(PREVIEW_ROWS).collect()]

            previews.update(zip(with_rows, map_dates(preview, with_rows)))
        return previews

    def write_dates(self, spark: SparkSession, frame: DataFrame, table: str, asset: str, business_dates: list[str]) -> dict[str, int]:
        """Write every date's partition with one partitioned write; returns the rows of each date.

        ``frame`` carries a ``business_date`` (date) column; its values must be among ``business_dates``
        (anything else, NULL included, fails before a partition is committed). Each date's folder is then committed as
        :meth:`write_partition` commits one, so readers see a date's old version or its new one.
        """
        if PARTITION_COLUMN not in frame.columns:
            raise ValueError(f"{table}/{asset}: DatedRows needs a {PARTITION_COLUMN} column, got {frame.columns}")
        stored_schema = _as_stored(frame.drop(PARTITION_COLUMN).schema)
        if len(business_dates) == 1:
            # One date needs no partitioned write (which sorts by date and, without rows, writes
            # nothing at all); write_partition refuses rows of another date itself.
            day = business_dates[0]
            return {day: self.write_partition(spark, frame, table, asset, day)}
        if _is_connect(spark):
            # No JVM handle to rename with: one overwrite per date, the best available there.
            return {
                day: self.write_partition(spark, frame.filter(_on(day)), table, asset, day)
                for day in business_dates
            }
        # Every date's rows are counted while they are written (observed metrics, no second job).
        observation = Observation(f"rows_written_{uuid.uuid4().hex}")
        observed = frame.observe(
            observation,
            F.count(F.lit(1)).alias(ROWS_METRIC),
            *(F.count_if(_on(day)).alias(day) for day in business_dates),
        )
        fs = self._fs(spark)
        staging_root = f"{self.root}/{table}/{STAGING_FOLDER}/{asset}"
        for day in business_dates:
            self._restore_retired(fs, table, asset, day)
        for leftover in fs.list_names(staging_root):  # from runs killed mid-write
            if leftover.startswith(RANGE_STAGING_PREFIX):
                fs.delete(f"{staging_root}/{leftover}")
        token = uuid.uuid4().hex
        staged = f"{staging_root}/{RANGE_STAGING_PREFIX}{token}.new"
        observed.write.partitionBy(PARTITION_COLUMN).mode("errorifexists").parquet(staged)
        figures = observation.get
        rows = {day: int(figures[day]) for day in business_dates}
        if int(figures[ROWS_METRIC]) != sum(rows.values()):
            fs.delete(staged)
            raise ValueError(
                f"{table}/{asset}: {int(figures[ROWS_METRIC]) - sum(rows.values())} row(s) are dated outside "
                f"the run's partitions {business_dates[0]}..{business_dates[-1]}; nothing was committed"
            )
        if not all(rows.values()):
            # A partitioned write makes no folder for a date without rows, but readers need one: each
            # such date gets a copy of one empty file (a Spark write per date would be a job each).
            empty = f"{staged}/_empty"
            # limit(0) plans as an empty local relation: a one-task job, no Python worker (as
            # createDataFrame([]) would start) and no upstream work.
            frame.drop(PARTITION_COLUMN).limit(0).write.parquet(empty)
            for day in business_dates:
                if not rows[day]:
                    fs.copy_files(empty, f"{staged}/{PARTITION_COLUMN}={day}")
        _pause_if_requested(table, asset)
        for day in business_dates:
            final, written = self.partition_path(table, asset, day), f"{staged}/{PARTITION_COLUMN}={day}"
            retired = f"{staging_root}/{PARTITION_COLUMN}={day}.{token}.old"
            if fs.exists(final):
                fs.rename(final, retired)
            self._committed.pop(final, None)
            fs.rename(written, final)
            fs.delete(retired)
            self._committed[final] = (stored_schema, frozenset(fs.list_names(final)))
        fs.delete(staged)
        return rows

    def write_partition(self, spark: SparkSession, frame: DataFrame, table: str, asset: str, business_date: str) -> int:
        """Write one partition so that readers see the old version or the new one, never a mix; returns its rows.

        The rows are counted while they are written (an observed metric), not by a second job. A
        ``frame`` with a ``business_date`` column (a one-date :class:`DatedRows`) is stored without it,
        and a row of another date fails the write before the commit.
        """
        final = self.partition_path(table, asset, business_date)
        observation = Observation(f"rows_written_{uuid.uuid4().hex}")
        metrics = [F.count(F.lit(1)).alias(ROWS_METRIC)]
        dated = PARTITION_COLUMN in frame.columns
        if dated:
            metrics.append(F.count_if(~F.coalesce(_on(business_date), F.lit(False))).alias(OTHER_DATES_METRIC))
        frame = frame.observe(observation, *metrics)
        if dated:
            frame = frame.drop(PARTITION_COLUMN)

        def refuse_other_dates() -> None:
            others = int(observation.get[OTHER_DATES_METRIC]) if dated else 0
            if others:
                raise ValueError(
                    f"{table}/{asset}: {others} row(s) are dated outside the run's partition {business_date}; "
                    "nothing was committed"
                )

        if _is_connect(spark):
            # No JVM handle to rename with; Spark's overwrite is the best available here.
            frame.write.mode("overwrite").parquet(final)
            refuse_other_dates()
            return int(observation.get[ROWS_METRIC])
        fs = self._fs(spark)
        staging_root = f"{self.root}/{table}/{STAGING_FOLDER}/{asset}"
        stem = f"{PARTITION_COLUMN}={business_date}"
        self._restore_retired(fs, table, asset, business_date)
        for leftover in fs.list_names(staging_root):  # from runs killed mid-write
            if leftover.startswith(stem + "."):
                fs.delete(f"{staging_root}/{leftover}")
        token = uuid.uuid4().hex
        staged, retired = f"{staging_root}/{stem}.{token}.new", f"{staging_root}/{stem}.{token}.old"
        frame.write.mode("errorifexists").parquet(staged)
        try:
            refuse_other_dates()
        except ValueError:
            fs.delete(staged)
            raise
        _pause_if_requested(table, asset)
        if fs.exists(final):
            fs.rename(final, retired)
        self._committed.pop(final, None)
        fs.rename(staged, final)
        fs.delete(retired)
        self._committed[final] = (_as_stored(frame.schema), frozenset(fs.list_names(final)))
        return int(observation.get[ROWS_METRIC])

    def _restore_retired(self, fs: HadoopFileSystem, table: str, asset: str, business_date: str) -> None:
        """Undo a commit that was killed between its two renames: put the retired version back."""
        final = self.partition_path(table, asset, business_date)
        if fs.exists(final):
            return
        staging_root = f"{self.root}/{table}/{STAGING_FOLDER}/{asset}"
        stem = f"{PARTITION_COLUMN}={business_date}."
        for name in fs.list_names(staging_root):
            if name.startswith(stem) and name.endswith(".old"):
                fs.rename(f"{staging_root}/{name}", final)
                return

    def _exists(self, spark: SparkSession, path: str) -> bool:
        if _is_connect(spark):
            try:
                spark.read.parquet(path).schema  # noqa: B018 - resolving the relation checks the path
                return True
            except Exception:  # noqa: BLE001 - Connect reports a missing path as a generic error
                return False
        return self._fs(spark).exists(path)


PAUSE_ENV, PAUSE_MARKER_ENV = "CDC_PAUSE_BEFORE_COMMIT", "CDC_PAUSE_MARKER"


def _pause_if_requested(table: str, asset: str) -> None:
    """Fault-injection hook for tests: hold a staged, uncommitted partition so a test can kill -9 the run.

    Set ``CDC_PAUSE_BEFORE_COMMIT=<table>/<asset>`` and ``CDC_PAUSE_MARKER=<file>``; the run touches
    the marker and waits there. Unset (always, outside tests), it does nothing.
    """
    if os.environ.get(PAUSE_ENV) != f"{table}/{asset}":
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if marker:
        with open(marker, "w") as handle:
            handle.write(str(os.getpid()))
    time.sleep(600)


PREVIEW_ROWS = 5
ONE_PREVIEW_SCAN_MAX_ROWS = 1_000_000
ROWS_METRIC = "rows"
OTHER_DATES_METRIC = "rows_of_other_dates"
RANGE_STAGING_PREFIX = "range."


def _on(business_date: str):
    return F.col(PARTITION_COLUMN) == F.lit(business_date).cast("date")


def describe_partition(schema: StructType, path: str, row_count: int, preview: list[tuple]) -> dict:
    """What the UI shows for a stored partition: row count (plotted across partitions), schema, preview, path.

    ``schema`` is the partition's as stored; ``row_count`` was counted as it was written;
    ``preview`` holds a few of its rows.
    """
    header = "| " + " | ".join(schema.names) + " |\n|" + "---|" * len(schema.names)
    body = "\n".join("| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in preview)
    return {
        "dagster/row_count": MetadataValue.int(row_count),
        "dagster/column_schema": TableSchema(
            columns=[TableColumn(name=field.name, type=field.dataType.simpleString()) for field in schema.fields]
        ),
        "preview": MetadataValue.md(header + ("\n" + body if body else "")),
        "path": MetadataValue.path(path),
    }


def _as_stored(schema: StructType) -> StructType:
    """The schema as Parquet files written by Spark declare it: every column nullable."""
    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])


def _table_and_asset(path: list[str]) -> tuple[str, str]:
    if len(path) != 2:
        raise ValueError(f"asset key {path} must be [table, asset] to map onto the warehouse layout")
    return path[0], path[1]
