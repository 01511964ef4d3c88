"""Many tables through the run queue (issues 13 and 22): day 2 of N tables, cold (a JVM per run) against warm
(every run on the project's one Spark Connect server), with a daemon launching the queued runs.

    .venv/bin/python benchmarks/bench_many_tables.py [--tables 20] [--rows 100000] [--dates 2]
        [--max-concurrent N] [--warm-concurrent 4] [--skip-cold] [--restart-server] [--no-pool-setup]
        [--dequeue-interval 1] [--dequeue-workers 0] [--timeout 14400] [--seed 11] [--workdir DIR] [--keep] [--results-dir DIR]

Issue 22's target: "Twenty tables of 100,000 rows, day 2 of each, through the run queue on the warm
server: total wall <= 0.2 x the same twenty runs cold through the queue, measured in the same
invocation", and the server's peak RSS while four runs share it.

Data: ``--tables`` table configs (``many_t01``, ...; the synthetic columns, full load, start date
2019-06-18) in a temp CDC_TABLE_CONFIGS folder, each with its own extracts from the generator (``--seed``
+ i): with ``--dates 2`` (the default) ``cdc-generate ROWS ROWS 5 10 0.2 0.4 0.4 <2019-06-18> <2019-06-19>``
(the Makefile's demo scenario), with ``--dates 1`` a ``--rows``-row 2019-06-18 only. A workspace file names
``cdc_assets.definitions`` (location ``cdc_assets``).

Every phase has a fresh DAGSTER_HOME whose dagster.yaml is the project's ``instance/dagster.yaml``
(pools: default_limit 1, granularity run: one run per table) plus the QueuedRunCoordinator (dequeue every
``--dequeue-interval`` s; with ``--dequeue-workers N``, ``dequeue_use_threads`` and N workers, else
Dagster's default of one launch at a time) and ``concurrency: runs: max_concurrent_runs``; each table's pool limit is
created before the daemon starts, as ``make ui`` does (``cdc_assets.dev_ui.create_table_pools``; not with
``--no-pool-setup``). In each phase:

1. ``dagster-daemon run -w <workspace>`` starts as a child process (own process group, that DAGSTER_HOME,
   CDC_WAREHOUSE and the phase's CDC_SPARK environment, which its code servers and run workers inherit);
   the script waits for its queued-run-coordinator heartbeat;
2. each table's ``<table>_daily`` schedule is evaluated for the date the way the scheduler does at 01:00
   UTC the day after (``schedule.evaluate_tick(build_schedule_context(...))``): one RunRequest per table;
3. each request becomes a run as the scheduler daemon makes one (Dagster's own
   ``dagster._scheduler.scheduler._create_scheduler_run``, so the run carries the schedule's tags and the
   table's pool) and is submitted with ``instance.submit_run``: QUEUED; the daemon dequeues and launches
   runs (DefaultRunLauncher: a run worker process each) as the run limit and the pools allow. The clock
   starts at the first submission and stops at the last run's end;
4. the script polls the run records until every run has ended, then stops the daemon.

The warm server: ``cdc_assets.connect_server.start_server`` on a free port with its state in
``<workdir>/spark-server``, started by this script before anything is submitted (outside every timed
window; its heap sized by ``server_heap_gib`` for ``--warm-concurrent`` runs, since DAGSTER_HOME then
names an instance with that limit) and stopped once the warm phases are done, and at the end, on failure,
Ctrl-C and SIGTERM. Warm phases run with ``CDC_SPARK=server``, ``CDC_SPARK_SERVER_DIR=<workdir>/spark-server``
and ``SPARK_CONNECT_PORT=<port>`` (as ``make ui`` sets them); cold ones with ``CDC_SPARK=local``.

Phases, in this order:

- ``setup`` (``--dates 2`` only; untimed): day 1 (2019-06-18) of every table through the warm queue
  (``--warm-concurrent`` at once), into a set-up warehouse; a run that fails is reported and submitted
  once more (set-up only has to store day 1); every day-1 current_table must hold --rows inserts. Each day-2 phase then starts from its own copy of that warehouse (``cp -a``: the date pointers
  are relative symlinks) and a fresh DAGSTER_HOME (day 2 reads no Dagster record of day 1: the
  previous date's state is in the warehouse).
- ``warm``: the timed date (2019-06-19, or 2019-06-18 with ``--dates 1``) of every table through the
  queue with ``max_concurrent_runs = --warm-concurrent`` (default 4), every run on the server. The
  server ran set-up's day 1 just before (JIT-warm, as under ``make ui`` the day after); with
  ``--restart-server`` it is restarted after set-up, so the phase gets a JVM that is up but has run
  nothing. The server JVM's peak RSS is its ``VmHWM`` over the phase (reset at the phase's start by
  writing 5 to ``/proc/<jvm>/clear_refs``), with the most runs in progress at once; its RSS is also
  sampled every second: the sampled peak with the runs in progress then, and the highest RSS sampled
  while the most runs were in progress.
- ``cold`` (not with ``--skip-cold``): the same runs, each with a JVM of its own (``CDC_SPARK=local``),
  the server stopped first; ``max_concurrent_runs = --max-concurrent``, by default sized as for one JVM
  per run: min(floor((total memory - 2 GiB) / (spark.driver.memory + 1 GiB)), 2 x cores) (4 on the 24
  GiB, 2-core machine; printed).

Reported: wall seconds per phase (first submission to last run end) and warm / cold against the target
0.2; every run's queued / launched / start / end times; the most runs in progress at once (launch to end;
must not exceed the limit); Spark JVMs under the daemon (0 when warm) and their summed RSS; the server's
peak RSS. Per-run overhead, from each run's Dagster event log, median and mean per phase:

  queue wait        RUN_ENQUEUED -> RUN_STARTING (the daemon launched it: waiting for the run limit)
  launch            RUN_STARTING -> RUN_START (the run worker process starts and loads the code location)
  to first step     RUN_START -> first STEP_START (execution plan, resources: "Spark for this run")
  Spark session     "Spark session ready in X s" (inside the first step that uses Spark)
  steps             sum of STEP_START..STEP_SUCCESS (including the Spark session), and their count
  between steps     first STEP_START -> last STEP_SUCCESS minus the steps (Dagster between steps)
  teardown          last STEP_SUCCESS -> RUN_SUCCESS (resource teardown: interrupt, release, session stop)
  run               RUN_STARTING -> RUN_SUCCESS

Dagster's bookkeeping is launch + to first step + between steps + teardown (event writes inside the steps,
which are not separable from here, come on top); the Spark session is the part the warm server removes.

Checks: every run must succeed; every warm run's "Spark for this run" must name the warm server and its
session the server's application id, every cold run its own; the timed date's outputs: day 2's
current_table I/U/N and history_partition I/U/D against the generator's counts for every table, in both
phases (day 1: current_table = --rows inserts). Exit status: 0 ok, 1 a run failed (or timed out), 2 wrong
counts, a run limit not held or a run on the wrong Spark, 130 interrupted.

Prints figures as phases finish, then a summary; JSON to
``benchmarks/results/bench_many_tables_<tables>x<rows>_<UTC>.json`` (git-ignored). The daemon (and any run
it launched, which is in its process group), the code server this script starts to create runs, and the
Connect server are stopped at the end, on failure, on Ctrl-C and on SIGTERM.

Removed (issue 22): issue 13's ``sequential`` (max_concurrent_runs = 1) and ``pair`` (two runs of one
table, the pool holding the second) phases and ``--skip-sequential`` / ``--skip-pair``: day-1 runs of a
table in a warehouse that holds day 2 do not fit this set-up, and the pools' gap they found is closed by
``create_table_pools`` (tests/test_dev_ui.py). Their code and figures: ``git show
c3ef443:benchmarks/bench_many_tables.py`` and benchmarks/README.md.

Uses Dagster internals (``_create_scheduler_run``, ``WorkspaceProcessContext``) as the daemon does;
written against dagster 1.13.

Commands and cost (the 2-core, 24 GiB machine):

    .venv/bin/python benchmarks/bench_many_tables.py                                  # 20 x 100k, day 2 cold vs warm
    .venv/bin/python benchmarks/bench_many_tables.py --tables 65 --rows 20000 --skip-cold   # 65 x 20k, one date, warm
    .venv/bin/python benchmarks/bench_many_tables.py --tables 3 --rows 2000 --warm-concurrent 2   # small check, ~6 min
    .venv/bin/python benchmarks/bench_many_tables.py --tables 4 --rows 1000 --skip-cold           # small warm-only check

Measured only at the small sizes (machine shared, other processes ~1.1-1.2 cores): the 3 x 2,000 check took
349 s in all (set-up 66 s, warm 48 s, cold 175 s, the rest server and daemon start-ups). Full sizes,
estimated, not measured: the default about 45-60 minutes (issue 13 measured 20 cold day-1 runs of 100k
rows at limit 4 in 1,141 s; cold day 2 does more work, so ~25-30 min; set-up and warm day 2 on the server
~8-12 min each, the cores being the bound); the 65-table warm mode about 15-25 minutes.
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
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict
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

DAY1 = "2019-06-18"
DAY2 = "2019-06-19"
LOCATION = "cdc_assets"
PREFIX = "many_t"
RESERVE_GIB = 2.0  # OS, the daemon and its code servers
OVERHEAD_GIB = 1.0  # per run above the driver heap: JVM off-heap, the run worker's Python
MARKER = ".cdc_bench_many_tables"
ENDED = {"SUCCESS", "FAILURE", "CANCELED"}
TARGET_RATIO = 0.2
# The environment this script sets per phase; the caller's own values of these are dropped.
PHASE_ENV = ("SPARK_REMOTE", "DAGSTER_HOME", "CDC_WAREHOUSE", "CDC_TABLE_CONFIGS", "CDC_SPARK", "CDC_SPARK_SERVER_DIR",
             "CDC_SPARK_SERVER_OWNER", "SPARK_CONNECT_PORT")
OWNER = "benchmarks/bench_many_tables.py"


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
    """Default max_concurrent_runs of the cold phase: as many drivers as fit in memory, at most 2 per core."""
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


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a live process in bytes ({} if it has gone)."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found


# -- processes --------------------------------------------------------------------------------------
class TreeSampler(threading.Thread):
    """Every second: the Spark JVMs under ``root`` (the daemon), how many at once and their summed RSS.

    ``extra`` pids (the warm server's JVM) count towards the CPU this bench's work used, from now on.
    """

    def __init__(self, root: int, interval: float = 1.0, extra: tuple[int, ...] = ()):
        super().__init__(name="many-sampler", daemon=True)
        self.root, self.interval = root, interval
        self.peak_jvms = 0
        self.peak_jvm_rss = 0
        self.peak_tree_rss = 0
        self._cpu: dict[int, float] = {}  # last CPU seconds seen per process of the tree
        self._extra_base: dict[int, float] = {}
        for pid in extra:
            try:
                times = psutil.Process(pid).cpu_times()
                self._extra_base[pid] = times.user + times.system
            except psutil.Error:
                pass
        self._busy0, self._t0 = machine_busy_seconds(), time.perf_counter()
        self._halt = threading.Event()

    def sample(self) -> None:
        for pid, base in self._extra_base.items():
            try:
                times = psutil.Process(pid).cpu_times()
                self._cpu[-pid] = times.user + times.system - base
            except psutil.Error:
                pass
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
        self.sample()
        wall = time.perf_counter() - self._t0
        own = sum(self._cpu.values())
        server = sum(v for k, v in self._cpu.items() if k < 0)
        other = max(machine_busy_seconds() - self._busy0 - own, 0.0) / wall if wall else 0.0
        return {"daemon_tree_cpu_seconds": round(own - server, 1), "server_cpu_seconds": round(server, 1),
                # The noise figure on a shared 2-core box: CPU the rest of the machine burnt meanwhile.
                "other_processes_avg_cores": round(other, 2),
                "peak_spark_jvms": self.peak_jvms, "peak_spark_jvm_rss_gib": round(self.peak_jvm_rss / GIB, 2),
                "peak_daemon_tree_rss_gib": round(self.peak_tree_rss / GIB, 2)}


class Daemon:
    """``dagster-daemon run`` for one DAGSTER_HOME, in its own process group; stopped with everything it started."""

    def __init__(self, name: str, env: dict, workspace: Path, logs: Path, extra_pids: tuple[int, ...] = ()):
        self.name, self.env = name, env
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"daemon_{name}.log"
        self._out = open(self.log_path, "wb")
        command = [str(REPO / ".venv" / "bin" / "dagster-daemon"), "run", "-w", str(workspace)]
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        self.sampler = TreeSampler(self.proc.pid, extra=extra_pids)
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


class WarmServer:
    """The project's Spark Connect server for the warm phases, started and stopped by this script."""

    def __init__(self, state_dir: Path, port: int):
        self.state_dir, self.port = state_dir, port
        self.handle = None
        self.jvm: int | None = None
        self.confs: dict = {}
        self._samples: list[tuple[float, int]] = []
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def env(self) -> dict[str, str]:
        return {"CDC_SPARK": "server", "CDC_SPARK_SERVER_DIR": str(self.state_dir), "SPARK_CONNECT_PORT": str(self.port)}

    def start(self, home: Path) -> float:
        """Start it as a run in the instance at ``home`` would (its heap sized for that instance's run limit)."""
        from cdc_assets.services import connect_server

        saved = {key: os.environ.get(key) for key in ("DAGSTER_HOME", *self.env())}
        os.environ.update({"DAGSTER_HOME": str(home), **self.env()})
        started = time.perf_counter()
        try:
            self.handle = connect_server.start_server(port=self.port, state_dir=self.state_dir, owner=OWNER, timeout=300)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        seconds = time.perf_counter() - started
        self.jvm = connect_server.jvm_pid(self.handle)
        self.confs = connect_server.probe(self.port)
        return round(seconds, 1)

    def alive(self) -> bool:
        from cdc_assets.services import connect_server

        return self.handle is not None and connect_server.running_server(self.state_dir) is not None

    def reset_peak(self) -> bool:
        """Reset the JVM's VmHWM to its current RSS (Linux >= 4.0: ``echo 5 > /proc/<pid>/clear_refs``)."""
        try:
            Path(f"/proc/{self.jvm}/clear_refs").write_text("5")
            return True
        except OSError as error:
            log(f"WARNING: could not reset the server's VmHWM ({error}); its peak then covers the server's whole life")
            return False

    def start_sampling(self) -> None:
        self._samples, self._halt = [], threading.Event()

        def sample() -> None:
            while not self._halt.is_set():
                rss = proc_status(self.jvm).get("VmRSS")
                if rss is not None:
                    self._samples.append((time.time(), rss))
                self._halt.wait(1.0)

        self._thread = threading.Thread(target=sample, name="server-rss", daemon=True)
        self._thread.start()

    def stop_sampling(self) -> list[tuple[float, int]]:
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
        return self._samples

    def stop(self) -> bool:
        from cdc_assets.services import connect_server

        self.stop_sampling()
        if self.handle is None:
            return False
        stopped = connect_server.stop_server(self.state_dir)
        self.handle = None
        return stopped


# -- the bench --------------------------------------------------------------------------------------
SESSION_READY = re.compile(r"Spark session ready in ([\d.]+) s on application (\S+)")
SPARK_FOR_RUN = "Spark for this run:"
# Per-run overhead figures, in the order printed; BOOKKEEPING adds up Dagster's own parts.
OVERHEAD = ("queue_wait", "launch", "to_first_step", "spark_session", "steps", "steps_without_session", "between_steps",
            "teardown", "bookkeeping", "run")
BOOKKEEPING = ("launch", "to_first_step", "between_steps", "teardown")
OVERHEAD_TEXT = {
    "queue_wait": "queue wait (ENQUEUED -> STARTING)",
    "launch": "launch (STARTING -> RUN_START)",
    "to_first_step": "RUN_START -> first STEP_START",
    "spark_session": "Spark session ready",
    "steps": "steps (sum)",
    "steps_without_session": "steps minus the session",
    "between_steps": "between steps",
    "teardown": "last step -> RUN_SUCCESS",
    "bookkeeping": "Dagster bookkeeping",
    "run": "run (STARTING -> RUN_SUCCESS)",
}


def tick_for(day: str) -> datetime:
    """The daily schedule's tick that materializes ``day``: 01:00 UTC the day after."""
    return datetime.combine(date.fromisoformat(day) + timedelta(days=1), dtime(1, 0), tzinfo=timezone.utc)


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args, self.workdir = args, workdir
        self.logs = workdir / "logs"
        self.configs = workdir / "configs"
        self.workspace = workdir / "workspace.yaml"
        self.daemons: list[Daemon] = []
        self.tables = [f"{PREFIX}{i:02d}" for i in range(1, args.tables + 1)]
        self.base_env = {k: v for k, v in os.environ.items() if k not in PHASE_ENV}
        self.defs = None
        self.generated: dict[str, dict] = {}
        self.server: WarmServer | None = None
        self.results: dict = {"phases": {}, "errors": {}}

    # set-up ----------------------------------------------------------------------------------------
    def prepare(self) -> None:
        from cdc_assets.generator import generate

        started = time.perf_counter()
        for index, table in enumerate(self.tables, start=1):
            data = self.workdir / "data" / table
            if self.args.dates == 2:  # the Makefile's demo scenario: 20% deleted, 40% updated, 40% unchanged
                summary = generate(self.args.rows, self.args.rows, 5, 10, 0.2, 0.4, 0.4, data / DAY1, data / DAY2, seed=self.args.seed + index)
                self.generated[table] = asdict(summary)
            else:
                generate(self.args.rows, 0, 5, 10, 1.0, 0.0, 0.0, data / DAY1, data / "_scratch", seed=self.args.seed + index)
                shutil.rmtree(data / "_scratch")
            bench_backfill.write_config(self.configs, data, table=table, start=DAY1)
        self.workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": {
            "module_name": "cdc_assets.definitions", "location_name": LOCATION,
            "working_directory": str(REPO), "executable_path": str(REPO / ".venv" / "bin" / "python")}}]}))
        log(f"{len(self.tables)} tables x {self.args.dates} date(s) of {self.args.rows:,} rows generated in {time.perf_counter() - started:.1f}s")
        # The Definitions the code location will build, for evaluating the schedules in this process.
        os.environ["CDC_TABLE_CONFIGS"] = str(self.configs)
        with _quiet_warnings():
            from cdc_assets.definitions import defs

        self.defs = defs

    def write_instance(self, home: Path, max_concurrent: int) -> None:
        home.mkdir(parents=True, exist_ok=True)
        settings = yaml.safe_load((REPO / "instance" / "dagster.yaml").read_text())
        settings.setdefault("concurrency", {})["runs"] = {"max_concurrent_runs": max_concurrent}
        coordinator = {"dequeue_interval_seconds": self.args.dequeue_interval}
        if self.args.dequeue_workers:
            # Launch several runs at once; Dagster's default (and the project's) launches one at a time.
            coordinator.update(dequeue_use_threads=True, dequeue_num_workers=self.args.dequeue_workers)
        settings["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator", "config": coordinator}
        (home / "dagster.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))

    def instance_home(self, phase: str, max_concurrent: int) -> tuple[Path, Path]:
        base = self.workdir / "phases" / phase
        shutil.rmtree(base, ignore_errors=True)
        home = base / "dagster_home"
        self.write_instance(home, max_concurrent)
        return home, base / "warehouse"

    # the warm server -------------------------------------------------------------------------------
    def start_server(self, label: str) -> None:
        from cdc_assets.services.process import free_port

        if self.server is None:
            self.server = WarmServer(self.workdir / "spark-server", free_port())
        # The server sizes its heap from DAGSTER_HOME's run limit: an instance with the warm phases' limit.
        home = self.workdir / "spark-server-home"
        self.write_instance(home, self.args.warm_concurrent)
        seconds = self.server.start(home)
        rss = proc_status(self.server.jvm).get("VmRSS", 0)
        entry = {"label": label, "start_seconds": seconds, "port": self.server.port, "pid": self.server.handle.pid, "jvm_pid": self.server.jvm,
                 "rss_after_start_gib": round(rss / GIB, 2), **{k: v for k, v in self.server.confs.items()}}
        self.results.setdefault("server_starts", []).append(entry)
        log(f"Spark Connect server ({label}) ready in {seconds}s at sc://127.0.0.1:{self.server.port} (pid {self.server.handle.pid}, JVM "
            f"{self.server.jvm}, application {self.server.confs.get('spark.app.id')}, driver memory {self.server.confs.get('spark.driver.memory')}, "
            f"scheduler {self.server.confs.get('spark.scheduler.mode')}, log {self.server.handle.log_path})")

    def stop_server(self) -> None:
        if self.server is not None and self.server.handle is not None:
            pid = self.server.handle.pid
            if self.server.stop():
                log(f"stopped the Spark Connect server (pid {pid})")

    # requests --------------------------------------------------------------------------------------
    def run_requests(self, instance, tables: list[str], day: str) -> list[tuple[str, datetime, object]]:
        """Each table's daily schedule evaluated for the tick that materializes ``day``."""
        from dagster import build_schedule_context

        tick = tick_for(day)
        requests = []
        with _quiet_warnings():
            for table in tables:
                schedule = self.defs.get_schedule_def(f"{table}_daily")
                data = schedule.evaluate_tick(build_schedule_context(instance=instance, scheduled_execution_time=tick))
                if len(data.run_requests or []) != 1 or data.run_requests[0].partition_key != day:
                    raise StepFailed(f"{table}_daily at {tick}: expected one request for {day}, got {data.run_requests} ({data.skip_message})")
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
        """Each run's times (seconds from ``t0``), its Spark and its overhead, from its record and event log."""
        from dagster import DagsterEventType as E, RunsFilter

        kinds = {E.RUN_ENQUEUED: "enqueued", E.RUN_DEQUEUED: "dequeued", E.RUN_STARTING: "starting", E.RUN_START: "started_event",
                 E.RUN_SUCCESS: "success", E.RUN_FAILURE: "failure", E.RUN_CANCELED: "canceled"}
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
            steps: dict[str, dict] = {}
            errors = []
            for entry in instance.all_logs(run_id):
                moment = round(entry.timestamp - t0, 2)
                event = entry.dagster_event
                if event is None:  # a log line of the run's own code
                    message = entry.user_message or ""
                    if SPARK_FOR_RUN in message:
                        row.setdefault("spark_target", message.split(SPARK_FOR_RUN, 1)[1].strip())
                    match = SESSION_READY.search(message)
                    if match:
                        row.setdefault("spark_session_seconds", float(match[1]))
                        row.setdefault("spark_application", match[2])
                    continue
                kind = event.event_type
                if kind in kinds:
                    row.setdefault(kinds[kind], moment)
                if kind == E.STEP_START:
                    steps.setdefault(entry.step_key, {})["start"] = moment
                elif kind in (E.STEP_SUCCESS, E.STEP_FAILURE):
                    steps.setdefault(entry.step_key, {})["end"] = moment
                if kind in (E.RUN_FAILURE, E.STEP_FAILURE):
                    errors.append((event.message or entry.user_message or "")[:300])
            # Dagster 1.13's daemon writes no RUN_DEQUEUED event: RUN_STARTING is the moment it took the run off the queue.
            row["launched"] = row.get("dequeued", row.get("starting", row["start"]))
            if row["start"] is not None and row["end"] is not None:
                row["seconds"] = round(row["end"] - row["start"], 1)
            row["steps"] = {key: round(s["end"] - s["start"], 2) for key, s in steps.items() if "start" in s and "end" in s}
            row["overhead"] = overhead(row, steps)
            if errors:
                row["error"] = " | ".join(errors)[:1200]
            rows.append(row)
        return rows

    def operation_counts(self, folder: Path) -> dict:
        import duckdb

        rows = duckdb.sql(f"select operation, count(*) from read_parquet('{folder}/*.parquet') group by all").fetchall()
        return {op: n for op, n in sorted(rows)}

    def expected(self, table: str, day: str) -> dict:
        if day == DAY1:
            return {"current_table": {"I": self.args.rows}}
        g = self.generated[table]
        wanted = {"current_table": {"I": g["inserted"], "U": g["updated"], "N": g["unchanged"]},
                  "history_partition": {"I": g["inserted"], "U": g["updated"], "D": g["deleted"]}}
        return {name: {op: n for op, n in ops.items() if n} for name, ops in wanted.items()}

    def check_outputs(self, warehouse: Path, day: str) -> dict:
        """The date's current_table (and on day 2 history_partition) operation counts against the generator's."""
        found, wrong = {}, {}
        for table in self.tables:
            expected = self.expected(table, day)
            try:
                found[table] = {name: self.operation_counts(warehouse / table / name / f"business_date={day}") for name in expected}
            except Exception as error:  # noqa: BLE001 - a missing output is a wrong count
                found[table] = {"error": str(error)[:300]}
            if found[table] != expected:
                wrong[table] = {"found": found[table], "expected": expected}
        if wrong:
            raise OutputsWrong(f"{day} outputs differ from the generator's counts: {wrong}")
        return found

    def check_spark(self, phase: str, runs: list[dict], warm: bool) -> list[str]:
        """Every warm run on the server (its application), every cold run on a JVM of its own."""
        problems = []
        if warm:
            application = self.server.confs.get("spark.app.id")
            for r in runs:
                if "warm Spark Connect server" not in r.get("spark_target", "") or r.get("spark_application") != application:
                    problems.append(f"{r['table']}: Spark {r.get('spark_target')!r}, application {r.get('spark_application')} (the server's: {application})")
        else:
            applications = [r.get("spark_application") for r in runs]
            for r in runs:
                if "of the run's own" not in r.get("spark_target", ""):
                    problems.append(f"{r['table']}: Spark {r.get('spark_target')!r}, expected a session of the run's own")
            if len(set(applications)) != len(applications):
                problems.append(f"cold runs shared an application: {applications}")
        return [f"{phase}: {p}" for p in problems]

    # phases ----------------------------------------------------------------------------------------
    def start_daemon(self, phase: str, home: Path, warehouse: Path, spark_env: dict, extra_pids: tuple[int, ...] = ()):
        from dagster import DagsterInstance

        env = {**self.base_env, **spark_env, "DAGSTER_HOME": str(home), "CDC_WAREHOUSE": str(warehouse), "CDC_TABLE_CONFIGS": str(self.configs)}
        instance = DagsterInstance.from_config(str(home))
        if not self.args.no_pool_setup:
            # As make ui does (cdc_assets/dev_ui.py): every table's pool limit exists before the daemon's
            # first pass, so that pass cannot count a pool as unlimited.
            from cdc_assets.services.dev_ui import create_table_pools

            created = create_table_pools(instance)
            log(f"{phase}: {len(created)} pool limits created before the daemon starts" if created
                else f"{phase}: every table's pool limit already exists")
        daemon = Daemon(phase, env, self.workspace, self.logs, extra_pids)
        self.daemons.append(daemon)
        ready = daemon.wait_ready(instance)
        log(f"{phase}: dagster-daemon up in {ready}s (pid {daemon.proc.pid}, log {daemon.log_path}); "
            + " ".join(f"{k}={v}" for k, v in spark_env.items()))
        return instance, daemon

    def stop_daemon(self, daemon: Daemon) -> dict:
        figures = daemon.stop()
        if daemon in self.daemons:
            self.daemons.remove(daemon)
        return figures

    def measure_queue(self, phase: str, limit: int, day: str, warm: bool, result: dict, source: Path | None = None,
                      retry: bool = False) -> None:
        """Every table's ``day`` through the queue at ``limit``, on the warm server or cold; ``source``: the warehouse to start from."""
        home, warehouse = self.instance_home(phase, limit)
        result.update(max_concurrent_runs=limit, tables=len(self.tables), rows=self.args.rows, date=day, spark="server" if warm else "local")
        if source is not None:
            started = time.perf_counter()
            shutil.copytree(source, warehouse, symlinks=True)
            result["warehouse_copy_seconds"] = round(time.perf_counter() - started, 1)
        if warm and not self.server.alive():
            raise StepFailed(f"{phase}: the Spark Connect server is not running")
        spark_env = self.server.env() if warm else {"CDC_SPARK": "local"}
        instance, daemon = self.start_daemon(phase, home, warehouse, spark_env, (self.server.jvm,) if warm else ())
        samples: list[tuple[float, int]] = []
        try:
            requests = self.run_requests(instance, self.tables, day)
            log(f"{phase}: {len(requests)} schedules evaluated for {day}; submitting to the queue (limit {limit}, Spark {result['spark']})")
            if warm:
                result["server_rss_at_start_gib"] = round(proc_status(self.server.jvm).get("VmRSS", 0) / GIB, 2)
                result["server_hwm_reset"] = self.server.reset_peak()
                self.server.start_sampling()
            run_ids, t0 = self.submit(instance, requests)
            log(f"{phase}: {len(run_ids)} runs submitted in {time.time() - t0:.1f}s")
            self.wait(instance, daemon, run_ids, phase)
            runs = self.timeline(instance, run_ids, t0)
            failed = [r for r in runs if r["status"] != "SUCCESS"]
            if failed and retry:
                # Set-up is untimed: its runs only have to store day 1. A failed one is reported, then submitted once more.
                result["failed_first"] = failed
                log(f"{phase}: {len(failed)} run(s) failed: " + "; ".join(f"{r['table']} {r.get('error', '')[:300]}" for r in failed)
                    + "; submitting them once more")
                again, _ = self.submit(instance, self.run_requests(instance, [r["table"] for r in failed], day))
                self.wait(instance, daemon, again, f"{phase} (again)")
                retried = {r["table"]: r for r in self.timeline(instance, again, t0)}
                runs = [retried.get(r["table"], r) for r in runs]
            if warm:
                samples = self.server.stop_sampling()
                result["server_vmhwm_gib"] = round(proc_status(self.server.jvm).get("VmHWM", 0) / GIB, 2)
            result["sampled"] = self.stop_daemon(daemon)
        finally:
            if warm:
                self.server.stop_sampling()
            if daemon in self.daemons:
                result["sampled"] = self.stop_daemon(daemon)
        result["runs"] = runs
        ends = [r["end"] for r in runs if r["end"] is not None]
        result["wall_seconds"] = round(max(ends), 1) if ends else None
        result["max_started_at_once"] = max_overlap([(r["start"], r["end"]) for r in runs])
        result["max_in_progress_at_once"] = max_overlap([(r["launched"], r["end"]) for r in runs])
        result["mean_run_seconds"] = round(sum(r.get("seconds", 0) for r in runs) / len(runs), 1)
        result["overhead"] = summarize_overhead(runs)
        result["failed"] = [r for r in runs if r["status"] != "SUCCESS"]
        if warm and samples:
            def in_progress(moment: float) -> int:
                return sum(1 for r in runs if r["launched"] is not None and r["launched"] <= moment < (r["end"] if r["end"] is not None else math.inf))

            counted = [(t - t0, rss, in_progress(t - t0)) for t, rss in samples]
            peak_time, peak_rss, peak_runs = max(counted, key=lambda s: s[1])
            result["server_sampled_peak_rss_gib"] = round(peak_rss / GIB, 2)
            result["server_runs_in_progress_at_sampled_peak"] = peak_runs
            # The RSS while the most runs shared the server (the issue: "while four runs share it").
            most = max(c[2] for c in counted)
            result["server_most_runs_sampled"] = most
            result["server_sampled_rss_at_most_runs_gib"] = round(max(c[1] for c in counted if c[2] == most) / GIB, 2)
            result["server_rss_samples"] = [(round(t, 1), round(v / GIB, 3), n) for t, v, n in counted]
        sampled = result["sampled"]
        log(f"{phase}: {len(runs)} runs in {result['wall_seconds']}s (first submission to last end); max in progress (launch to end) "
            f"{result['max_in_progress_at_once']}, max started at once {result['max_started_at_once']}, limit {limit}; mean run "
            f"{result['mean_run_seconds']}s; other processes {sampled.get('other_processes_avg_cores')} cores; peak "
            f"{sampled.get('peak_spark_jvms')} Spark JVMs under the daemon, {sampled.get('peak_spark_jvm_rss_gib')} GiB JVM RSS summed")
        if warm:
            log(f"{phase}: server JVM peak RSS (VmHWM{' since the phase started' if result.get('server_hwm_reset') else ', whole life'}) "
                f"{result.get('server_vmhwm_gib')} GiB with up to {result['max_in_progress_at_once']} runs in progress at once; sampled peak "
                f"{result.get('server_sampled_peak_rss_gib')} GiB with {result.get('server_runs_in_progress_at_sampled_peak')} in progress; "
                f"{result.get('server_sampled_rss_at_most_runs_gib')} GiB at most while {result.get('server_most_runs_sampled')} ran; "
                f"{result.get('server_rss_at_start_gib')} GiB at the phase's start")
        for r in runs:
            o = r["overhead"]
            log(f"    {r['table']:<10} {r['status']:<8} queued {r['created']:>6.1f} launched {fmt(r['launched']):>6} start {fmt(r['start']):>6} "
                f"end {fmt(r['end']):>6} ({fmt(r.get('seconds'))} s); session {fmt(o.get('spark_session'))} s, {len(r['steps'])} steps "
                f"{fmt(o.get('steps'))} s, bookkeeping {fmt(o.get('bookkeeping'))} s" + (f"  ERROR {r['error'][:200]}" if r.get("error") else ""))
        if result["failed"]:
            raise StepFailed(f"{phase}: {len(result['failed'])} run(s) did not succeed: "
                             + "; ".join(f"{r['table']} {r['status']} {r.get('error', '')[:200]}" for r in result["failed"]))
        problems = self.check_spark(phase, runs, warm)
        if result["max_in_progress_at_once"] > limit:
            problems.append(f"{phase}: {result['max_in_progress_at_once']} runs in progress at once, limit {limit}")
        if warm and sampled.get("peak_spark_jvms"):
            problems.append(f"{phase}: {sampled['peak_spark_jvms']} Spark JVM(s) seen under the daemon: a run did not use the server")
        result["outputs"] = self.check_outputs(warehouse, day)
        log(f"{phase}: outputs of {day} checked for {len(self.tables)} tables")
        if problems:
            raise OutputsWrong("; ".join(problems))

    def run(self) -> None:
        args = self.args
        sizing = size_concurrency()
        self.results["sizing"] = sizing
        cold_limit = args.max_concurrent or sizing["max_concurrent"]
        self.results["max_concurrent_runs"] = {"cold": None if args.skip_cold else cold_limit, "warm": args.warm_concurrent}
        if not args.skip_cold:
            log(("cold: --max-concurrent " + str(cold_limit) + " given; the default would be: " if args.max_concurrent else "cold: sized: ")
                + sizing["explanation"])
        log(f"warm: max_concurrent_runs {args.warm_concurrent} (--warm-concurrent)")
        self.prepare()
        self.start_server("before set-up" if args.dates == 2 else "before the warm phase")
        timed = DAY2 if args.dates == 2 else DAY1
        source = self.workdir / "phases" / "setup" / "warehouse" if args.dates == 2 else None
        phases = []
        if args.dates == 2:
            phases.append(("setup", lambda r: self.measure_queue("setup", args.warm_concurrent, DAY1, True, r, retry=True)))
            if args.restart_server:
                phases.append(("restart", lambda r: (self.stop_server(), self.start_server("restarted after set-up"))))
        phases.append(("warm", lambda r: self.measure_queue("warm", args.warm_concurrent, timed, True, r, source)))
        phases.append(("stop-server", lambda r: self.stop_server()))
        if not args.skip_cold:
            phases.append(("cold", lambda r: self.measure_queue("cold", cold_limit, timed, False, r, source)))
        for name, measure in phases:
            if name in ("restart", "stop-server"):
                measure({})
                continue
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
                if name == "setup":
                    log("set-up failed: the day-2 phases have no day 1 to start from; stopping")
                    break
        warm, cold = self.results["phases"].get("warm", {}), self.results["phases"].get("cold", {})
        if warm.get("wall_seconds") and cold.get("wall_seconds"):
            self.results["warm_over_cold"] = round(warm["wall_seconds"] / cold["wall_seconds"], 3)
            self.results["target"] = TARGET_RATIO
            self.results["target_met"] = self.results["warm_over_cold"] <= TARGET_RATIO

    def stop_all(self) -> None:
        for daemon in list(self.daemons):
            try:
                self.stop_daemon(daemon)
                log(f"stopped dagster-daemon {daemon.name} (pid {daemon.proc.pid})")
            except Exception as error:  # noqa: BLE001
                log(f"WARNING: could not stop dagster-daemon {daemon.name}: {error}")
        try:
            self.stop_server()
        except Exception as error:  # noqa: BLE001
            log(f"WARNING: could not stop the Spark Connect server: {error}")
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


def overhead(row: dict, steps: dict[str, dict]) -> dict:
    """Seconds of each part of a run (see the module docstring); a part whose events are missing is left out."""
    found: dict[str, float] = {}
    starts = [s["start"] for s in steps.values() if "start" in s]
    ends = [s["end"] for s in steps.values() if "end" in s]
    durations = [s["end"] - s["start"] for s in steps.values() if "start" in s and "end" in s]
    end = row.get("success", row.get("failure", row.get("canceled")))
    if row.get("enqueued") is not None and row.get("starting") is not None:
        found["queue_wait"] = row["starting"] - row["enqueued"]
    if row.get("starting") is not None and row.get("started_event") is not None:
        found["launch"] = row["started_event"] - row["starting"]
    if row.get("started_event") is not None and starts:
        found["to_first_step"] = min(starts) - row["started_event"]
    if row.get("spark_session_seconds") is not None:
        found["spark_session"] = row["spark_session_seconds"]
    if durations:
        found["steps"] = sum(durations)
        found["steps_without_session"] = found["steps"] - found.get("spark_session", 0.0)
        found["between_steps"] = max(ends) - min(starts) - found["steps"]
    if ends and end is not None:
        found["teardown"] = end - max(ends)
    if all(part in found for part in BOOKKEEPING):
        found["bookkeeping"] = sum(found[part] for part in BOOKKEEPING)
    if row.get("starting") is not None and end is not None:
        found["run"] = end - row["starting"]
    return {key: round(value, 2) for key, value in found.items()}


def summarize_overhead(runs: list[dict]) -> dict:
    summary = {}
    for key in OVERHEAD:
        values = [r["overhead"][key] for r in runs if key in r.get("overhead", {})]
        if values:
            summary[key] = {"median": round(statistics.median(values), 2), "mean": round(statistics.fmean(values), 2),
                            "min": round(min(values), 2), "max": round(max(values), 2), "n": len(values)}
    steps = [len(r.get("steps", {})) for r in runs]
    if steps:
        summary["step_count"] = {"median": statistics.median(steps), "mean": round(statistics.fmean(steps), 1), "n": len(steps)}
    return summary


class _quiet_warnings:
    """Dagster warns about get_schedule_def's resource resolution and preview features; not ours to fix here."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


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
    timed = DAY2 if results.get("dates") == 2 else DAY1
    print("\n" + line)
    print(f"MANY TABLES (issues 13, 22)  {results['tables']} tables x {results['rows']:,} rows, {timed} of each through the run queue, "
          f"warm vs cold  at {results['git_commit']}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s")
    print(f"{'phase':<6} {'Spark':<6} {'date':<10} {'limit':>5} {'runs':>4} {'wall s':>8} {'other':>5} {'max in progress':>15} {'mean run s':>10} "
          f"{'JVMs under daemon':>17} {'their RSS GiB':>13}  result")
    for name in ("setup", "warm", "cold"):
        p = phases.get(name)
        if not p or "runs" not in p:
            continue
        s = p.get("sampled", {})
        ok = "ok" if name not in results["errors"] else results["errors"][name]["kind"]
        print(f"{name:<6} {p['spark']:<6} {p['date']:<10} {p['max_concurrent_runs']:>5} {len(p['runs']):>4} {fmt(p['wall_seconds']):>8} "
              f"{s.get('other_processes_avg_cores', '-'):>5} {p['max_in_progress_at_once']:>15} {fmt(p['mean_run_seconds']):>10} "
              f"{s.get('peak_spark_jvms', '-'):>17} {s.get('peak_spark_jvm_rss_gib', '-'):>13}  {ok}")
    if "warm_over_cold" in results:
        print(f"warm / cold wall = {phases['warm']['wall_seconds']:.1f} / {phases['cold']['wall_seconds']:.1f} = {results['warm_over_cold']:.3f}  "
              f"(target <= {TARGET_RATIO}: {'MET' if results['target_met'] else 'NOT met'})")
    warm = phases.get("warm", {})
    if "server_vmhwm_gib" in warm:
        start = (results.get("server_starts") or [{}])[-1]
        print(f"server (driver memory {start.get('spark.driver.memory')}, scheduler {start.get('spark.scheduler.mode')}): peak RSS "
              f"(VmHWM{' over the warm phase' if warm.get('server_hwm_reset') else ', whole life'}) {warm['server_vmhwm_gib']} GiB with up to "
              f"{warm['max_in_progress_at_once']} runs in progress at once (limit {warm['max_concurrent_runs']}); sampled peak "
              f"{warm.get('server_sampled_peak_rss_gib')} GiB with {warm.get('server_runs_in_progress_at_sampled_peak')} in progress, "
              f"{warm.get('server_sampled_rss_at_most_runs_gib')} GiB at most while {warm.get('server_most_runs_sampled')} ran; "
              f"{warm.get('server_rss_at_start_gib')} GiB at the phase's start")
    shown = [n for n in ("warm", "cold", "setup") if phases.get(n, {}).get("overhead")]
    if shown:
        print("per-run overhead, s (median / mean) from the runs' event logs:")
        print(f"  {'':<32}" + "".join(f"{n + ' (' + phases[n]['date'] + ')':>24}" for n in shown))
        for key in (*OVERHEAD, "step_count"):
            cells = []
            for n in shown:
                v = phases[n]["overhead"].get(key)
                cells.append(f"{v['median']:>11.1f} / {v['mean']:<10.1f}" if v else f"{'-':>24}")
            print(f"  {OVERHEAD_TEXT.get(key, 'steps per run'):<32}" + "".join(f"{c:>24}" for c in cells))
        print("  Dagster bookkeeping = launch + RUN_START -> first step + between steps + last step -> RUN_SUCCESS;")
        print("  the Spark session is inside the first step that uses Spark; queue wait is the run limit at work")
    if results["sizing"].get("explanation") and phases.get("cold"):
        print(f"cold sizing: {results['sizing']['explanation']}")
    for name, error in results["errors"].items():
        print(f"{name}: {'WRONG' if error['kind'] == 'outputs' else 'FAILED'}: {error['message'].strip().splitlines()[0][:300]}")
    if results.get("interrupted"):
        print("INTERRUPTED")
    print("other: average cores that processes outside the daemon's tree and the server kept busy meanwhile (above ~0.2: not idle);")
    print("wall s: first submission to the last run's end; max in progress: most runs between the launch (RUN_STARTING) and")
    print("the end at one instant; JVMs / RSS: Spark JVMs sampled each second under the daemon (none when warm)")
    print(line, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=20, help="tables (default 20)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table and date (default 100,000)")
    parser.add_argument("--dates", type=int, choices=(1, 2),
                        help="2: day 1 set up (untimed, warm), day 2 timed (the default); 1: day 1 timed from an empty warehouse "
                             "(the default with --skip-cold)")
    parser.add_argument("--max-concurrent", type=int, help="max_concurrent_runs of the cold phase (default: sized to memory and cores)")
    parser.add_argument("--warm-concurrent", type=int, default=4, help="max_concurrent_runs of set-up and the warm phase (default 4)")
    parser.add_argument("--skip-cold", action="store_true", help="warm phase only (then one date each, unless --dates 2)")
    parser.add_argument("--restart-server", action="store_true", help="restart the server between set-up and the warm phase")
    parser.add_argument("--no-pool-setup", action="store_true",
                        help="do not create the tables' pool limits before the daemon starts (make ui does)")
    parser.add_argument("--dequeue-interval", type=int, default=1, help="QueuedRunCoordinator dequeue_interval_seconds (default 1; Dagster's is 5)")
    parser.add_argument("--dequeue-workers", type=int, default=0,
                        help="QueuedRunCoordinator dequeue_use_threads with this many workers (default 0: Dagster's one launch at a time)")
    parser.add_argument("--timeout", type=int, default=4 * 3600, help="seconds to wait for a phase's runs (default 4 h)")
    parser.add_argument("--seed", type=int, default=11, help="generator seed of table 1 (table i: seed + i)")
    parser.add_argument("--workdir", help="default: a fresh temp dir, deleted at the end unless --keep")
    parser.add_argument("--keep", action="store_true", help="keep data, instances, warehouses and logs")
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"), help="'' to skip the JSON copy")
    args = parser.parse_args(argv)
    if args.dates is None:
        args.dates = 1 if args.skip_cold else 2
    if args.tables < 1 or args.tables > 99 or args.rows < 10:
        parser.error("need 1 <= --tables <= 99 and --rows >= 10")
    if args.max_concurrent is not None and args.max_concurrent < 1 or args.warm_concurrent < 1:
        parser.error("--max-concurrent and --warm-concurrent must be >= 1")
    if args.restart_server and args.dates != 2:
        parser.error("--restart-server needs --dates 2 (there is no set-up to restart after)")
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
        dates=args.dates,
        timed_date=DAY2 if args.dates == 2 else DAY1,
        skip_cold=args.skip_cold,
        restart_server=args.restart_server,
        dequeue_interval_seconds=args.dequeue_interval,
        dequeue_workers=args.dequeue_workers,
        workdir=str(workdir),
        spark_env={k: os.environ[k] for k in ("CDC_SPARK_CONF", "CDC_SPARK_MASTER") if k in os.environ},
        machine={"cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / GIB, 1),
                 "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
    )
    log(f"workdir {workdir}; {args.tables} tables x {args.rows:,} rows, {'day 2 timed after a day-1 set-up' if args.dates == 2 else 'day 1 timed'}; "
        f"{'warm only' if args.skip_cold else 'warm and cold'}; load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    interrupted = False
    try:
        bench.run()
    except (KeyboardInterrupt, Interrupted):
        interrupted = results["interrupted"] = True
        log("interrupted: stopping the daemon, everything it launched and the Spark Connect server")
    except Exception:  # noqa: BLE001 - set-up failed: report it like a phase
        results["errors"]["prepare"] = {"kind": "failed", "message": traceback.format_exc()}
        log(f"set-up FAILED: {results['errors']['prepare']['message']}")
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
                    if entry.name not in ("logs", "phases", "spark-server"):
                        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                log(f"removed {workdir} except logs/, phases/ and spark-server/ (run logs, server log; pass --keep to keep all)")
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
