"""Many tables (issue 13): 20 tables materialized for one date through the run queue, as the daily schedules request them.

    .venv/bin/python benchmarks/bench_many_tables.py [--tables 20] [--rows 100000] [--max-concurrent N]
        [--skip-sequential] [--skip-pair] [--no-pool-setup] [--dequeue-interval 1] [--timeout 14400] [--seed 11]
        [--workdir DIR] [--keep] [--results-dir DIR]

Set-up: ``--tables`` table configs (``many_t01``, ...; the synthetic columns, full load, start date
2019-06-18) in a temp CDC_TABLE_CONFIGS folder, each with its own ``--rows``-row day-1 extract from the
generator (``--seed`` + i), and a workspace file naming ``cdc_assets.definitions`` (location
``cdc_assets``). Each phase has a fresh DAGSTER_HOME whose dagster.yaml is the project's
``instance/dagster.yaml`` (pools: default_limit 1, granularity run: one run per table) plus the
QueuedRunCoordinator (dequeue every ``--dequeue-interval`` s) and ``concurrency: runs:
max_concurrent_runs``, and a fresh warehouse.

How runs are requested and launched, per phase:

1. ``dagster-daemon run -w <workspace>`` starts as a child process (own process group, same
   DAGSTER_HOME and CDC_* environment); the script waits for its queued-run-coordinator heartbeat;
2. each table's ``<table>_daily`` schedule is evaluated for the date the way the scheduler does at
   2019-06-19 01:00 UTC: ``schedule.evaluate_tick(build_schedule_context(instance=...,
   scheduled_execution_time=...))`` on the Definitions built from the temp configs, giving one
   RunRequest (partition 2019-06-18) per table;
3. each RunRequest becomes a run the way the scheduler daemon makes one (Dagster's own
   ``dagster._scheduler.scheduler._create_scheduler_run`` against the workspace's code location, so
   the run carries the schedule's tags and the table's pool) and is submitted with
   ``instance.submit_run``: the QueuedRunCoordinator puts it in the queue (QUEUED), and the daemon
   dequeues and launches it (DefaultRunLauncher: a run worker process with its own JVM) as the run limit
   and the pools allow. The clock starts at the first submission;
4. the script polls the run records until every run has ended, then stops the daemon.

Phases:

- ``parallel``: the ``--tables`` runs with ``max_concurrent_runs = --max-concurrent``. Default:
  sized so that the drivers fit the machine's memory, min(floor((total memory - 2 GiB) /
  (spark.driver.memory + 1 GiB)), 2 x cores), printed at the start;
- ``pair`` (needs a limit >= 2): two runs of one table for the same date, twice: for a table never run
  before and for a table the parallel phase already ran; all four runs are QUEUED before the daemon
  starts, so its first pass sees both runs of each pair (the new table's first, so that a first look at
  a pool that let both through would launch both). For each pair the run records and events must show
  the second run was taken off the queue (its RUN_STARTING event: dagster 1.13 defines RUN_DEQUEUED but
  never writes it) only after the first ended, its start after the first's end, and that it was enqueued
  before the first started (so it sat QUEUED while the first ran); exit 2 if not.
  Each phase's instance gets every table's pool limit before its daemon starts, as ``make ui`` does
  (``cdc_assets.dev_ui.create_table_pools``). With ``--no-pool-setup`` it does not: the daemon creates a
  pool's limit on first sight, and dagster 1.13 launches both runs of the new table in that pass (it
  counts the pool as unlimited until the limit row exists; benchmarks/README.md), so that pair is then
  reported as a FINDING, with whether the table's writer lock made the second run wait;
- ``sequential``: the same ``--tables`` runs with max_concurrent_runs = 1 (fresh instance and
  warehouse), for comparison.

Reported: wall seconds per phase (first submission to last run end), parallel / sequential, every
run's queued / start / end times, the maximum number of runs STARTED at the same time (from the run
records' start and end times) and the maximum in progress counting from the launch (RUN_STARTING) --
neither may exceed the limit -- the peak number of Spark JVMs alive at once and their summed RSS
(sampled every second), and the pair timelines. Every run must succeed, and every table's day-1
current_table must hold --rows inserts.

Prints figures as phases finish, then a summary; JSON to ``benchmarks/results/bench_many_tables_<tables>x<rows>_<UTC>.json``
(git-ignored). The daemon (and any run it launched, which is in its process group) and the code
server this script starts to create runs are stopped at the end, on failure, on Ctrl-C and on SIGTERM.
Exit status: 0 ok, 1 a run failed (or timed out), 2 wrong counts or a run/pool limit not held, 130 interrupted.

Uses Dagster internals (``_create_scheduler_run``, ``WorkspaceProcessContext``) as the daemon does;
written against dagster 1.13.

Cost at the defaults on the idle 2-core machine: about 46 minutes (measured 2,740 s; a 100k-row run
alone is about a minute of mostly JVM start-up and JIT; 20 of them twice, plus 4 pair runs). Small check (about 8 minutes):
    .venv/bin/python benchmarks/bench_many_tables.py --tables 3 --rows 5000 --max-concurrent 2
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from datetime import date, datetime, time as dtime, timedelta, timezone
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_backfill  # noqa: E402 - its table config writer
from bench_scale import prepare_workdir  # noqa: E402
from bench_targets import GIB, Interrupted, OutputsWrong, StepFailed, git_commit, kill_group, machine_busy_seconds  # noqa: E402

DAY = "2019-06-18"
LOCATION = "cdc_assets"
PREFIX = "many_t"
FRESH_PAIR_TABLE = "many_pair"
RESERVE_GIB = 2.0  # OS, the daemon and its code servers
OVERHEAD_GIB = 1.0  # per run above the driver heap: JVM off-heap, the run worker's Python
MARKER = ".cdc_bench_many_tables"
ENDED = {"SUCCESS", "FAILURE", "CANCELED"}


def log(message: str) -> None:
    print(f"[many {time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_size(text: str) -> float:
    """A JVM memory size (``4g``, ``4096m``) in GiB."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", text.lower())
    if not match:
        raise ValueError(f"not a memory size: {text!r}")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"": 1 / 2**30, "k": 1 / 2**20, "m": 1 / 1024, "g": 1, "t": 1024}[unit]


