"""The per-table schedule and landing sensor, evaluated against a real Dagster instance."""

from __future__ import annotations

from datetime import datetime, timezone

from dagster import DagsterInstance, build_schedule_context, build_sensor_context

from tests.pipeline import definitions_for, run_dates, write_table_config


def _write_day(root, day: str) -> None:
    folder = root / day
    folder.mkdir(parents=True)
    header = ",".join([f"key_{i}" for i in range(1, 6)] + [f"nonkey_{i}" for i in range(1, 11)])
    (folder / "part-00000.csv").write_text(header + "\n" + ",".join(["k"] * 5 + ["1.0"] * 10) + "\n")


def test_schedule_targets_the_business_date_that_just_ended(tmp_path):
    config = write_table_config(tmp_path / "configs", "synthetic", f"{tmp_path}/src/{{date}}/")
    schedule = definitions_for(config).get_schedule_def("synthetic_daily")
    assert schedule.cron_schedule == "0 1 * * *" and schedule.execution_timezone == "UTC"
    context = build_schedule_context(scheduled_execution_time=datetime(2024, 3, 5, 1, 0, tzinfo=timezone.utc))
    [request] = schedule.evaluate_tick(context).run_requests
    assert request.partition_key == "2024-03-04"


def test_sensor_requests_landed_dates_in_order(spark, warehouse, tmp_path):
    source = tmp_path / "src"
    config = write_table_config(tmp_path / "configs", "synthetic", f"{source}/{{date}}/", start_date="2024-01-01")
    defs = definitions_for(config)
    sensor = defs.get_sensor_def("synthetic_landing_sensor")
    instance = DagsterInstance.ephemeral()

    def requested() -> list[str]:
        result = sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=defs))
        return [request.partition_key for request in result.run_requests or []]

    assert requested() == []
    _write_day(source, "2024-01-01")
    _write_day(source, "2024-01-02")
    _write_day(source, "2024-01-04")  # 01-03 has not landed: 01-04 must wait for it
    assert requested() == ["2024-01-01", "2024-01-02"]

    run_dates(defs, ["2024-01-01", "2024-01-02"], instance)
    assert requested() == []
    _write_day(source, "2024-01-03")
    assert requested() == ["2024-01-03", "2024-01-04"]
