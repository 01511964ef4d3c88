"""Reading the warehouse: which dates are stored, where a date's current version is, and its rows.

Readers take no lock and write nothing, so they work on a read-only mount. A date's pointer is
resolved once and its version's folder read, so a commit that replaces the date meanwhile changes
nothing under the reader.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.errors import SummarizedError
from resources.storage.files import list_names
from resources.storage.layout import EARLIER_RELEASE_ASIDE_SUFFIX, VERSION_KEY, WarehouseLayout, state_changes_asset
from resources.storage.retention import STAGING_DAYS, dropped_partition


class MissingPartitionError(SummarizedError, RuntimeError):
    """An upstream partition the step needs has never been written."""


class DroppedPartitionError(MissingPartitionError):
    """The partition was stored, then dropped by the table's retention setting (``retention.current_days``,
    or ``retention.staging_days`` for a staging output)."""


@dataclass(frozen=True)
class StateLayout:
    """The parts a date's state is read from: a full copy, and the changes of later dates up to it."""

    full_date: str
    change_dates: list[str]


def stored_path(layout: WarehouseLayout, table: str, asset: str, business_date: str) -> str:
    """The folder of the date's current version, resolved once.

    Raises :class:`MissingPartitionError` if the date was never written, and
    :class:`DroppedPartitionError` (naming the retention setting) if retention dropped it. A date
    that a killed commit of an earlier release left without a folder is read where that commit left
    it (the next writer puts it back).
    """
    version = layout.current_version(table, asset, business_date)
    if version is not None:
        return version
    retired = _set_aside_by_earlier_release(layout, table, asset, business_date)
    if retired is not None:
        return retired
    dropped = dropped_partition(layout, table, asset, business_date)
    if dropped is not None:
        setting = dropped["setting"]
        dropped_it = (
            f"{table}/{asset} has no partition for {business_date}: retention.{setting} "
            f"({dropped[setting]}, in the table config of {table}) dropped it when the newest stored date "
            f"was {dropped['newest']} (run {dropped['run_id']})."
        )
        if setting == STAGING_DAYS:
            raise DroppedPartitionError(
                f"{dropped_it} A run of {business_date} writes it again from the date's extract; raise "
                "retention.staging_days to keep more dates."
            )
        raise DroppedPartitionError(
            f"{dropped_it} What needs the state as of {business_date}, "
            "such as a run of the date after it, cannot run; raise retention.current_days to keep more dates."
        )
    raise MissingPartitionError(
        f"{table}/{asset} has no partition for {business_date} (looked in "
        f"{layout.partition_path(table, asset, business_date)}). "
        "Materialize the dates in order: each date needs the previous date's outputs."
    )


def _set_aside_by_earlier_release(layout: WarehouseLayout, table: str, asset: str, business_date: str) -> str | None:
    folder = layout.staging_path(table, asset)
    for name in sorted(list_names(folder)):
        if name.startswith(f"{BUSINESS_DATE}={business_date}.") and name.endswith(EARLIER_RELEASE_ASIDE_SUFFIX):
            return f"{folder}/{name}"
    return None


def stored_dates(layout: WarehouseLayout, table: str, asset: str) -> list[str]:
    """The business dates the asset has a committed partition for, oldest first (no Spark job)."""
    prefix = f"{BUSINESS_DATE}="
    return sorted(name[len(prefix) :] for name in list_names(layout.asset_path(table, asset)) if name.startswith(prefix))


def has_partition(layout: WarehouseLayout, table: str, asset: str, business_date: str) -> bool:
    """Whether the partition is stored, so :func:`stored_path` finds it: committed, or left aside by a
    killed commit of an earlier release (no Spark read, nothing restored)."""
    if layout.current_version(table, asset, business_date) is not None:
        return True
    return _set_aside_by_earlier_release(layout, table, asset, business_date) is not None


