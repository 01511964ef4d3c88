"""The alert sensor: one alert per table, business date and cause (a late date, a failed run, a failed
blocking check), to the webhook of the ``alert_webhook`` resource, or to the sensor's log without one.

One sensor for the code location, not one per table: a webhook that is down then costs one timeout per
tick, not one per table, and a run that fails across tables is looked at once.

Each tick looks back ``ALERT_MEMORY_DAYS``: failed runs that ended since then, failed evaluations of
blocking checks recorded since then, and dates whose freshness deadline passed since then. The cursor
holds what was sent, as ``table|date|cause`` -> the time of the newest event behind it, and forgets an
entry once that time is older than the look-back: an event can be sent only while it is inside the
look-back, and it is remembered for as long as it is. So repeated ticks send nothing twice, and a second
failure of a date already alerted within the window is not sent again (the key has no run in it).

An alert the webhook does not take is logged (its table, cause and dates, not its content) and left
unsent, so the next tick tries it again, and so on for as long as its event is inside the look-back
(then it is dropped, as every memory is). The rest of that tick's alerts wait too: a dead webhook costs
one timeout per tick.

An alert leaves the instance, so it carries no row values: of a failed run, only the failed step and
the summary of a :class:`~cdc_assets.core.errors.SummarizedError` (else the error's type), never the
error's message, which may name keys (it stays in the run's own log).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from cdc_assets.defs.automation import RANGE_END_TAG, RANGE_START_TAG
from cdc_assets.model.config import TableConfig
from cdc_assets.core.errors import MESSAGE_WITHHELD, summarized_error_names
from cdc_assets.defs.freshness import Clock, late, utc_now
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import CURRENT, PUBLISHED
from resources.alerts import AlertDeliveryError, AlertWebhook

if TYPE_CHECKING:
    from dagster._utils.error import SerializableErrorInfo

ALERT_SENSOR_NAME = "cdc_alerts"
ALERT_SENSOR_INTERVAL_SECONDS = 60
ALERT_MEMORY_DAYS = 7
ALERT_WEBHOOK_KEY = "alert_webhook"
PARTITION_TAG = "dagster/partition"
# Evaluations read per check and tick, newest first: a week of one date a day, with re-runs, is far fewer.
CHECK_HISTORY_LIMIT = 200


class Cause(str, Enum):
    late = "late"
    run_failed = "run_failed"
    check_failed = "check_failed"


@dataclass(frozen=True)
class Event:
    """Something to alert about, for one table and business date."""

    table: str
    day: str
    cause: Cause
    at: float  # when it happened (a deadline, a run's end, a check's evaluation), epoch seconds
    run_id: str | None = None
    what: str = ""  # a failed check's name and equation; a failed run's error is read when it is sent

    @property
    def key(self) -> str:
        return f"{self.table}|{self.day}|{self.cause.value}"


@dataclass(frozen=True)
class WatchedTable:
    """A table the alert sensor watches, and its blocking checks."""

    config: TableConfig
    blocking_checks: tuple[AssetCheckKey, ...]


def watched_table(config: TableConfig, asset_checks: Iterable) -> WatchedTable:
    keys = [spec.key for checks in asset_checks for spec in checks.check_specs if spec.blocking]
    return WatchedTable(config, tuple(sorted(keys, key=lambda key: key.to_user_string())))


def build_alert_sensor(tables: list[WatchedTable], clock: Clock = utc_now) -> SensorDefinition:
    by_name = {table.config.name: table for table in tables}

    # RUNNING by default: it launches no runs, and an alert sensor that is off alerts nobody.
    @sensor(
        name=ALERT_SENSOR_NAME,
        minimum_interval_seconds=ALERT_SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        required_resource_keys={ALERT_WEBHOOK_KEY},
        description=(
            "Sends one alert per table, business date and cause: a date late by its freshness config, a failed "
            "run, a failed blocking check. To the alert_webhook resource's URL as JSON, or to this sensor's log "
            f"when none is set. Looks back {ALERT_MEMORY_DAYS} days; launches no runs."
        ),
    )
    def alert_sensor(context: SensorEvaluationContext):
        webhook: AlertWebhook = getattr(context.resources, ALERT_WEBHOOK_KEY)
        now = clock()
        since = now - timedelta(days=ALERT_MEMORY_DAYS)
        sent = _sent(context.cursor)
        events = [
            *_failed_runs(context.instance, by_name, since),
            *_failed_checks(context.instance, by_name.values(), since),
            *_late_dates(context.instance, by_name.values(), now, since),
        ]
        pending: dict[tuple[str, Cause, str | None], list[Event]] = {}  # one alert each
        queued: dict[str, tuple[str, Cause, str | None]] = {}
        for event in events:
            group = (event.table, event.cause, event.run_id)
            if event.key in sent:  # remembered as long as its newest event is inside the look-back
                sent[event.key] = max(sent[event.key], event.at)
            elif queued.setdefault(event.key, group) == group:  # a key goes in one alert (two failed runs of a date: the newest)
                pending.setdefault(group, []).append(event)
        delivered = 0
        for grouped in pending.values():
            payload = _payload(context.instance, webhook, grouped)
            if webhook.target:
                try:
                    webhook.send(payload)
                except AlertDeliveryError as error:
                    # Not the payload: the log is kept as long as the instance keeps the tick.
                    context.log.warning(
                        f"Alert not delivered ({error}); it ({payload['table']}, {payload['cause']}, "
                        f"{', '.join(payload['business_dates'])}) and {len(pending) - delivered - 1} more are tried "
                        "again next tick"
                    )
                    break
            else:
                context.log.warning(f"ALERT {json.dumps(payload)}")
            for event in grouped:
                sent[event.key] = max(sent.get(event.key, event.at), event.at)
            delivered += 1
        context.update_cursor(json.dumps({key: at for key, at in sorted(sent.items()) if at >= since.timestamp()}))
        where = f"to {webhook.shown}" if webhook.target else "to the log (no webhook URL set)"
        return SkipReason(f"{delivered} alert(s) sent {where}, {len(pending) - delivered} left for the next tick")

    return alert_sensor


def _sent(cursor: str | None) -> dict[str, float]:
    return {str(key): float(at) for key, at in json.loads(cursor).items()} if cursor else {}


def _payload(instance: DagsterInstance, webhook: AlertWebhook, events: list[Event]) -> dict:
    """One alert for events of one table, cause and run (a range run's dates, a table's late dates)."""
    first = events[0]
    dates = sorted({event.day for event in events})
    if first.cause is Cause.run_failed:
        what = _run_failure(instance, first.run_id)
    elif first.cause is Cause.late:
        what = first.what.format(dates=", ".join(dates))
    else:
        what = "; ".join(sorted({event.what for event in events}))
    return {
        "table": first.table,
        "business_date": dates[0],
        "business_dates": dates,
        "cause": first.cause.value,
        "what": what,
        "run_id": first.run_id,
        "run_url": webhook.run_url(first.run_id) if first.run_id else webhook.asset_url([first.table, CURRENT]),
    }


def _failed_runs(instance: DagsterInstance, tables: dict[str, WatchedTable], since: datetime) -> list[Event]:
    """A table's runs that failed since ``since``: its job's, and any other run that selected its assets
    (a backfill or materialization from the UI, ``dagster asset materialize``). Runs without a business
    date (a checks-only run) are left out."""
    events = []
    for record in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE], updated_after=since)):
        run = record.dagster_run
        dates = _run_dates(run)
        at = record.end_time or record.update_timestamp.timestamp()
        if at >= since.timestamp():
            events += [Event(table, day, Cause.run_failed, at, run.run_id) for table in _run_tables(run, tables) for day in dates]
    return events


def _run_tables(run: DagsterRun, tables: dict[str, WatchedTable]) -> list[str]:
    named = {name for name in tables if run.job_name == f"{name}_job"}
    selected = {key.path[0] for key in run.asset_selection or () if key.path[0] in tables}
    return sorted(named | selected)


def _run_dates(run: DagsterRun) -> tuple[str, ...]:
    if PARTITION_TAG in run.tags:
        return (run.tags[PARTITION_TAG],)
    if RANGE_START_TAG in run.tags and RANGE_END_TAG in run.tags:
        first, last = date.fromisoformat(run.tags[RANGE_START_TAG]), date.fromisoformat(run.tags[RANGE_END_TAG])
        return tuple((first + timedelta(days=n)).isoformat() for n in range((last - first).days + 1))
    return ()


def _run_failure(instance: DagsterInstance, run_id: str | None) -> str:
    """The run's first failed step and what its error says without row values (:func:`failure_summary`)."""
    if run_id is None:
        return ""
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        failure = entry.dagster_event
        if failure is not None and failure.step_failure_data is not None:
            return f"step {failure.step_key} failed: {failure_summary(failure.step_failure_data.error)}"
    return "the run failed before any step did (the reason is in the run's log)"


