"""Every performance target of issue 10, measured in one invocation (`make benchmark`).

    .venv/bin/python benchmarks/bench_targets.py [--rows 1000000] [--range-days 10] [--range-rows 10000]
        [--workdir DIR] [--keep] [--skip-warm] [--skip-range] [--only a,b,c,range-cold,range-warm]
        [--yardstick PATH] [--server-conf JSON] [--results-dir DIR]

Each measurement runs in a fresh process (the `dagster` CLI or the yardstick script, as a user would
run them) unless it says warm; warm ones run the same CLI with SPARK_REMOTE set to a Spark Connect
server started for the purpose. Measurements (names for `--only`):

  a           the yardstick, `../shared/bench/plain_cdc.py` (plain PySpark, no Dagster): day 1, then
              day 2, each a fresh process. (a) = day-2 wall seconds.
  b           the pipeline through `dagster asset materialize ... --partition D`, day 1 then day 2,
              each a fresh process with its own JVM; fresh DAGSTER_HOME and warehouse.
              (b) = day-2 wall seconds; b/a target <= 1.0. Also the day-2 JVM's peak RSS.
  c           the same two CLI runs against a Spark Connect server started just before (server
              cold for day 1, warm for day 2). (c) = day-2 wall seconds; c/a target <= 0.7. The
              server JVM's peak RSS (VmHWM) over these runs, target <= 3 GiB. Then, for reference, the
              yardstick's day 1 and day 2 on the same warm server.
  range-cold  `--range-days` dates of `--range-rows` rows (bench_backfill.py's data): one CLI run
              per date, then one `--partition-range FIRST...LAST` run into a fresh warehouse.
              range / single target <= 2.0 (<= 2.5 acceptable). Both warehouses must hold the same.
  range-warm  the same against a Connect server of its own; target <= 1.5.
  changeset   a flagged change set (load_type: changeset, issue 11) of the same table: day 1 = the
              day-1 rows as insert records, day 2 = `--changeset-records` records (40% updates, 20%
              upserts that change nothing, 20% inserts, 20% deletes), each a cold CLI run. Printed
              against (b)'s day 2, the full load of the same table; no target.
  b-incremental          (b) again with `storage: {current: incremental}` (issue 23): day 2 stores
              its changes. b-incremental / b target <= 1.0 (no slower than a snapshot).
  changeset-incremental  changeset with `storage: {current: incremental}`: day 2 / (b)'s day 2
              target <= 0.15 (issue 23).

"single" is the mean of the one-date runs of dates 2..N (date 1 has no previous state to join), as in
bench_backfill.py; the mean over all dates is in the JSON too.

JVM peak RSS of a CLI run: a thread walks the run's process tree every 0.2 s, and for each java
process found reads VmHWM from /proc/<pid>/status (the kernel's own high-water mark of its RSS, so a
spike between two samples is not missed; only growth in the last < 0.2 s before the JVM exits could
be). Reading VmHWM once "just before the JVM exits" is not possible from outside: the JVM exits when
the run's Python process closes its pipe, with no moment we can hook. For the Connect server the JVM
outlives the runs, so its VmHWM is read once after them.

Prints each measurement as it finishes, then a table of figures, ratios and targets; writes the same
as JSON to `<workdir>/results.json` and `benchmarks/results/bench_targets_<rows>rows_<UTC>.json`
(git-ignored). Every server this script starts is stopped at the end, on failure, on Ctrl-C and on
SIGTERM too, and a run in progress is killed with its process group (its JVM included). A failed
measurement is reported and the others still run; a temp workdir then keeps its logs/.
Exit status: 0 all ran and checked out, 1 a measurement failed, 2 outputs were wrong or differed,
130 interrupted.

Full default run on the idle 2-core machine: about 20-30 minutes (a ~1.5 min, b ~4, c ~5, range-cold
~8, range-warm ~4), longer if others use the machine: the table's "other" column says how much they
did. The same at small sizes takes about 10 minutes, mostly process and JVM start-up:
    .venv/bin/python benchmarks/bench_targets.py --rows 20000 --range-days 3 --range-rows 2000
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_backfill  # noqa: E402 - its range data, table config and output comparison are reused
from spark_eventlog import partition_bytes as asset_partition_bytes  # noqa: E402

from cdc_assets.services.process import free_port  # noqa: E402

TABLE = "synthetic"
DAY1, DAY2 = "2019-06-18", "2019-06-19"
DEFAULT_YARDSTICK = REPO.parent / "shared" / "bench" / "plain_cdc.py"
MEASUREMENTS = ("a", "b", "c", "range-cold", "range-warm", "changeset", "b-incremental", "changeset-incremental")
CHANGESET_TABLE = "synthetic_changes"
# The day-2 change set's mix: updates, upserts that change nothing, inserts and deletes.
CHANGESET_MIX = {"U": 0.4, "N": 0.2, "I": 0.2, "D": 0.2}
WARM = {"c", "range-warm"}
RANGE = {"range-cold", "range-warm"}
TARGETS = {"b/a": 1.0, "c/a": 0.7, "server_rss_gib": 3.0, "range_cold": 2.0, "range_cold_acceptable": 2.5, "range_warm": 1.5,
           "b_incremental/b": 1.0, "changeset_incremental/b": 0.15}
# storage: in a table config; the *-incremental measurements store each date's changes (issue 23).
INCREMENTAL = "storage: {current: incremental}\n"
MARKER = ".cdc_bench_targets"
GIB = 2**30


def log(message: str) -> None:
    print(f"[targets {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Interrupted(BaseException):
    """SIGTERM, turned into an exception so that the same clean-up runs as for Ctrl-C (not caught as a failure)."""


class StepFailed(Exception):
    pass


class OutputsWrong(Exception):
    pass


# -- processes --------------------------------------------------------------------------------
def vm_hwm(pid: int) -> int:
    """Peak RSS in bytes (VmHWM) of a live process; 0 if it has gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (not idle, not waiting for I/O)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


