"""The per-table schedule and landing sensor, evaluated against a real Dagster instance."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, build_schedule_context, build_sensor_context

from cdc_assets.automation import RANGE_END_TAG, RANGE_START_TAG, SENSOR_MAX_DATES_PER_RUN
from cdc_assets.names import CURRENT, asset_key
from tests.pipeline import definitions_for, write_table_config

# The tags the sensor daemon puts on a run it launches for a sensor's run request.
RUN_KEY_TAG, SENSOR_NAME_TAG = "dagster/run_key", "dagster/sensor_name"
HEADER = [f"key_{i}" for i in range(1, 6)] + [f"nonkey_{i}" for i in range(1, 11)]


def _write_day(root, day: str, header: list[str] = HEADER) -> None:
    folder = root / day
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-00000.csv").write_text(",".join(header) + "\n" + ",".join(["k"] * 5 + ["1.0"] * 10) + "\n")


def test_schedule_targets_the_business_date_that_just_ended(tmp_path):
    config = write_table_config(tmp_path / "configs", "synthetic", f"{tmp_path}/src/{{date}}/")
    schedule = definitions_for(config).get_schedule_def("synthetic_daily")
    assert schedule.cron_schedule == "0 1 * * *" and schedule.execution_timezone == "UTC"
    context = build_schedule_context(scheduled_execution_time=datetime(2024, 3, 5, 1, 0, tzinfo=timezone.utc))
    [request] = schedule.evaluate_tick(context).run_requests
    assert request.partition_key == "2024-03-04"


def test_sensor_requests_landed_dates_as_one_run_and_recovers_after_a_bad_extract_is_replaced(spark, warehouse, tmp_path):
    source = tmp_path / "src"
    config = write_table_config(tmp_path / "configs", "synthetic", f"{source}/{{date}}/", start_date="2024-01-01")
    defs = definitions_for(config)
    sensor = defs.get_sensor_def("synthetic_landing_sensor")
    job = defs.resolve_job_def("synthetic_job")
    instance = DagsterInstance.ephemeral()

    def evaluate():
        return sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=defs))

    def requested_dates() -> list[tuple[str, str]]:
        """Each run request as (first date, last date)."""
        requests = evaluate().run_requests or []
        return [
            (r.partition_key, r.partition_key) if r.partition_key else (r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG])
            for r in requests
        ]

    def launch():
        """What the sensor daemon does with the evaluation: a run key it has launched before is skipped,
        any other request becomes a run of the sensor's job, tagged with the key. Returns the runs."""
        results = []
        for request in evaluate().run_requests or []:
            if instance.get_runs(RunsFilter(tags={RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: sensor.name})):
                continue
            tags = {**request.tags, RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: sensor.name}
            results.append(job.execute_in_process(instance=instance, tags=tags, raise_on_error=False))
        return results

    def materialized() -> list[str]:
        return sorted(instance.get_materialized_partitions(asset_key(config, CURRENT)))

    assert requested_dates() == []
    _write_day(source, "2024-01-01", header=HEADER[:-1])  # a bad extract: its header lacks nonkey_10
    _write_day(source, "2024-01-02")
    _write_day(source, "2024-01-04")  # 01-03 has not landed: 01-04 must wait for it
    assert requested_dates() == [("2024-01-01", "2024-01-02")]

    [failed] = launch()
    assert not failed.success and materialized() == []
    # Nothing changed: the same run key, so the daemon launches nothing (no retry loop on a bad extract).
    assert requested_dates() == [("2024-01-01", "2024-01-02")] and launch() == []

    _write_day(source, "2024-01-01")  # the extract is replaced
    [recovered] = launch()
    assert recovered.success and materialized() == ["2024-01-01", "2024-01-02"]
    assert evaluate().skip_message == "synthetic: no new extract has landed"

    _write_day(source, "2024-01-03")
    running = instance.create_run_for_job(job_def=job, status=DagsterRunStatus.STARTED)
    result = evaluate()
    assert not result.run_requests and running.run_id in result.skip_message  # waits for the table's run
    instance.report_run_canceled(running)
    assert requested_dates() == [("2024-01-03", "2024-01-04")]
    # A backlog goes SENSOR_MAX_DATES_PER_RUN dates at a time.
    backlog = [(date(2024, 1, 3) + timedelta(days=n)).isoformat() for n in range(SENSOR_MAX_DATES_PER_RUN + 2)]
    for day in backlog:
        _write_day(source, day)
    assert requested_dates() == [(backlog[0], backlog[SENSOR_MAX_DATES_PER_RUN - 1])]
