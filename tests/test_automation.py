"""The per-table schedule and landing sensor, evaluated against a real Dagster instance."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, build_schedule_context, build_sensor_context

from cdc_assets.defs.automation import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    SENSOR_MAX_DATES_PER_RUN,
    SENSOR_WATCHED_DATES,
    LandingCursor,
    build_landing_sensor,
    fingerprint,
    landed_files,
)
from cdc_assets.model.config import TableConfigError
from cdc_assets.core.intake.source import read_source
from cdc_assets.defs.factory import build_table_definitions
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import CURRENT, HASHED_INCOMING
from tests.pipeline import definitions_for, partition_dir, read_stored, write_table_config

# The tags the sensor daemon puts on a run it launches for a sensor's run request.
RUN_KEY_TAG, SENSOR_NAME_TAG = "dagster/run_key", "dagster/sensor_name"
HEADER = [f"key_{i}" for i in range(1, 6)] + [f"nonkey_{i}" for i in range(1, 11)]


def _write_day(root, day: str, header: list[str] = HEADER) -> None:
    folder = root / day
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-00000.csv").write_text(",".join(header) + "\n" + ",".join(["k"] * 5 + ["1.0"] * 10) + "\n")


def _extract(rows: int) -> str:
    """A full extract of ``rows`` distinct keys, as CSV text with its header."""
    lines = [",".join([f"k{row}"] + ["k"] * 4 + [f"{row}.0"] * 10) for row in range(rows)]
    return "\n".join([",".join(HEADER), *lines]) + "\n"


class LandingSensor:
    """The table's landing sensor evaluated tick by tick against a real instance as the sensor daemon
    does: each tick gets the cursor the last one left, and a run request whose run key was launched
    before launches nothing. With ``settable_clock`` the sensor is built by the project's builder on the
    test's clock (``now``, epoch seconds); without, it is the definitions' own, on the real clock."""

    def __init__(self, config, settable_clock: bool = True):
        self.config = config
        self.defs = definitions_for(config)
        self.job = self.defs.resolve_job_def(f"{config.name}_job")
        self.now = 1_700_000_000.0
        if settable_clock:
            partitions_def = build_table_definitions(config).partitions_def
            self.sensor = build_landing_sensor(config, self.job, partitions_def, clock=lambda: self.now)
        else:
            self.sensor = self.defs.get_sensor_def(f"{config.name}_landing_sensor")
        self.instance = DagsterInstance.ephemeral()
        self.cursor = None

    def tick(self):
        context = build_sensor_context(instance=self.instance, definitions=self.defs, cursor=self.cursor)
        result = self.sensor.evaluate_tick(context)
        if result.cursor is not None:  # the daemon keeps the cursor a tick did not set
            self.cursor = result.cursor
        return result

    def requested_dates(self, result) -> list[tuple[str, str]]:
        """Each run request of a tick as (first date, last date)."""
        return [
            (r.partition_key, r.partition_key) if r.partition_key else (r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG])
            for r in result.run_requests or []
        ]

    def launch(self, result):
        """Run the tick's new run requests through the job, tagged as the daemon tags them."""
        runs = []
        for request in result.run_requests or []:
            tags = {RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: self.sensor.name}
            if self.instance.get_runs(RunsFilter(tags=tags)):
                continue
            runs.append(
                self.job.execute_in_process(
                    instance=self.instance,
                    tags={**request.tags, **tags},
                    partition_key=request.partition_key,
                    raise_on_error=False,
                )
            )
        return runs

    def materialized(self) -> list[str]:
        return sorted(self.instance.get_materialized_partitions(asset_key(self.config, CURRENT)))


def test_schedule_targets_the_business_date_that_just_ended(tmp_path):
    config = write_table_config(tmp_path / "configs", "synthetic", f"{tmp_path}/src/{{date}}/")
    schedule = definitions_for(config).get_schedule_def("synthetic_daily")
    assert schedule.cron_schedule == "0 1 * * *" and schedule.execution_timezone == "UTC"
    context = build_schedule_context(scheduled_execution_time=datetime(2024, 3, 5, 1, 0, tzinfo=timezone.utc))
    [request] = schedule.evaluate_tick(context).run_requests
    assert request.partition_key == "2024-03-04"


