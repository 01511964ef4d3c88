"""The benchmark harness: how every scenario runs, measures and reports (benchmarks/README.md).

A run is a command in a fresh process group (the ``dagster`` CLI, the yardstick, a daemon), as a user starts
it: timed, its Spark JVM's peak RSS sampled (``VmHWM``, the kernel's high-water mark, so a spike between two
samples still counts), its output in ``<workdir>/logs/``, killed with its group on failure, Ctrl-C or SIGTERM.
A scenario module measures into :class:`Bench`; :func:`run` prints its table, writes the results as JSON to
``benchmarks/results/`` and sets the exit status: 0 all ran and checked out, 1 a run failed, 2 outputs were
wrong (or a limit was not held), 130 interrupted.
"""

from __future__ import annotations

import json
import os
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

import psutil

from benchmarks.eventlog import conf_env as eventlog_conf, describe as describe_eventlog, read as read_eventlog
from cdc_assets.engines.process import free_port, stop_group

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# Where a clone finds the yardstick: beside the repository, as the machine's shared folder holds it.
YARDSTICK = REPO.parent / "shared" / "bench" / "plain_cdc.py"
GIB, MIB = 2**30, 2**20
# Set per run by the harness: the caller's own values would point a run at another instance, warehouse or
# server (a running `make spark-server` would turn a cold run warm).
RUN_ENV = ("SPARK_REMOTE", "DAGSTER_HOME", "CDC_WAREHOUSE", "CDC_TABLE_CONFIGS", "CDC_SPARK", "CDC_SPARK_SERVER_DIR",
           "CDC_SPARK_SERVER_OWNER", "SPARK_CONNECT_PORT")
KEEP_ON_ERROR = ("logs", "eventlogs", "phases", "servers")  # what a failed run's messages point at


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


class StepFailed(Exception):
    """A run exited non-zero, or data could not be made: the measurement has no figure."""


class OutputsWrong(Exception):
    """The runs finished but their outputs (or a limit) are wrong: the figures stand, the outputs do not."""


class Interrupted(BaseException):
    """SIGTERM, raised so that the same clean-up runs as for Ctrl-C (and no ``except Exception`` swallows it)."""


def mib(n: float | None) -> float | None:
    return None if n is None else round(n / MIB, 1)


def gib(n: float | None) -> float | None:
    return None if n is None else round(n / GIB, 2)


def describe(figures: dict) -> str:
    """A run's progress line: wall seconds, its JVM's peak RSS, CPU, and the machine's other load."""
    rss = f", JVM peak RSS {figures['jvm_peak_rss_mib'] / 1024:.2f} GiB" if figures.get("jvm_peak_rss_mib") else ""
    return (f"{figures['seconds']:.1f}s{rss}, CPU {figures['own_cpu_seconds']}s, other processes "
            f"{figures['other_processes_avg_cores']} cores" + (f"; yardstick: {figures['yardstick_says']}" if figures.get("yardstick_says") else "")
            + (f"; {describe_eventlog(figures['eventlog'])}" if "eventlog" in figures else ""))


