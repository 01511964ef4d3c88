"""A Spark standalone cluster on loopback (a master and its workers), started from the installed pyspark.

    python -m cdc_assets.engines.cluster start [--port N] [--webui-port N] [--workers N] [--worker-cores N]
                                                [--worker-memory M] [--worker-webui-port N] [--state-dir D]
                                                # prints spark://127.0.0.1:N
    python -m cdc_assets.engines.cluster status [--state-dir D]
    python -m cdc_assets.engines.cluster stop [--state-dir D]

pyspark's wheel ships ``bin/spark-class`` and the master's and workers' classes but not ``sbin/start-*.sh``,
so the daemons are started as ``spark-class org.apache.spark.deploy.master.Master`` and ``...worker.Worker``
with ``SPARK_HOME`` set to the pyspark package: nothing is downloaded. Each runs detached in a session of
its own (Ctrl-C of whoever started it does not reach it) and writes its pid to ``<state_dir>/<name>.pid``
and its output to ``<state_dir>/<name>.log`` (``master``, ``worker-1``, ...); the ports and sizes are in
``<state_dir>/cluster.json``. ``start`` returns a running cluster as it is and restarts a partly running
one (a daemon died); it returns once every worker has registered with the master (the master's web UI
lists them at ``/json/``). Everything listens on
127.0.0.1 only (``--host`` and ``SPARK_LOCAL_IP``, which the web UIs bind to too). Like any standalone
cluster without ``spark.authenticate``, it has no authentication: anyone who can open a socket on this
machine can submit work to it. Their web UIs cannot kill applications (``spark.ui.killEnabled=false``).

The default size, two workers of 1 core and 2g each, fits a 2-core machine next to the driver: an
application's executors get the default ``spark.executor.memory`` (1g) each, one per worker. A worker's
executors run in ``<state_dir>/work/<worker>/<app id>/<executor id>/`` (their ``stderr`` is the executor's
log), and they are children of the worker, in its process group: stopping the worker stops them.

Runs use the cluster with ``CDC_SPARK_MASTER=spark://127.0.0.1:<port>``, or through a Connect server on it
(``python -m cdc_assets.engines.connect_server start --master spark://127.0.0.1:<port>``). An application takes
every free core until it ends (standalone's default ``spark.cores.max``), so while a Connect server runs
on the cluster, other applications wait for cores.

No Dagster import; the process handling is :mod:`cdc_assets.engines.process`'s.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cdc_assets.model.file_modes import apply_umask
from cdc_assets.engines.process import (
    HOST,
    log_tail,
    port_is_free,
    process_alive,
    recorded_pid,
    start_detached,
    stop_groups,
    wait_for_port,
    write_number_file,
)
from cdc_assets.engines.spark_home import launcher, spark_env, write_properties_file

DEFAULT_PORT = 7077
DEFAULT_WEBUI_PORT = 8080
DEFAULT_WORKER_WEBUI_PORT = 8081  # worker i (from 1) gets this + i - 1
DEFAULT_WORKERS = 2
DEFAULT_WORKER_CORES = 1
DEFAULT_WORKER_MEMORY = "2g"
DEFAULT_STATE_DIR = ".spark-cluster"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
LAYOUT_FILE = "cluster.json"
LOCK_FILE = "start.lock"
PROPERTIES_FILE = "daemons.properties"
WORK_DIR = "work"
MASTER = "master"


@dataclass(frozen=True)
class ClusterLayout:
    """Where the master and each worker listen, and how big a worker is."""

    port: int = DEFAULT_PORT
    webui_port: int = DEFAULT_WEBUI_PORT
    worker_webui_ports: tuple[int, ...] = (DEFAULT_WORKER_WEBUI_PORT, DEFAULT_WORKER_WEBUI_PORT + 1)
    worker_cores: int = DEFAULT_WORKER_CORES
    worker_memory: str = DEFAULT_WORKER_MEMORY

    @property
    def workers(self) -> list[str]:
        return [f"worker-{number}" for number in range(1, len(self.worker_webui_ports) + 1)]

    def ports(self) -> list[int]:
        return [self.port, self.webui_port, *self.worker_webui_ports]


@dataclass(frozen=True)
class ClusterHandle:
    master_url: str  # spark://127.0.0.1:<port>, for CDC_SPARK_MASTER
    webui_url: str  # the master's web UI; <webui_url>/json/ lists workers and applications
    layout: ClusterLayout
    pids: dict[str, int]  # "master", "worker-1", ... -> pid
    state_dir: Path

    @property
    def work_dir(self) -> Path:
        """Parent of the workers' work dirs: ``<worker>/<app id>/<executor id>/stderr`` per executor."""
        return self.state_dir / WORK_DIR

    def log_path(self, name: str) -> Path:
        return self.state_dir / f"{name}.log"


