"""Helpers for the scale benchmarks (bench_scale.py, bench_big_small.py): Spark's event log, warehouse sizes.

Not a benchmark itself. A CLI run's JVM is out of reach of py4j from the benchmark, so its Spark-side
figures come from the event log Spark writes when ``spark.eventLog.enabled`` is set: the benchmark
passes :func:`event_log_conf` to the run through ``CDC_SPARK_CONF`` (merged with the caller's own
``CDC_SPARK_CONF``, which wins nothing here: the event-log keys are ours) and reads the file with
:func:`summarize_event_log` after the run's process has ended.

What is summed, over every ``SparkListenerTaskEnd`` (failed and killed task attempts included, as
Spark's UI does):

- shuffle bytes written (``Shuffle Write Metrics`` / ``Shuffle Bytes Written``) and read
  (``Shuffle Read Metrics``: ``Remote Bytes Read`` + ``Local Bytes Read``), and records;
- input and output bytes (``Input Metrics`` / ``Output Metrics``);
- spill (``Memory Bytes Spilled``, ``Disk Bytes Spilled``);
- ``Result Size``: bytes a task sent back to the driver. Its maximum per task and its total per
  result stage (what one action, a collect, a count, a write's commit messages, returned to the
  driver) are the driver-side evidence that no action brings data proportional to the table to the
  driver.

Also, from the SQL events: every ``BroadcastExchange`` node's ``data size`` metric (a broadcast is
built on the driver from collected rows, so it is driver memory that grows with what is broadcast),
and from ``SparkListenerStageExecutorMetrics`` (``spark.eventLog.logStageExecutorMetrics``) the peak
JVM heap in use and the peak execution and storage memory of the driver (in local mode the driver is
the only executor).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

# Uncompressed, one file per application: the parser needs no zstd module and finds one file per run.
# A larger queue for the event-log listener: at 10M rows a run has many thousand task events, and a full
# queue drops events silently from the log (Spark logs "Dropping event from queue eventLog").
EVENT_LOG_CONF = {
    "spark.eventLog.enabled": "true",
    "spark.eventLog.compress": "false",
    "spark.eventLog.rolling.enabled": "false",
    "spark.eventLog.logStageExecutorMetrics": "true",
    "spark.scheduler.listenerbus.eventqueue.eventLog.capacity": "200000",
}

SQL_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
SQL_AQE_UPDATE = "org.apache.spark.sql.execution.ui.SparkListenerSQLAdaptiveExecutionUpdate"
SQL_DRIVER_ACCUMS = "org.apache.spark.sql.execution.ui.SparkListenerDriverAccumUpdates"


def event_log_conf(folder: Path) -> dict[str, str]:
    """Spark conf that writes the run's event log into ``folder`` (created here)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {**EVENT_LOG_CONF, "spark.eventLog.dir": folder.resolve().as_uri()}


def spark_conf_env(extra: dict[str, str], base_env: dict[str, str]) -> str:
    """``CDC_SPARK_CONF`` for a run: the caller's own (from ``base_env``), then ``extra``."""
    raw = base_env.get("CDC_SPARK_CONF", "").strip()
    conf = json.loads(raw) if raw else {}
    if not isinstance(conf, dict):
        raise ValueError("CDC_SPARK_CONF must be a JSON object")
    return json.dumps({**{str(k): str(v) for k, v in conf.items()}, **extra})


def event_log_files(folder: Path) -> list[Path]:
    """The event log file(s) in ``folder``: plain files, or the events_* files of a rolling log dir."""
    files: list[Path] = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        if entry.is_dir() and entry.name.startswith("eventlog_v2_"):
            files += sorted((p for p in entry.iterdir() if p.name.startswith("events_")), key=lambda p: int(p.name.split("_")[1]))
        elif entry.is_file() and not entry.name.startswith("."):
            files.append(entry)
    return files


