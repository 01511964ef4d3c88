"""Spark-side figures of a CLI run, from the event log Spark writes when the run's conf asks for it.

A CLI run's JVM is out of the harness's reach (Python reaches no other process's JVM), so :func:`conf_env` adds
the event-log settings to the run's ``CDC_SPARK_CONF`` (the caller's own kept) and :func:`read` sums the
log once the JVM has closed it. Over every ``SparkListenerTaskEnd`` (failed attempts included, as Spark's
UI counts them): shuffle bytes written and read (remote + local), spill, JVM CPU; ``Result Size``, the
bytes a task sent back to the driver, its maximum per task and per result stage (one action: a collect,
a count, a write's commit messages), the evidence that no action brings table-sized data to the driver.
From the SQL events, each ``BroadcastExchange``'s ``data size`` (a broadcast is built on the driver);
from ``SparkListenerStageExecutorMetrics``, the peak JVM heap in use (local mode: the driver is the only
executor).
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path

GIB = 2**30

# Uncompressed and one file per application: no zstd needed to read it, one file per run. A larger queue for
# the event-log listener: at 10M rows a run has many thousand task events, and a full queue drops events.
EVENT_LOG_CONF = {
    "spark.eventLog.enabled": "true",
    "spark.eventLog.compress": "false",
    "spark.eventLog.rolling.enabled": "false",
    "spark.eventLog.logStageExecutorMetrics": "true",
    "spark.scheduler.listenerbus.eventqueue.eventLog.capacity": "200000",
}
SQL_EVENTS = ("org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart",
              "org.apache.spark.sql.execution.ui.SparkListenerSQLAdaptiveExecutionUpdate")
DRIVER_ACCUMS = "org.apache.spark.sql.execution.ui.SparkListenerDriverAccumUpdates"


def conf_env(folder: Path, env: dict) -> str:
    """``CDC_SPARK_CONF`` for a run whose event log goes to ``folder``: the caller's conf, then the event log's."""
    folder.mkdir(parents=True, exist_ok=True)
    raw = env.get("CDC_SPARK_CONF", "").strip()
    conf = json.loads(raw) if raw else {}
    if not isinstance(conf, dict):
        raise ValueError("CDC_SPARK_CONF must be a JSON object")
    return json.dumps({**{str(k): str(v) for k, v in conf.items()}, **EVENT_LOG_CONF, "spark.eventLog.dir": folder.resolve().as_uri()})


def read(folder: Path, run_log: Path, timeout: float = 120.0) -> dict:
    """The summary of the log in ``folder``, once the JVM has closed it (it outlives the run's Python side by
    a moment, to write the last events); whether it was closed and whether Spark said it dropped events."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        if files and not any(p.name.endswith(".inprogress") for p in files) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not files:
        return {"error": f"no event log in {folder}"}
    summary = summarize(files)
    summary["closed_by_jvm"] = not any(p.name.endswith(".inprogress") for p in files)
    summary["events_dropped"] = "Dropping event from queue" in run_log.read_text(errors="replace")
    return summary


def describe(e: dict) -> str:
    """The event log's part of a CLI run's progress line (:func:`read`'s figures)."""
    if "error" in e:
        return f"event log: {e['error']}"
    return (f"shuffle W/R {e['shuffle_write_bytes'] / GIB:.3f} / {e['shuffle_read_bytes'] / GIB:.3f} GiB, spill "
            f"{e['disk_bytes_spilled'] / GIB:.3f} GiB, heap peak {e['peak_jvm_heap_bytes'] / GIB:.2f} GiB; driver: max task result "
            f"{e['driver_max_task_result_bytes'] / 1024:.1f} KiB, max action result {e['driver_max_result_stage_bytes'] / 1024:.1f} KiB, "
            f"max broadcast {e['broadcast_max_bytes'] / 2**20:.1f} MiB" + ("; EVENTS DROPPED" if e["events_dropped"] else "")
            + ("" if e["complete"] else "; event log incomplete"))


