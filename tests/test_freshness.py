"""When a business date is due (a frozen clock, across Europe/Amsterdam's daylight-saving changes), and the
freshness check on current_table: evaluated in a real run and reported by its sensor on a real instance."""

from __future__ import annotations

from datetime import date, datetime, timezone

from dagster import AssetCheckKey, AssetCheckSeverity, AssetMaterialization, AssetSelection, DagsterInstance, build_sensor_context, define_asset_job

from cdc_assets.model.config import Freshness
from cdc_assets.defs.component import build_definitions
from cdc_assets.defs.factory import build_table_definitions
from cdc_assets.defs.freshness import (
    FRESHNESS_CHECK,
    Due,
    build_freshness_check,
    build_freshness_sensor,
    deadline,
    expected,
    late,
    latest_due,
)
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import CURRENT, PUBLISHED
from tests.pipeline import write_table_config

AMSTERDAM = Freshness(expected_by="06:00", timezone="Europe/Amsterdam")


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=timezone.utc)


def test_a_date_is_due_at_expected_by_on_the_next_day_in_the_configured_zone():
    # Winter (CET, UTC+1): 2026-01-14 is due at 2026-01-15 06:00 Amsterdam = 05:00 UTC.
    assert deadline(AMSTERDAM, date(2026, 1, 14)) == utc(2026, 1, 15, 5, 0)
    assert latest_due(AMSTERDAM, utc(2026, 1, 15, 4, 59)).business_date == date(2026, 1, 13)
    assert latest_due(AMSTERDAM, utc(2026, 1, 15, 5, 0)) == Due(date(2026, 1, 14), utc(2026, 1, 15, 5, 0))
    # Summer (CEST, UTC+2): an hour earlier in UTC.
    assert deadline(AMSTERDAM, date(2026, 7, 1)) == utc(2026, 7, 2, 4, 0)
    assert deadline(Freshness(expected_by="06:00"), date(2026, 7, 1)) == utc(2026, 7, 2, 6, 0)  # UTC by default


def test_the_deadline_follows_the_clock_across_daylight_saving_changes():
    # Clocks go forward on 2026-03-29 at 02:00: 2026-03-27 is due at 05:00 UTC, 2026-03-28 at 04:00 UTC.
    assert deadline(AMSTERDAM, date(2026, 3, 27)) == utc(2026, 3, 28, 5, 0)
    assert deadline(AMSTERDAM, date(2026, 3, 28)) == utc(2026, 3, 29, 4, 0)
    assert latest_due(AMSTERDAM, utc(2026, 3, 29, 3, 59)).business_date == date(2026, 3, 27)
    assert latest_due(AMSTERDAM, utc(2026, 3, 29, 4, 0)).business_date == date(2026, 3, 28)  # a fixed UTC+1 would wait
    # Clocks go back on 2026-10-25 at 03:00: 2026-10-24 is due at 05:00 UTC, not yet at 04:30.
    assert deadline(AMSTERDAM, date(2026, 10, 24)) == utc(2026, 10, 25, 5, 0)
    assert latest_due(AMSTERDAM, utc(2026, 10, 25, 4, 30)).business_date == date(2026, 10, 23)
    # 02:30 does not exist on 2026-03-29: read with the offset before the change (03:30 CEST); on
    # 2026-10-25 it occurs twice: the first (CEST).
    skipped = Freshness(expected_by="02:30", timezone="Europe/Amsterdam")
    assert deadline(skipped, date(2026, 3, 28)) == utc(2026, 3, 29, 1, 30)
    assert deadline(skipped, date(2026, 10, 24)) == utc(2026, 10, 25, 0, 30)


