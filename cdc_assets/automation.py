"""Per-table job, daily schedule and landing sensor.

Business dates are UTC calendar days (the partitions are ``DailyPartitionsDefinition(timezone="UTC")``).
The schedule runs at 01:00 UTC and materializes the business date that ended at midnight UTC. The sensor
looks for extracts that have landed after the newest materialized date and requests them as one run,
keyed by the dates and the state of their files, so a failed date is requested again once its extract
is replaced (see :func:`build_landing_sensor`).
"""

import glob
import hashlib
import os
from datetime import date, timedelta

from dagster import (
    AssetSelection,
    DailyPartitionsDefinition,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    build_schedule_from_partitioned_job,
    define_asset_job,
    sensor,
)

from cdc_assets.config import TableConfig
from cdc_assets.names import CURRENT, asset_key
from cdc_assets.runs_log import config_hash

SCHEDULE_HOUR_UTC = 1
SENSOR_INTERVAL_SECONDS = 60
# At most this many dates in one sensor run: a range run holds all its dates' rows at once (docs/running.md,
# "A range of dates in one run"), so a sensor switched on over a long backlog catches up a week per run.
SENSOR_MAX_DATES_PER_RUN = 7
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
    """The date's extract as a sorted list of files; empty until it has landed.

    Local paths only: a sensor must not start a JVM to ask. A folder counts with the data files in it;
    Spark's own markers (``_SUCCESS``, ``.crc``) are not data.
    """
    files = []
    for match in glob.glob(config.source.path_for(business_date)):
        if os.path.isfile(match):
            files.append(match)
        elif os.path.isdir(match):
            files += [
                os.path.join(match, name)
                for name in os.listdir(match)
                if not name.startswith((".", "_")) and os.path.isfile(os.path.join(match, name))
            ]
    return sorted(files)


def input_has_landed(config: TableConfig, business_date: str) -> bool:
    """Whether the date's extract exists (see :func:`landed_files`)."""
    return bool(landed_files(config, business_date))


def landing_run_key(config: TableConfig, dates: list[str]) -> str:
    """``<table>:<first>..<last>:<fingerprint>``: the fingerprint hashes the path, size and modification
    time of every file of the dates' extracts, and the table config. The same dates with the same files
    give the same key (Dagster launches a run key once per sensor); a replaced file gives a new one."""
    digest = hashlib.sha256(config_hash(config).encode("utf-8"))
    for day in dates:
        for path in landed_files(config, day):
            stat = os.stat(path)
            digest.update(f"\n{day}\t{path}\t{stat.st_size}\t{stat.st_mtime_ns}".encode("utf-8"))
    return f"{config.name}:{dates[0]}..{dates[-1]}:{digest.hexdigest()[:16]}"


def dates_to_request(
    config: TableConfig, materialized: set[str], last_date: str, limit: int = SENSOR_MAX_DATES_PER_RUN
) -> list[str]:
    """Dates whose input has landed and that are not materialized, oldest first, without gaps.

    Starts after the latest materialized date (or at start_date) and stops at the first date whose
    input is missing, so a date is never requested before its predecessor, or after ``limit`` dates.
    """
    latest = max(materialized) if materialized else None
    day = date.fromisoformat(latest) + timedelta(days=1) if latest else config.start_date
    end = date.fromisoformat(last_date)
    pending = []
    while day <= end and len(pending) < limit:
        key = day.isoformat()
        if not input_has_landed(config, key):
            break
        pending.append(key)
        day += timedelta(days=1)
    return pending


def landing_run_request(config: TableConfig, dates: list[str]) -> RunRequest:
    """One run for ``dates`` (consecutive, oldest first): a partition run for one date, else a run over
    the range, as a single-run backfill makes (every asset has ``BackfillPolicy.single_run()``)."""
    run_key = landing_run_key(config, dates)
    if len(dates) == 1:
        return RunRequest(run_key=run_key, partition_key=dates[0])
    return RunRequest(run_key=run_key, tags={RANGE_START_TAG: dates[0], RANGE_END_TAG: dates[-1]})


def build_landing_sensor(config: TableConfig, job, partitions_def: DailyPartitionsDefinition):
    """The table's landing sensor: at most one run request per evaluation.

    It waits while a run of the table's job is queued or running. Otherwise it requests the dates
    after the newest materialized one whose extracts have landed, up to the first that has not and at
    most ``SENSOR_MAX_DATES_PER_RUN``, as one run (:func:`landing_run_request`). A run failed by a bad
    extract leaves those dates unmaterialized, so the next evaluation finds the same dates; with the
    same files it has the same run key, which Dagster does not launch twice (no retry loop on a bad
    extract), and once a file is replaced, or another date lands, the key is new and the dates are
    requested again.
    """
    if "://" in config.source.path:
        remote_note = " The source is not on a local filesystem, so this sensor cannot see it; use the schedule."
    else:
        remote_note = ""

    @sensor(
        name=f"{config.name}_landing_sensor",
        job=job,
        minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.STOPPED,
        description=(
            f"Watches {config.source.path} and requests one run for the business dates whose extracts have "
            "landed after the newest materialized date, oldest first; a failed date is requested again once "
            f"its extract is replaced.{remote_note}"
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
        materialized = set(context.instance.get_materialized_partitions(asset_key(config, CURRENT)))
        pending = dates_to_request(config, materialized, last_date)
        if not pending:
            return SkipReason(f"{config.name}: no new extract has landed")
        return landing_run_request(config, pending)

    return landing_sensor