def size_concurrency() -> dict:
    """Default max_concurrent_runs: as many drivers as fit in memory, at most 2 per core."""
    from resources.spark import LOCAL_DEFAULTS, spark_conf_from_env

    driver = spark_conf_from_env().get("spark.driver.memory", LOCAL_DEFAULTS["spark.driver.memory"])
    total = psutil.virtual_memory().total / GIB
    per_run = parse_size(driver) + OVERHEAD_GIB
    by_memory = max(1, math.floor((total - RESERVE_GIB) / per_run))
    by_cpu = 2 * (psutil.cpu_count() or 1)
    chosen = max(1, min(by_memory, by_cpu))
    text = (f"max_concurrent_runs = min(floor(({total:.1f} GiB total - {RESERVE_GIB:g} GiB reserve) / ({driver} driver + "
            f"{OVERHEAD_GIB:g} GiB overhead)) = {by_memory}, 2 x {psutil.cpu_count()} cores = {by_cpu}) = {chosen}; "
            f"{psutil.virtual_memory().available / GIB:.1f} GiB available now")
    return {"max_concurrent": chosen, "by_memory": by_memory, "by_cpu": by_cpu, "driver_memory": driver,
            "total_gib": round(total, 1), "explanation": text}


# -- processes --------------------------------------------------------------------------------------
class TreeSampler(threading.Thread):
    """Every second: the Spark JVMs under ``root`` (the daemon), how many at once and their summed RSS."""

    def __init__(self, root: int, interval: float = 1.0):
        super().__init__(name="many-sampler", daemon=True)
        self.root, self.interval = root, interval
        self.peak_jvms = 0
        self.peak_jvm_rss = 0
        self.peak_tree_rss = 0
        self._cpu: dict[int, float] = {}  # last CPU seconds seen per process of the tree
        self._busy0, self._t0 = machine_busy_seconds(), time.perf_counter()
        self._halt = threading.Event()

    def sample(self) -> None:
        try:
            procs = [psutil.Process(self.root), *psutil.Process(self.root).children(recursive=True)]
        except psutil.Error:
            return
        jvms = tree = 0
        jvm_rss = 0
        for proc in procs:
            try:
                rss = proc.memory_info().rss
                tree += rss
                times = proc.cpu_times()
                self._cpu[proc.pid] = times.user + times.system  # the last second of a process is missed
                if "java" in proc.name().lower() and "org.apache.spark.launcher.Main" not in " ".join(proc.cmdline()):
                    jvms += 1
                    jvm_rss += rss
            except psutil.Error:
                pass
        self.peak_jvms = max(self.peak_jvms, jvms)
        self.peak_jvm_rss = max(self.peak_jvm_rss, jvm_rss)
        self.peak_tree_rss = max(self.peak_tree_rss, tree)

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> dict:
        self._halt.set()
        self.join()
        wall = time.perf_counter() - self._t0
        own = sum(self._cpu.values())
        other = max(machine_busy_seconds() - self._busy0 - own, 0.0) / wall if wall else 0.0
        return {"daemon_tree_cpu_seconds": round(own, 1),
                # The noise figure on a shared 2-core box: CPU the rest of the machine burnt meanwhile.
                "other_processes_avg_cores": round(other, 2),
                "peak_spark_jvms": self.peak_jvms, "peak_spark_jvm_rss_gib": round(self.peak_jvm_rss / GIB, 2),
                "peak_daemon_tree_rss_gib": round(self.peak_tree_rss / GIB, 2)}