def tool(name: str) -> str:
    """A console script beside the running interpreter (the project's .venv/bin under make), else the PATH's."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else (shutil.which(name) or name)


# -- processes -------------------------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a live process in bytes; {} once it has gone."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found


def machine_busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def is_spark_jvm(proc: psutil.Process) -> bool:
    # spark-submit first runs a short-lived launcher JVM; it is not the one doing the work.
    return "java" in proc.name().lower() and "org.apache.spark.launcher.Main" not in " ".join(proc.cmdline())


class TreeSampler(threading.Thread):
    """Samples a process tree: its Spark JVMs' peak RSS (VmHWM), how many ran at once and their summed RSS,
    the tree's CPU seconds and the cores the rest of the machine kept busy meanwhile.

    The tree is walked only while no JVM of it is alive, unless ``rewalk`` (a daemon starts a JVM per run):
    reading a few /proc files per sample costs next to nothing, walking every process does not. ``server``:
    a Connect server's JVM working for the tree, whose CPU from now on counts as the tree's.
    """

    def __init__(self, root: int, interval: float = 0.2, rewalk: bool = False, server: int | None = None):
        super().__init__(name=f"sampler-{root}", daemon=True)
        self.root, self.interval, self.rewalk, self.server = root, interval, rewalk, server
        self.jvm_peaks: dict[int, int] = {}
        self.peak_jvms = self.peak_jvm_rss = 0
        self._live: set[int] = set()
        self._procs: dict[int, psutil.Process] = {}
        self._cpu0: dict[int, float] = {}
        self._cpu: dict[int, float] = {}  # CPU seconds since tracked, as last seen (a process that ended keeps its figure)
        self._halt = threading.Event()
        self._busy0, self._t0 = machine_busy_seconds(), time.perf_counter()
        self._track(root, from_now=False)
        if server:
            self._track(server, from_now=True)  # long-lived: only what it does from now on

    def _track(self, pid: int, from_now: bool) -> None:
        if pid not in self._procs:
            try:
                proc = psutil.Process(pid)
                self._cpu0[pid] = cpu_seconds(proc) if from_now else 0.0
                self._procs[pid] = proc
            except psutil.Error:
                pass

    def sample(self) -> None:
        if self.rewalk or not any(psutil.pid_exists(pid) for pid in self._live):
            try:
                children = psutil.Process(self.root).children(recursive=True)
            except psutil.Error:
                children = []
            self._live = set()
            for child in children:
                try:
                    self._track(child.pid, from_now=False)
                    if is_spark_jvm(child):
                        self._live.add(child.pid)
                except psutil.Error:
                    pass
        jvms = rss = 0
        for pid in self._live:
            status = proc_status(pid)
            if "VmRSS" in status:
                jvms, rss = jvms + 1, rss + status["VmRSS"]
                self.jvm_peaks[pid] = max(self.jvm_peaks.get(pid, 0), status.get("VmHWM", 0))
        self.peak_jvms, self.peak_jvm_rss = max(self.peak_jvms, jvms), max(self.peak_jvm_rss, rss)
        for pid, proc in self._procs.items():
            try:
                self._cpu[pid] = cpu_seconds(proc) - self._cpu0[pid]
            except psutil.Error:
                pass

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> dict:
        if not self._halt.is_set():
            self._halt.set()
            self.join()
        wall = time.perf_counter() - self._t0
        own = sum(self._cpu.values())
        jvm = sum(v for pid, v in self._cpu.items() if pid in self.jvm_peaks or pid == self.server)
        return {
            "jvm_peak_rss_mib": mib(max(self.jvm_peaks.values(), default=0)),
            "own_cpu_seconds": round(own, 1),
            "jvm_cpu_seconds": round(jvm, 1),
            "other_processes_avg_cores": round(max(machine_busy_seconds() - self._busy0 - own, 0.0) / wall, 2) if wall else 0.0,
            "peak_spark_jvms": self.peak_jvms,
            "peak_spark_jvm_rss_gib": gib(self.peak_jvm_rss),
        }


def end_all(procs: list[psutil.Process], grace: float = 10.0) -> None:
    """SIGTERM to each, SIGKILL to those still alive after ``grace`` seconds."""
    for proc in procs:
        try:
            proc.kill() if grace == 0 else proc.terminate()
        except psutil.Error:
            pass
    for proc in psutil.wait_procs(procs, timeout=grace)[1] if grace else []:
        try:
            proc.kill()
        except psutil.Error:
            pass


class Child:
    """A command in a process group of its own, its output in ``logs/<name>.log``, its tree sampled."""

    def __init__(self, name: str, command: list, env: dict, logs: Path, cwd: Path = REPO, **sampler):
        logs.mkdir(parents=True, exist_ok=True)
        self.name, self.log_path = name, logs / f"{name}.log"
        self._out = open(self.log_path, "wb")
        self._out.write(("$ " + " ".join(map(str, command)) + "\n").encode())
        self._out.flush()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([str(c) for c in command], cwd=cwd, env=env, stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.sampler = TreeSampler(self.proc.pid, **sampler)
        self.sampler.start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, kill: bool = True) -> dict:
        """The sampler's figures; with ``kill``, the whole group (daemon, code servers, runs) is stopped too."""
        figures = self.sampler.stop()
        if kill:
            try:  # a run worker may leave the group; it is still in the tree until its parent dies
                tree = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.Error:
                tree = []
            stop_group(self.proc.pid, grace=10)
            self.proc.poll()  # reap the leader
            end_all(tree, grace=0)
        self._out.close()
        return figures