class JvmMonitor(threading.Thread):
    """Every 0.2 s: the java processes under ``root``, their VmHWM and CPU seconds; the root's too.

    The tree is walked only until the Spark JVM is found (skipping Spark's short-lived launcher JVM),
    then only /proc/<pid> files are read, so sampling costs next to nothing. ``server`` is the pid of a
    Connect server's JVM that works for the run: its CPU seconds count as the run's own.
    """

    def __init__(self, root: int, server: int | None = None, interval: float = 0.2):
        super().__init__(name=f"jvm-monitor-{root}", daemon=True)
        self.root, self.interval = root, interval
        self.peaks: dict[int, int] = {}
        self.root_peak = 0
        self._jvm: int | None = None
        self._halt = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._cpu: dict[int, float] = {}  # last CPU seconds seen per process (root, JVMs)
        self._cpu0: dict[int, float] = {}
        self._busy0 = machine_busy_seconds()
        self._t0 = time.perf_counter()
        self._track(root)  # started just now: all its CPU is the run's
        self._track(server, from_now=True)  # long-lived: only what it uses from now on

    def _track(self, pid: int | None, from_now: bool = False) -> None:
        if pid is None or pid in self._procs:
            return
        try:
            proc = psutil.Process(pid)
            self._cpu0[pid] = cpu_seconds(proc) if from_now else 0.0
            self._procs[pid] = proc
        except psutil.Error:
            pass

    def _find_jvm(self) -> None:
        try:
            children = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                if "java" not in child.name().lower():
                    continue
                self.peaks.setdefault(child.pid, 0)
                self._track(child.pid)
                if "org.apache.spark.launcher.Main" not in " ".join(child.cmdline()):
                    self._jvm = child.pid
            except psutil.Error:
                pass

    def sample(self) -> None:
        if self._jvm is None or not psutil.pid_exists(self._jvm):
            self._jvm = None
            self._find_jvm()
        for pid in self.peaks:
            self.peaks[pid] = max(self.peaks[pid], vm_hwm(pid))
        self.root_peak = max(self.root_peak, vm_hwm(self.root))
        for pid, proc in self._procs.items():
            try:
                self._cpu[pid] = cpu_seconds(proc)
            except psutil.Error:
                pass  # gone: keep its last figure

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> dict:
        """Stop sampling; the run's CPU seconds and what the rest of the machine used meanwhile."""
        self._halt.set()
        self.join()
        wall = time.perf_counter() - self._t0
        busy = machine_busy_seconds() - self._busy0
        own = sum(self._cpu.get(pid, 0.0) - self._cpu0.get(pid, 0.0) for pid in self._procs)
        jvm = sum(self._cpu.get(pid, 0.0) - self._cpu0.get(pid, 0.0) for pid in self._procs if pid != self.root)
        return {
            "own_cpu_seconds": round(own, 1),
            "jvm_cpu_seconds": round(jvm, 1),
            # The noise figure on a shared 2-core box: CPU the rest of the machine burnt during the run.
            "other_processes_avg_cores": round(max(busy - own, 0.0) / wall, 2) if wall else 0.0,
            "loadavg_1min_at_end": round(os.getloadavg()[0], 2),
        }

    @property
    def jvm_peak(self) -> int:
        return max(self.peaks.values(), default=0)


def kill_group(proc: subprocess.Popen) -> None:
    """End a child we started (it leads its own process group, with any JVM it started)."""
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_process(name: str, command: list[str], env: dict, logs: Path, cwd: Path = REPO, server: int | None = None) -> dict:
    """Run one command as a fresh process; wall seconds, peak RSS of its JVM (if any) and of itself, CPU.

    ``server``: the pid of the Connect server JVM the run uses, whose CPU seconds count as the run's.
    """
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with open(log_path, "wb") as out:
        out.write(("$ " + " ".join(command) + "\n").encode())
        out.flush()
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        monitor = JvmMonitor(proc.pid, server)
        monitor.start()
        try:
            returncode = proc.wait()
            seconds = time.perf_counter() - started
        finally:
            cpu = monitor.stop()
            kill_group(proc)  # only does something when we were interrupted
    if returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise StepFailed(f"{name} exited with {returncode} after {seconds:.1f}s; log {log_path}:\n{tail}")
    return {
        "seconds": round(seconds, 2),
        "jvm_peak_rss_mib": mib(monitor.jvm_peak),
        "jvms_seen": len(monitor.peaks),
        "process_peak_rss_mib": mib(monitor.root_peak),
        **cpu,
        "log": str(log_path),
    }


def mib(n: int) -> float:
    return round(n / 2**20, 1)


def gib(n_mib: float | None) -> float | None:
    return None if n_mib is None else round(n_mib / 1024, 2)


