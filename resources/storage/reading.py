"""What a reader is told when a date it needs is not stored: never written, or dropped by retention.

Readers take no lock and write nothing, so they work on a read-only mount; they read each table at
the snapshot committed when they look (resources/storage/tables.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from cdc_assets.core.errors import SummarizedError
from resources.storage.retention import RERUN, STAGING_DAYS

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


def missing_partition_error(dropped: dict[str, Any] | None, table: str, asset: str, business_date: str) -> MissingPartitionError:
    """The error for a date of ``table``/``asset`` that is not stored: dropped by retention or a re-run
    (``dropped``, the storage's record of it, naming the setting), or never written (``dropped`` is None)."""
    if dropped is not None and dropped["setting"] == RERUN:
        rerun = dropped[RERUN]
        after = (date.fromisoformat(rerun.split("..")[-1]) + timedelta(days=1)).isoformat()
        return DroppedPartitionError(
            f"{table}/{asset} has no partition for {business_date}: it was dropped by a re-run of {rerun} "
            f"(run {dropped['run_id']}), with the other dates up to {dropped['newest']} computed from the state "
            f"that re-run replaced. Run {after}..{dropped['newest']}, oldest first, to compute them from the new "
            "state (the re-run's backfill does, unless it stopped)."
        )
    if dropped is not None:
        setting = dropped["setting"]
        dropped_it = (
            f"{table}/{asset} has no partition for {business_date}: retention.{setting} "
            f"({dropped[setting]}, in the table config of {table}) dropped it when the newest stored date "
            f"was {dropped['newest']} (run {dropped['run_id']})."
        )
        if setting == STAGING_DAYS:
            return DroppedPartitionError(
                f"{dropped_it} A run of {business_date} writes it again from the date's extract; raise "
                "retention.staging_days to keep more dates."
            )
        return DroppedPartitionError(
            f"{dropped_it} What needs the state as of {business_date}, "
            "such as a run of the date after it, cannot run; raise retention.current_days to keep more dates."
        )
    return MissingPartitionError(
        f"{table}/{asset} has no partition for {business_date} (the Iceberg table lake.{table}.{asset} "
        "does not hold it). Materialize the dates in order: each date needs the previous date's outputs."
    )
