"""When a table's business date is due, and the ``freshness`` check that shows in the UI whether it arrived.

A table with ``freshness: {expected_by: "06:00", timezone: "Europe/Amsterdam"}`` expects business date D
(a UTC day, as the partitions are) to have its ``current_table`` materialized by 06:00 Amsterdam time on
the day after D. The check looks at the newest date due at the time it runs: passed when that date is
materialized, failed (severity WARN: late, not wrong) when it is not.

Why not Dagster's own freshness machinery: ``FreshnessPolicy`` looks at the time of the newest
materialization of any partition, so a re-run of an old date would count as fresh; and
``build_time_partition_freshness_checks`` (partition-aware, but superseded in Dagster 1.13) fails with an
error, not a result, until the first date is due, after which its evaluation sensor waits on that
check forever. This check asks the same question as the latter ("is the newest due partition
materialized?") with the config's own deadline, and never errors.

The check runs in every run that materializes ``current_table`` (Dagster adds an asset's checks to its
runs), and the table's freshness sensor reports it whenever its outcome changes between runs, e.g. when a
deadline passes with nothing materialized. The sensor launches no runs.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetChecksDefinition,
    AssetRecordsFilter,
    DagsterInstance,
    DefaultSensorStatus,
    MetadataValue,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    asset_check,
    sensor,
)

from cdc_assets.model.config import Freshness, TableConfig
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import CURRENT, PUBLISHED

FRESHNESS_CHECK = "freshness"
FRESHNESS_SENSOR_INTERVAL_SECONDS = 60
EXPECTED_DATE_METADATA = "expected_business_date"

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Due:
    """A business date and the moment its ``current_table`` is due (UTC)."""

    business_date: date
    deadline: datetime


def deadline(freshness: Freshness, business_date: date) -> datetime:
    """When ``business_date`` is due: ``expected_by`` on the next day, in the config's time zone, as UTC.

    A clock time that does not exist that night (the hour skipped when daylight saving starts) is read
    with the offset before the change, an hour later on the clock; one that occurs twice (when it ends)
    is its first occurrence.
    """
    hour, minute = (int(part) for part in freshness.expected_by.split(":"))
    local = datetime.combine(business_date + timedelta(days=1), time(hour, minute), tzinfo=ZoneInfo(freshness.timezone))
    return local.astimezone(timezone.utc)


def latest_due(freshness: Freshness, now: datetime) -> Due:
    """The newest business date whose deadline is at or before ``now``."""
    local_today = now.astimezone(ZoneInfo(freshness.timezone)).date()
    # D's deadline is on the local day after D: yesterday's date once today's deadline has passed, else the day before.
    for business_date in (local_today - timedelta(days=1), local_today - timedelta(days=2)):
        due = Due(business_date, deadline(freshness, business_date))
        if due.deadline <= now:
            return due
    raise AssertionError(f"no deadline of {freshness} on or before {now}")  # the second candidate's is a day before today


def expected(config: TableConfig, now: datetime) -> Due | None:
    """The table's newest date due at ``now`` (at most its ``end_date``); None before ``start_date`` is due."""
    newest = latest_due(_freshness(config), now).business_date
    if config.end_date is not None:
        newest = min(newest, config.end_date)
    if newest < config.start_date:
        return None
    return Due(newest, deadline(_freshness(config), newest))


def late(config: TableConfig, now: datetime, materialized: Collection[str], since: datetime) -> list[Due]:
    """The dates due at ``now`` whose deadline is at or after ``since`` and whose ``current_table`` is not in
    ``materialized`` (ISO dates), oldest first."""
    newest = expected(config, now)
    found = []
    day = newest.business_date if newest else None
    while day is not None and day >= config.start_date:
        due = Due(day, deadline(_freshness(config), day))
        if due.deadline < since:
            break
        if day.isoformat() not in materialized:
            found.append(due)
        day -= timedelta(days=1)
    return found[::-1]


@dataclass(frozen=True)
class FreshnessOutcome:
    passed: bool
    description: str
    expected_date: str  # "" when nothing is due yet
    metadata: dict


