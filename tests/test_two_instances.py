"""Two Dagster instances that share nothing but the lake (issue 35, point 5): each is its own process tree with
its own DAGSTER_HOME, working directory and TMPDIR (so no local lock file of one is the other's), and both
write the same table in the same SeaweedFS lake (S3 and the REST catalog) at the same time.

- Both run the same dates at once: both succeed, one after the other (the writer lease in the bucket), and
  every date's tables were last written by one run (no mixed date), equal to the same dates on the local default.
- One erases a key while the other is between its read of the state and its commit: the erase waits for the
  lease, then erases the key from the date committed meanwhile too; ``--verify`` finds it nowhere, and the
  tables equal the same date run then erase on the local default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus

from cdc_assets.model.names import CURRENT, HISTORY
from resources.storage import WarehouseStorage
from resources.storage.tables import RUN_ID, WRITTEN_DATES
from tests.lake import pointed_at
from tests.pipeline import definitions_for, run_range
from tests.test_lake import DAYS, REPO, _extracts_in_the_lake, _rows

pytestmark = [pytest.mark.lake, pytest.mark.slow]

# One Dagster run of a date range of a table, recorded in the instance under DAGSTER_HOME.
RUN_IN_INSTANCE = """
import sys
from dagster import DagsterInstance
from cdc_assets.model.config import load_table_config
from tests.pipeline import definitions_for, run_range

result = run_range(definitions_for(load_table_config(sys.argv[1])), sys.argv[2], sys.argv[3], instance=DagsterInstance.get(), raise_on_error=False)
sys.exit(0 if result.success else 1)
"""


def _instance_environment(host: Path, variables: dict[str, str], **extra: str) -> dict[str, str]:
    """A process environment of an instance of its own: its DAGSTER_HOME and TMPDIR under ``host``, the lake's variables."""
    for folder in ("dagster_home", "tmp"):
        (host / folder).mkdir(parents=True, exist_ok=True)
    return {
        **os.environ, **variables, **extra, "DAGSTER_HOME": str(host / "dagster_home"), "TMPDIR": str(host / "tmp"),
        "PYTHONPATH": str(REPO),
        "CDC_SPARK_CONF": json.dumps({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}),
    }  # fmt: skip


def _start(command: list[str], host: Path, env: dict[str, str]) -> subprocess.Popen:
    with (host / "output.log").open("w") as output:
        return subprocess.Popen(command, env=env, cwd=host, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def _finished(process: subprocess.Popen, host: Path, timeout: float = 600) -> str:
    """Wait for the process; its output (asserting it succeeded)."""
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait(timeout=60)
    output = (host / "output.log").read_text()
    assert process.returncode == 0, output[-4000:]
    return output


def _last_writers(storage: WarehouseStorage, table: str) -> dict[str, dict[str, str]]:
    """Per date, per asset: the run of the last commit that wrote the date (from the Iceberg snapshots' summaries)."""
    writers: dict[str, dict[str, str]] = {}
    for asset in storage.stored_assets(table):
        for snapshot in sorted(storage.tables.load(table, asset).snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0)):
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            for day in filter(None, summary.get(WRITTEN_DATES, "").split(",")):
                writers.setdefault(day, {})[asset] = summary.get(RUN_ID, "")
    return writers


def test_two_instances_running_the_same_dates_at_once_take_turns_and_leave_no_mixed_date(spark, tmp_path, monkeypatch, lake):
    extracts, config, variables = _extracts_in_the_lake(tmp_path, lake, "delta")
    config_file = str(tmp_path / "configs" / f"{config.name}.yaml")
    local_root = tmp_path / "warehouse"
    with pointed_at(monkeypatch, {"CDC_WAREHOUSE": str(local_root), "CDC_DATA_ROOT": str(extracts)}):
        run_range(definitions_for(config), DAYS[0], DAYS[2])
        local = WarehouseStorage(str(local_root))
        expected = {(asset, day): _rows(local, spark, config.name, asset, day) for asset in (CURRENT, HISTORY) for day in DAYS[:3]}

    hosts = [tmp_path / "host-a", tmp_path / "host-b"]
    runs = [
        _start([sys.executable, "-c", RUN_IN_INSTANCE, config_file, DAYS[0], DAYS[2]], host, _instance_environment(host, variables))
        for host in hosts
    ]
    outputs = [_finished(run, host) for run, host in zip(runs, hosts)]
    # The second to reach the table waited for the first's lease; neither failed (no concurrent commit was refused).
    assert sum("waiting for the writer lease" in output for output in outputs) >= 1, [o[-2000:] for o in outputs]
    run_ids = []
    for host in hosts:
        with DagsterInstance.from_config(str(host / "dagster_home")) as instance:
            records = instance.get_runs()
            assert [run.status for run in records] == [DagsterRunStatus.SUCCESS], host
            run_ids.append(records[0].run_id)

    with pointed_at(monkeypatch, variables):
        on_lake = WarehouseStorage(variables["CDC_WAREHOUSE"])
        writers = _last_writers(on_lake, config.name)
        assert sorted(writers) == DAYS[:3]
        for day, by_asset in writers.items():
            # Every table's last write of the date is one run's, and each date's last writer ran second.
            assert len(set(by_asset.values())) == 1, (day, by_asset)
            assert set(by_asset.values()) <= set(run_ids)
        assert len({next(iter(by_asset.values())) for by_asset in writers.values()}) == 1
        for (asset, day), rows in expected.items():
            assert _rows(on_lake, spark, config.name, asset, day) == rows, (asset, day)
        left = [path for path in on_lake.layout.files.files_under(f"{on_lake.root}/{config.name}") if path.endswith("_writer.lease")]
        assert left == [], "both runs let go of their leases"