def failure_summary(error: SerializableErrorInfo | None) -> str:
    """Of an error as Dagster recorded it (by class name and message, with its causes), the summary of
    the first :class:`~cdc_assets.core.errors.SummarizedError` in the chain (its message's first line),
    else the type of what the step raised alone: the message may hold row values."""
    summarized = summarized_error_names()
    innermost = None
    while error is not None:  # Dagster's wrapper, then what the step raised, then what that was raised from
        if error.cls_name in summarized:
            return (error.message.strip().splitlines() or ["no message"])[0]
        innermost, error = error, error.cause
    name = innermost.cls_name if innermost is not None and innermost.cls_name else "an error"
    return f"{name} {MESSAGE_WITHHELD}"


def _failed_checks(instance: DagsterInstance, tables: Iterable[WatchedTable], since: datetime) -> list[Event]:
    """Failed evaluations of the tables' blocking checks (severity ERROR) recorded since ``since``."""
    events = []
    for table in tables:
        for key in table.blocking_checks:
            for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=CHECK_HISTORY_LIMIT):
                if record.create_timestamp < since.timestamp():
                    break  # newest first
                evaluation = record.event.asset_check_evaluation if record.event else None  # None: planned, not evaluated
                day = record.partition or (evaluation.partition if evaluation else None)
                if evaluation is None or evaluation.passed or evaluation.severity != AssetCheckSeverity.ERROR or not day:
                    continue
                what = f"{key.asset_key.path[-1]}:{key.name} failed on {day}: {evaluation.description or 'no description'}"
                events.append(Event(table.config.name, day, Cause.check_failed, record.create_timestamp, record.run_id or None, what))
    return events


def _late_dates(instance: DagsterInstance, tables: Iterable[WatchedTable], now: datetime, since: datetime) -> list[Event]:
    """The dates of tables with ``freshness`` whose deadline passed since ``since`` without being published."""
    events = []
    for table in tables:
        config = table.config
        if config.freshness is None:
            continue
        materialized = instance.get_materialized_partitions(asset_key(config, PUBLISHED))
        due_by = f"not published for {{dates}}: each was due by {config.freshness.expected_by} ({config.freshness.timezone}) on the next day"
        events += [
            Event(config.name, due.business_date.isoformat(), Cause.late, due.deadline.timestamp(), what=due_by)
            for due in late(config, now, materialized, since)
        ]
    return events