def freshness_outcome(config: TableConfig, instance: DagsterInstance, now: datetime) -> FreshnessOutcome:
    """Whether the table's newest due date is published, as of ``now``."""
    freshness = _freshness(config)
    key = asset_key(config, PUBLISHED)
    newest = expected(config, now)
    if newest is None:
        first = deadline(freshness, config.start_date)
        return FreshnessOutcome(
            True,
            f"No business date is due yet: {config.start_date} is due by {_local(first, freshness)}.",
            "",
            {"next_deadline": MetadataValue.timestamp(first.timestamp())},
        )
    day = newest.business_date.isoformat()
    metadata = {
        EXPECTED_DATE_METADATA: MetadataValue.text(day),
        "deadline": MetadataValue.timestamp(newest.deadline.timestamp()),
    }
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1).records
    if records:
        return FreshnessOutcome(
            True, f"{day} is published; it was due by {_local(newest.deadline, freshness)}.", day, metadata
        )
    overdue = now - newest.deadline
    metadata["overdue_minutes"] = MetadataValue.int(int(overdue.total_seconds() // 60))
    return FreshnessOutcome(
        False,
        f"{day} is late: it was due by {_local(newest.deadline, freshness)} and is not published "
        f"({_duration(overdue)} overdue).",
        day,
        metadata,
    )


def build_freshness_check(config: TableConfig, clock: Clock = utc_now) -> AssetChecksDefinition:
    freshness = _freshness(config)

    @asset_check(
        asset=asset_key(config, CURRENT),
        name=FRESHNESS_CHECK,
        blocking=False,
        description=(
            f"Each business date is published ({PUBLISHED}) by {freshness.expected_by} "
            f"({freshness.timezone}) on the next day: the newest date due is checked."
        ),
    )
    def freshness_check(context: AssetCheckExecutionContext) -> AssetCheckResult:
        outcome = freshness_outcome(config, context.instance, clock())
        return AssetCheckResult(
            passed=outcome.passed, severity=AssetCheckSeverity.WARN, description=outcome.description, metadata=outcome.metadata
        )

    return freshness_check


def build_freshness_sensor(config: TableConfig, clock: Clock = utc_now) -> SensorDefinition:
    """Reports the freshness check whenever its outcome (the date due, or whether it is materialized)
    differs from the latest one recorded, so the UI turns when a deadline passes without a run."""
    check_key = AssetCheckKey(asset_key(config, CURRENT), FRESHNESS_CHECK)

    # RUNNING by default: it launches no runs, and stopped it would leave the check as the last run left it.
    @sensor(
        name=f"{config.name}_freshness_sensor",
        minimum_interval_seconds=FRESHNESS_SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            f"Reports {config.name}'s freshness check when a deadline passes or a date arrives between runs; "
            "launches no runs."
        ),
    )
    def freshness_sensor(context: SensorEvaluationContext):
        outcome = freshness_outcome(config, context.instance, clock())
        latest = context.instance.event_log_storage.get_latest_asset_check_execution_by_key([check_key]).get(check_key)
        evaluation = latest.event.asset_check_evaluation if latest and latest.event else None
        if latest is not None and evaluation is None:  # planned by a run: wait for it, unless it ended without evaluating
            run = context.instance.get_run_by_id(latest.run_id)
            if run is not None and not run.is_finished:
                return SkipReason(f"{config.name}: run {run.run_id} is evaluating the freshness check")
        if evaluation is not None and (evaluation.passed, _expected_date(evaluation)) == (outcome.passed, outcome.expected_date):
            return SkipReason(f"{config.name}: unchanged, {outcome.description}")
        context.instance.report_runless_asset_event(
            AssetCheckEvaluation(
                asset_key=check_key.asset_key,
                check_name=FRESHNESS_CHECK,
                passed=outcome.passed,
                severity=AssetCheckSeverity.WARN,
                description=outcome.description,
                metadata=outcome.metadata,
            )
        )
        return SkipReason(f"{config.name}: reported {outcome.description}")

    return freshness_sensor


def freshness_definitions(config: TableConfig) -> tuple[list[AssetChecksDefinition], list[SensorDefinition]]:
    """The table's freshness check and sensor; none for a table without ``freshness``."""
    if config.freshness is None:
        return [], []
    return [build_freshness_check(config)], [build_freshness_sensor(config)]


def _expected_date(evaluation: AssetCheckEvaluation) -> str:
    value = evaluation.metadata.get(EXPECTED_DATE_METADATA)
    return str(value.value) if value is not None else ""


def _freshness(config: TableConfig) -> Freshness:
    if config.freshness is None:
        raise ValueError(f"{config.source_file}: table {config.name} has no freshness section")
    return config.freshness


def _local(moment: datetime, freshness: Freshness) -> str:
    return f"{moment.astimezone(ZoneInfo(freshness.timezone)):%Y-%m-%d %H:%M} {freshness.timezone}"


def _duration(span: timedelta) -> str:
    minutes = int(span.total_seconds() // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"