def test_sensor_requests_landed_dates_as_one_run_and_recovers_after_a_bad_extract_is_replaced(spark, warehouse, tmp_path):
    source = tmp_path / "src"
    # Files counted as landed at first sight (settle_seconds 0): settling has tests of its own below.
    config = write_table_config(
        tmp_path / "configs", "synthetic", "",
        start_date="2024-01-01",
        source={"path": f"{source}/{{date}}/", "format": "csv", "options": {"header": True}, "settle_seconds": 0},
    )
    sensor = LandingSensor(config, settable_clock=False)

    def requested_dates() -> list[tuple[str, str]]:
        return sensor.requested_dates(sensor.tick())

    def launch():
        return sensor.launch(sensor.tick())

    assert requested_dates() == []
    _write_day(source, "2024-01-01", header=HEADER[:-1])  # a bad extract: its header lacks nonkey_10
    _write_day(source, "2024-01-02")
    _write_day(source, "2024-01-04")  # 01-03 has not landed: 01-04 must wait for it
    assert requested_dates() == [("2024-01-01", "2024-01-02")]

    [failed] = launch()
    assert not failed.success and sensor.materialized() == []
    # Nothing changed: the same run key, so the daemon launches nothing (no retry loop on a bad extract).
    assert requested_dates() == [("2024-01-01", "2024-01-02")] and launch() == []

    _write_day(source, "2024-01-01")  # the extract is replaced
    [recovered] = launch()
    assert recovered.success and sensor.materialized() == ["2024-01-01", "2024-01-02"]
    assert sensor.tick().skip_message == "synthetic: no new extract has landed"

    _write_day(source, "2024-01-03")
    running = sensor.instance.create_run_for_job(job_def=sensor.job, status=DagsterRunStatus.STARTED)
    result = sensor.tick()
    assert not result.run_requests and running.run_id in result.skip_message  # waits for the table's run
    sensor.instance.report_run_canceled(running)
    assert requested_dates() == [("2024-01-03", "2024-01-04")]
    # A backlog goes SENSOR_MAX_DATES_PER_RUN dates at a time.
    backlog = [(date(2024, 1, 3) + timedelta(days=n)).isoformat() for n in range(SENSOR_MAX_DATES_PER_RUN + 2)]
    for day in backlog:
        _write_day(source, day)
    assert requested_dates() == [(backlog[0], backlog[SENSOR_MAX_DATES_PER_RUN - 1])]