def state_layout(layout: WarehouseLayout, table: str, asset: str, as_of: str) -> StateLayout:
    """Where the state of ``as_of`` is stored: the newest full copy on or before it and the dates of
    changes after it (see ``cdc_assets/core/state.py``). A state stored as a snapshot per date is its
    own full copy. Raises :class:`MissingPartitionError` (or :class:`DroppedPartitionError`) naming the
    first date that is needed and not stored. Reads folder names only."""
    changes_asset = state_changes_asset(asset)
    if has_partition(layout, table, asset, as_of):
        return StateLayout(as_of, [])
    if not has_partition(layout, table, changes_asset, as_of):
        # Raises, naming the date, and retention if it dropped the date's changes or its full copy.
        dropped_changes = dropped_partition(layout, table, changes_asset, as_of)
        stored_path(layout, table, changes_asset if dropped_changes else asset, as_of)
    fulls = [day for day in stored_dates(layout, table, asset) if day < as_of]
    if not fulls:
        raise MissingPartitionError(
            f"{table}/{asset}: the state as of {as_of} is stored as changes, and no full copy of it on an "
            f"earlier date is stored (looked in {layout.asset_path(table, asset)}). Materialize the dates in order."
        )
    full = date.fromisoformat(fulls[-1])
    days = [(full + timedelta(days=n)).isoformat() for n in range(1, (date.fromisoformat(as_of) - full).days + 1)]
    for day in days:
        if not has_partition(layout, table, changes_asset, day):
            stored_path(layout, table, changes_asset, day)  # raises
    return StateLayout(fulls[-1], days)


def read(
    spark: SparkSession,
    layout: WarehouseLayout,
    table: str,
    asset: str,
    business_dates: list[str],
    schema: StructType | str | None = None,
    known_schemas: Mapping[str, StructType] | None = None,
) -> DataFrame:
    """Stored partitions as one DataFrame with a ``business_date`` column (a date), in one scan.

    Raises :class:`MissingPartitionError` naming the first date that was never written. A version in
    ``known_schemas`` (folder -> schema written) is read with that schema (no inference job). With
    ``schema`` (the columns without ``business_date``), every date is read with it: a column a date's
    files lack reads as NULL there, and stored columns it does not name are not read.
    """
    paths = [stored_path(layout, table, asset, day) for day in business_dates]
    base = layout.versions_path(table, asset)
    if schema is None:
        schemas = {_known_schema(known_schemas, path) for path in paths}
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


def read_one(
    spark: SparkSession, layout: WarehouseLayout, table: str, asset: str, business_date: str,
    known_schemas: Mapping[str, StructType] | None = None,
) -> DataFrame:
    """One stored partition, without the ``business_date`` column."""
    path = stored_path(layout, table, asset, business_date)
    schema = _known_schema(known_schemas, path)
    return (spark.read.schema(schema) if schema is not None else spark.read).parquet(path)


def _known_schema(known_schemas: Mapping[str, StructType] | None, path: str) -> StructType | None:
    known = (known_schemas or {}).get(path)
    return None if known is None else StructType(list(known.fields))


def row_counts(layout: WarehouseLayout, table: str, asset: str, business_dates: Iterable[str]) -> dict[str, int]:
    """Rows per stored partition, from the Parquet footers (no Spark job, no row read)."""
    counts = {}
    for day in business_dates:
        folder = stored_path(layout, table, asset, day)
        counts[day] = sum(pq.ParquetFile(f"{folder}/{name}").metadata.num_rows for name in list_names(folder) if name.endswith(".parquet"))
    return counts


# Where Spark keeps the schema it wrote in a Parquet footer: its exact types (a timestamp stored as
# INT96 is a timestamp, not the timestamp without time zone pyarrow reads it as), and each column's metadata.
_SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def folder_schema(folder: str) -> StructType:
    """The Spark schema a stored date's folder was written with (its first Parquet file's footer; no Spark job)."""
    names = sorted(name for name in list_names(folder) if name.endswith(".parquet"))
    if not names:
        raise ValueError(f"{folder} holds no Parquet file")
    schema = pq.read_schema(f"{folder}/{names[0]}")
    written = (schema.metadata or {}).get(_SPARK_SCHEMA_KEY)
    if written is not None:
        return StructType.fromJson(json.loads(written))
    # Not written by Spark: read as Spark infers it.
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)