class Daemon:
    """``dagster-daemon run`` for one DAGSTER_HOME, in its own process group; stopped with everything it started."""

    def __init__(self, name: str, env: dict, workspace: Path, logs: Path):
        self.name, self.env = name, env
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"daemon_{name}.log"
        self._out = open(self.log_path, "wb")
        command = [str(REPO / ".venv" / "bin" / "dagster-daemon"), "run", "-w", str(workspace)]
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        self.sampler = TreeSampler(self.proc.pid)
        self.sampler.start()

    def wait_ready(self, instance, timeout: float = 180.0) -> float:
        """Seconds until the queued run coordinator's first heartbeat."""
        started = time.time()
        while time.time() - started < timeout:
            if self.proc.poll() is not None:
                raise StepFailed(f"dagster-daemon exited with {self.proc.returncode}; log {self.log_path}:\n{self.tail()}")
            beat = instance.get_daemon_heartbeats().get("QUEUED_RUN_COORDINATOR")
            if beat and beat.timestamp >= started - 1:
                return round(time.time() - started, 1)
            time.sleep(0.5)
        raise StepFailed(f"dagster-daemon sent no queued-run-coordinator heartbeat in {timeout:.0f}s; log {self.log_path}:\n{self.tail()}")

    def tail(self) -> str:
        self._out.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> dict:
        """SIGTERM to the group (the daemon, its code servers and any run still going), then SIGKILL."""
        figures = self.sampler.stop() if self.sampler.is_alive() else {}
        group = self.proc.pid
        kill_group(self.proc)
        for proc in psutil.process_iter(["pid"]):  # anything of the group that outlived its leader
            try:
                if os.getpgid(proc.pid) == group:
                    proc.kill()
            except (ProcessLookupError, psutil.Error, OSError):
                pass
        self._out.close()
        return figures