def test_sensor_requests_a_date_copied_in_two_steps_once_its_files_stop_changing(spark, warehouse, tmp_path):
    """A full extract still being copied is not requested: its missing keys would be deletes, its cut last
    line a wrong row. It is requested once its files' size and mtime held across ticks settle_seconds apart;
    a file that changes after its date ran is reported, not re-run."""
    source = tmp_path / "src"
    config = write_table_config(tmp_path / "configs", "synthetic", f"{source}/{{date}}/", start_date="2024-01-01")
    assert config.source.settle_seconds == 60  # the default
    sensor = LandingSensor(config)
    day, extract = "2024-01-01", _extract(rows=4)
    (source / day).mkdir(parents=True)
    part = source / day / "part-00000.csv"
    part.write_text(extract[: len(extract) // 2])  # the first half of the copy: the last line is cut
    waiting = sensor.tick()
    assert not waiting.run_requests
    assert "2024-01-01 waits for its files to stay unchanged for 60 s" in waiting.skip_message

    with part.open("a") as copying:  # the rest of the copy
        copying.write(extract[len(extract) // 2 :])
    sensor.now += 45
    assert not sensor.tick().run_requests  # changed since the last tick: the 60 s start again
    sensor.now += 59
    assert not sensor.tick().run_requests  # unchanged for 59 s only
    sensor.now += 1
    complete = sensor.tick()
    assert sensor.requested_dates(complete) == [(day, day)]
    again = sensor.tick()  # the run not launched yet: the same request, which the daemon launches once
    assert [r.run_key for r in again.run_requests] == [r.run_key for r in complete.run_requests]

    [run] = sensor.launch(complete)
    assert run.success and sensor.materialized() == [day] and sensor.launch(sensor.tick()) == []
    assert read_stored(spark, partition_dir(warehouse, "synthetic", HASHED_INCOMING, day)).count() == 4

    # The extract changes after its date ran: reported once (tick message, and an observation of the
    # date's hashed_incoming), never re-run.
    part.write_text(_extract(rows=5))
    sensor.now += 60
    changed = sensor.tick()
    assert not changed.run_requests
    assert "the extract of 2024-01-01 changed after the sensor requested it" in changed.skip_message
    assert "was 1 file(s)" in changed.skip_message and "is materialized and is not re-run" in changed.skip_message
    [observation] = changed.asset_events
    assert observation.asset_key == asset_key(config, HASHED_INCOMING) and observation.partition == day
    sensor.now += 60
    later = sensor.tick()
    assert later.skip_message == "synthetic: no new extract has landed" and not later.asset_events
    assert sensor.materialized() == [day] and len(sensor.instance.get_runs()) == 1


def test_sensor_of_a_table_with_a_ready_marker_waits_for_the_marker(tmp_path):
    """With source.ready_marker the marker says when a date is complete: complete files without it are
    not requested, however long they sit; with it the date is requested at once."""
    source = tmp_path / "src"
    config = write_table_config(
        tmp_path / "configs", "synthetic", "",
        start_date="2024-01-01",
        source={"path": f"{source}/{{date}}/", "format": "csv", "options": {"header": True}, "ready_marker": "_SUCCESS"},
    )
    sensor = LandingSensor(config)
    for day in ("2024-01-01", "2024-01-02"):
        (source / day).mkdir(parents=True)
        (source / day / "part-00000.csv").write_text(_extract(rows=3))
    for _ in range(2):
        result = sensor.tick()
        assert not result.run_requests
        assert f"2024-01-01 waits for its ready marker {source}/2024-01-01/_SUCCESS" in result.skip_message
        sensor.now += 3600
    (source / "2024-01-01" / "_SUCCESS").write_text("")
    assert sensor.requested_dates(sensor.tick()) == [("2024-01-01", "2024-01-01")]  # 01-02 has no marker yet
    (source / "2024-01-02" / "_SUCCESS").write_text("")
    assert sensor.requested_dates(sensor.tick()) == [("2024-01-01", "2024-01-02")]


def test_a_backlog_settles_together_and_the_cursor_stays_small(tmp_path):
    """Dates past one that is still settling are watched too, so a backlog goes as one run; the cursor
    keeps only the dates it looks at and the newest SENSOR_WATCHED_DATES it requested."""
    source = tmp_path / "src"
    config = write_table_config(tmp_path / "configs", "synthetic", f"{source}/{{date}}/", start_date="2024-01-01")
    sensor = LandingSensor(config)
    backlog = [(date(2024, 1, 1) + timedelta(days=n)).isoformat() for n in range(3)]
    for day in backlog:
        _write_day(source, day)
    assert not sensor.tick().run_requests
    sensor.now += config.source.settle_seconds
    assert sensor.requested_dates(sensor.tick()) == [(backlog[0], backlog[-1])]
    assert sorted(json.loads(sensor.cursor)["settling"]) == backlog

    many = [(date(2024, 2, 1) + timedelta(days=n)).isoformat() for n in range(SENSOR_WATCHED_DATES + 5)]
    cursor = LandingCursor()
    for day in many:
        cursor.record_requested({day: fingerprint([])})
    assert sorted(cursor.requested) == many[-SENSOR_WATCHED_DATES:]


@pytest.mark.parametrize("layout", ["folder", "glob"])
def test_a_ready_marker_is_not_data(spark, tmp_path, layout):
    """Spark skips files whose names start with _ or ., in a folder and where a glob names them: the
    intake never reads the marker, and the sensor does not count it as one of the date's files."""
    source = tmp_path / "src"
    path = f"{source}/{{date}}/" if layout == "folder" else f"{source}/{{date}}/*"
    config = write_table_config(
        tmp_path / "configs", "synthetic", "",
        source={"path": path, "format": "csv", "options": {"header": True}, "ready_marker": "_SUCCESS"},
    )
    folder = source / "2019-06-18"
    folder.mkdir(parents=True)
    (folder / "part-00000.csv").write_text(_extract(rows=3))
    (folder / "_SUCCESS").write_text(_extract(rows=2))  # a marker with rows in it: read, it would add 2
    assert landed_files(config, "2019-06-18") == [str(folder / "part-00000.csv")]
    assert config.source.ready_marker_for("2019-06-18") == str(folder / "_SUCCESS")
    assert read_source(spark, config, "2019-06-18").count() == 3


@pytest.mark.parametrize(
    ("path", "fields", "message"),
    [
        ("src/{date}/", {"ready_marker": "READY"}, "would be read as data from the date's folder"),
        ("src/{date}.csv", {"ready_marker": "_SUCCESS"}, "would be one file for every date"),
        ("src/{date}*", {"ready_marker": "{date}.done"}, "matches source.path"),
        ("src/*/{date}.csv", {"ready_marker": "_{date}.done"}, "folder has no wildcards"),
        ("src/{date}/", {"ready_marker": "done/_SUCCESS"}, "must be a file name"),
        ("src/{date}/", {"ready_marker": "_SUCCESS", "settle_seconds": 30}, "settle_seconds applies without a ready_marker"),
        ("src/{date}/", {"settle_seconds": -1}, "greater than or equal to 0"),
    ],
)
def test_landing_settings_that_cannot_work_name_the_file_and_field(tmp_path, path, fields, message):
    with pytest.raises(TableConfigError) as error:
        write_table_config(tmp_path, "synthetic", "", source={"path": path, "format": "csv", **fields})
    assert str(tmp_path / "synthetic.yaml") in str(error.value) and "field 'source" in str(error.value)
    assert message in str(error.value)


def test_a_marker_named_by_date_sits_beside_a_file_per_date(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_DATA_ROOT", str(tmp_path))
    config = write_table_config(
        tmp_path / "configs", "orders", "",
        source={"path": "samples/orders/{date}.csv", "format": "csv", "ready_marker": "{date}.csv.done"},
    )
    assert config.source.ready_marker_for("2024-01-02") == str(tmp_path / "samples/orders/2024-01-02.csv.done")
