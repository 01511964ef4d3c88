"""Per-table job, daily schedule and landing sensor.

Business dates are UTC calendar days (the partitions are ``DailyPartitionsDefinition(timezone="UTC")``).
The schedule runs at 01:00 UTC and materializes the business date that ended at midnight UTC. The sensor
looks for extracts that have landed complete (a ready marker, or files that stopped changing) after the
newest materialized date and requests them as one run, keyed by the dates and the state of their files,
so a failed date is requested again once its extract is replaced (see :func:`build_landing_sensor`).
"""

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import NamedTuple

from dagster import (
    AssetObservation,
    AssetSelection,
    DailyPartitionsDefinition,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    build_schedule_from_partitioned_job,
    define_asset_job,
    sensor,
)

from cdc_assets.model.config import TableConfig
from cdc_assets.usecases.landing import LandedFile, landed
from cdc_assets.usecases.landing import exists as marker_exists
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import CURRENT, HASHED_INCOMING
from cdc_assets.defs.runs_log import config_hash

SCHEDULE_HOUR_UTC = 1
SENSOR_INTERVAL_SECONDS = 60
# At most this many dates in one sensor run: a range run holds all its dates' rows at once (docs/running.md,
# "A range of dates in one run"), so a sensor switched on over a long backlog catches up a week per run.
SENSOR_MAX_DATES_PER_RUN = 7
# The sensor watches this many of the newest dates it requested for files that change after their run.
SENSOR_WATCHED_DATES = 14
# Dagster's tags for a run over a range of partitions (what a single-run backfill sets).
RANGE_START_TAG, RANGE_END_TAG = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
# A run in these states may still materialize dates: the sensor waits for it. NOT_STARTED is left out:
# a run the daemon created but never launched would otherwise hold the sensor forever.
UNFINISHED_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def build_table_job(config: TableConfig, partitions_def: DailyPartitionsDefinition):
    """All of the table's assets and checks for one business date (or a range, in one run)."""
    return define_asset_job(
        name=f"{config.name}_job",
        selection=AssetSelection.groups(config.name),
        partitions_def=partitions_def,
        description=f"Materialize every asset of {config.name} for a business date, with its checks.",
    )


def build_daily_schedule(config: TableConfig, job):
    return build_schedule_from_partitioned_job(
        job,
        name=f"{config.name}_daily",
        hour_of_day=SCHEDULE_HOUR_UTC,
        minute_of_hour=0,
        description=(
            f"Every day at {SCHEDULE_HOUR_UTC:02d}:00 UTC, materialize {config.name} for the business date "
            "that just ended (yesterday, UTC)."
        ),
    )


def landed_files(config: TableConfig, business_date: str) -> list[str]:
    """The date's extract as a sorted list of data files; empty until any has landed (cdc_assets/usecases/landing.py:
    a local folder or a bucket, listed without Spark)."""
    return [found.path for found in landed(config.source.path_for(business_date))]


@dataclass(frozen=True)
class Fingerprint:
    """The state of a date's files: a digest of each file's path, size and modification time (ns)."""

    digest: str
    files: int
    size: int

    def describe(self) -> str:
        return f"{self.files} file(s), {self.size} bytes"


def fingerprint(files: list[LandedFile]) -> Fingerprint:
    digest = hashlib.sha256()
    for found in files:
        digest.update(f"{found.path}\t{found.size}\t{found.modified_ns}\n".encode("utf-8"))
    return Fingerprint(digest.hexdigest()[:16], len(files), sum(found.size for found in files))


@dataclass
class LandingCursor:
    """What the landing sensor remembers between ticks, kept in its Dagster cursor as JSON. It stays
    small: ``settling`` holds only the dates after the newest materialized one that the last tick
    looked at, ``requested`` only the newest ``SENSOR_WATCHED_DATES`` dates the sensor requested."""

    # date -> [digest, when first seen with that digest (epoch seconds)]: a date being copied in.
    settling: dict[str, list] = field(default_factory=dict)
    # date -> [digest, files, bytes]: the files of a date when the sensor requested it.
    requested: dict[str, list] = field(default_factory=dict)

    @classmethod
    def load(cls, text: str | None) -> "LandingCursor":
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = {}  # a cursor set by hand, or by an older version: start afresh
        if not isinstance(data, dict):
            data = {}
        return cls(settling=dict(data.get("settling") or {}), requested=dict(data.get("requested") or {}))

    def dump(self) -> str:
        return json.dumps({"settling": self.settling, "requested": self.requested}, sort_keys=True, separators=(",", ":"))

    def record_requested(self, dates: dict[str, Fingerprint]) -> None:
        for day, state in dates.items():
            self.requested[day] = [state.digest, state.files, state.size]
        for day in sorted(self.requested)[:-SENSOR_WATCHED_DATES]:
            del self.requested[day]