def test_a_table_expects_nothing_before_its_start_and_nothing_after_its_end(tmp_path):
    config = write_table_config(
        tmp_path, "shop", "x/{date}.csv", start_date="2026-03-26", end_date="2026-03-27",
        freshness={"expected_by": "06:00", "timezone": "Europe/Amsterdam"},
    )
    assert expected(config, utc(2026, 3, 27, 4, 59)) is None  # 2026-03-26 is due at 05:00 UTC
    assert expected(config, utc(2026, 3, 27, 5, 0)).business_date == date(2026, 3, 26)
    assert expected(config, utc(2026, 4, 30)).business_date == date(2026, 3, 27)  # the last date, for good
    since = utc(2026, 3, 27)
    assert [due.business_date for due in late(config, utc(2026, 4, 30), set(), since)] == [date(2026, 3, 26), date(2026, 3, 27)]
    assert late(config, utc(2026, 4, 30), {"2026-03-26", "2026-03-27"}, since) == []
    # Only deadlines since `since`: 2026-03-26's passed before 2026-03-28.
    assert [due.business_date for due in late(config, utc(2026, 4, 30), set(), utc(2026, 3, 28))] == [date(2026, 3, 27)]


def test_the_freshness_check_turns_when_a_deadline_passes_and_when_the_date_arrives(tmp_path):
    config = write_table_config(
        tmp_path, "shop", "x/{date}.csv", start_date="2026-03-26", freshness={"expected_by": "06:00", "timezone": "Europe/Amsterdam"}
    )
    table = build_table_definitions(config)
    check_key = AssetCheckKey(asset_key(config, CURRENT), FRESHNESS_CHECK)
    shipped = [spec.key for checks in table.asset_checks for spec in checks.check_specs]
    assert check_key in shipped and "shop_freshness_sensor" in [sensor.name for sensor in table.sensors]
    now = [utc(2026, 3, 29, 3, 59)]  # the frozen clock: before 2026-03-28 is due (04:00 UTC, the first day of CEST)
    table.asset_checks = [checks for checks in table.asset_checks if check_key not in checks.check_keys]
    table.asset_checks.append(build_freshness_check(config, clock=lambda: now[0]))
    table.jobs.append(define_asset_job("freshness_only", selection=AssetSelection.checks(check_key)))
    defs = build_definitions([table])
    # The table's own job evaluates it in every run that materializes current_table.
    assert check_key in defs.resolve_job_def("shop_job").asset_layer.asset_graph.asset_check_keys
    sensor = build_freshness_sensor(config, clock=lambda: now[0])
    instance = DagsterInstance.ephemeral()

    def materialize(day: str) -> None:
        instance.report_runless_asset_event(AssetMaterialization(asset_key(config, PUBLISHED), partition=day))

    def latest():
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key([check_key])[check_key]
        return record.event.asset_check_evaluation

    def tick() -> str:
        return sensor.evaluate_tick(build_sensor_context(instance=instance)).skip_message

    materialize("2026-03-26")
    materialize("2026-03-27")
    assert tick().startswith("shop: reported 2026-03-27 is published")
    assert latest().passed and latest().metadata["expected_business_date"].value == "2026-03-27"
    assert tick().startswith("shop: unchanged")  # nothing new is recorded while nothing changes

    now[0] = utc(2026, 3, 29, 4, 0)  # 06:00 in Amsterdam: 2026-03-28 is due and has not arrived
    assert tick().startswith("shop: reported 2026-03-28 is late")
    evaluation = latest()
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.WARN
    assert evaluation.description == (
        "2026-03-28 is late: it was due by 2026-03-29 06:00 Europe/Amsterdam and is not published (0h00m overdue)."
    )
    now[0] = utc(2026, 3, 29, 6, 30)
    assert tick().startswith("shop: unchanged")  # still late: no new evaluation every tick

    # A run evaluates the check as well, with the same clock.
    result = defs.resolve_job_def("freshness_only").execute_in_process(instance=instance)
    [run_evaluation] = result.get_asset_check_evaluations()
    assert not run_evaluation.passed and "2h30m overdue" in run_evaluation.description

    materialize("2026-03-28")
    assert tick().startswith("shop: reported 2026-03-28 is published; it was due by 2026-03-29 06:00 Europe/Amsterdam")
    assert latest().passed