# -- the bench --------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args, self.workdir = args, workdir
        self.logs = workdir / "logs"
        self.configs = workdir / "configs"
        self.workspace = workdir / "workspace.yaml"
        self.daemons: list[Daemon] = []
        self.tables = [f"{PREFIX}{i:02d}" for i in range(1, args.tables + 1)]
        self.base_env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "DAGSTER_HOME", "CDC_WAREHOUSE", "CDC_TABLE_CONFIGS")}
        self.defs = None
        self.results: dict = {"phases": {}, "errors": {}}

    # set-up ----------------------------------------------------------------------------------------
    def prepare(self) -> None:
        from cdc_assets.generator import generate

        started = time.perf_counter()
        names = [*self.tables, *([] if self.args.skip_pair else [FRESH_PAIR_TABLE])]
        for index, table in enumerate(names, start=1):
            data = self.workdir / "data" / table
            generate(self.args.rows, 0, 5, 10, 1.0, 0.0, 0.0, data / DAY, data / "_scratch", seed=self.args.seed + index)
            shutil.rmtree(data / "_scratch")
            bench_backfill.write_config(self.configs, data, table=table, start=DAY)
        self.workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": {
            "module_name": "cdc_assets.definitions", "location_name": LOCATION,
            "working_directory": str(REPO), "executable_path": str(REPO / ".venv" / "bin" / "python")}}]}))
        log(f"{len(names)} tables of {self.args.rows:,} rows generated in {time.perf_counter() - started:.1f}s")
        # The Definitions the code location will build, for evaluating the schedules in this process.
        os.environ["CDC_TABLE_CONFIGS"] = str(self.configs)
        with _quiet_warnings():
            from cdc_assets.definitions import defs

        self.defs = defs

    def instance_home(self, phase: str, max_concurrent: int) -> tuple[Path, Path]:
        base = self.workdir / "phases" / phase
        shutil.rmtree(base, ignore_errors=True)
        home = base / "dagster_home"
        home.mkdir(parents=True)
        settings = yaml.safe_load((REPO / "instance" / "dagster.yaml").read_text())
        settings.setdefault("concurrency", {})["runs"] = {"max_concurrent_runs": max_concurrent}
        settings["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator",
                                       "config": {"dequeue_interval_seconds": self.args.dequeue_interval}}
        (home / "dagster.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
        return home, base / "warehouse"

    # requests --------------------------------------------------------------------------------------
    def run_requests(self, instance, tables: list[str]) -> list[tuple[str, datetime, object]]:
        """Each table's daily schedule evaluated for the tick that materializes DAY (01:00 UTC the day after)."""
        from dagster import build_schedule_context

        tick = datetime.combine(date.fromisoformat(DAY) + timedelta(days=1), dtime(1, 0), tzinfo=timezone.utc)
        requests = []
        with _quiet_warnings():
            for table in tables:
                schedule = self.defs.get_schedule_def(f"{table}_daily")
                data = schedule.evaluate_tick(build_schedule_context(instance=instance, scheduled_execution_time=tick))
                if len(data.run_requests or []) != 1 or data.run_requests[0].partition_key != DAY:
                    raise StepFailed(f"{table}_daily at {tick}: expected one request for {DAY}, got {data.run_requests} ({data.skip_message})")
                requests.append((f"{table}_daily", tick, data.run_requests[0]))
        return requests

    def submit(self, instance, requests: list) -> tuple[list[str], float]:
        """Create each run as the scheduler daemon does and submit it to the queue; run ids and the first submit time."""
        import dagster._daemon  # noqa: F401 - dagster._scheduler.scheduler imports it back (import cycle)
        from dagster._core.definitions.selector import JobSubsetSelector
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import WorkspaceFileTarget
        from dagster._scheduler.scheduler import _create_scheduler_run

        run_ids: list[str] = []
        target = WorkspaceFileTarget(paths=[str(self.workspace)])
        with _quiet_warnings(), WorkspaceProcessContext(instance, target, code_server_log_level="ERROR") as process_context:
            context = process_context.create_request_context()
            error = context.get_code_location_error(LOCATION)
            if error:
                raise StepFailed(f"code location {LOCATION} did not load: {error.to_string()}")
            location = context.get_code_location(LOCATION)
            [repository] = location.get_repositories().values()
            first = time.time()
            for name, tick, request in requests:
                schedule = repository.get_schedule(name)
                job = location.get_job(JobSubsetSelector(
                    location_name=location.name, repository_name=repository.name, job_name=schedule.job_name,
                    op_selection=None, asset_selection=request.asset_selection, asset_check_selection=request.asset_check_keys))
                run = _create_scheduler_run(instance, tick, location, schedule, job, request)
                submitted = instance.submit_run(run.run_id, context)
                run_ids.append(run.run_id)
                if submitted.status.value != "QUEUED":
                    log(f"note: run {run.run_id} of {name} is {submitted.status.value} right after submission")
        return run_ids, first

    # waiting and reading back ----------------------------------------------------------------------
    def wait(self, instance, daemon: Daemon, run_ids: list[str], label: str) -> None:
        from dagster import RunsFilter

        deadline = time.time() + self.args.timeout
        last = None
        while True:
            records = instance.get_run_records(RunsFilter(run_ids=run_ids))
            statuses = [r.dagster_run.status.value for r in records]
            counts = {s: statuses.count(s) for s in sorted(set(statuses))}
            if counts != last:
                log(f"{label}: " + ", ".join(f"{s.lower()} {n}" for s, n in counts.items()))
                last = counts
            if len(records) == len(run_ids) and all(s in ENDED for s in statuses):
                return
            if not daemon.alive():
                raise StepFailed(f"dagster-daemon exited with {daemon.proc.returncode} before the runs ended; log {daemon.log_path}:\n{daemon.tail()}")
            if time.time() > deadline:
                raise StepFailed(f"{label}: runs still not ended after --timeout {self.args.timeout}s: {counts}")
            time.sleep(2)

    @staticmethod
    def timeline(instance, run_ids: list[str], t0: float) -> list[dict]:
        from dagster import DagsterEventType, RunsFilter

        kinds = {DagsterEventType.RUN_ENQUEUED: "enqueued", DagsterEventType.RUN_DEQUEUED: "dequeued",
                 DagsterEventType.RUN_STARTING: "starting", DagsterEventType.RUN_START: "started_event",
                 DagsterEventType.RUN_SUCCESS: "success", DagsterEventType.RUN_FAILURE: "failure"}
        records = {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=run_ids))}
        rows = []
        for run_id in run_ids:
            record = records[run_id]
            run = record.dagster_run
            row = {"run_id": run_id, "table": run.tags.get("dagster/schedule_name", "").removesuffix("_daily"),
                   "partition": run.tags.get("dagster/partition"), "status": run.status.value,
                   "created": round(utc(record.create_timestamp).timestamp() - t0, 2),
                   "start": round(record.start_time - t0, 2) if record.start_time else None,
                   "end": round(record.end_time - t0, 2) if record.end_time else None}
            for entry in instance.all_logs(run_id, of_type=set(kinds)):
                row.setdefault(kinds[entry.dagster_event.event_type], round(entry.timestamp - t0, 2))
            # Dagster 1.13's daemon writes no RUN_DEQUEUED event: RUN_STARTING is the moment it took the run off the queue.
            row["launched"] = row.get("dequeued", row.get("starting", row["start"]))
            if row["start"] is not None and row["end"] is not None:
                row["seconds"] = round(row["end"] - row["start"], 1)
            if run.status.value == "FAILURE":
                failures = instance.all_logs(run_id, of_type={DagsterEventType.RUN_FAILURE, DagsterEventType.STEP_FAILURE})
                row["error"] = " | ".join((e.dagster_event.message or e.user_message or "")[:300] for e in failures)[:1200]
            rows.append(row)
        return rows

    def check_outputs(self, warehouse: Path, tables: list[str]) -> dict:
        import duckdb

        found = {}
        for table in tables:
            folder = warehouse / table / "current_table" / f"business_date={DAY}"
            found[table] = dict(duckdb.sql(f"select operation, count(*) from read_parquet('{folder}/*.parquet') group by all").fetchall())
        wrong = {t: c for t, c in found.items() if c != {"I": self.args.rows}}
        if wrong:
            raise OutputsWrong(f"day-1 current_table should be {{'I': {self.args.rows}}}: {wrong}")
        return found

    # phases ----------------------------------------------------------------------------------------
    def start_daemon(self, phase: str, home: Path, warehouse: Path):
        from dagster import DagsterInstance

        env = {**self.base_env, "DAGSTER_HOME": str(home), "CDC_WAREHOUSE": str(warehouse), "CDC_TABLE_CONFIGS": str(self.configs)}
        instance = DagsterInstance.from_config(str(home))
        if not self.args.no_pool_setup:
            # As make ui does (cdc_assets/dev_ui.py): every table's pool limit exists before the daemon's
            # first pass, so that pass cannot count a pool as unlimited.
            from cdc_assets.dev_ui import create_table_pools

            created = create_table_pools(instance)
            log(f"{phase}: {len(created)} pool limits created before the daemon starts" if created
                else f"{phase}: every table's pool limit already exists")
        daemon = Daemon(phase, env, self.workspace, self.logs)
        self.daemons.append(daemon)
        ready = daemon.wait_ready(instance)
        log(f"{phase}: dagster-daemon up in {ready}s (pid {daemon.proc.pid}, log {daemon.log_path})")
        return instance, daemon

    def stop_daemon(self, daemon: Daemon) -> dict:
        figures = daemon.stop()
        if daemon in self.daemons:
            self.daemons.remove(daemon)
        return figures

    def measure_batch(self, phase: str, limit: int, result: dict) -> None:
        home, warehouse = self.instance_home(phase, limit)
        result.update(max_concurrent_runs=limit, tables=len(self.tables), rows=self.args.rows)
        instance, daemon = self.start_daemon(phase, home, warehouse)
        try:
            requests = self.run_requests(instance, self.tables)
            log(f"{phase}: {len(requests)} schedules evaluated for {DAY}; submitting to the queue (limit {limit})")
            run_ids, t0 = self.submit(instance, requests)
            log(f"{phase}: {len(run_ids)} runs submitted in {time.time() - t0:.1f}s")
            self.wait(instance, daemon, run_ids, phase)
            result["sampled"] = self.stop_daemon(daemon)
            runs = self.timeline(instance, run_ids, t0)
        finally:
            if daemon in self.daemons:
                result["sampled"] = self.stop_daemon(daemon)
        result["runs"] = runs
        ends = [r["end"] for r in runs if r["end"] is not None]
        result["wall_seconds"] = round(max(ends), 1) if ends else None
        result["max_started_at_once"] = max_overlap([(r["start"], r["end"]) for r in runs])
        result["max_in_progress_at_once"] = max_overlap([(r["launched"], r["end"]) for r in runs])
        result["mean_run_seconds"] = round(sum(r.get("seconds", 0) for r in runs) / len(runs), 1)
        result["failed"] = [r for r in runs if r["status"] != "SUCCESS"]
        log(f"{phase}: {len(runs)} runs in {result['wall_seconds']}s (first submission to last end); max started at once "
            f"{result['max_started_at_once']}, max in progress (launch to end) {result['max_in_progress_at_once']}, limit {limit}; "
            f"mean run {result['mean_run_seconds']}s; other processes {result['sampled'].get('other_processes_avg_cores')} cores; peak {result['sampled'].get('peak_spark_jvms')} Spark JVMs, "
            f"{result['sampled'].get('peak_spark_jvm_rss_gib')} GiB JVM RSS summed")
        for r in runs:
            log(f"    {r['table']:<12} {r['status']:<8} queued {r['created']:>7.1f}  start {fmt(r['start']):>7}  end {fmt(r['end']):>7}  "
                f"({fmt(r.get('seconds'))} s)" + (f"  ERROR {r['error'][:200]}" if r.get("error") else ""))
        if result["failed"]:
            raise StepFailed(f"{phase}: {len(result['failed'])} run(s) did not succeed: "
                             + "; ".join(f"{r['table']} {r['status']} {r.get('error', '')[:200]}" for r in result["failed"]))
        if result["max_in_progress_at_once"] > limit:
            raise OutputsWrong(f"{phase}: {result['max_in_progress_at_once']} runs in progress at once, limit {limit}")
        result["outputs"] = self.check_outputs(warehouse, self.tables)

    def measure_pairs(self, limit: int, result: dict) -> None:
        """Two runs of one table queued together: for a table whose pool the instance knows, and for a new one."""
        from dagster import DagsterInstance, RunsFilter

        home = self.workdir / "phases" / "parallel" / "dagster_home"
        warehouse = self.workdir / "phases" / "parallel" / "warehouse"
        known = home.exists()
        if not known:  # the parallel phase did not run: the "known" table is new here too
            log("pair: the parallel phase's instance is missing, so both pools are new to this one; nothing to check")
            home, warehouse = self.instance_home("pair", limit)
        result["max_concurrent_runs"] = limit
        instance = DagsterInstance.from_config(str(home))
        # The never-seen pool first: if the daemon's first look at a pool let both runs through, they would
        # both be launched in that pass, before the known pool's first run takes a slot. All four runs are
        # in the queue before the daemon starts, so its first pass sees both runs of each pair at once.
        pairs = {"new_pool": FRESH_PAIR_TABLE, "known_pool": self.tables[0]}
        requests = []
        for table in pairs.values():
            [request] = self.run_requests(instance, [table])
            requests += [request, request]  # the same request twice
        new_pool = ("never run; its pool limit created before the daemon started, as make ui does" if not self.args.no_pool_setup
                    else "its pool never seen by this instance")
        log(f"pair: submitting two runs of {pairs['new_pool']} ({new_pool}), then two of "
            f"{pairs['known_pool']} (pool seen in the parallel phase), then starting the daemon (limit {limit})")
        run_ids, t0 = self.submit(instance, requests)
        queued = [r.status.value for r in instance.get_runs(RunsFilter(run_ids=run_ids))]
        log(f"pair: {len(run_ids)} runs in the queue ({', '.join(sorted(set(queued)))}); starting the daemon")
        instance, daemon = self.start_daemon("pair", home, warehouse)
        try:
            self.wait(instance, daemon, run_ids, "pair")
            result["sampled"] = self.stop_daemon(daemon)
            runs = self.timeline(instance, run_ids, t0)
        finally:
            if daemon in self.daemons:
                result["sampled"] = self.stop_daemon(daemon)
        result["runs"] = runs
        problems = []
        for index, (kind, table) in enumerate(pairs.items()):
            first, second = sorted(runs[2 * index: 2 * index + 2], key=lambda r: (r["start"] is None, r["start"] or 0))
            held = (first["end"] is not None and second["start"] is not None and second["start"] >= first["end"]
                    and second["launched"] >= first["end"])
            queued_meanwhile = second.get("enqueued", second["created"]) <= (first["start"] or 0)
            pair = result[kind] = {"table": table, "first": first, "second": second, "second_waited": held,
                                   "second_queued_while_first_ran": held and queued_meanwhile,
                                   # The runs' own logs: did the table's writer lock make the second run wait?
                                   "writer_lock_waits": [r["run_id"] for r in (first, second) if waited_for_lock(home, r["run_id"])],
                                   "second_waited_seconds": round(second["start"] - second.get("enqueued", second["created"]), 1)
                                   if second["start"] is not None else None}
            log(f"pair ({kind.replace('_', ' ')}), {table}: first run enqueued {fmt(first.get('enqueued'))}, launched "
                f"{fmt(first['launched'])}, started {fmt(first['start'])}, ended {fmt(first['end'])}; second enqueued "
                f"{fmt(second.get('enqueued'))}, launched {fmt(second['launched'])}, started {fmt(second['start'])}, ended "
                f"{fmt(second['end'])} -> " + ("the second WAITED (QUEUED while the first ran)" if pair["second_queued_while_first_ran"]
                                               else "the second did NOT wait for the first"))
            if not pair["second_queued_while_first_ran"]:
                lock = ("the writer lock then held the second run's writes back ('waiting for the writer lock' in its log)"
                        if pair["writer_lock_waits"] else "no writer-lock wait found in the runs' logs")
                if (kind == "known_pool" and known) or not self.args.no_pool_setup:
                    problems.append(f"{kind}: two runs of {table} overlapped or the second did not sit queued; {lock}")
                else:
                    # Dagster 1.13: the daemon's pass that first sees a pool creates its limit row after reading the
                    # pools it knows, so in that pass the pool counts as unlimited (op_concurrency_limits_counter.py).
                    finding = (f"two runs of {table}, whose pool cdc_{table} this instance had never seen, were both launched by the "
                               f"daemon's first pass: the pool did not hold them apart; {lock}")
                    result.setdefault("findings", []).append(finding)
                    log(f"pair: FINDING: {finding}")
        failed = [r for r in runs if r["status"] != "SUCCESS"]
        if failed:
            raise StepFailed("pair: run(s) did not succeed: " + "; ".join(f"{r['table']} {r['status']} {r.get('error', '')[:200]}" for r in failed))
        if problems:
            raise OutputsWrong("pool did not hold: " + "; ".join(problems))

    def run(self) -> None:
        args = self.args
        sizing = size_concurrency()
        self.results["sizing"] = sizing
        limit = args.max_concurrent or sizing["max_concurrent"]
        self.results["max_concurrent_runs"] = limit
        log(("--max-concurrent " + str(limit) + " given; the default would be: " if args.max_concurrent else "sized: ")
            + sizing["explanation"])
        self.prepare()
        phases = [("parallel", lambda r: self.measure_batch("parallel", limit, r))]
        if not args.skip_pair:
            if limit >= 2:
                phases.append(("pair", lambda r: self.measure_pairs(limit, r)))
            else:
                log("pair: skipped, it needs a run limit of at least 2 to show the pool holding a run back")
        if not args.skip_sequential:
            phases.append(("sequential", lambda r: self.measure_batch("sequential", 1, r)))
        for name, measure in phases:
            log(f"--- {name} ---")
            result = self.results["phases"][name] = {}
            try:
                measure(result)
            except OutputsWrong as error:
                self.results["errors"][name] = {"kind": "outputs", "message": str(error)}
                log(f"{name}: WRONG: {error}")
            except Exception as error:  # noqa: BLE001 - report, go on with the other phases
                message = str(error) if isinstance(error, StepFailed) else traceback.format_exc()
                self.results["errors"][name] = {"kind": "failed", "message": message}
                log(f"{name}: FAILED: {message}")

    def stop_all(self) -> None:
        for daemon in list(self.daemons):
            try:
                self.stop_daemon(daemon)
                log(f"stopped dagster-daemon {daemon.name} (pid {daemon.proc.pid})")
            except Exception as error:  # noqa: BLE001
                log(f"WARNING: could not stop dagster-daemon {daemon.name}: {error}")
        # Anything else this process started (the code server of a WorkspaceProcessContext cut short).
        for child in psutil.Process().children(recursive=True):
            try:
                child.terminate()
            except psutil.Error:
                pass
        psutil.wait_procs(psutil.Process().children(recursive=True), timeout=10)
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass


class _quiet_warnings:
    """Dagster warns about get_schedule_def's resource resolution and preview features; not ours to fix here."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def waited_for_lock(home: Path, run_id: str) -> bool:
    """Whether the run's captured logs (``<home>/storage/<run_id>/compute_logs``) show a writer-lock wait."""
    for path in (home / "storage" / run_id).rglob("*"):
        if path.is_file() and b"waiting for the writer lock" in path.read_bytes():
            return True
    return False


def utc(moment: datetime) -> datetime:
    """Run storage returns naive UTC datetimes."""
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def fmt(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def max_overlap(intervals: list[tuple]) -> int:
    """The largest number of [start, end) intervals that hold one instant (an end before a start at the same time)."""
    points = []
    for start, end in intervals:
        if start is None:
            continue
        points.append((start, 1))
        points.append((end if end is not None else float("inf"), -1))
    current = best = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        current += delta
        best = max(best, current)
    return best


def print_summary(results: dict) -> None:
    phases = results["phases"]
    line = "=" * 118
    print("\n" + line)
    print(f"MANY TABLES (issue 13)  {results['tables']} tables x {results['rows']:,} rows, one date through the run queue  "
          f"at {results['git_commit']}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s")
    print(f"{'phase':<12} {'limit':>5} {'runs':>4} {'wall s':>8} {'other':>5} {'max started':>11} {'max in progress':>15} {'mean run s':>10} "
          f"{'peak JVMs':>9} {'peak JVM RSS GiB':>16}  result")
    for name in ("parallel", "sequential"):
        p = phases.get(name)
        if not p or "runs" not in p:
            continue
        s = p.get("sampled", {})
        ok = "ok" if not p.get("failed") and name not in results["errors"] else results["errors"].get(name, {}).get("kind", "?")
        print(f"{name:<12} {p['max_concurrent_runs']:>5} {len(p['runs']):>4} {fmt(p['wall_seconds']):>8} "
              f"{s.get('other_processes_avg_cores', '-'):>5} {p['max_started_at_once']:>11} "
              f"{p['max_in_progress_at_once']:>15} {fmt(p['mean_run_seconds']):>10} {s.get('peak_spark_jvms', '-'):>9} "
              f"{s.get('peak_spark_jvm_rss_gib', '-'):>16}  {ok}")
    par, seq = phases.get("parallel", {}), phases.get("sequential", {})
    if par.get("wall_seconds") and seq.get("wall_seconds"):
        print(f"parallel / sequential wall = {par['wall_seconds'] / seq['wall_seconds']:.2f} "
              f"(sequential is {seq['wall_seconds'] / par['wall_seconds']:.2f} x the parallel time)")
    pair = phases.get("pair", {})
    for kind in ("known_pool", "new_pool"):
        if kind in pair:
            p = pair[kind]
            print(f"pair, {kind.replace('_', ' ')} ({p['table']}): second run started {fmt(p['second']['start'])} s, first ended "
                  f"{fmt(p['first']['end'])} s; waited {fmt(p['second_waited_seconds'])} s in the queue -> "
                  + ("HELD (second QUEUED while the first ran)" if p["second_queued_while_first_ran"] else "NOT HELD by the pool")
                  + (f"; writer-lock wait in the log of {len(p['writer_lock_waits'])} run(s)" if p.get("writer_lock_waits") else ""))
    for finding in pair.get("findings", []):
        print(f"FINDING: {finding}")
    print(f"sizing: {results['sizing']['explanation']}")
    for name, error in results["errors"].items():
        print(f"{name}: {'WRONG' if error['kind'] == 'outputs' else 'FAILED'}: {error['message'].strip().splitlines()[0][:200]}")
    if results.get("interrupted"):
        print("INTERRUPTED")
    print("other: average cores that processes outside the daemon's tree kept busy meanwhile (above ~0.2: not an idle run);")
    print("wall s: first submission to the last run's end; max started: most runs between RUN_START and end at one instant (run")
    print("records); max in progress: the same from the launch (RUN_STARTING); peak JVMs / RSS: sampled each second under the daemon")
    print(line, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=20, help="tables (default 20)")
    parser.add_argument("--rows", type=int, default=100_000, help="day-1 rows per table (default 100,000)")
    parser.add_argument("--max-concurrent", type=int, help="max_concurrent_runs of the parallel phase (default: sized to memory and cores)")
    parser.add_argument("--skip-sequential", action="store_true", help="no max_concurrent_runs=1 comparison")
    parser.add_argument("--skip-pair", action="store_true", help="no two-runs-of-one-table check")
    parser.add_argument("--no-pool-setup", action="store_true",
                        help="do not create the tables' pool limits before the daemon starts (make ui does): shows Dagster's first-pass gap")
    parser.add_argument("--dequeue-interval", type=int, default=1, help="QueuedRunCoordinator dequeue_interval_seconds (default 1; Dagster's is 5)")
    parser.add_argument("--timeout", type=int, default=4 * 3600, help="seconds to wait for a phase's runs (default 4 h)")
    parser.add_argument("--seed", type=int, default=11, help="generator seed of table 1 (table i: seed + i)")
    parser.add_argument("--workdir", help="default: a fresh temp dir, deleted at the end unless --keep")
    parser.add_argument("--keep", action="store_true", help="keep data, instances, warehouses and logs")
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"), help="'' to skip the JSON copy")
    args = parser.parse_args(argv)
    if args.tables < 1 or args.tables > 99 or args.rows < 10:
        parser.error("need 1 <= --tables <= 99 and --rows >= 10")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        parser.error("--max-concurrent must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum, frame):
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    logging.getLogger("dagster").setLevel(logging.WARNING)
    workdir, is_temp = prepare_workdir(args.workdir, MARKER, "cdc_many_")
    bench = Bench(args, workdir)
    results = bench.results
    results.update(
        started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        git_commit=git_commit(),
        tables=args.tables,
        rows=args.rows,
        date=DAY,
        dequeue_interval_seconds=args.dequeue_interval,
        workdir=str(workdir),
        spark_env={k: os.environ[k] for k in ("CDC_SPARK_CONF", "CDC_SPARK_MASTER") if k in os.environ},
        machine={"cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / GIB, 1),
                 "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
    )
    log(f"workdir {workdir}; {args.tables} tables x {args.rows:,} rows for {DAY}; load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    interrupted = False
    try:
        bench.run()
    except (KeyboardInterrupt, Interrupted):
        interrupted = results["interrupted"] = True
        log("interrupted: stopping the daemon and everything it launched")
    except Exception:  # noqa: BLE001 - set-up failed: report it like a phase
        results["errors"]["setup"] = {"kind": "failed", "message": traceback.format_exc()}
        log(f"set-up FAILED: {results['errors']['setup']['message']}")
    finally:
        bench.stop_all()
        results["total_seconds"] = round(time.perf_counter() - started, 1)
        results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        results.setdefault("sizing", {"explanation": "-"})
        print_summary(results)
        text = json.dumps(results, indent=2, default=str) + "\n"
        if not (is_temp and not args.keep):
            (workdir / "results.json").write_text(text)
        if args.results_dir:
            folder = Path(args.results_dir)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"bench_many_tables_{args.tables}x{args.rows}_{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
            path.write_text(text)
            log(f"results written to {path}")
        if is_temp and not args.keep:
            if results["errors"] or interrupted:
                for entry in workdir.iterdir():
                    if entry.name not in ("logs", "phases"):
                        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                log(f"removed {workdir} except logs/ and phases/ (the instances: run logs; pass --keep to keep all)")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
                log(f"removed {workdir} (pass --keep to keep it)")
        log(f"total {results['total_seconds']:.0f}s")
    if interrupted:
        return 130
    if any(e["kind"] == "failed" for e in results["errors"].values()):
        return 1
    return 2 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