class Landing(NamedTuple):
    """Whether a date's extract is complete: its fingerprint if so; else, if files are there, why not yet."""

    fingerprint: Fingerprint | None
    waiting: str | None = None


def input_has_landed(config: TableConfig, business_date: str, cursor: LandingCursor, now: float) -> Landing:
    """Whether the date's extract is complete, so that it may be requested.

    With ``source.ready_marker``: once the marker exists. Otherwise once the size and modification time
    of every file (:func:`landed_files`) are the same as a tick at least ``source.settle_seconds`` ago saw
    them: a file still being copied in grows, and a date requested half-copied would read a full
    extract's missing keys as deletes and a half-written last line as a wrong row. Records what it saw
    in ``cursor.settling``.
    """
    files = landed(config.source.path_for(business_date))
    marker = config.source.ready_marker_for(business_date)
    if marker is not None:
        if marker_exists(marker):
            return Landing(fingerprint(files))
        return Landing(None, f"{business_date} waits for its ready marker {marker}" if files else None)
    if not files:
        return Landing(None)
    current = fingerprint(files)
    seen = cursor.settling.get(business_date)
    if seen is None or seen[0] != current.digest:
        seen = cursor.settling[business_date] = [current.digest, now]
    unchanged_for = now - seen[1]
    if unchanged_for >= config.source.settle_seconds:
        return Landing(current)
    return Landing(
        None,
        f"{business_date} waits for its files to stay unchanged for {config.source.settle_seconds} s "
        f"(source.settle_seconds; unchanged for {unchanged_for:.0f} s so far)",
    )


def landing_run_key(config: TableConfig, dates: dict[str, Fingerprint]) -> str:
    """``<table>:<first>..<last>:<fingerprint>``: the fingerprint hashes the path, size and modification
    time of every file of the dates' extracts, and the table config. The same dates with the same files
    give the same key (Dagster launches a run key once per sensor); a replaced file gives a new one."""
    digest = hashlib.sha256(config_hash(config).encode("utf-8"))
    for day, state in dates.items():
        digest.update(f"\n{day}\t{state.digest}".encode("utf-8"))
    days = list(dates)
    return f"{config.name}:{days[0]}..{days[-1]}:{digest.hexdigest()[:16]}"


def dates_to_request(
    config: TableConfig,
    materialized: set[str],
    last_date: str,
    cursor: LandingCursor,
    now: float,
    limit: int = SENSOR_MAX_DATES_PER_RUN,
) -> tuple[dict[str, Fingerprint], str | None]:
    """Dates whose extract is complete (:func:`input_has_landed`) and that are not materialized, oldest
    first, without gaps, with their fingerprints; and why the next date is not requested yet, if its
    files are there.

    Starts after the latest materialized date (or at start_date) and stops at the first date whose
    input is missing, so a date is never requested before its predecessor, or after ``limit`` dates.
    Past a date that is not complete yet it still looks at the later ones (up to ``limit``), so a
    backlog settles together and goes as one run.
    """
    latest = max(materialized) if materialized else None
    day = date.fromisoformat(latest) + timedelta(days=1) if latest else config.start_date
    end = date.fromisoformat(last_date)
    pending: dict[str, Fingerprint] = {}
    waiting, complete = None, True
    looked_at: list[str] = []
    while day <= end and len(looked_at) < limit:
        key = day.isoformat()
        landing = input_has_landed(config, key, cursor, now)
        if landing.fingerprint is None and landing.waiting is None:
            break  # not there at all
        looked_at.append(key)
        if complete and landing.fingerprint is not None:
            pending[key] = landing.fingerprint
        elif complete:
            complete, waiting = False, landing.waiting
        day += timedelta(days=1)
    cursor.settling = {key: seen for key, seen in cursor.settling.items() if key in looked_at}
    return pending, waiting


def changed_after_request(
    config: TableConfig, cursor: LandingCursor, materialized: set[str]
) -> list[tuple[str, list, Fingerprint]]:
    """The materialized dates the sensor requested whose files have changed since, as (date, what the
    cursor had, now); the cursor then holds the new state, so each change is reported once. A date
    whose files are all gone is dropped without a report: landing folders are often cleared after a load."""
    changed = []
    for day, before in sorted(cursor.requested.items()):
        if day not in materialized:
            continue  # not run yet, or its run failed: its files are requested again once complete
        files = landed(config.source.path_for(day))
        if not files:
            del cursor.requested[day]
            continue
        now = fingerprint(files)
        if now.digest != before[0]:
            changed.append((day, before, now))
            cursor.requested[day] = [now.digest, now.files, now.size]
    return changed