def wait_for_event_log(folder: Path, timeout: float = 120.0) -> bool:
    """Wait until the run's JVM has closed its event log (no ``.inprogress`` file left); False on timeout.

    A CLI run's JVM outlives its Python process by a moment (it stops when the Python side closes its
    pipe, then runs Spark's shutdown hook, which writes the last events and renames the file).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = event_log_files(folder)
        if files and not any(f.name.endswith(".inprogress") for f in files):
            return True
        time.sleep(0.5)
    return False


def _plan_nodes(info: dict):
    yield info
    for child in info.get("children", []):
        yield from _plan_nodes(child)


def summarize_event_log(folder: Path) -> dict:
    """Sums and maxima over the event log(s) in ``folder`` (see the module docstring). Sizes in bytes."""
    files = event_log_files(folder)
    if not files:
        return {"error": f"no event log in {folder}"}
    if any(f.suffix in (".zstd", ".lz4", ".snappy", ".lzf") for f in files):
        return {"error": f"compressed event log in {folder}: set spark.eventLog.compress=false", "files": [str(f) for f in files]}
    totals = defaultdict(int)
    result_bytes_by_stage: dict[tuple[int, int], int] = defaultdict(int)
    result_task_stages: set[tuple[int, int]] = set()
    max_task_result = 0
    max_peak_execution = 0
    broadcast_accums: dict[int, str] = {}  # accumulator id -> node description
    driver_accums: dict[int, int] = {}
    executor_peaks: dict[str, int] = defaultdict(int)
    stages: dict[tuple[int, int], dict] = {}
    failed_tasks = 0
    jobs = 0
    sql_executions = 0
    app_start = app_end = None
    spark_version = None
    truncated = False
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    truncated = True  # the last line of a log whose JVM was killed mid-write
                    continue
                kind = event.get("Event")
                if kind == "SparkListenerTaskEnd":
                    metrics = event.get("Task Metrics") or {}
                    reason = (event.get("Task End Reason") or {}).get("Reason")
                    if reason != "Success":
                        failed_tasks += 1
                    totals["tasks"] += 1
                    write = metrics.get("Shuffle Write Metrics") or {}
                    read = metrics.get("Shuffle Read Metrics") or {}
                    totals["shuffle_write_bytes"] += write.get("Shuffle Bytes Written", 0)
                    totals["shuffle_write_records"] += write.get("Shuffle Records Written", 0)
                    totals["shuffle_read_remote_bytes"] += read.get("Remote Bytes Read", 0)
                    totals["shuffle_read_local_bytes"] += read.get("Local Bytes Read", 0)
                    totals["shuffle_read_records"] += read.get("Total Records Read", 0)
                    totals["input_bytes"] += (metrics.get("Input Metrics") or {}).get("Bytes Read", 0)
                    totals["output_bytes"] += (metrics.get("Output Metrics") or {}).get("Bytes Written", 0)
                    totals["memory_bytes_spilled"] += metrics.get("Memory Bytes Spilled", 0)
                    totals["disk_bytes_spilled"] += metrics.get("Disk Bytes Spilled", 0)
                    totals["executor_run_ms"] += metrics.get("Executor Run Time", 0)
                    totals["executor_cpu_ns"] += metrics.get("Executor CPU Time", 0)
                    totals["jvm_gc_ms"] += metrics.get("JVM GC Time", 0)
                    size = metrics.get("Result Size", 0)
                    totals["result_bytes"] += size
                    max_task_result = max(max_task_result, size)
                    max_peak_execution = max(max_peak_execution, metrics.get("Peak Execution Memory", 0))
                    if event.get("Task Type") == "ResultTask":
                        stage = (event.get("Stage ID"), event.get("Stage Attempt ID", 0))
                        result_task_stages.add(stage)
                        result_bytes_by_stage[stage] += size
                elif kind == "SparkListenerStageCompleted":
                    info = event.get("Stage Info") or {}
                    key = (info.get("Stage ID"), info.get("Stage Attempt ID", 0))
                    submitted, completed = info.get("Submission Time"), info.get("Completion Time")
                    stages[key] = {
                        "stage": key[0],
                        "name": info.get("Stage Name"),
                        "tasks": info.get("Number of Tasks"),
                        "seconds": round((completed - submitted) / 1000, 2) if submitted and completed else None,
                        "failed": bool(info.get("Failure Reason")),
                    }
                elif kind == "SparkListenerStageExecutorMetrics":
                    for name, value in (event.get("Executor Metrics") or {}).items():
                        executor_peaks[name] = max(executor_peaks[name], value)
                elif kind == "SparkListenerJobStart":
                    jobs += 1
                elif kind in (SQL_START, SQL_AQE_UPDATE):
                    if kind == SQL_START:
                        sql_executions += 1
                    for node in _plan_nodes(event.get("sparkPlanInfo") or {}):
                        if "BroadcastExchange" in node.get("nodeName", ""):
                            for metric in node.get("metrics", []):
                                if metric.get("name") == "data size":
                                    broadcast_accums[metric["accumulatorId"]] = node.get("simpleString", "")[:200]
                elif kind == SQL_DRIVER_ACCUMS:
                    for accumulator, value in event.get("accumUpdates", []):
                        driver_accums[accumulator] = max(driver_accums.get(accumulator, 0), value)
                elif kind == "SparkListenerApplicationStart":
                    app_start = event.get("Timestamp")
                elif kind == "SparkListenerApplicationEnd":
                    app_end = event.get("Timestamp")
                elif kind == "SparkListenerLogStart":
                    spark_version = event.get("Spark Version")
    broadcasts = sorted((driver_accums[a] for a in broadcast_accums if a in driver_accums), reverse=True)
    longest = sorted((s for s in stages.values() if s["seconds"] is not None), key=lambda s: -s["seconds"])[:8]
    return {
        "files": [str(f) for f in files],
        "complete": app_end is not None and not truncated and not any(f.name.endswith(".inprogress") for f in files),
        "spark_version": spark_version,
        "application_seconds": round((app_end - app_start) / 1000, 1) if app_start and app_end else None,
        "jobs": jobs,
        "sql_executions": sql_executions,
        "stages": len(stages),
        "tasks": totals["tasks"],
        "failed_tasks": failed_tasks,
        "shuffle_write_bytes": totals["shuffle_write_bytes"],
        "shuffle_read_bytes": totals["shuffle_read_remote_bytes"] + totals["shuffle_read_local_bytes"],
        "shuffle_read_remote_bytes": totals["shuffle_read_remote_bytes"],
        "shuffle_read_local_bytes": totals["shuffle_read_local_bytes"],
        "shuffle_write_records": totals["shuffle_write_records"],
        "shuffle_read_records": totals["shuffle_read_records"],
        "input_bytes": totals["input_bytes"],
        "output_bytes": totals["output_bytes"],
        "memory_bytes_spilled": totals["memory_bytes_spilled"],
        "disk_bytes_spilled": totals["disk_bytes_spilled"],
        "executor_run_seconds": round(totals["executor_run_ms"] / 1000, 1),
        "executor_cpu_seconds": round(totals["executor_cpu_ns"] / 1e9, 1),
        "jvm_gc_seconds": round(totals["jvm_gc_ms"] / 1000, 1),
        "max_task_peak_execution_memory_bytes": max_peak_execution,
        # Driver side: what tasks sent back, per task and per action (result stage), and broadcasts.
        "driver_result_bytes_total": totals["result_bytes"],
        "driver_max_task_result_bytes": max_task_result,
        "driver_max_result_stage_bytes": max(result_bytes_by_stage.values(), default=0),
        "result_stages": len(result_task_stages),
        "broadcasts": len(broadcasts),
        "broadcast_max_bytes": broadcasts[0] if broadcasts else 0,
        "broadcast_total_bytes": sum(broadcasts),
        # Peaks of the driver's memory as Spark saw it (local mode: the driver is the only executor).
        "peak_jvm_heap_bytes": executor_peaks.get("JVMHeapMemory", 0),
        "peak_jvm_offheap_bytes": executor_peaks.get("JVMOffHeapMemory", 0),
        "peak_execution_memory_bytes": executor_peaks.get("OnHeapExecutionMemory", 0) + executor_peaks.get("OffHeapExecutionMemory", 0),
        "peak_storage_memory_bytes": executor_peaks.get("OnHeapStorageMemory", 0) + executor_peaks.get("OffHeapStorageMemory", 0),
        "major_gc_seconds": round(executor_peaks.get("MajorGCTime", 0) / 1000, 1),
        "longest_stages": longest,
    }


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (0 if it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def partition_bytes(warehouse: Path, table: str, business_date: str) -> dict[str, int]:
    """Bytes of each asset's ``business_date=`` partition of ``table`` (``_runs`` and the like left out)."""
    root = warehouse / table
    sizes = {}
    for asset in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))) if root.is_dir() else []:
        sizes[asset.name] = folder_bytes(asset / f"business_date={business_date}")
    return sizes


def gib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**30, 3)


def mib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)