def run_process(name: str, command: list, env: dict, logs: Path, cwd: Path = REPO, server: int | None = None,
                check: bool = True, timed: bool = False) -> dict:
    """Run ``command`` to its end as a fresh process: wall seconds, its JVM's peak RSS, CPU, the log's path, its
    exit status; with ``timed``, ``lines``: each line of output with the seconds since the start at which it
    appeared (a Python command must not buffer it: PYTHONUNBUFFERED). With ``check``, a
    non-zero exit raises StepFailed. A run that ended is left alone: its JVM may still be closing its event log.
    Interrupted, the group is killed."""
    child, lines = Child(name, command, env, logs, cwd, server=server), []
    try:
        if timed:
            ended, lines = _lines_as_they_come(child)
        else:
            child.proc.wait()
            ended = time.perf_counter()
        seconds = ended - child.started
    finally:
        figures = child.stop(kill=child.alive())
    if check and child.proc.returncode != 0:
        raise StepFailed(f"{name} exited with {child.proc.returncode} after {seconds:.1f}s; log {child.log_path}:\n{child.tail()}")
    return {"seconds": round(seconds, 2), **figures, "log": str(child.log_path), "returncode": child.proc.returncode,
            "started_epoch": round(time.time() - seconds, 2), **({"lines": lines} if timed else {})}


def _lines_as_they_come(child: Child) -> tuple[float, list[tuple[float, str]]]:
    """Follow the child's log until it exits: when it did, and each line with the seconds since its start at
    which it appeared (within 0.1 s)."""
    lines: list[tuple[float, str]] = []
    pending = ""
    with open(child.log_path, errors="replace") as output:
        while True:
            done, now = not child.alive(), time.perf_counter()
            pending += output.read()
            *complete, pending = pending.split("\n")
            at = round(now - child.started, 2)
            lines += [(at, line) for line in complete] + ([(at, pending)] if done and pending else [])
            if done:
                return now, lines
            time.sleep(0.1)


def cold_env() -> dict:
    """The caller's environment (their CDC_SPARK_CONF, CDC_SPARK_MASTER...) without RUN_ENV, and a JVM of the run's own."""
    return {**{k: v for k, v in os.environ.items() if k not in RUN_ENV}, "CDC_SPARK": "local"}


def run_env(base: Path, configs: Path, remote: str | None = None, fresh: bool = True) -> dict:
    """A DAGSTER_HOME (the project's dagster.yaml) and a warehouse under ``base``, made afresh unless ``fresh`` is False."""
    home = base / "dagster_home"
    if fresh:  # only these two: the data and configs may live under ``base`` too
        for folder in (home, base / "warehouse"):
            shutil.rmtree(folder, ignore_errors=True)
        home.mkdir(parents=True)
        shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    env = {**cold_env(), "DAGSTER_HOME": str(home), "CDC_WAREHOUSE": str(base / "warehouse"), "CDC_TABLE_CONFIGS": str(configs)}
    if remote:
        env["SPARK_REMOTE"] = remote
    return env


def step_seconds(home: str | Path) -> dict[str, float]:
    """Seconds of each step of the instance's latest run, from its STEP_SUCCESS events."""
    import warnings

    from dagster import DagsterEventType, DagsterInstance

    with warnings.catch_warnings(action="ignore"):
        with DagsterInstance.from_config(str(home)) as instance:
            runs = instance.get_runs(limit=1)
            events = instance.all_logs(runs[0].run_id, of_type=DagsterEventType.STEP_SUCCESS) if runs else []
            return {e.step_key: round(e.dagster_event.event_specific_data.duration_ms / 1000, 2) for e in events}