def summarize(files: list[Path]) -> dict:
    totals = dict.fromkeys(("tasks", "shuffle_write_bytes", "shuffle_read_bytes", "disk_bytes_spilled", "memory_bytes_spilled",
                            "executor_cpu_ns", "driver_max_task_result_bytes"), 0)
    by_result_stage: dict[tuple, int] = defaultdict(int)
    peaks: dict[str, int] = defaultdict(int)
    broadcast_accums: set[int] = set()
    driver_accums: dict[int, int] = {}
    ended = truncated = False
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
                    m = event.get("Task Metrics") or {}
                    read_ = m.get("Shuffle Read Metrics") or {}
                    totals["tasks"] += 1
                    totals["shuffle_write_bytes"] += (m.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0)
                    totals["shuffle_read_bytes"] += read_.get("Remote Bytes Read", 0) + read_.get("Local Bytes Read", 0)
                    totals["disk_bytes_spilled"] += m.get("Disk Bytes Spilled", 0)
                    totals["memory_bytes_spilled"] += m.get("Memory Bytes Spilled", 0)
                    totals["executor_cpu_ns"] += m.get("Executor CPU Time", 0)
                    size = m.get("Result Size", 0)
                    totals["driver_max_task_result_bytes"] = max(totals["driver_max_task_result_bytes"], size)
                    if event.get("Task Type") == "ResultTask":
                        by_result_stage[(event.get("Stage ID"), event.get("Stage Attempt ID", 0))] += size
                elif kind == "SparkListenerStageExecutorMetrics":
                    for name, value in (event.get("Executor Metrics") or {}).items():
                        peaks[name] = max(peaks[name], value)
                elif kind in SQL_EVENTS:
                    nodes = [event.get("sparkPlanInfo") or {}]
                    while nodes:
                        node = nodes.pop()
                        nodes += node.get("children", [])
                        if "BroadcastExchange" in node.get("nodeName", ""):
                            broadcast_accums |= {m["accumulatorId"] for m in node.get("metrics", []) if m.get("name") == "data size"}
                elif kind == DRIVER_ACCUMS:
                    for accumulator, value in event.get("accumUpdates", []):
                        driver_accums[accumulator] = max(driver_accums.get(accumulator, 0), value)
                elif kind == "SparkListenerApplicationEnd":
                    ended = True
    broadcasts = [driver_accums[a] for a in broadcast_accums if a in driver_accums]
    return {
        **{k: v for k, v in totals.items() if k != "executor_cpu_ns"},
        "executor_cpu_seconds": round(totals["executor_cpu_ns"] / 1e9, 1),
        "driver_max_result_stage_bytes": max(by_result_stage.values(), default=0),
        "broadcast_max_bytes": max(broadcasts, default=0),
        "peak_jvm_heap_bytes": peaks.get("JVMHeapMemory", 0),
        "complete": ended and not truncated,
    }


# The plan nodes that write: Iceberg's (v2 writes, row-level operations) and a plain file write.
WRITE_NODE = re.compile(r"\b(?:AppendData|OverwriteByExpression|OverwritePartitionsDynamic|ReplaceData|WriteDelta|InsertIntoHadoopFsRelationCommand)")


def sql_executions(files: list[Path], table: str) -> tuple[float | None, list[dict]]:
    """The application's start (epoch seconds) and each SQL execution: start, seconds, whether it wrote, the
    asset of ``table`` its plan reads or writes (from the paths in it; None when it names none), and its
    tasks' summed run time and CPU seconds (run time above CPU: waiting for a core, GC, I/O)."""
    # An asset's Iceberg table shows as its folder (/<table>/<asset>/data/...) or its name (lake.<table>.<asset>).
    asset_path = re.compile(rf"(?:/|\blake\.){re.escape(table)}[/.]([a-z][a-z0-9_]*)")
    app_start, started, ended, stage_execution = None, {}, {}, {}
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not any(kind in line for kind in ('"SparkListenerApplicationStart"', "SQLExecution", '"SparkListenerJobStart"',
                                                     '"SparkListenerTaskEnd"')):
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                kind = event.get("Event", "")
                if kind == "SparkListenerApplicationStart":
                    app_start = event["Timestamp"] / 1000
                elif kind.endswith("SparkListenerSQLExecutionStart"):
                    plan = event.get("physicalPlanDescription", "")
                    assets = asset_path.findall(plan)
                    started[event["executionId"]] = {"start": event["time"] / 1000, "write": bool(WRITE_NODE.search(plan)),
                                                     "asset": assets[0] if assets else None, "description": event.get("description", ""),
                                                     "task_seconds": 0.0, "task_cpu_seconds": 0.0}
                elif kind.endswith("SparkListenerSQLExecutionEnd"):
                    ended[event["executionId"]] = event["time"] / 1000
                elif kind == "SparkListenerJobStart":
                    execution = (event.get("Properties") or {}).get("spark.sql.execution.id")
                    for stage in event.get("Stage IDs", []) if execution is not None else []:
                        stage_execution[stage] = int(execution)
                elif kind == "SparkListenerTaskEnd" and stage_execution.get(event.get("Stage ID")) in started:
                    metrics, execution = event.get("Task Metrics") or {}, started[stage_execution[event["Stage ID"]]]
                    execution["task_seconds"] += metrics.get("Executor Run Time", 0) / 1000
                    execution["task_cpu_seconds"] += metrics.get("Executor CPU Time", 0) / 1e9
    executions = [{**e, "seconds": round(ended[i] - e["start"], 3)} for i, e in sorted(started.items()) if i in ended]
    return app_start, executions
