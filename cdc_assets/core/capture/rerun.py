"""Whether a run may replace dates that later stored dates were computed from (pure Python, no Spark, no Dagster).

Each date's state is computed from the state of the date before. A run of the dates D..E of a table
whose ``current_table`` already stores dates after E would leave those later dates holding states
computed from the state it replaces. Such a run is refused before anything is written, unless it is
part of a Dagster backfill whose target holds every one of those later dates: the backfill recomputes
them, oldest first, and this run's writes drop them in the same commit as they write D..E, so a
backfill that stops half-way leaves them absent ("not stored"), never stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from cdc_assets.core.dates import date_runs
from cdc_assets.core.errors import SummarizedError


class LaterDatesStoredError(SummarizedError, RuntimeError):
    """A run of dates that later stored dates were computed from, outside a backfill that recomputes them."""


@dataclass(frozen=True)
class RerunDecision:
    """An allowed run: ``dropped`` are the stored dates after the run's last date that its writes drop
    (empty when none is stored, or the run's range reaches the newest stored date); ``carried`` are the
    stored dates after it that the run recomputes from their stored intake and writes in the same commits
    as its own (a correction that flows forward)."""

    dropped: tuple[str, ...] = ()
    carried: tuple[str, ...] = ()


def rerun_decision(
    table: str, run_dates: list[str], stored_dates: list[str], backfill_dates: set[str] | None,
    carry_forward: bool = False, intake_stored: set[str] | frozenset[str] = frozenset(),
) -> RerunDecision:
    """Decide a run of ``run_dates`` of ``table`` whose ``current_table`` stores ``stored_dates``.

    ``backfill_dates`` are the dates the run's backfill targets (None when the run is not part of a
    backfill). A backfill that targets every later stored date recomputes them: the run drops them.
    Otherwise, with ``carry_forward``, the run recomputes them itself when they are every day from the
    day after its last through the newest and ``intake_stored`` (the dates whose hashed_incoming is
    stored) holds each. Else raises :class:`LaterDatesStoredError` naming them and the range to launch.
    """
    first, last = min(run_dates), max(run_dates)
    later = sorted(day for day in stored_dates if day > last)
    if not later:
        return RerunDecision()
    if backfill_dates is not None and set(later) <= set(backfill_dates):
        return RerunDecision(tuple(later))
    newest = later[-1]
    every_day = [(date.fromisoformat(last) + timedelta(days=n)).isoformat() for n in range(1, (date.fromisoformat(newest) - date.fromisoformat(last)).days + 1)]
    if carry_forward and later == every_day and set(later) <= set(intake_stored):
        return RerunDecision(carried=tuple(later))
    run = first if first == last else f"{first}..{last}"
    outside = "" if backfill_dates is None else (
        f" This run's backfill targets {date_runs(backfill_dates) or 'no date of it'}, which leaves out "
        f"{date_runs(set(later) - set(backfill_dates))}."
    )
    not_carried = ""
    if carry_forward:
        gaps = sorted(set(every_day) - set(later))
        no_intake = sorted(set(later) - set(intake_stored))
        not_carried = (
            f" It cannot recompute them itself: {'current_table lacks ' + date_runs(gaps) if gaps else 'hashed_incoming lacks ' + date_runs(no_intake)}"
            " (dropped by retention, or never run)."
        )
    raise LaterDatesStoredError(
        f"{table}: the run of {run} is refused, nothing was written: current_table stores {date_runs(later)}, "
        f"computed from the state as of {last} that this run would replace, so they would keep a state "
        f"computed from the old one.{outside}{not_carried} Launch {first}..{newest} instead, oldest first: one run of the "
        f"range (dagster asset materialize -m cdc_assets.defs.definitions --select 'group:{table}' "
        f"--partition-range {first}...{newest}), or in the UI Materialize all... with the partition range "
        f"[{first}...{newest}] and Launch backfill."
    )


class PartlyStoredDateError(SummarizedError, RuntimeError):
    """The date a run would build on is stored in current_table but not in every output written after it."""


def require_wholly_stored(table: str, run_dates: list[str], previous: str, missing: list[str]) -> None:
    """Refuse a run of ``run_dates`` built on ``previous`` (the day before its first date), whose
    current_table is stored while ``missing`` (the outputs a date's run commits after current_table) lack
    it: a run of ``previous`` stopped between its commits (a kill, a lost server). Building on it would
    leave those outputs without ``previous`` for good, with every later check passing."""
    if not missing:
        return
    first, last = min(run_dates), max(run_dates)
    run = first if first == last else f"{first}..{last}"
    raise PartlyStoredDateError(
        f"{table}: the run of {run} is refused, nothing was written: {previous}, the date it builds on, is not wholly "
        f"stored: current_table holds it, {' and '.join(missing)} {'does' if len(missing) == 1 else 'do'} not (a run of "
        f"{previous} stopped between its commits). Run {previous} again first (dagster asset materialize -m "
        f"cdc_assets.defs.definitions --select 'group:{table}' --partition {previous}, or Materialize in the UI), then {run}."
    )