# -- the Connect server ----------------------------------------------------------------------------------
class ConnectServer:
    """The project's Spark Connect server on a free port, its state in ``state_dir``; stopped by the Bench."""

    def __init__(self, state_dir: Path, conf: dict | None = None, instance_home: Path | None = None):
        from cdc_assets.engines import connect_server

        self.cs, self.state_dir, self.conf, self.instance_home = connect_server, state_dir, conf, instance_home
        self.handle, self.jvm, self.port, self.confs = None, None, None, {}

    def start(self) -> float:
        """Start it; seconds until it answered. ``instance_home``: the instance whose run limit sizes its heap."""
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.port = free_port()
        saved = os.environ.get("DAGSTER_HOME")
        if self.instance_home:
            os.environ["DAGSTER_HOME"] = str(self.instance_home)
        started = time.perf_counter()
        try:
            self.handle = self.cs.start_server(self.port, self.state_dir, conf=self.conf, owner="benchmarks", timeout=300)
        finally:
            os.environ.pop("DAGSTER_HOME", None) if saved is None else os.environ.update(DAGSTER_HOME=saved)
        seconds = round(time.perf_counter() - started, 1)
        self.jvm, self.confs = self.cs.jvm_pid(self.handle), self.cs.probe(self.port, token=self.handle.token)
        log(f"Connect server up at {self.handle.url} in {seconds}s (JVM {self.jvm}, application {self.confs.get('spark.app.id')}, "
            f"driver memory {self.confs.get('spark.driver.memory')}, log {self.handle.log_path})")
        return seconds

    def env(self) -> dict[str, str]:
        """What ``make ui`` gives its runs: the project's server, found through its state dir."""
        return {"CDC_SPARK": "server", "CDC_SPARK_SERVER_DIR": str(self.state_dir), "SPARK_CONNECT_PORT": str(self.port)}

    def alive(self) -> bool:
        return self.handle is not None and self.cs.running_server(self.state_dir) is not None

    def peak_rss(self) -> int:
        return proc_status(self.jvm).get("VmHWM", 0)

    def reset_peak(self) -> bool:
        """VmHWM back to the current RSS (Linux >= 4.0), so the peak covers what follows only."""
        try:
            Path(f"/proc/{self.jvm}/clear_refs").write_text("5")
            return True
        except OSError as error:
            log(f"WARNING: could not reset the server's VmHWM ({error}): its peak covers its whole life")
            return False

    def stop(self) -> None:
        if self.handle is not None:
            self.cs.stop_server(self.state_dir)
            log(f"stopped the Connect server in {self.state_dir}")
            self.handle = None


# -- reporting ---------------------------------------------------------------------------------------------
def verdict(value: float | None, target: float, acceptable: float | None = None) -> str:
    if value is None:
        return "-"
    if value <= target:
        return "MET"
    return f"met (<= {acceptable})" if acceptable is not None and value <= acceptable else "NOT MET"


def cell(value) -> str:
    if value is None:
        return ""
    return f"{value:,}" if isinstance(value, (int, float)) else str(value)  # floats as the scenario rounded them


def run_row(label: str, figures: dict, *cells) -> list:
    """A table row of one run: label, wall seconds, other processes' cores, its JVM's peak RSS in GiB, then ``cells``."""
    return [label, figures["seconds"], figures["other_processes_avg_cores"], gib((figures.get("jvm_peak_rss_mib") or 0) * MIB), *cells]


def print_table(title: str, head: list[str], rows: list[list], notes: list[str] = ()) -> None:
    """A table (columns of numbers right-aligned, of text left-aligned) and notes under it."""
    rows = [row + [None] * (len(head) - len(row)) for row in rows]
    numeric = [any(isinstance(r[i], (int, float)) for r in rows) for i in range(len(head))]
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(head)]
    line = lambda r: "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(r, widths, numeric)).rstrip()  # noqa: E731
    rule = "=" * max(len(title), len(line(head)))
    print("\n".join(["", rule, title, line(head), *map(line, cells), *notes, rule]), flush=True)