def layout_for(
    port: int = DEFAULT_PORT,
    webui_port: int = DEFAULT_WEBUI_PORT,
    workers: int = DEFAULT_WORKERS,
    worker_cores: int = DEFAULT_WORKER_CORES,
    worker_memory: str = DEFAULT_WORKER_MEMORY,
    worker_webui_port: int = DEFAULT_WORKER_WEBUI_PORT,
) -> ClusterLayout:
    if workers < 1:
        raise ValueError("a cluster needs at least one worker")
    layout = ClusterLayout(port, webui_port, tuple(worker_webui_port + i for i in range(workers)), worker_cores, worker_memory)
    if len(set(layout.ports())) != len(layout.ports()):
        raise ValueError(f"the master's port, its web UI port and the workers' web UI ports must differ: {layout.ports()}")
    return layout


def start_cluster(layout: ClusterLayout | None = None, state_dir: str | Path = DEFAULT_STATE_DIR, timeout: float = 120) -> ClusterHandle:
    """Start a master and its workers on 127.0.0.1 and wait until every worker has registered with the master.

    If the cluster recorded in ``state_dir`` is running with the same layout, it is returned as it is. A
    partly running one (a daemon died) is stopped and started again: its applications are lost anyway.

    Raises ``RuntimeError`` if a cluster with another layout runs from ``state_dir``, if a port is taken,
    or if a daemon dies while starting, and ``TimeoutError`` (after stopping the cluster) if the workers
    have not registered within ``timeout`` seconds; both carry the end of the log concerned.
    """
    layout = layout or ClusterLayout()
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    # One start at a time per state dir: a concurrent caller waits, then finds the cluster running.
    with open(state / LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(layout, state, timeout)


def _start_locked(layout: ClusterLayout, state: Path, timeout: float) -> ClusterHandle:
    recorded = _recorded_layout(state)
    alive = _running_pids(state)
    if recorded is not None and alive and set(alive) == {MASTER, *recorded.workers}:
        if recorded != layout:
            raise RuntimeError(f"a Spark cluster from {state} already runs with another layout ({recorded}); stop it first")
        handle = _handle(layout, alive, state)
        _wait_until_ready(handle, timeout)
        return handle
    if alive:
        print(f"restarting the partly running Spark cluster from {state} (running: {', '.join(sorted(alive))})", file=sys.stderr)
        stop_cluster(state)
    taken = [port for port in layout.ports() if not port_is_free(port)]
    if taken:
        raise RuntimeError(f"port(s) {', '.join(f'{HOST}:{port}' for port in taken)} in use by another process")

    (state / LAYOUT_FILE).write_text(json.dumps(_layout_document(layout), indent=2) + "\n")
    master_url = f"spark://{HOST}:{layout.port}"
    pids = {MASTER: _launch(state, MASTER, [MASTER_CLASS, "--host", HOST, "--port", str(layout.port), "--webui-port", str(layout.webui_port)])}
    handle = _handle(layout, pids, state)
    try:
        # Workers that start before the master answers retry their registration after a few seconds.
        _wait_for_port(handle, layout.port, timeout)
        for name, webui_port in zip(layout.workers, layout.worker_webui_ports):
            work_dir = state / WORK_DIR / name
            work_dir.mkdir(parents=True, exist_ok=True)
            command = [WORKER_CLASS, master_url, "--host", HOST, "--cores", str(layout.worker_cores), "--memory", layout.worker_memory,
                       "--webui-port", str(webui_port), "--work-dir", str(work_dir)]
            pids[name] = _launch(state, name, command)
        _wait_until_ready(handle, timeout)
    except BaseException:
        stop_cluster(state, timeout=10)
        raise
    return handle


def stop_cluster(state_dir: str | Path = DEFAULT_STATE_DIR, timeout: float = 30) -> bool:
    """Stop the daemons recorded in ``state_dir``: SIGTERM to their process groups (a worker's holds its
    executors), SIGKILL after ``timeout`` s. Returns whether any was running; stale pid files are not an error.
    """
    state = Path(state_dir).resolve()
    alive = _running_pids(state)
    survivors = stop_groups(alive, grace=timeout)
    if survivors:
        raise RuntimeError(f"Spark {survivors[0]} pid {alive[survivors[0]]} survived SIGKILL")
    for pid_file in state.glob("*.pid"):
        pid_file.unlink(missing_ok=True)
    (state / LAYOUT_FILE).unlink(missing_ok=True)
    return bool(alive)


def running_cluster(state_dir: str | Path = DEFAULT_STATE_DIR) -> ClusterHandle | None:
    """The cluster recorded in ``state_dir`` if its master and every worker process are alive, else None."""
    state = Path(state_dir).resolve()
    layout = _recorded_layout(state)
    alive = _running_pids(state)
    if layout is None or set(alive) != {MASTER, *layout.workers}:
        return None
    return _handle(layout, alive, state)


def master_state(handle: ClusterHandle, timeout: float = 5) -> dict:
    """The master's own view (its web UI's ``/json/``): ``status``, ``workers``, ``activeapps``, ``completedapps``, ..."""
    with urllib.request.urlopen(f"{handle.webui_url}/json/", timeout=timeout) as response:
        return json.load(response)


def registered_workers(handle: ClusterHandle, state: dict | None = None) -> list[dict]:
    """The master's ALIVE workers that are this cluster's (matched by their web UI port)."""
    state = state if state is not None else master_state(handle)
    ours = {f"http://{HOST}:{port}" for port in handle.layout.worker_webui_ports}
    return [worker for worker in state.get("workers", []) if worker.get("state") == "ALIVE" and worker.get("webuiaddress") in ours]


# -- internals -------------------------------------------------------------------------------------


def _handle(layout: ClusterLayout, pids: dict[str, int], state: Path) -> ClusterHandle:
    return ClusterHandle(f"spark://{HOST}:{layout.port}", f"http://{HOST}:{layout.webui_port}", layout, pids, state)


def _layout_document(layout: ClusterLayout) -> dict:
    return {"port": layout.port, "webui_port": layout.webui_port, "worker_webui_ports": list(layout.worker_webui_ports),
            "worker_cores": layout.worker_cores, "worker_memory": layout.worker_memory}


def _recorded_layout(state: Path) -> ClusterLayout | None:
    try:
        document = json.loads((state / LAYOUT_FILE).read_text())
        return ClusterLayout(int(document["port"]), int(document["webui_port"]), tuple(int(port) for port in document["worker_webui_ports"]),
                             int(document["worker_cores"]), str(document["worker_memory"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _running_pids(state: Path) -> dict[str, int]:
    """Name -> pid of the recorded daemons that are alive and still what was started (a pid can be reused)."""
    running = {}
    for pid_file in sorted(state.glob("*.pid")):
        pid = recorded_pid(pid_file, MASTER_CLASS if pid_file.stem == MASTER else WORKER_CLASS)
        if pid is not None:
            running[pid_file.stem] = pid
    return running


def _launch(state: Path, name: str, arguments: list[str]) -> int:
    # The daemons' web UIs (on 127.0.0.1: SPARK_LOCAL_IP) show applications and cannot kill them.
    properties = write_properties_file(state / PROPERTIES_FILE, {"spark.ui.killEnabled": "false"})
    # The previous daemon's log stays as <name>.log.1, e.g. after a crash; the start lock is not inherited.
    command = [launcher("spark-class"), *arguments, "--properties-file", str(properties)]
    pid = start_detached(command, state / f"{name}.log", spark_env())
    write_number_file(state / f"{name}.pid", pid)
    return pid


def _check_alive(handle: ClusterHandle) -> None:
    for name, pid in handle.pids.items():
        if not process_alive(pid):
            raise RuntimeError(f"the Spark {name} exited while starting; end of {handle.log_path(name)}:\n{log_tail(handle.log_path(name))}")


def _wait_for_port(handle: ClusterHandle, port: int, timeout: float) -> None:
    if not wait_for_port(port, timeout, check=lambda: _check_alive(handle)):
        raise TimeoutError(f"the Spark master did not listen on {HOST}:{port} within {timeout:g} s; end of "
                           f"{handle.log_path(MASTER)}:\n{log_tail(handle.log_path(MASTER))}")


def _wait_until_ready(handle: ClusterHandle, timeout: float) -> None:
    """Until the master is ALIVE and lists every worker of ``handle`` as ALIVE."""
    deadline = time.monotonic() + timeout
    seen = "no answer from the master's web UI"
    while True:
        _check_alive(handle)
        try:
            state = master_state(handle, timeout=max(1.0, min(5.0, deadline - time.monotonic())))
            workers = registered_workers(handle, state)
            if state.get("status") == "ALIVE" and len(workers) == len(handle.layout.workers):
                return
            seen = f"master {state.get('status')}, {len(workers)} of {len(handle.layout.workers)} workers registered"
        except (OSError, urllib.error.URLError, ValueError) as error:
            seen = f"master's web UI: {error}"
        if time.monotonic() > deadline:
            logs = "\n".join(f"end of {handle.log_path(name)}:\n{log_tail(handle.log_path(name), 15)}" for name in handle.pids)
            raise TimeoutError(f"the Spark cluster was not ready within {timeout:g} s ({seen});\n{logs}")
        time.sleep(0.25)


def main(argv: list[str] | None = None) -> int:
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.engines.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"pid files, logs, executors' work dirs (default: {DEFAULT_STATE_DIR})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"start: the master's port (default: {DEFAULT_PORT})")
    parser.add_argument("--webui-port", type=int, default=DEFAULT_WEBUI_PORT, help=f"start: the master's web UI (default: {DEFAULT_WEBUI_PORT})")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help=f"start: how many workers (default: {DEFAULT_WORKERS})")
    parser.add_argument("--worker-cores", type=int, default=DEFAULT_WORKER_CORES, help=f"start: cores per worker (default: {DEFAULT_WORKER_CORES})")
    parser.add_argument("--worker-memory", default=DEFAULT_WORKER_MEMORY, help=f"start: executor memory per worker (default: {DEFAULT_WORKER_MEMORY})")
    parser.add_argument("--worker-webui-port", type=int, default=DEFAULT_WORKER_WEBUI_PORT,
                        help=f"start: the first worker's web UI; the next get the following ports (default: {DEFAULT_WORKER_WEBUI_PORT})")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait: start, for the workers (120); stop, before SIGKILL (30)")
    args = parser.parse_args(argv)

    if args.command == "start":
        try:
            layout = layout_for(args.port, args.webui_port, args.workers, args.worker_cores, args.worker_memory, args.worker_webui_port)
            began = time.monotonic()
            already = running_cluster(args.state_dir)
            started = start_cluster(layout, args.state_dir, timeout=args.timeout or 120)
        except (RuntimeError, TimeoutError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        how = "already running" if already is not None and already.pids == started.pids else f"ready in {time.monotonic() - began:.1f} s"
        print(f"Spark cluster {how}: {len(layout.workers)} workers of {layout.worker_cores} core(s) and {layout.worker_memory}; "
              f"web UI {started.webui_url}; logs in {started.state_dir}", file=sys.stderr)
        print(started.master_url)
        return 0
    if args.command == "stop":
        stopped = stop_cluster(args.state_dir, timeout=args.timeout or 30)
        print("stopped" if stopped else "not running", file=sys.stderr)
        return 0
    handle = running_cluster(args.state_dir)
    if handle is None:
        alive = _running_pids(Path(args.state_dir).resolve())
        print(f"partly running ({', '.join(sorted(alive))}): start restarts it, stop stops it" if alive else "not running")
        return 1
    try:
        state = master_state(handle)
    except (OSError, urllib.error.URLError, ValueError) as error:
        print(f"{handle.master_url}: processes alive but the master's web UI is not answering ({error}); logs in {handle.state_dir}")
        return 1
    workers = registered_workers(handle, state)
    print(f"{handle.master_url} {state.get('status')} web UI {handle.webui_url} workers {len(workers)}/{len(handle.layout.workers)} "
          f"running apps {len(state.get('activeapps', []))} completed apps {len(state.get('completedapps', []))}")
    return 0 if state.get("status") == "ALIVE" and len(workers) == len(handle.layout.workers) else 1


if __name__ == "__main__":
    raise SystemExit(main())