# -- the bench ----------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args, self.workdir = args, workdir
        self.logs = workdir / "logs"
        self.dagster = REPO / ".venv" / "bin" / "dagster"
        if not self.dagster.exists():
            self.dagster = Path(shutil.which("dagster") or "dagster")
        self.python = sys.executable
        self.servers: list[Path] = []  # state dirs of every server we tried to start
        self.connect = None
        self.results: dict = {"measurements": {}, "errors": {}}
        # The user's Spark settings reach every run; an inherited SPARK_REMOTE, or the project's running
        # server (which runs find by default), must not make a "cold" run warm: warm runs name their server.
        self.base_env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "DAGSTER_HOME", "CDC_WAREHOUSE", "CDC_TABLE_CONFIGS")}
        self.base_env["CDC_SPARK"] = "local"
        self.generated = None

    # environment -----------------------------------------------------------------------------
    def run_env(self, name: str, configs: Path, remote: str | None = None) -> dict:
        """A fresh DAGSTER_HOME (with the project's dagster.yaml) and warehouse under runs/<name>/."""
        base = self.workdir / "runs" / name
        if base.exists():
            shutil.rmtree(base)
        home = base / "dagster_home"
        home.mkdir(parents=True)
        shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
        env = {**self.base_env, "DAGSTER_HOME": str(home), "CDC_WAREHOUSE": str(base / "warehouse"), "CDC_TABLE_CONFIGS": str(configs)}
        if remote:
            env["SPARK_REMOTE"] = remote
        return env

    def materialize(self, name: str, env: dict, table: str, *partition: str, server: int | None = None) -> dict:
        command = [str(self.dagster), "asset", "materialize", "-m", "cdc_assets.definitions", "--select", f"group:{table}", *partition]
        return run_process(name, command, env, self.logs, server=server)

    def yardstick(self, name: str, day: str, out: Path, env: dict, server: int | None = None) -> dict:
        command = [self.python, str(self.args.yardstick), "--csv", str(self.day_dir(day)), "--date", day, "--out", str(out)]
        if day == DAY2:
            command += ["--prev-date", DAY1]
        figures = run_process(name, command, env, self.logs, cwd=self.workdir, server=server)
        lines = [line for line in Path(figures["log"]).read_text(errors="replace").splitlines() if line.startswith("session ")]
        figures["yardstick_says"] = lines[-1] if lines else None
        return figures

    def day_dir(self, day: str) -> Path:
        return self.workdir / "data" / TABLE / day

    # servers ---------------------------------------------------------------------------------
    def connect_module(self):
        if self.connect is None:
            spec = self.args.connect_module
            if spec.endswith(".py"):
                loaded = importlib.util.spec_from_file_location("bench_connect_server", spec)
                module = importlib.util.module_from_spec(loaded)
                sys.modules["bench_connect_server"] = module  # dataclasses look their module up
                loaded.loader.exec_module(module)
                self.connect = module
            else:
                self.connect = importlib.import_module(spec)
        return self.connect

    def start_server(self, name: str):
        connect = self.connect_module()
        state_dir = self.workdir / "servers" / name
        if state_dir.exists():
            shutil.rmtree(state_dir)
        state_dir.mkdir(parents=True)
        self.servers.append(state_dir)
        conf = json.loads(self.args.server_conf) if self.args.server_conf else None
        started = time.perf_counter()
        handle = connect.start_server(free_port(), state_dir, conf=conf)
        seconds = time.perf_counter() - started
        pid = connect.jvm_pid(handle)
        log(f"Connect server '{name}' up at {handle.url} in {seconds:.1f}s (JVM pid {pid}, log {handle.log_path})")
        return handle, pid, round(seconds, 2)

    def stop_servers(self) -> None:
        if not self.servers:
            return
        connect = self.connect_module()
        for state_dir in self.servers:
            try:
                connect.stop_server(state_dir)
                log(f"stopped Connect server in {state_dir}")
            except Exception as error:  # noqa: BLE001 - try the others too
                log(f"WARNING: could not stop the Connect server in {state_dir}: {error}")
        self.servers.clear()

    # data ------------------------------------------------------------------------------------
    def generate(self) -> dict:
        if self.generated is None:
            rows = str(self.args.rows)
            command = [str(self.dagster.parent / "cdc-generate"), rows, rows, "5", "10", "0.2", "0.4", "0.4",
                       str(self.day_dir(DAY1)), str(self.day_dir(DAY2)), "--seed", str(self.args.seed)]
            if not Path(command[0]).exists():
                command[0] = shutil.which("cdc-generate") or "cdc-generate"
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise StepFailed(f"cdc-generate failed:\n{done.stderr[-3000:]}")
            summary = dict(re.findall(r"(\w+)=(\d+)", done.stdout))
            self.generated = {"seconds": round(time.perf_counter() - started, 2), **{k: int(v) for k, v in summary.items()}}
            bench_backfill.write_config(self.workdir / "configs" / TABLE, self.workdir / "data" / TABLE, table=TABLE, start=DAY1)
            log(f"generated {rows} + {rows} rows (--seed {self.args.seed}) in {self.generated['seconds']}s: {done.stdout.strip()}")
        return self.generated

    def range_data(self) -> list[str]:
        if getattr(self, "_range_dates", None) is None:
            started = time.perf_counter()
            root = self.workdir / "range_data"
            self._range_dates = bench_backfill.make_days(root, self.args.range_days, self.args.range_rows, self.args.range_seed)
            bench_backfill.write_config(self.workdir / "configs" / bench_backfill.TABLE, root)
            log(f"generated {self.args.range_days} dates of {self.args.range_rows} rows in {time.perf_counter() - started:.1f}s")
        return self._range_dates

    # checks ----------------------------------------------------------------------------------
    def expected_day2(self) -> dict:
        g = self.generated
        return {
            "current_table": {"I": g["inserted"], "U": g["updated"], "N": g["unchanged"]},
            "history_partition": {"I": g["inserted"], "U": g["updated"], "D": g["deleted"]},
        }

    @staticmethod
    def operation_counts(folder: Path) -> dict:
        rows = duckdb.sql(f"select operation, count(*) from read_parquet('{folder}/*.parquet') group by all").fetchall()
        return {op: n for op, n in sorted(rows)}

    def check_day2(self, label: str, root: Path, current: Path | None = None) -> dict:
        """Day-2 current_table I/U/N and history_partition I/U/D under ``root`` against the generator's counts;
        ``current``: a folder holding the day-2 state instead (an incremental table's, from cdc-current)."""
        expected = {name: {op: n for op, n in ops.items() if n} for name, ops in self.expected_day2().items()}
        folders = {name: root / name / f"business_date={DAY2}" for name in expected}
        if current is not None:
            folders["current_table"] = current
        found = {name: self.operation_counts(folder) for name, folder in folders.items()}
        if found != expected:
            raise OutputsWrong(f"{label}: day-2 counts {found}, expected {expected}")
        return found

    # measurements ----------------------------------------------------------------------------
    def measure_a(self, result: dict) -> None:
        self.generate()
        out = self.workdir / "runs" / "a_yardstick" / "warehouse"
        shutil.rmtree(out.parent, ignore_errors=True)
        result["day1"] = self.yardstick("a_yardstick_day1", DAY1, out, self.base_env)
        log(f"(a) yardstick day 1, cold: {describe(result['day1'])}")
        result["day2"] = day2 = self.yardstick("a_yardstick_day2", DAY2, out, self.base_env)
        result["seconds"] = day2["seconds"]
        log(f"(a) yardstick day 2, cold: {describe(day2)}")
        result["day2_counts"] = self.check_day2("(a) yardstick", out)

    def measure_b(self, result: dict, incremental: bool = False) -> None:
        self.generate()
        label, name = ("(b, incremental)", "b_incremental") if incremental else ("(b)", "b_cold")
        configs = self.workdir / "configs" / TABLE
        if incremental:
            configs = self.workdir / "configs" / f"{TABLE}_incremental"
            configs.mkdir(parents=True, exist_ok=True)
            (configs / f"{TABLE}.yaml").write_text((self.workdir / "configs" / TABLE / f"{TABLE}.yaml").read_text() + INCREMENTAL)
        env = self.run_env(name, configs)
        result["day1"] = self.materialize(f"{name}_day1", env, TABLE, "--partition", DAY1)
        log(f"{label} pipeline day 1, cold CLI: {describe(result['day1'])}")
        result["day2"] = day2 = self.materialize(f"{name}_day2", env, TABLE, "--partition", DAY2)
        result.update(seconds=day2["seconds"], jvm_peak_rss_mib=day2["jvm_peak_rss_mib"])
        log(f"{label} pipeline day 2, cold CLI: {describe(day2)}")
        stored = Path(env["CDC_WAREHOUSE"]) / TABLE
        result["day2_bytes"] = asset_partition_bytes(stored.parent, stored.name, DAY2)
        log(f"{label} day-2 partitions (MiB): " + ", ".join(f"{k} {mib(v)}" for k, v in result["day2_bytes"].items()))
        if incremental:
            # Day 2 stores its changes: the state as of day 2 is read back through cdc-current.
            result["day2_counts"] = self.check_day2(label, stored, current=self.current_as_of(env, TABLE, DAY2))
        else:
            result["day2_counts"] = self.check_day2(label, stored)

    def current_as_of(self, env: dict, table: str, day: str) -> Path:
        """``cdc-current TABLE --as-of DAY`` into a folder of the run's own: the state as a snapshot holds it."""
        out = Path(env["CDC_WAREHOUSE"]).parent / f"cdc_current_{table}_{day}"
        shutil.rmtree(out, ignore_errors=True)
        done = subprocess.run([str(self.dagster.parent / "cdc-current"), table, "--as-of", day, "--out", str(out)],
                              env=env, capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0:
            raise StepFailed(f"cdc-current {table} --as-of {day} failed:\n{done.stderr[-3000:]}")
        return out

    def measure_c(self, result: dict) -> None:
        self.generate()
        try:
            handle, pid, start_seconds = self.start_server("c")
            result.update(server_url=handle.url, server_start_seconds=start_seconds, server_log=str(handle.log_path))
            env = self.run_env("c_warm", self.workdir / "configs" / TABLE, remote=handle.url)
            result["day1"] = self.materialize("c_warm_day1", env, TABLE, "--partition", DAY1, server=pid)
            log(f"(c) pipeline day 1 on the Connect server (server cold): {describe(result['day1'])}")
            result["day2"] = day2 = self.materialize("c_warm_day2", env, TABLE, "--partition", DAY2, server=pid)
            result.update(seconds=day2["seconds"], server_jvm_peak_rss_mib=mib(vm_hwm(pid)))
            log(f"(c) pipeline day 2 on the warm Connect server: {describe(day2)}; "
                f"server JVM peak RSS (VmHWM) {gib(result['server_jvm_peak_rss_mib'])} GiB")
            result["day2_counts"] = self.check_day2("(c) pipeline", Path(env["CDC_WAREHOUSE"]) / TABLE)
            # Reference: the yardstick on the same warm server. Absolute paths: the server resolves them.
            out = (self.workdir / "runs" / "c_yardstick_warm" / "warehouse").resolve()
            shutil.rmtree(out.parent, ignore_errors=True)
            yenv = {**self.base_env, "SPARK_REMOTE": handle.url}
            result["yardstick_warm"] = y = {}
            y["day1"] = self.yardstick("c_yardstick_warm_day1", DAY1, out, yenv, server=pid)
            log(f"yardstick day 1 on the same server: {describe(y['day1'])}")
            y["day2"] = self.yardstick("c_yardstick_warm_day2", DAY2, out, yenv, server=pid)
            y.update(seconds=y["day2"]["seconds"], server_jvm_peak_rss_mib_after=mib(vm_hwm(pid)))
            log(f"yardstick day 2 on the same warm server: {describe(y['day2'])}; "
                f"server JVM peak RSS now {gib(y['server_jvm_peak_rss_mib_after'])} GiB")
            y["day2_counts"] = self.check_day2("yardstick on the warm server", out)
        finally:
            self.stop_servers()

    def changeset_data(self) -> dict:
        """Day 1: the synthetic day-1 rows as insert records; day 2: ``--changeset-records`` records."""
        if getattr(self, "_changeset_data", None) is None:
            self._changeset_data = self._make_changeset_data()
        return self._changeset_data

    def _make_changeset_data(self) -> dict:
        self.generate()
        root = self.workdir / "data" / CHANGESET_TABLE
        shutil.rmtree(root, ignore_errors=True)
        started = time.perf_counter()
        keys = [f"key_{i}" for i in range(1, 6)]
        non_keys = [f"nonkey_{i}" for i in range(1, 11)]
        columns = ", ".join(keys + non_keys)
        on = " AND ".join(f"d1.{k} = d2.{k}" for k in keys)
        differs = " OR ".join(f"d1.{c} <> d2.{c}" for c in non_keys)
        counts = {op: int(self.args.changeset_records * share) for op, share in CHANGESET_MIX.items()}
        db = duckdb.connect()
        db.sql(f"CREATE TABLE d1 AS SELECT * FROM read_csv('{self.day_dir(DAY1)}/*.csv', header=true, all_varchar=true)")
        db.sql(f"CREATE TABLE d2 AS SELECT * FROM read_csv('{self.day_dir(DAY2)}/*.csv', header=true, all_varchar=true)")
        for day in (DAY1, DAY2):
            (root / day).mkdir(parents=True)
        db.sql(f"COPY (SELECT 'I' AS op, {columns}, 1::BIGINT AS seq FROM d1) TO '{root / DAY1 / 'changes.csv'}' (HEADER)")
        d2_columns = ", ".join(f"d2.{c}" for c in keys + non_keys)
        d1_columns = ", ".join(f"d1.{c}" for c in keys + non_keys)
        db.sql(
            f"""COPY (
              (SELECT 'U' AS op, {d2_columns}, 2::BIGINT AS seq FROM d2 JOIN d1 ON {on} WHERE {differs} LIMIT {counts['U']})
              UNION ALL (SELECT 'U', {d2_columns}, 2 FROM d2 JOIN d1 ON {on} WHERE NOT ({differs}) LIMIT {counts['N']})
              UNION ALL (SELECT 'I', {d2_columns}, 2 FROM d2 ANTI JOIN d1 ON {on} LIMIT {counts['I']})
              UNION ALL (SELECT 'D', {d1_columns}, 2 FROM d1 ANTI JOIN d2 ON {on} LIMIT {counts['D']})
            ) TO '{root / DAY2 / 'changes.csv'}' (HEADER)"""
        )
        configs = self.workdir / "configs" / CHANGESET_TABLE
        configs.mkdir(parents=True, exist_ok=True)
        keys_yaml = "\n".join(f"  - {{name: {k}, type: string}}" for k in keys)
        non_keys_yaml = "\n".join(f"  - {{name: {c}, type: double}}" for c in non_keys)
        (configs / f"{CHANGESET_TABLE}.yaml").write_text(
            f"name: {CHANGESET_TABLE}\nstart_date: '{DAY1}'\nload_type: changeset\n"
            f"source:\n  path: {root}/{{date}}/\n  format: csv\n"
            f"keys:\n{keys_yaml}\nnon_keys:\n{non_keys_yaml}\n"
            "untracked_columns:\n  - {name: seq, type: bigint}\n"
            "changes:\n  operation_column: op\n  sequence_columns: [seq]\n"
        )
        rows = db.sql("SELECT count(*) FROM d1").fetchall()[0][0]
        log(f"changeset data: {rows} insert records, then {sum(counts.values())} change records, in {time.perf_counter() - started:.1f}s")
        expected = {"I": counts["I"], "U": counts["U"], "N": counts["N"], "X": rows - counts["U"] - counts["N"] - counts["D"]}
        return {"configs": configs, "day1_records": rows, "day2_records": sum(counts.values()), "expected_current": expected,
                "expected_history": {"I": counts["I"], "U": counts["U"], "D": counts["D"]}}

    def measure_changeset(self, result: dict, incremental: bool = False) -> None:
        data = self.changeset_data()
        configs, name = data["configs"], "changeset_incremental" if incremental else "changeset"
        if incremental:
            configs = configs.parent / f"{CHANGESET_TABLE}_incremental"
            configs.mkdir(parents=True, exist_ok=True)
            (configs / f"{CHANGESET_TABLE}.yaml").write_text((data["configs"] / f"{CHANGESET_TABLE}.yaml").read_text() + INCREMENTAL)
        env = self.run_env(f"{name}_cold", configs)
        result["day1"] = self.materialize(f"{name}_day1", env, CHANGESET_TABLE, "--partition", DAY1)
        log(f"{name} day 1 ({data['day1_records']:,} insert records), cold CLI: {describe(result['day1'])}")
        result["day2"] = day2 = self.materialize(f"{name}_day2", env, CHANGESET_TABLE, "--partition", DAY2)
        result.update(seconds=day2["seconds"], day2_records=data["day2_records"], current_rows=data["day1_records"])
        log(f"{name} day 2 ({data['day2_records']:,} change records on {data['day1_records']:,} rows), cold CLI: {describe(day2)}")
        stored = Path(env["CDC_WAREHOUSE"]) / CHANGESET_TABLE
        result["day2_bytes"] = asset_partition_bytes(stored.parent, stored.name, DAY2)
        log(f"{name} day-2 partitions (MiB): " + ", ".join(f"{k} {mib(v)}" for k, v in result["day2_bytes"].items()))
        folders = {"current_table": stored / "current_table" / f"business_date={DAY2}",
                   "history_partition": stored / "history_partition" / f"business_date={DAY2}"}
        if incremental:
            folders["current_table"] = self.current_as_of(env, CHANGESET_TABLE, DAY2)
        found = {name: self.operation_counts(folder) for name, folder in folders.items()}
        expected = {"current_table": data["expected_current"], "history_partition": data["expected_history"]}
        result["day2_counts"] = found
        if found != expected:
            raise OutputsWrong(f"changeset: day-2 counts {found}, expected {expected}")

    def measure_range(self, result: dict, warm: bool) -> None:
        dates = self.range_data()
        table = bench_backfill.TABLE
        configs = self.workdir / "configs" / table
        label = "range-warm" if warm else "range-cold"
        result.update(dates=len(dates), rows_per_date=self.args.range_rows)
        remote = pid = None
        try:
            if warm:
                handle, pid, start_seconds = self.start_server("range")
                remote = handle.url
                result.update(server_url=remote, server_start_seconds=start_seconds, server_log=str(handle.log_path))
            single_env = self.run_env(f"{label}_single", configs, remote)
            result["single_runs"] = singles = []
            for index, day in enumerate(dates, start=1):
                singles.append(self.materialize(f"{label}_single_{day}", single_env, table, "--partition", day, server=pid))
                log(f"{label}: one-date run {index}/{len(dates)} ({day}): {describe(singles[-1])}")
            range_env = self.run_env(f"{label}_one_run", configs, remote)
            result["one_run"] = one_run = self.materialize(
                f"{label}_one_run", range_env, table, "--partition-range", f"{dates[0]}...{dates[-1]}", server=pid
            )
            seconds = [run["seconds"] for run in singles]
            single = sum(seconds[1:]) / len(seconds[1:])  # date 1 has no previous state to join
            result.update(
                single_date_seconds=seconds,
                single_seconds=round(single, 2),
                single_seconds_all_dates=round(sum(seconds) / len(seconds), 2),
                single_other_processes_avg_cores=round(sum(r["other_processes_avg_cores"] for r in singles[1:]) / len(singles[1:]), 2),
                one_run_seconds=one_run["seconds"],
                ratio=round(one_run["seconds"] / single, 2),
            )
            if warm:
                result["server_jvm_peak_rss_mib"] = mib(vm_hwm(pid))
            log(f"{label}: one run {dates[0]}...{dates[-1]}: {describe(one_run)}; "
                f"single date (mean of dates 2..{len(dates)}) {single:.1f}s; ratio {result['ratio']:.2f}")
            same = bench_backfill.counts(Path(single_env["CDC_WAREHOUSE"])) == bench_backfill.counts(Path(range_env["CDC_WAREHOUSE"]))
            result["outputs_identical"] = same
            if not same:
                raise OutputsWrong(f"{label}: the one-run range wrote other counts than the one-date runs")
        finally:
            if warm:
                self.stop_servers()

    def run(self, selected: list[str]) -> None:
        steps = {
            "a": self.measure_a,
            "b": self.measure_b,
            "c": self.measure_c,
            "range-cold": lambda result: self.measure_range(result, warm=False),
            "range-warm": lambda result: self.measure_range(result, warm=True),
            "changeset": self.measure_changeset,
            "b-incremental": lambda result: self.measure_b(result, incremental=True),
            "changeset-incremental": lambda result: self.measure_changeset(result, incremental=True),
        }
        for name in selected:
            log(f"--- {name} ---")
            started = time.perf_counter()
            result: dict = {}
            try:
                steps[name](result)
                self.results["measurements"][name] = result
            except OutputsWrong as error:  # the figures stand; the outputs do not
                self.results["measurements"][name] = result
                self.results["errors"][name] = {"kind": "outputs", "message": str(error)}
                log(f"{name} WRONG OUTPUTS: {error}")
            except Exception as error:  # noqa: BLE001 - report it, keep what was measured, measure the rest
                message = str(error) if isinstance(error, StepFailed) else traceback.format_exc()
                self.results["errors"][name] = {"kind": "failed", "message": message, "partial": result}
                log(f"{name} FAILED: {message}")
            log(f"--- {name} done in {time.perf_counter() - started:.0f}s ---")


def stored_mib(measured: dict | None) -> float | None:
    return mib(sum(measured["day2_bytes"].values())) if measured and "day2_bytes" in measured else None


def describe(figures: dict) -> str:
    """One run's figures for a progress line."""
    text = f"{figures['seconds']:.1f}s"
    extra = []
    if figures.get("jvm_peak_rss_mib"):
        extra.append(f"JVM peak RSS {gib(figures['jvm_peak_rss_mib'])} GiB")
    if figures.get("yardstick_says"):
        extra.append(f"yardstick: {figures['yardstick_says']}")
    extra.append(f"CPU {figures['own_cpu_seconds']}s, other processes {figures['other_processes_avg_cores']} cores")
    return f"{text} ({'; '.join(extra)})"


# -- summary ------------------------------------------------------------------------------------
def verdict(value: float | None, target: float, acceptable: float | None = None) -> str:
    if value is None:
        return "-"
    if value <= target:
        return "MET"
    if acceptable is not None and value <= acceptable:
        return f"met (<= {acceptable})"
    return "NOT MET"


def summarise(results: dict) -> list[dict]:
    """The table's rows; also stored in the JSON. ``other`` = other processes' average busy cores during that run."""
    m = results["measurements"]
    a, b, c = m.get("a"), m.get("b"), m.get("c")
    rows: list[dict] = []

    def row(what, run=None, seconds=None, value=None, target=None, met=None, note=""):
        if run is not None:
            seconds = run["seconds"]
        other = run.get("other_processes_avg_cores") if run else None
        rows.append({"what": what, "seconds": seconds, "other": other, "value": value, "target": target, "met": met, "note": note})

    def ratio(figure: dict, label: str, target: float, text: str) -> None:
        if a:
            value = figure["seconds"] / a["seconds"]
            row(f"    {label}", value=round(value, 2), target=text, met=verdict(value, target))
        else:
            row(f"    {label}", target=text, met="-", note="needs a (--only a,...)")

    if a:
        row("(a) yardstick day 1, cold process", a["day1"])
        row("(a) yardstick day 2, cold process", a["day2"], note=f"JVM peak RSS {gib(a['day2']['jvm_peak_rss_mib'])} GiB")
    if b:
        row("(b) pipeline day 1, cold CLI", b["day1"], note=f"JVM peak RSS {gib(b['day1']['jvm_peak_rss_mib'])} GiB")
        row("(b) pipeline day 2, cold CLI", b["day2"])
        ratio(b, "b/a", TARGETS["b/a"], "<= 1.0")
        row("    JVM peak RSS day 2, GiB (VmHWM)", value=gib(b["jvm_peak_rss_mib"]), note="no target")
    if c and "day2" in c:
        row("(c) pipeline day 1, Connect server cold", c["day1"], note=f"server start {c['server_start_seconds']} s, not counted")
        row("(c) pipeline day 2, Connect server warm", c["day2"])
        ratio(c, "c/a", TARGETS["c/a"], "<= 0.7")
        rss = gib(c["server_jvm_peak_rss_mib"])
        row("    server JVM peak RSS, GiB (VmHWM)", value=rss, target="<= 3", met=verdict(rss, TARGETS["server_rss_gib"]),
            note="server start + (c) day 1 + day 2")
        y = c.get("yardstick_warm", {})
        if "day2" in y:
            row("(c') yardstick day 2 on the same warm server", y["day2"], value=round(c["seconds"] / y["seconds"], 2),
                note=f"value = c / c'; reference, no target; day 1 {y['day1']['seconds']} s")
    for name, target, acceptable in (("range-cold", TARGETS["range_cold"], TARGETS["range_cold_acceptable"]),
                                     ("range-warm", TARGETS["range_warm"], None)):
        r = m.get(name)
        if not r or "ratio" not in r:
            continue
        row(f"{name}: one-date run (mean of dates 2..{r['dates']})", seconds=r["single_seconds"],
            note=f"{r['rows_per_date']:,} rows/date; all {r['dates']} dates: {r['single_seconds_all_dates']} s")
        rows[-1]["other"] = r["single_other_processes_avg_cores"]
        row(f"{name}: one run of {r['dates']} dates", r["one_run"])
        row("    range / single", value=r["ratio"], target=f"<= {target}" + (f" (<= {acceptable})" if acceptable else ""),
            met=verdict(r["ratio"], target, acceptable), note="outputs identical" if r.get("outputs_identical") else "OUTPUTS DIFFER")
        if "server_jvm_peak_rss_mib" in r:
            row("    server JVM peak RSS, GiB (VmHWM)", value=gib(r["server_jvm_peak_rss_mib"]), note="no target")
    cs = m.get("changeset")
    if cs and "day2" in cs:
        row(f"changeset day 2: {cs['day2_records']:,} records on {cs['current_rows']:,} rows, cold CLI", cs["day2"])
        if b:
            row("    changeset day 2 / full load day 2 (b)", value=round(cs["seconds"] / b["seconds"], 2), note="no target")
        else:
            row("    changeset day 2 / full load day 2 (b)", note="needs b (--only b,changeset)")
    bi, csi = m.get("b-incremental"), m.get("changeset-incremental")
    if bi and "day2" in bi:
        row("(b, incremental) pipeline day 2, cold CLI", bi["day2"], note=f"wrote {stored_mib(bi)} MiB; (b) wrote {stored_mib(b)} MiB")
        if b:
            value = bi["seconds"] / b["seconds"]
            row("    b-incremental / b", value=round(value, 2), target="<= 1.0", met=verdict(value, TARGETS["b_incremental/b"]))
        else:
            row("    b-incremental / b", note="needs b (--only b,b-incremental)")
    if csi and "day2" in csi:
        row(f"changeset day 2, incremental: {csi['day2_records']:,} records on {csi['current_rows']:,} rows, cold CLI", csi["day2"],
            note=f"wrote {stored_mib(csi)} MiB" + (f"; snapshot changeset wrote {stored_mib(cs)} MiB" if cs else ""))
        if b:
            value = csi["seconds"] / b["seconds"]
            row("    changeset-incremental day 2 / full load day 2 (b)", value=round(value, 2), target="<= 0.15",
                met=verdict(value, TARGETS["changeset_incremental/b"]))
        else:
            row("    changeset-incremental day 2 / (b)", note="needs b (--only b,changeset-incremental)")
    for name, error in results["errors"].items():
        row(f"{name}: {'WRONG OUTPUTS' if error['kind'] == 'outputs' else 'FAILED'}", note=error["message"].strip().splitlines()[0][:120])
    if results.get("interrupted"):
        row("INTERRUPTED", note="the measurements after the last one shown did not run")
    return rows


def print_table(results: dict) -> None:
    rows = results["summary"]
    fmt = lambda v: "" if v is None else (f"{v:,.2f}" if isinstance(v, float) else str(v))  # noqa: E731
    width = max((len(r["what"]) for r in rows), default=10)
    head = f"{'':<{width}}  {'seconds':>9}  {'other':>5}  {'value':>6}  {'target':<14} {'verdict':<15} note"
    print("\n" + "=" * len(head))
    print(f"PERFORMANCE TARGETS (issues 10, 11)  rows/day={results['rows']:,}  range={results['range_days']}x{results['range_rows']:,}  "
          f"at {results.get('git_commit', '?')}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s")
    print(head)
    for r in rows:
        print(f"{r['what']:<{width}}  {fmt(r['seconds']):>9}  {fmt(r['other']):>5}  {fmt(r['value']):>6}  "
              f"{r['target'] or '':<14} {r['met'] or '':<15} {r['note']}")
    print("seconds: wall seconds of one fresh process (CLI or yardstick) unless warm; other: average cores that other")
    print("processes kept busy meanwhile (on 2 cores, above ~0.2 the seconds are not comparable with an idle run)")
    print("=" * len(head), flush=True)


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per day for a, b, c (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=7, help="cdc-generate --seed (default 7, as the yardstick's figures)")
    parser.add_argument("--range-days", type=int, default=10, help="dates in the range measurements (default 10)")
    parser.add_argument("--range-rows", type=int, default=10_000, help="rows per date in the range measurements (default 10,000)")
    parser.add_argument("--range-seed", type=int, default=3, help="seed of the range data (default 3, as bench_backfill.py)")
    parser.add_argument("--changeset-records", type=int, default=100_000,
                        help="records in the changeset measurement's day-2 change set (default 100,000; day 1 = --rows inserts)")
    parser.add_argument("--workdir", help="default: a fresh temp dir, deleted at the end unless --keep")
    parser.add_argument("--keep", action="store_true", help="keep the temp workdir (data, warehouses, logs)")
    parser.add_argument("--skip-warm", action="store_true", help="no Connect server: skip c and range-warm")
    parser.add_argument("--skip-range", action="store_true", help="skip range-cold and range-warm")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(MEASUREMENTS)} ('range' = both range ones)")
    parser.add_argument("--yardstick", type=Path, default=DEFAULT_YARDSTICK, help=f"plain_cdc.py (default {DEFAULT_YARDSTICK})")
    parser.add_argument("--server-conf", help="JSON object of Spark conf for the Connect servers (default: connect_server's own)")
    parser.add_argument("--connect-module", default="cdc_assets.services.connect_server",
                        help="module (dotted name or .py path) with start_server/stop_server/jvm_pid")
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"), help="'' to skip the copy")
    args = parser.parse_args(argv)
    if args.rows < 10 or args.range_rows < 100 or args.range_days < 2:
        parser.error("need --rows >= 10, --range-rows >= 100 and --range-days >= 2")
    if args.only:
        wanted = set()
        for name in (n.strip().replace("_", "-") for n in args.only.split(",") if n.strip()):
            if name == "range":
                wanted |= RANGE
            elif name in MEASUREMENTS:
                wanted.add(name)
            else:
                parser.error(f"--only: unknown measurement {name!r}; choose from {', '.join(MEASUREMENTS)}, range")
    else:
        wanted = set(MEASUREMENTS)
    if args.skip_warm:
        wanted -= WARM
    if args.skip_range:
        wanted -= RANGE
    args.selected = [name for name in MEASUREMENTS if name in wanted]
    if not args.selected:
        parser.error("nothing left to measure")
    if {"a", "c"} & wanted and not args.yardstick.exists():
        parser.error(f"yardstick not found: {args.yardstick} (use --yardstick PATH)")
    args.yardstick = args.yardstick.resolve()
    return args