def test_an_erase_from_one_instance_while_the_other_runs_a_date_waits_and_leaves_both_correct(spark, tmp_path, monkeypatch, lake):
    # A delta carries every key it does not name: the key would come back from a stale state.
    extracts, config, variables = _extracts_in_the_lake(tmp_path, lake, "delta")
    configs = tmp_path / "configs"
    keys = tmp_path / "keys.csv"
    keys.write_text("id\n1\n")
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)  # this process's erase tells no instance
    from cdc_assets.cli.erase import main as erase

    local_root = tmp_path / "warehouse"
    with pointed_at(monkeypatch, {"CDC_WAREHOUSE": str(local_root), "CDC_DATA_ROOT": str(extracts)}):
        run_range(definitions_for(config), DAYS[0], DAYS[2])
        assert erase([config.name, "--keys", str(keys)]) == 0
        local = WarehouseStorage(str(local_root))
        expected = {(asset, day): _rows(local, spark, config.name, asset, day) for asset in (CURRENT, HISTORY) for day in DAYS[:3]}

    with pointed_at(monkeypatch, variables):
        assert run_range(definitions_for(config), DAYS[0], DAYS[1]).success
        on_lake = WarehouseStorage(variables["CDC_WAREHOUSE"])
        assert 1 in {row[0] for row in _rows(on_lake, spark, config.name, CURRENT, DAYS[1])}
        # Host A runs the third date and stops before current_table's commit, with the second date's state read.
        host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"
        paused, release = tmp_path / "paused.marker", tmp_path / "release.marker"
        env_a = _instance_environment(
            host_a, variables, CDC_PAUSE_BEFORE_COMMIT=f"{config.name}/{CURRENT}", CDC_PAUSE_MARKER=str(paused),
            CDC_PAUSE_RELEASE=str(release), CDC_WRITER_LEASE_SECONDS="6",
        )  # fmt: skip
        run_a = _start([sys.executable, "-c", RUN_IN_INSTANCE, str(configs / f"{config.name}.yaml"), DAYS[2], DAYS[2]], host_a, env_a)
        try:
            deadline = time.monotonic() + 300
            while not paused.exists():
                assert run_a.poll() is None, (host_a / "output.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "host A did not reach current_table's commit"
                time.sleep(0.5)
            # Host B erases the key meanwhile, with cdc-erase as an operator would.
            env_b = _instance_environment(host_b, variables, CDC_TABLE_CONFIGS=str(configs))
            erase_b = _start([str(Path(sys.executable).parent / "cdc-erase"), config.name, "--keys", str(keys)], host_b, env_b)
            # Host A stays paused until the erase says it waits for A's lease, however long B's JVM takes to start
            # (a fixed sleep raced it on a loaded machine); and for two of A's lease terms more, so that only
            # A's renewals keep the erase out. Meanwhile the erase must not begin.
            deadline, waiting_since = time.monotonic() + 300, None
            while waiting_since is None or time.monotonic() < waiting_since + 12:
                output = (host_b / "output.log").read_text()
                assert erase_b.poll() is None, output[-3000:]
                assert on_lake.erasure_requests(config.name) == [], "the erase began while host A was between its read and its commit"
                if waiting_since is None and "waiting for the writer lease" in output:
                    waiting_since = time.monotonic()
                assert time.monotonic() < deadline, f"the erase never waited for host A's lease: {output[-3000:]}"
                time.sleep(0.5)
            release.touch()
            _finished(run_a, host_a)
            erased = _finished(erase_b, host_b)
        finally:
            release.touch()
            if run_a.poll() is None:
                os.killpg(run_a.pid, 9)
        assert "waiting for the writer lease" in erased, erased
        assert [request["status"] for request in on_lake.erasure_requests(config.name)] == ["complete"]
        assert erase([config.name, "--keys", str(keys), "--verify"]) == 0, "no stored file of the lake holds the key"
        for (asset, day), rows in expected.items():
            stored = _rows(on_lake, spark, config.name, asset, day)
            assert stored == rows, (asset, day)
        assert 1 not in {row[0] for row in _rows(on_lake, spark, config.name, CURRENT, DAYS[2])}