def landing_run_request(config: TableConfig, dates: dict[str, Fingerprint]) -> RunRequest:
    """One run for ``dates`` (consecutive, oldest first): a partition run for one date, else a run over
    the range, as a single-run backfill makes (every asset has ``BackfillPolicy.single_run()``)."""
    run_key = landing_run_key(config, dates)
    days = list(dates)
    if len(days) == 1:
        return RunRequest(run_key=run_key, partition_key=days[0])
    return RunRequest(run_key=run_key, tags={RANGE_START_TAG: days[0], RANGE_END_TAG: days[-1]})


def build_landing_sensor(
    config: TableConfig, job, partitions_def: DailyPartitionsDefinition, clock: Callable[[], float] = time.time
):
    """The table's landing sensor: at most one run request per evaluation.

    It waits while a run of the table's job is queued or running. Otherwise it requests the dates
    after the newest materialized one whose extracts are complete (:func:`input_has_landed`), up to the
    first that is not and at most ``SENSOR_MAX_DATES_PER_RUN``, as one run (:func:`landing_run_request`).
    A run failed by a bad extract leaves those dates unmaterialized, so the next evaluation finds the
    same dates; with the same files it has the same run key, which Dagster does not launch twice (no
    retry loop on a bad extract), and once a file is replaced (and complete), or another date lands, the
    key is new and the dates are requested again.

    A date it requested and that was materialized, whose files change afterwards, is reported (a
    warning in the tick's log, the tick's message, and an observation of ``hashed_incoming`` for that
    date), never re-run: later dates were built on its state, so whether to re-run it, with the dates
    after it (a run of it alone is refused: cdc_assets/core/capture/rerun.py), is the operator's call. ``clock``
    gives the time (epoch seconds) the settling is measured with.
    """
    if "://" in config.source.path:
        remote_note = " The source is not on a local filesystem, so this sensor cannot see it; use the schedule."
    else:
        remote_note = ""
    if config.source.ready_marker is not None:
        complete = f"once its ready marker {config.source.ready_marker} is there"
    else:
        complete = f"once its files have stayed unchanged for {config.source.settle_seconds} s"

    @sensor(
        name=f"{config.name}_landing_sensor",
        job=job,
        minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.STOPPED,
        description=(
            f"Watches {config.source.path} and requests one run for the business dates whose extracts have "
            f"landed after the newest materialized date, oldest first; a date counts as landed {complete}. "
            "A failed date is requested again once its extract is replaced. A materialized date whose files "
            f"change later is reported here, not re-run.{remote_note}"
        ),
    )
    def landing_sensor(context: SensorEvaluationContext):
        if remote_note:
            return SkipReason(remote_note.strip())
        last_date = partitions_def.get_last_partition_key()
        if last_date is None:
            return SkipReason(f"{config.name}: no business date has ended yet (start_date {config.start_date})")
        unfinished = context.instance.get_run_ids(RunsFilter(job_name=job.name, statuses=UNFINISHED_STATUSES), limit=1)
        if unfinished:
            return SkipReason(f"{config.name}: waiting for run {unfinished[0]} of {job.name} to finish")
        cursor = LandingCursor.load(context.cursor)
        materialized = set(context.instance.get_materialized_partitions(asset_key(config, CURRENT)))
        reports, observations = [], []
        for day, before, now in changed_after_request(config, cursor, materialized):
            report = (
                f"{config.name}: the extract of {day} changed after the sensor requested it (was {before[1]} file(s), "
                f"{before[2]} bytes; now {now.describe()}); {day} is materialized and is not re-run: re-run it and "
                "the dates after it (one range run, or a backfill of them) if the change should count"
            )
            context.log.warning(report)
            reports.append(report)
            observations.append(
                AssetObservation(
                    asset_key=asset_key(config, HASHED_INCOMING),
                    partition=day,
                    description=report,
                    metadata={"source_changed_after_run": True, "files": now.files, "bytes": now.size},
                )
            )
        pending, waiting = dates_to_request(config, materialized, last_date, cursor, clock())
        if pending:
            cursor.record_requested(pending)
            return SensorResult(
                run_requests=[landing_run_request(config, pending)], cursor=cursor.dump(), asset_events=observations
            )
        reason = f"{config.name}: {waiting}" if waiting else f"{config.name}: no new extract has landed"
        return SensorResult(skip_reason="; ".join([reason, *reports]), cursor=cursor.dump(), asset_events=observations)

    return landing_sensor
