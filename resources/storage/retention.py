"""What the warehouse lets go of: partitions outside ``retention.current_days`` or ``retention.staging_days``,
and replaced versions.

Dropping a partition records why under ``_retention`` (so a later read can tell "dropped" from "never
written"), removes its pointer and retires its version. A retired version, dropped or replaced by a
commit, stays whole for readers that resolved it before, for the grace period; after that the next
writer to take the table's lock deletes it (:func:`sweep_retired`). Only a writer calls what changes
anything here; :func:`dropped_partition` is a reader's.
"""

from __future__ import annotations

import json
import os
import time
from datetime import date, datetime, timedelta, timezone

from cdc_assets.core.columns import BUSINESS_DATE
from resources.storage.files import delete, fsync_folder, list_names
from resources.storage.layout import RETIRED_SUFFIX, WarehouseLayout

RETIRED_GRACE_ENV = "CDC_RETIRED_VERSION_GRACE_SECONDS"
# How long a replaced (or retention-dropped) version stays on disk for readers that resolved it before.
DEFAULT_RETIRED_GRACE_SECONDS = 3600.0


# The settings a drop is recorded under (the table config's ``retention.<setting>``): current_table's
# states, or the staging outputs (hashed_incoming, rejects, the classification, late_changes).
CURRENT_DAYS = "current_days"
STAGING_DAYS = "staging_days"


def check_days(table: str, asset: str, days: int, setting: str = CURRENT_DAYS) -> None:
    if days < 1:
        raise ValueError(f"{table}/{asset}: retention.{setting} must be at least 1, got {days}")


def oldest_kept(newest: str, current_days: int) -> str:
    """The oldest date the window keeps: the newest stored date and the ``current_days - 1`` days before it."""
    return (date.fromisoformat(newest) - timedelta(days=current_days - 1)).isoformat()


def outside_window(stored: list[str], current_days: int) -> list[str]:
    """The dates of ``stored`` (oldest first) older than the newest ``current_days`` calendar days."""
    if not stored:
        return []
    kept_from = oldest_kept(stored[-1], current_days)
    return [day for day in stored if day < kept_from]


def state_outside_window(fulls: list[str], changes: list[str], current_days: int) -> tuple[list[str], list[str], str | None]:
    """For a state stored as full copies (dates ``fulls``) and changes (dates ``changes``), oldest first:
    the full copies and the changes that no state of the newest ``current_days`` dates is read from,
    and the newest date stored (None when nothing is)."""
    if not fulls and not changes:
        return [], [], None
    newest = max(fulls[-1:] + changes[-1:])
    kept_from = oldest_kept(newest, current_days)
    needed = [day for day in fulls if day <= kept_from]
    if not needed:
        return [], [], newest  # no full copy the kept states could do without
    keep_from = needed[-1]  # the full copy the oldest kept state is read from
    return [d for d in fulls if d < keep_from], [d for d in changes if d <= keep_from], newest


def drop(layout: WarehouseLayout, table: str, asset: str, expired: list[str], record: dict, write_id: str) -> None:
    """Drop the partitions ``expired``: record each (``record``, with when), then remove its pointer
    (readers see the partition or nothing, never part of it) and retire its version."""
    for day in expired:
        record_dropped(layout, table, asset, day, {**record, "dropped_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}, write_id)
        final = layout.partition_path(table, asset, day)
        version = layout.current_version(table, asset, day)
        if version is not None and version != final:
            mark_retired(version)
            os.unlink(final)
        elif version == final:  # a real folder of an earlier release: moved among the versions, retired
            aside = layout.version_path(table, asset, day, f"legacy-{write_id}")
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            os.rename(final, aside)
            mark_retired(aside)
        elif os.path.islink(final):
            os.unlink(final)  # a pointer whose version is gone
        fsync_folder(layout.asset_path(table, asset))


def mark_retired(version: str) -> None:
    """Record that ``version`` stops being current now: the sweep keeps it for the grace period from here.

    Written before the pointer moves away from it, so a retired version is never without its mark.
    """
    with open(f"{version}{RETIRED_SUFFIX}", "w", encoding="utf-8") as stream:
        stream.write(datetime.now(timezone.utc).isoformat(timespec="seconds") + "\n")
    os.utime(f"{version}{RETIRED_SUFFIX}")


def sweep_retired(layout: WarehouseLayout, table: str, grace: float) -> None:
    """Delete the table's versions retired more than ``grace`` seconds ago, marks whose version is gone,
    and date folders left empty. The current version of a date is never touched."""
    now = time.time()
    for folder, current, names in layout.dated_version_folders(table):
        for name in names:
            if name.endswith(RETIRED_SUFFIX):
                if name.removesuffix(RETIRED_SUFFIX) not in names:
                    os.unlink(f"{folder}/{name}")  # its version is gone already
                continue
            version = f"{folder}/{name}"
            retired = f"{version}{RETIRED_SUFFIX}"
            if version != current and os.path.exists(retired) and now - os.path.getmtime(retired) >= grace:
                delete(version)
                os.unlink(retired)
        if not list_names(folder):
            os.rmdir(folder)


def dropped_partition(layout: WarehouseLayout, table: str, asset: str, business_date: str) -> dict | None:
    """What retention recorded when it dropped the partition (``setting``, the setting's value under its
    name, ``newest``, ``run_id``, ``dropped_at``), or None if it never dropped it. A record written
    before ``setting`` existed is a ``current_days`` one. Reads one small file; no lock, no Spark."""
    try:
        with open(layout.dropped_marker_path(table, asset, business_date), encoding="utf-8") as stream:
            record = json.load(stream)
    except FileNotFoundError:
        return None
    return {"setting": CURRENT_DAYS, **record}


def record_dropped(layout: WarehouseLayout, table: str, asset: str, business_date: str, record: dict, write_id: str) -> None:
    # Written under a hidden name and renamed, so a reader never parses half a record.
    marker = layout.dropped_marker_path(table, asset, business_date)
    hidden = f"{os.path.dirname(marker)}/.{os.path.basename(marker)}.{write_id}.tmp"
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(hidden, "w", encoding="utf-8") as stream:
        stream.write(json.dumps(record) + "\n")
        stream.flush()
        os.fsync(stream.fileno())
    os.rename(hidden, marker)
    fsync_folder(os.path.dirname(marker))


def forget_dropped(layout: WarehouseLayout, table: str, asset: str, business_dates: list[str]) -> None:
    """A date written again is no longer a dropped one (one listing per write; usually nothing there)."""
    recorded = set(list_names(layout.retention_path(table, asset)))
    for day in business_dates:
        if f"{BUSINESS_DATE}={day}.json" in recorded:
            delete(layout.dropped_marker_path(table, asset, day))
