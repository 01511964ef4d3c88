"""Per-table job, daily schedule and landing sensor.

Business dates are UTC calendar days (the partitions are ``DailyPartitionsDefinition(timezone="UTC")``).
The schedule runs at 01:00 UTC and materializes the business date that ended at midnight UTC. The sensor
looks for extracts that have landed and requests their dates in order, never a date whose predecessor
has neither been materialized nor requested in the same evaluation.
"""

import glob
import os
from datetime import date, timedelta

from dagster import (
    AssetSelection,
    DailyPartitionsDefinition,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    build_schedule_from_partitioned_job,
    define_asset_job,
    sensor,
)

from cdc_assets.config import TableConfig
from cdc_assets.names import CURRENT, asset_key

SCHEDULE_HOUR_UTC = 1
SENSOR_INTERVAL_SECONDS = 60


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


def input_has_landed(config: TableConfig, business_date: str) -> bool:
    """Whether the date's extract exists. Local paths only: a sensor must not start a JVM to ask."""
    for match in glob.glob(config.source.path_for(business_date)):
        if os.path.isfile(match):
            return True
        # A folder counts once it holds a data file; Spark's own markers (_SUCCESS, .crc) do not.
        if any(not name.startswith((".", "_")) for name in os.listdir(match)):
            return True
    return False


def dates_to_request(config: TableConfig, materialized: set[str], last_date: str) -> list[str]:
    """Dates whose input has landed and that are not materialized, oldest first, without gaps.

    Starts after the latest materialized date (or at start_date) and stops at the first date whose
    input is missing, so a date is never requested before its predecessor.
    """
    latest = max(materialized) if materialized else None
    day = date.fromisoformat(latest) + timedelta(days=1) if latest else config.start_date
    end = date.fromisoformat(last_date)
    pending = []
    while day <= end:
        key = day.isoformat()
        if not input_has_landed(config, key):
            break
        pending.append(key)
        day += timedelta(days=1)
    return pending


def build_landing_sensor(config: TableConfig, job, partitions_def: DailyPartitionsDefinition):
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
            f"Watches {config.source.path} and requests a run for each business date whose extract has "
            f"landed and is not materialized yet, oldest first.{remote_note}"
        ),
    )
    def landing_sensor(context: SensorEvaluationContext):
        if remote_note:
            return SkipReason(remote_note.strip())
        last_date = partitions_def.get_last_partition_key()
        if last_date is None:
            return SkipReason(f"{config.name}: no business date has ended yet (start_date {config.start_date})")
        materialized = set(context.instance.get_materialized_partitions(asset_key(config, CURRENT)))
        pending = dates_to_request(config, materialized, last_date)
        if not pending:
            return SkipReason(f"{config.name}: no new extract has landed")
        return SensorResult(
            run_requests=[RunRequest(run_key=f"{config.name}:{day}", partition_key=day) for day in pending]
        )

    return landing_sensor
