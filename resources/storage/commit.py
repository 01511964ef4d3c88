"""The one way anything is stored: stage a write, then commit it date by date; and recovery after a kill.

A write of one date or of many goes the same way: Spark writes every date's rows into a staging
folder unique to that write, rows dated outside the write fail it before anything is committed, and
then each date is committed on its own: its staged files are synced to disk and renamed into a new
version folder, and the date's pointer is replaced by one atomic rename of a new symlink over it. A
reader resolves the pointer once and reads that version's folder, which nothing changes or deletes
for the grace period after it stops being current (resources/storage/retention.py): it sees the old
version or the new one, never nothing and never a mix.

A writer that takes a table's lock first puts right what killed writers left (:func:`recover`): they
are all gone, since only the lock's holder writes.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc_assets.core.columns import BUSINESS_DATE
from resources.storage import fault_injection
from resources.storage.files import delete, exchange, fsync_folder, fsync_tree, list_names
from resources.storage.layout import EARLIER_RELEASE_ASIDE_SUFFIX, POINTER_SUFFIX, RETIRED_SUFFIX, WarehouseLayout
from resources.storage.retention import mark_retired

_ROWS = "rows"
_log = logging.getLogger(__name__)


def as_stored(schema: StructType) -> StructType:
    """The schema as Parquet files written by Spark declare it: every column nullable."""
    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])


def write(
    layout: WarehouseLayout,
    frame: DataFrame,
    table: str,
    asset: str,
    business_dates: list[str],
    write_id: str,
    on_commit: Callable[[str, str], None],
) -> dict[str, int]:
    """Stage ``frame`` and commit it as the partitions ``business_dates``; rows per date.

    The caller holds the table's writer lock; ``write_id`` is unique to this write and names its
    staging folder and versions. ``on_commit(day, version folder)`` is called as each date is committed.
    """
    staged = f"{layout.staging_path(table, asset)}/{write_id}"
    rows = stage(frame, staged, table, asset, business_dates)
    fault_injection.pause_point(fault_injection.BEFORE_COMMIT, table, asset)
    for day in business_dates:
        on_commit(day, commit_date(layout, table, asset, day, f"{staged}/{BUSINESS_DATE}={day}", write_id))
    delete(staged)
    return rows


def stage(frame: DataFrame, staged: str, table: str, asset: str, business_dates: list[str]) -> dict[str, int]:
    """Write ``frame`` into the folder ``staged``, a ``business_date=D`` folder per date; rows per date.

    ``frame`` has a ``business_date`` (date) column whose values must be among ``business_dates``,
    or, for a single date, may have none. Rows dated elsewhere (NULL included) fail the write, and
    the staged folder is deleted. A date without rows gets a folder holding an empty file. Rows are
    counted while they are written (observed metrics), not by a second job.
    """
    dated = BUSINESS_DATE in frame.columns
    if not dated and len(business_dates) != 1:
        raise ValueError(f"{table}/{asset}: rows for {len(business_dates)} dates need a {BUSINESS_DATE} column")
    observation = Observation(f"rows_written_{uuid.uuid4().hex}")
    counted = [F.count(F.lit(1)).alias(_ROWS)]
    if dated:
        counted += [F.count_if(_is_date(day)).alias(day) for day in business_dates]
    observed = frame.observe(observation, *counted)
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
        total, rows = _staged_counts(staged, business_dates)
        if dated and len(business_dates) == 1:
            # One date's rows all went into its folder: those dated elsewhere need a job of their own.
            day = business_dates[0]
            rows = {day: total - frame.filter(~F.coalesce(_is_date(day), F.lit(False))).count()}
    if total != sum(rows.values()):
        delete(staged)
        span = business_dates[0] if len(business_dates) == 1 else f"{business_dates[0]}..{business_dates[-1]}"
        raise ValueError(
            f"{table}/{asset}: {total - sum(rows.values())} row(s) are dated outside the write's "
            f"partition(s) {span}; nothing was committed"
        )
    missing = [day for day in business_dates if not os.path.exists(f"{staged}/{BUSINESS_DATE}={day}")]
    if missing:
        # A partitioned write makes no folder for a date without rows, but readers need one: such
        # dates get a copy of one empty file. limit(0) plans as an empty local relation: no
        # upstream work, and no Python worker (createDataFrame([]) would start one).
        empty = f"{staged}/_empty"
        frame.drop(BUSINESS_DATE).limit(0).write.parquet(empty)
        for day in missing:
            os.makedirs(f"{staged}/{BUSINESS_DATE}={day}")
            for name in list_names(empty):
                if name.endswith(".parquet"):
                    shutil.copyfile(f"{empty}/{name}", f"{staged}/{BUSINESS_DATE}={day}/{name}")
    return rows


def _is_date(business_date: str):
    return F.col(BUSINESS_DATE) == F.lit(business_date).cast("date")


def _staged_counts(staged: str, business_dates: list[str]) -> tuple[int, dict[str, int]]:
    """Rows in a staged write, in all and per date of ``business_dates``, from the Parquet footers.

    Every ``business_date=`` folder counts towards the total, those of other dates (NULL's
    ``__HIVE_DEFAULT_PARTITION__`` included) too, so the caller's check of rows dated elsewhere holds.
    """
    per_folder = {}
    for name in list_names(staged):
        if name.startswith(f"{BUSINESS_DATE}="):
            folder = f"{staged}/{name}"
            per_folder[name.split("=", 1)[1]] = sum(
                pq.ParquetFile(f"{folder}/{part}").metadata.num_rows for part in list_names(folder) if part.endswith(".parquet")
            )
    return sum(per_folder.values()), {day: per_folder.get(day, 0) for day in business_dates}


def commit_date(layout: WarehouseLayout, table: str, asset: str, business_date: str, staged: str, write_id: str) -> str:
    """Make the folder ``staged`` the date's version, durable first, then visible in one atomic rename;
    returns the version's folder.

    1. fsync the staged files and folder, rename the folder to a new version under ``_versions``
       (not yet visible: no pointer names it) and fsync the folders it was renamed into;
    2. mark the version being replaced as retired (the sweep keeps it for the grace period);
    3. create a new symlink beside the pointer and rename it over the pointer (a rename replaces its
       target atomically), then fsync the asset folder so the switch survives a power loss.

    A kill before 3 leaves the old version current and an unreferenced new one, which the next
    writer deletes; after 3 the new version is current.
    """
    final = layout.partition_path(table, asset, business_date)
    version = layout.version_path(table, asset, business_date, write_id)
    folder = os.path.dirname(version)
    fsync_tree(staged)
    os.makedirs(folder, exist_ok=True)
    os.rename(staged, version)
    for synced in (folder, os.path.dirname(folder), os.path.dirname(os.path.dirname(folder))):
        fsync_folder(synced)
    fault_injection.pause_point(fault_injection.IN_COMMIT, table, asset)
    previous = layout.current_version(table, asset, business_date)
    legacy = previous == final  # a real folder, as releases before versioning wrote
    if previous is not None and not legacy:
        mark_retired(previous)
    asset_folder = layout.asset_path(table, asset)
    os.makedirs(asset_folder, exist_ok=True)
    pointer = layout.pointer_path(table, asset, business_date, write_id)
    os.symlink(os.path.relpath(version, asset_folder), pointer)
    if legacy:
        _replace_legacy_folder(layout, table, asset, business_date, pointer, write_id)
    else:
        os.rename(pointer, final)
    fsync_folder(asset_folder)
    return version


def _replace_legacy_folder(layout: WarehouseLayout, table: str, asset: str, business_date: str, pointer: str, write_id: str) -> None:
    """Swap a real date folder (written before versioning) for the pointer, and retire the folder.

    rename(2) cannot put a symlink over a folder; Linux's renameat2(RENAME_EXCHANGE) swaps the two
    atomically. Where it is missing, the folder is moved aside first, and a reader arriving in
    between finds neither (once per date, on the first re-run after an upgrade).
    """
    final = layout.partition_path(table, asset, business_date)
    aside = layout.version_path(table, asset, business_date, f"legacy-{write_id}")
    if exchange(pointer, final):
        os.rename(pointer, aside)  # the pointer's name now holds the old folder
    else:
        _log.warning(f"{table}/{asset}: no atomic exchange here; {final} is missing for a moment")
        os.rename(final, aside)
        os.rename(pointer, final)
    mark_retired(aside)


def recover(layout: WarehouseLayout, table: str) -> None:
    """Put right what killed writers of ``table`` left; only the holder of the table's lock calls this.

    - put back a date whose folder a commit of an earlier release (which moved the folder aside before
      renaming the new one in) left missing, and empty the table's staging folder;
    - delete pointer files a killed commit never renamed into place;
    - delete versions a killed commit placed but never pointed to (no reader can have seen them), and
      the retired mark of a version a killed commit retired but never switched away from.
    """
    for asset in list_names(layout.staging_path(table)):
        folder = layout.staging_path(table, asset)
        for name in list_names(folder):
            if name.endswith(EARLIER_RELEASE_ASIDE_SUFFIX):
                _restore_folder_set_aside(layout, table, asset, name)
        for name in list_names(folder):
            delete(f"{folder}/{name}")
    for asset in list_names(layout.table_path(table)):
        if asset.startswith(("_", ".")):
            continue
        for name in list_names(layout.asset_path(table, asset)):
            if name.startswith(".") and name.endswith(POINTER_SUFFIX):
                delete(f"{layout.asset_path(table, asset)}/{name}")
    for folder, current, names in layout.dated_version_folders(table):
        for name in names:
            if name.endswith(RETIRED_SUFFIX):
                if f"{folder}/{name.removesuffix(RETIRED_SUFFIX)}" == current:
                    os.unlink(f"{folder}/{name}")  # a retirement whose pointer switch never happened
            elif f"{folder}/{name}" != current and f"{name}{RETIRED_SUFFIX}" not in names:
                delete(f"{folder}/{name}")  # placed by a killed commit, never pointed to: never read


def _restore_folder_set_aside(layout: WarehouseLayout, table: str, asset: str, name: str) -> None:
    """Undo a commit of an earlier release killed between its two renames (it left the date without
    a folder and the stored one under ``_staging/{asset}/business_date=D.{write}.old``)."""
    business_date = name.split(".", 1)[0].removeprefix(f"{BUSINESS_DATE}=")
    final = layout.partition_path(table, asset, business_date)
    if not os.path.lexists(final):
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.rename(f"{layout.staging_path(table, asset)}/{name}", final)
        fsync_folder(os.path.dirname(final))