# -- one invocation ------------------------------------------------------------------------------------------
class Bench:
    """One invocation of a scenario: its workdir, logs, results, and every server and child it started."""

    def __init__(self, scenario: str, args):
        self.scenario, self.args = scenario, args
        self.workdir, self.temp = prepare_workdir(args.workdir, scenario)
        self.logs = self.workdir / "logs"
        self.servers: list[ConnectServer] = []
        self.children: list[Child] = []
        settings = {k: v for k, v in vars(args).items() if k not in ("module", "workdir", "results_dir", "keep")}
        self.results: dict = {
            "scenario": scenario, "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(), "settings": json.loads(json.dumps(settings, default=str)), "workdir": str(self.workdir),
            "machine": {"cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / GIB, 1),
                        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
            "spark_env": {k: os.environ[k] for k in ("CDC_SPARK_CONF", "CDC_SPARK_MASTER") if k in os.environ},
            "measurements": {}, "errors": {},
        }

    def measure(self, name: str, step, *args) -> dict:
        """``step(result, *args)`` into measurements[name]; a failure is recorded and the next measurement runs."""
        log(f"--- {name} ---")
        started = time.perf_counter()
        result = self.results["measurements"].setdefault(name, {})
        try:
            step(result, *args)
        except OutputsWrong as error:
            self.results["errors"][name] = {"kind": "outputs", "message": str(error)}
            log(f"{name} WRONG OUTPUTS: {error}")
        except Exception as error:  # noqa: BLE001 - report it, keep what was measured, measure the rest
            message = str(error) if isinstance(error, StepFailed) else traceback.format_exc()
            self.results["errors"][name] = {"kind": "failed", "message": message}
            log(f"{name} FAILED: {message}")
        log(f"--- {name} done in {time.perf_counter() - started:.0f}s ---")
        return result

    def cli(self, name: str, env: dict, table: str, *partition: str, server: int | None = None, eventlog: bool = False,
            select: str | None = None) -> dict:
        """``dagster asset materialize`` of the table's group (or of ``select``) in a fresh process; with
        ``eventlog``, Spark's figures from its event log (benchmarks/eventlog.py) and the steps' seconds too."""
        if eventlog:
            folder = self.workdir / "eventlogs" / name
            shutil.rmtree(folder, ignore_errors=True)
            env = {**env, "CDC_SPARK_CONF": eventlog_conf(folder, env)}
        command = [tool("dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions", "--select", select or f"group:{table}", *partition]
        figures = run_process(name, command, env, self.logs, server=server)
        if eventlog:
            figures["steps"] = step_seconds(env["DAGSTER_HOME"])
            figures["eventlog"] = read_eventlog(folder, Path(figures["log"]))
        return figures

    def each_size(self, sizes: list[int], measure_size, disk_per_row: int) -> None:
        """``measure_size(result, bench, rows)`` as the measurement ``rows`` for each size; a size's folder
        (``r<rows>``) goes before the next (unless --keep): the biggest need the disk."""
        for rows in sizes:
            if shutil.disk_usage(self.workdir).free < rows * disk_per_row:
                log(f"WARNING: {shutil.disk_usage(self.workdir).free / GIB:.1f} GiB free in {self.workdir}, about "
                    f"{rows * disk_per_row / GIB:.1f} GiB needed for {rows:,} rows")
            self.measure(str(rows), measure_size, self, rows)
            if not self.args.keep:
                shutil.rmtree(self.workdir / f"r{rows}", ignore_errors=True)

    def days(self, name: str, what: str, dates: tuple[str, str], run_day) -> dict:
        """``run_day(run_name, date)`` for day 1, then day 2, each logged; day 2's seconds and JVM peak are the figure."""
        result = {}
        for key, day in zip(("day1", "day2"), dates):
            result[key] = run_day(f"{name}_{key}", day)
            log(f"{what} day {key[-1]} ({day}): {describe(result[key])}")
        return {**result, "seconds": result["day2"]["seconds"], "jvm_peak_rss_mib": result["day2"]["jvm_peak_rss_mib"]}

    def cli_days(self, name: str, env: dict, table: str, what: str, dates: tuple[str, str], server: int | None = None,
                 eventlog: bool = False, select: str | None = None) -> dict:
        """Day 1, then day 2 of ``table``, each a ``dagster asset materialize`` process (:meth:`cli`)."""
        return self.days(name, what, dates, lambda run, day: self.cli(run, env, table, "--partition", day, server=server, eventlog=eventlog,
                                                                      select=select))

    def yardstick_days(self, name: str, data: Path, env: dict, what: str, dates: tuple[str, str], server: int | None = None) -> dict:
        """The yardstick (``--yardstick``, plain PySpark) on ``data/<date>/``: day 1, then day 2, each a fresh process;
        its outputs under ``runs/<name>/warehouse`` (absolute: a Connect server resolves it)."""
        out = (self.workdir / "runs" / name / "warehouse").resolve()
        shutil.rmtree(out.parent, ignore_errors=True)

        def run_day(run: str, day: str) -> dict:
            command = [sys.executable, self.args.yardstick, "--csv", data / day, "--date", day, "--out", out]
            command += ["--prev-date", dates[0]] if day == dates[1] else []
            figures = run_process(run, command, env, self.logs, cwd=self.workdir, server=server, timed=True)
            said = [text for _, text in figures.pop("lines") if text.startswith("session ")]
            return {**figures, "yardstick_says": said[-1] if said else None}

        return {**self.days(name, what, dates, run_day), "out": str(out)}

    def server(self, name: str, conf: dict | None = None, instance_home: Path | None = None) -> ConnectServer:
        server = ConnectServer(self.workdir / "servers" / name, conf, instance_home)
        self.servers.append(server)
        return server

    def close(self) -> None:
        """Stop every child and server this invocation started, whatever happened."""
        for child in self.children:
            try:
                child.stop()
            except Exception as error:  # noqa: BLE001 - stop the others too
                log(f"WARNING: could not stop {child.name}: {error}")
        for server in self.servers:
            try:
                server.stop()
            except Exception as error:  # noqa: BLE001
                log(f"WARNING: could not stop the Connect server in {server.state_dir}: {error}")
        end_all(psutil.Process().children(recursive=True))  # e.g. a code server of a cut-short workspace context


def prepare_workdir(requested: str | None, scenario: str) -> tuple[Path, bool]:
    """The workdir and whether it is a fresh temp dir. A given folder must be empty or made by the same
    scenario before (its marker file), and is then emptied."""
    marker = f".cdc_bench_{scenario}"
    if requested is None:
        workdir = Path(tempfile.mkdtemp(prefix=f"cdc_bench_{scenario}_"))
    else:
        workdir = Path(requested).resolve()
        if workdir.exists() and any(workdir.iterdir()):
            if not (workdir / marker).exists():
                sys.exit(f"--workdir {workdir} is not empty and was not made by this scenario; pick another folder")
            for entry in workdir.iterdir():
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        workdir.mkdir(parents=True, exist_ok=True)
    (workdir / marker).touch()
    return workdir, requested is None


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if done.returncode == 0 else "?"


def run(scenario, args) -> int:
    """Run a scenario module (``measure(bench)``, ``summary(results)``, ``label(args)``); the exit status."""
    def on_sigterm(signum, frame):
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    bench = Bench(args.scenario, args)
    results = bench.results
    log(f"{args.scenario}: workdir {bench.workdir}; load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    try:
        scenario.measure(bench)
    except (KeyboardInterrupt, Interrupted):
        results["interrupted"] = True
        log("interrupted: stopping every run, daemon and server this invocation started")
    except Exception:  # noqa: BLE001 - set-up failed: reported like a measurement
        results["errors"]["setup"] = {"kind": "failed", "message": traceback.format_exc()}
        log(f"set-up FAILED: {results['errors']['setup']['message']}")
    finally:
        bench.close()
        results["total_seconds"] = round(time.perf_counter() - started, 1)
        results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        try:
            scenario.summary(results)
        except Exception:  # noqa: BLE001 - the JSON below still has every figure
            log(f"WARNING: the summary table failed:\n{traceback.format_exc()}")
        for name, error in results["errors"].items():
            print(f"{name}: {'WRONG OUTPUTS' if error['kind'] == 'outputs' else 'FAILED'}: {error['message'].strip().splitlines()[0][:300]}")
        if results.get("interrupted"):
            print("INTERRUPTED: the measurements after the last one shown did not run")
        finish(bench, scenario.label(args))
    if results.get("interrupted"):
        return 130
    kinds = {e["kind"] for e in results["errors"].values()}
    return 1 if "failed" in kinds else 2 if kinds else 0


def finish(bench: Bench, label: str) -> None:
    """JSON to the results folder (and the kept workdir); a temp workdir goes, but for the logs errors name."""
    text = json.dumps(bench.results, indent=2, default=str) + "\n"
    keep = bench.args.keep or not bench.temp
    if keep:
        (bench.workdir / "results.json").write_text(text)
    if bench.args.results_dir:
        folder = Path(bench.args.results_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{bench.scenario}_{label}_{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
        path.write_text(text)
        log(f"results written to {path}")
    if not keep:
        if bench.results["errors"] or bench.results.get("interrupted"):
            for entry in bench.workdir.iterdir():
                if entry.name not in KEEP_ON_ERROR:
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            log(f"removed {bench.workdir} but for its {', '.join(KEEP_ON_ERROR)} (pass --keep to keep all)")
        else:
            shutil.rmtree(bench.workdir, ignore_errors=True)
            log(f"removed {bench.workdir} (pass --keep to keep it)")
    log(f"total {bench.results['total_seconds']:.0f}s")
