"""What the warehouse lets go of: partitions outside ``retention.current_days`` or ``retention.staging_days``.

Which dates fall outside the window is decided here; dropping them is one Iceberg commit per table
(resources/storage/warehouse.py). Each dropped date is recorded under ``_retention`` first, so a later
read can tell "dropped" from "never written" (:func:`dropped_partition`, a reader's).
"""

from __future__ import annotations

import json
from datetime import date, timedelta

from cdc_assets.core.columns import BUSINESS_DATE
from resources.storage.layout import WarehouseLayout


# The settings a drop is recorded under (the table config's ``retention.<setting>``): current_table's
# states, or the staging outputs (hashed_incoming, rejects, the classification, late_changes).
CURRENT_DAYS = "current_days"
STAGING_DAYS = "staging_days"
SNAPSHOT_DAYS = "snapshot_days"
# Not a setting: a date dropped by a re-run of an earlier date inside a backfill (cdc_assets/core/capture/rerun.py),
# recorded with the re-run's dates under this name.
RERUN = "rerun"


def check_days(table: str, asset: str, days: int, setting: str = CURRENT_DAYS, minimum: int = 1) -> None:
    if days < minimum:
        raise ValueError(f"{table}/{asset}: retention.{setting} must be at least {minimum}, got {days}")


def oldest_kept(newest: str, current_days: int) -> str:
    """The oldest date the window keeps: the newest stored date and the ``current_days - 1`` days before it."""
    return (date.fromisoformat(newest) - timedelta(days=current_days - 1)).isoformat()


def outside_window(stored: list[str], current_days: int) -> list[str]:
    """The dates of ``stored`` (oldest first) older than the newest ``current_days`` calendar days."""
    if not stored:
        return []
    kept_from = oldest_kept(stored[-1], current_days)
    return [day for day in stored if day < kept_from]


def dropped_partition(layout: WarehouseLayout, table: str, asset: str, business_date: str) -> dict | None:
    """What retention recorded when it dropped the partition (``setting``, the setting's value under its
    name, ``newest``, ``run_id``, ``dropped_at``), or None if it never dropped it. A record written
    before ``setting`` existed is a ``current_days`` one. Reads one small file; no lock, no Spark."""
    try:
        record = json.loads(layout.files.read_bytes(layout.dropped_marker_path(table, asset, business_date)))
    except FileNotFoundError:
        return None
    return {"setting": CURRENT_DAYS, **record}


def record_dropped(layout: WarehouseLayout, table: str, asset: str, business_date: str, record: dict) -> None:
    # Written atomically, so a reader never parses half a record.
    layout.files.write_atomically(layout.dropped_marker_path(table, asset, business_date), (json.dumps(record) + "\n").encode("utf-8"))


def forget_dropped(layout: WarehouseLayout, table: str, asset: str, business_dates: list[str]) -> None:
    """A date written again is no longer a dropped one (one listing per write; usually nothing there)."""
    recorded = set(layout.files.list_names(layout.retention_path(table, asset)))
    for day in business_dates:
        if f"{BUSINESS_DATE}={day}.json" in recorded:
            layout.files.delete(layout.dropped_marker_path(table, asset, day))