def prepare_workdir(requested: str | None) -> tuple[Path, bool]:
    if requested is None:
        workdir = Path(tempfile.mkdtemp(prefix="cdc_targets_"))
        (workdir / MARKER).touch()
        return workdir, True
    workdir = Path(requested).resolve()
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / MARKER).exists():
            sys.exit(f"--workdir {workdir} is not empty and was not made by this script; pick another folder")
        for name in ("data", "range_data", "configs", "runs", "servers", "logs", "results.json"):
            target = workdir / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).touch()
    return workdir, False


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if done.returncode == 0 else "?"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum, frame):
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    workdir, is_temp = prepare_workdir(args.workdir)
    bench = Bench(args, workdir)
    results = bench.results
    results.update(
        started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        git_commit=git_commit(),
        rows=args.rows,
        seed=args.seed,
        range_days=args.range_days,
        range_rows=args.range_rows,
        selected=args.selected,
        yardstick=str(args.yardstick),
        workdir=str(workdir),
        targets=TARGETS,
        machine={
            "cpus": psutil.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / GIB, 1),
            "python": platform.python_version(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        spark_env={k: os.environ[k] for k in ("CDC_SPARK_CONF", "CDC_SPARK_MASTER") if k in os.environ},
    )
    log(f"workdir {workdir}; measuring {', '.join(args.selected)}; load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    interrupted = False
    try:
        bench.run(args.selected)
    except (KeyboardInterrupt, Interrupted):
        interrupted = results["interrupted"] = True
        log("interrupted: stopping servers and children")
    finally:
        bench.stop_servers()
        results["total_seconds"] = round(time.perf_counter() - started, 1)
        results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if bench.generated:
            results["generation"] = bench.generated
        results["summary"] = summarise(results)
        print_table(results)
        tail = ("summary", "errors", "measurements")  # the setting first, the details last
        ordered = {**{k: v for k, v in results.items() if k not in tail}, **{k: results[k] for k in tail}}
        text = json.dumps(ordered, indent=2, default=str) + "\n"
        if not (is_temp and not args.keep):
            (workdir / "results.json").write_text(text)
        if args.results_dir:
            folder = Path(args.results_dir)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"bench_targets_{args.rows}rows_{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
            path.write_text(text)
            log(f"results written to {path}")
        if is_temp and not args.keep:
            if results["errors"]:  # keep the runs' logs, which the error messages name
                for entry in workdir.iterdir():
                    if entry.name != "logs":
                        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                log(f"removed {workdir} except its logs/ (pass --keep to keep all)")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
                log(f"removed {workdir} (pass --keep to keep it)")
        log(f"total {results['total_seconds']:.0f}s")
    if interrupted:
        return 130
    errors = results["errors"].values()
    if any(e["kind"] == "failed" for e in errors):
        return 1
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
