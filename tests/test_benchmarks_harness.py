"""The benchmark harness (benchmarks/) on plain processes: what a failed or interrupted run leaves behind,
and the figures it reads from a Spark event log. No benchmark scenario runs here (they take minutes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from benchmarks import eventlog, harness

REPO = Path(__file__).resolve().parent.parent


def test_a_failed_run_names_its_exit_status_and_the_end_of_its_log(tmp_path):
    with pytest.raises(harness.StepFailed, match="exited with 3") as failed:
        harness.run_process("fails", ["sh", "-c", "echo the-last-words; exit 3"], dict(os.environ), tmp_path)
    assert "the-last-words" in str(failed.value)
    assert (tmp_path / "fails.log").read_text().startswith("$ sh -c")


def test_sigterm_ends_the_run_in_progress_with_its_whole_tree_and_still_writes_the_results(tmp_path):
    """A run's child in its group, and one that left the group (as a run worker may), both go; exit status 130."""
    pids, results = tmp_path / "pids", tmp_path / "results"
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(f"""
        import argparse, os, sys
        from benchmarks import harness

        class Scenario:
            @staticmethod
            def measure(bench):
                bench.measure("quick", lambda r: r.update(harness.run_process("quick", ["true"], dict(os.environ), bench.logs)))
                command = "sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; wait"
                harness.run_process("long", ["sh", "-c", command], dict(os.environ), bench.logs)

            summary = staticmethod(lambda results: print("measured:", sorted(results["measurements"])))
            label = staticmethod(lambda args: "test")

        args = argparse.Namespace(scenario="test", workdir=sys.argv[2], keep=False, results_dir=sys.argv[1])
        sys.exit(harness.run(Scenario, args))
    """))
    proc = subprocess.Popen([sys.executable, str(script), str(results), str(tmp_path / "work")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    sleepers = [int(pid) for pid in pids.read_text().split()]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]

    assert proc.returncode == 130, output
    assert "measured: ['quick']" in output
    assert not [pid for pid in sleepers if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    [written] = results.iterdir()
    figures = json.loads(written.read_text())
    assert figures["interrupted"] is True
    assert figures["measurements"]["quick"]["seconds"] >= 0
    assert (tmp_path / "work" / "logs" / "long.log").read_text().startswith("$ sh -c")  # the given workdir keeps its logs


def test_the_event_log_figures_sum_over_tasks_and_take_the_largest_action_and_broadcast(tmp_path):
    logs = tmp_path / "eventlog"
    logs.mkdir()
    task = lambda stage, size, written: {"Event": "SparkListenerTaskEnd", "Task Type": "ResultTask", "Stage ID": stage,  # noqa: E731
                                          "Task Metrics": {"Result Size": size, "Shuffle Write Metrics": {"Shuffle Bytes Written": written}}}
    events = [task(1, 10, 100), task(1, 30, 200), task(2, 25, 0),
              {"Event": "SparkListenerStageExecutorMetrics", "Executor Metrics": {"JVMHeapMemory": 7}},
              {"Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart", "sparkPlanInfo": {"nodeName": "Project", "children": [
                  {"nodeName": "BroadcastExchange", "metrics": [{"name": "data size", "accumulatorId": 5}]}]}},
              {"Event": "org.apache.spark.sql.execution.ui.SparkListenerDriverAccumUpdates", "accumUpdates": [[5, 4096]]},
              {"Event": "SparkListenerApplicationEnd"}]
    (logs / "local-1").write_text("".join(json.dumps(e) + "\n" for e in events))
    run_log = tmp_path / "run.log"
    run_log.write_text("WARN Dropping event from queue eventLog\n")

    figures = eventlog.read(logs, run_log, timeout=5)

    assert figures["shuffle_write_bytes"] == 300
    assert figures["driver_max_task_result_bytes"] == 30
    assert figures["driver_max_result_stage_bytes"] == 40
    assert figures["broadcast_max_bytes"] == 4096
    assert figures["peak_jvm_heap_bytes"] == 7
    assert figures["complete"] and figures["closed_by_jvm"] and figures["events_dropped"]


def test_the_erase_scenario_refuses_more_keys_than_the_dates_keep_on_every_date():
    from benchmarks.__main__ import main

    # 1,000 rows lose 5 keys a date: 29 later dates leave 855 keys present on all 30.
    with pytest.raises(SystemExit) as refused:
        main(["erase", "--rows", "1000", "--dates", "30", "--keys", "856"])
    assert refused.value.code == 2
    with pytest.raises(SystemExit):
        main(["erase", "--dates", "1"])


def test_the_erase_scenario_data_puts_every_erased_key_on_every_date(tmp_path):
    import argparse

    import duckdb

    from benchmarks import erase
    from benchmarks.data import KEYS, business_dates

    args = argparse.Namespace(rows=1000, dates=4, keys=20, seed=7)
    data = erase.make_data(tmp_path, args, business_dates(args.dates))

    per_date = [duckdb.sql(f"select * from read_csv('{tmp_path / day}/*.csv', all_varchar=true)") for day in business_dates(4)]
    assert [len(rows) for rows in (d.fetchall() for d in per_date)] == [1000] * 4
    keys = duckdb.sql(f"select * from read_csv('{data['keys_file']}', all_varchar=true)")
    assert keys.columns == KEYS and len(keys.fetchall()) == 20
    for day in business_dates(4):
        found = duckdb.sql(f"select count(*) from read_csv('{tmp_path / day}/*.csv', all_varchar=true) "
                           f"join read_csv('{data['keys_file']}', all_varchar=true) using ({', '.join(KEYS)})").fetchall()[0][0]
        assert found == 20, day
    first, last = (set(duckdb.sql(f"select key_1 from read_csv('{tmp_path / day}/*.csv', all_varchar=true)").fetchall())
                   for day in business_dates(4)[::3])
    assert len(first - last) == 3 * data["churn_per_date"] == 15  # 0.5% deleted (and as many inserted) a date


def test_the_erase_scenario_reads_the_line_cdc_erase_prints():
    from benchmarks import erase
    from cdc_assets.model.config import TableConfig
    from cdc_assets.usecases.erasure import ErasureResult
    from cdc_assets.defs.erasure_events import describe

    config = TableConfig.model_validate({"name": "t", "start_date": "2024-01-01", "load_type": "full",
                                         "source": {"path": "/d/{date}/", "format": "csv"},
                                         "keys": [{"name": "k", "type": "string"}], "non_keys": [{"name": "v", "type": "double"}]})
    result = ErasureResult(request_id="r1", keys=2, resumed=False, removed={("current_table", "2024-01-01"): 2, ("hashed_incoming", "2024-01-01"): 2},
                           bytes_rewritten=300, bytes_stored=4000)

    found = erase.ERASED_LINE.search(f"cdc-erase: {describe(config, result)}")

    assert found and tuple(map(int, found.groups())) == (4, 2, 300, 4000)


def test_sql_executions_are_timed_and_named_by_the_asset_their_plan_reads_or_writes(tmp_path):
    start = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
    end = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"
    events = [{"Event": "SparkListenerApplicationStart", "Timestamp": 1000},
              {"Event": start, "executionId": 0, "time": 2000, "physicalPlanDescription": "BatchScan lake.t.current_table[key_hash#1] (branch=null)"},
              {"Event": end, "executionId": 0, "time": 2500},
              {"Event": start, "executionId": 1, "time": 3000,
               "physicalPlanDescription": "OverwriteByExpression IcebergWrite(table=lake.t.history_partition, format=PARQUET)"},
              {"Event": end, "executionId": 1, "time": 4250},
              {"Event": start, "executionId": 2, "time": 5000, "physicalPlanDescription": "LocalTableScan"}]
    (tmp_path / "local-1").write_text("".join(json.dumps(e) + "\n" for e in events))

    app_start, executions = eventlog.sql_executions([tmp_path / "local-1"], "t")

    assert app_start == 1.0
    assert [(e["asset"], e["write"], e["seconds"]) for e in executions] == [("current_table", False, 0.5), ("history_partition", True, 1.25)]


def test_a_timed_run_gives_each_line_the_time_it_appeared_and_returns_a_failed_exit(tmp_path):
    figures = harness.run_process("timed", ["sh", "-c", "echo first; sleep 1; echo second; exit 1"], dict(os.environ), tmp_path,
                                  check=False, timed=True)
    lines = figures.pop("lines")

    said = {text: at for at, text in lines}
    assert figures["returncode"] == 1
    assert said["second"] - said["first"] >= 0.9
    assert said["second"] <= figures["seconds"]
