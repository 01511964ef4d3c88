"""What a step hands the storage to write: a range's rows for one asset, dated, with the table's retention.

Plain data, no Dagster: the use cases build them (``cdc_assets/usecases/``), the IO manager passes them to
:class:`~resources.storage.WarehouseStorage`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import DataFrame


@dataclass(frozen=True)
class DatedRows:
    """A step's rows for every partition of its run in one DataFrame, dated by a ``business_date`` column.

    Written with one partitioned write and committed date by date; a date without rows still gets a
    partition (with no rows). With ``retention_current_days`` (the table's ``retention.current_days``,
    for ``current_table``) or ``retention_staging_days`` (``retention.staging_days``, for the staging
    outputs), the asset's partitions older than that many newest dates are dropped once the write is
    committed (``WarehouseStorage.drop_outside_retention``). With ``retention_snapshot_days``
    (``retention.snapshot_days``), the asset's table versions older than that many days are then expired
    (``WarehouseStorage.expire_snapshots``).
    """

    frame: DataFrame
    retention_current_days: int | None = None
    retention_staging_days: int | None = None
    retention_snapshot_days: int | None = None
    # A re-run inside a backfill (cdc_assets/core/capture/rerun.py): the asset's stored dates after the run's last
    # date were computed from the state it replaces, and leave the table in the same commit as its write.
    drop_stored_after: str | None = None
    # A correction that flows forward: later stored dates the run recomputed, written in the same commit as
    # its own partitions (``frame`` holds their rows too), each with the figures its materialization records.
    carried: tuple[str, ...] = ()
    carried_metadata: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


@dataclass(frozen=True)
class StateRows:
    """A merged state's rows for every partition of the run (``resources/storage/merged.py``): dates in
    ``full_dates`` replace the whole state (rows of ``full``), the others apply their changes (rows of
    ``changes``) with one MERGE; both DataFrames dated by ``business_date``. ``untouched`` is the
    operation a date's untouched rows read with; ``properties`` go into each date's snapshot summary and
    ``metadata`` into its materialization."""

    changes: DataFrame
    full: DataFrame | None
    full_dates: tuple[str, ...]
    untouched: str
    retention_current_days: int | None = None
    retention_snapshot_days: int | None = None
    metadata: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    properties: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    drop_stored_after: str | None = None  # as DatedRows's
    carried: tuple[str, ...] = ()  # as DatedRows's; ``metadata`` holds their figures too
