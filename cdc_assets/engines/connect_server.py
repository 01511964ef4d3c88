"""A long-lived Spark Connect server on loopback, started from the installed pyspark.

    python -m cdc_assets.engines.connect_server start [--port N] [--state-dir D] [--master M]   # prints sc://127.0.0.1:N
    python -m cdc_assets.engines.connect_server status [--state-dir D]
    python -m cdc_assets.engines.connect_server stop [--state-dir D]

pyspark's wheel ships the server (``jars/spark-connect_2.13-*.jar``) and ``bin/spark-submit``, so nothing
is downloaded: the server is ``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer
spark-internal`` with ``SPARK_HOME`` set to the pyspark package. It runs detached in a session of its own
(Ctrl-C of whoever started it does not reach it), writes its pid to ``<state_dir>/server.pid`` and its
output to ``<state_dir>/server.log``, reads its conf from ``<state_dir>/server.properties`` (mode 0600:
conf on its command line would be anyone's to read with ``ps``), and listens on 127.0.0.1 only (gRPC,
driver RPC, block manager and UI alike: ``spark.connect.grpc.binding.address`` plus ``SPARK_LOCAL_IP``;
its UI cannot kill jobs). It serves only clients that present its token: a fresh secret made at each start
(Spark's ``spark.connect.authenticate.token``), kept in ``<state_dir>/server.token`` and in the properties
file, both mode 0600, so another user of the machine who can open the port is refused
(``UNAUTHENTICATED``) instead of running code as the server's owner. What its JVM fixes at the start and no
session can change (the S3 keys of its environment, ``CDC_SPARK_CONF``, the jars, ...) is recorded in
``<state_dir>/server.settings`` (:mod:`cdc_assets.engines.server_settings`), and a run goes to the server only
when its own match.

Runs then reach it with :attr:`ServerHandle.client_url`, ``sc://localhost:<port>/;token=...`` (pyspark sends
a token over a plain loopback channel only to a host named ``localhost``); :attr:`ServerHandle.url`,
``sc://127.0.0.1:<port>``, is the form logs and messages show, without the token. Runs skip the JVM start
(about 10 s) and share one JVM's caches. The server's working directory is the caller's, so relative paths a client sends
resolve as they would for a local session.

Conf, lowest precedence first: ``PIPELINE_DEFAULTS``, ``LOOPBACK_DEFAULTS``, ``LOCAL_DEFAULTS`` (local masters only),
``CDC_SPARK_CONF``, ``conf``; the Iceberg runtime's jars and extensions in front of any that conf names
(:mod:`cdc_assets.engines.iceberg_runtime`); then the binding address and port, which cannot be overridden. The master is
``master``, else ``CDC_SPARK_MASTER``, else ``local[*]``. Every Connect session starts from this conf:
static conf (``spark.driver.memory``, ...) can only be set here, not by a client's builder.

No Dagster here; the conf defaults every JVM shares are :mod:`cdc_assets.engines.spark_conf`'s. The process handling is :mod:`cdc_assets.engines.process`'s.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import secrets
import sys
import time
import uuid
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

from cdc_assets.model.file_modes import apply_umask
from cdc_assets.model import settings
from cdc_assets.engines import server_settings
from cdc_assets.engines.iceberg_runtime import with_iceberg_runtime
from cdc_assets.engines.process import (
    HOST,
    command_line,
    descendants,
    is_java,
    log_tail,
    port_accepts,
    port_is_free,
    process_alive,
    read_number_file,
    recorded_pid,
    start_detached,
    stop_group,
    write_number_file,
)
from cdc_assets.engines.spark_conf import LOCAL_DEFAULTS, LOOPBACK_DEFAULTS, PIPELINE_DEFAULTS, file_mode_conf, spark_conf_from_env
from cdc_assets.engines.spark_home import launcher, spark_env, write_properties_file

DEFAULT_PORT = int(settings.SPARK_CONNECT_PORT.default)
DEFAULT_STATE_DIR = settings.SPARK_SERVER_DIR.default
PORT_ENV = settings.SPARK_CONNECT_PORT.name
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
PID_FILE = "server.pid"
PORT_FILE = "server.port"
OWNER_FILE = "server.owner"
LOG_FILE = "server.log"
PROPERTIES_FILE = "server.properties"  # the server's conf, mode 0600
TOKEN_FILE = "server.token"  # the clients' token, mode 0600
# Spark's conf key of a Connect server's pre-shared token (Spark 4.0's SparkConnectAuthenticator).
TOKEN_CONF = "spark.connect.authenticate.token"
LOCK_FILE = "start.lock"
# Runs that may share the server at once when the Dagster instance does not say (instance/dagster.yaml's).
DEFAULT_SHARED_RUNS = 4


@dataclass(frozen=True)
class ServerHandle:
    url: str  # sc://127.0.0.1:<port>, for logs and messages: no token
    pid: int
    port: int
    state_dir: Path
    log_path: Path
    token: str | None = field(default=None, repr=False)

    @property
    def client_url(self) -> str:
        """The connection string a client uses: :attr:`url` with the server's token, or :attr:`url` itself
        for a server that has none (one started before servers had tokens)."""
        return client_url(self.port, self.token)


def client_url(port: int, token: str | None) -> str:
    """``sc://localhost:<port>/;token=<token>``: pyspark sends a token over a plain (loopback) channel only
    to the host ``localhost`` (gRPC's local credentials); to any other name it insists on TLS."""
    return f"sc://{HOST}:{port}" if token is None else f"sc://localhost:{port}/;token={token}"


def redacted_url(url: str) -> str:
    """``url`` with the value of its ``token`` parameter hidden, for logs and messages."""
    base, _, params = url.partition(";")
    if not params:
        return url
    shown = [part if not part.lower().startswith("token=") else "token=<redacted>" for part in params.split(";")]
    return f"{base};{';'.join(shown)}"


def configured_port() -> int:
    """The project server's port: ``SPARK_CONNECT_PORT``, else 15002."""
    return int(settings.SPARK_CONNECT_PORT.value())


def shared_runs() -> int:
    """How many runs may share the server at once: the Dagster instance's ``max_concurrent_runs``.

    Read from ``$DAGSTER_HOME/dagster.yaml`` (``concurrency.runs`` or the run coordinator's config);
    :data:`DEFAULT_SHARED_RUNS` when there is no such file or setting.
    """
    home = os.environ.get("DAGSTER_HOME", "").strip()
    if not home:
        return DEFAULT_SHARED_RUNS
    try:
        import yaml

        settings = yaml.safe_load((Path(home) / "dagster.yaml").read_text()) or {}
    except (OSError, ValueError):
        return DEFAULT_SHARED_RUNS
    candidates = [
        ((settings.get("concurrency") or {}).get("runs") or {}).get("max_concurrent_runs"),
        ((settings.get("run_coordinator") or {}).get("config") or {}).get("max_concurrent_runs"),
    ]
    for value in candidates:
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_SHARED_RUNS


def server_heap_gib(memory_gib: float, runs: int) -> int:
    """The local server's JVM heap: 2 GiB of its own plus 1.5 GiB per run sharing it, at most half the machine.

    A run alone used to get a 4 GiB JVM of its own; cached data is on disk (core/caching.py), so the heap
    holds the running stages' buffers, and four runs at once fit in 8 GiB. The other half of the machine
    stays for the run processes (about 0.3 GiB each), the Python workers and the page cache.
    """
    return max(2, min(int(2 + 1.5 * runs), int(memory_gib // 2)))


def machine_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def server_conf(port: int, master: str | None = None, conf: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """The master and the conf a server on ``port`` gets (in its properties file)."""

    resolved_master = master or settings.SPARK_MASTER.value() or "local[*]"
    merged = {**PIPELINE_DEFAULTS, **LOOPBACK_DEFAULTS, **file_mode_conf()}  # the server writes the runs' files
    if resolved_master.startswith("local"):
        merged.update(LOCAL_DEFAULTS)
        # One JVM serves every run at once: sized for them, not for one.
        merged["spark.driver.memory"] = f"{server_heap_gib(machine_memory_gib(), shared_runs())}g"
    # Runs share the server side by side: each run's jobs go to its table's pool (the session conf
    # spark.scheduler.pool, which Spark copies onto every job of the session), and pools share fairly,
    # so a big table's long stages do not hold a small table's run behind them.
    merged["spark.scheduler.mode"] = "FAIR"
    merged.update(spark_conf_from_env())
    merged.update({str(key): str(value) for key, value in (conf or {}).items()})
    # Static conf: the server's sessions have Iceberg only if its JVM starts with it (clients cannot add it).
    merged = with_iceberg_runtime(merged)
    merged.update(
        {
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(port),
            # Fail rather than silently listen on another port than the one recorded (Spark's default too).
            "spark.connect.grpc.port.maxRetries": "0",
        }
    )
    return resolved_master, merged


def start_server(
    port: int = DEFAULT_PORT,
    state_dir: str | Path = DEFAULT_STATE_DIR,
    master: str | None = None,
    conf: dict[str, str] | None = None,
    timeout: float = 120,
    owner: str | None = None,
) -> ServerHandle:
    """Start a detached Spark Connect server on 127.0.0.1:``port`` and wait until it answers a query.

    If the server recorded in ``state_dir`` is alive on ``port``, it is returned as it is (its conf is not
    changed). ``owner`` is recorded with a server this call starts (see :func:`server_owner`), e.g. so that
    ``make ui`` stops at its end the server it (or one of its runs) started, and no other. Once started, the
    server is in a session of its own: Ctrl-C of the caller does not reach it (interrupting ``start_server``
    while it waits does stop the half-started server).

    Raises ``RuntimeError`` if that server runs on another port, if the port is taken, or if the server
    dies while starting, and ``TimeoutError`` (after stopping it) if it is not ready within ``timeout``
    seconds; both carry the end of its log.
    """
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    # One start at a time per state dir: a concurrent caller waits, then finds the server running.
    with open(state / LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(port, state, master, conf, timeout, owner)


def _start_locked(port: int, state: Path, master: str | None, conf: dict[str, str] | None, timeout: float, owner: str | None) -> ServerHandle:
    log_path = state / LOG_FILE
    running = _recorded_server(state)
    if running is not None:
        pid, running_port = running
        if running_port != port:
            raise RuntimeError(f"a Spark Connect server from {state} already runs on port {running_port} (pid {pid}); stop it first")
        handle = _handle(pid, port, state)
        _wait_until_ready(handle, timeout)
        return handle
    if not port_is_free(port):
        raise RuntimeError(f"port {HOST}:{port} is in use by another process")

    resolved_master, merged = server_conf(port, master, conf)
    # A token of CDC_SPARK_CONF (or conf) is kept; otherwise a new one for this server's life.
    token = merged.setdefault(TOKEN_CONF, secrets.token_urlsafe(32))
    # The conf is in a file only the owner reads, not on the command line, which any local user reads.
    properties = write_properties_file(state / PROPERTIES_FILE, merged)
    _write_private(state / TOKEN_FILE, token)
    # What the JVM fixes now and no run can change on its session: a run checks it before it comes here.
    server_settings.record(state)
    command = [launcher("spark-submit"), "--class", SERVER_CLASS, "--name", "cdc_assets Spark Connect server", "--master", resolved_master,
               "--properties-file", str(properties), "spark-internal"]  # fmt: skip

    env = spark_env()
    # Python workers (UDFs, Python data sources) run with this interpreter, whose pyspark matches the jars.
    env.setdefault("PYSPARK_PYTHON", sys.executable)

    # The previous server's log stays as server.log.1, e.g. after a crash; the start lock is not inherited.
    pid = start_detached(command, log_path, env)
    write_number_file(state / PORT_FILE, port)
    (state / OWNER_FILE).write_text(f"{owner or ''}\n")
    write_number_file(state / PID_FILE, pid)  # last: a pid file found means the others are written
    handle = _handle(pid, port, state)
    try:
        _wait_until_ready(handle, timeout)
    except BaseException:
        stop_server(state, timeout=10)
        raise
    return handle


def stop_server(state_dir: str | Path = DEFAULT_STATE_DIR, timeout: float = 30) -> bool:
    """Stop the server recorded in ``state_dir``: SIGTERM to its process group, SIGKILL after ``timeout`` s.

    Returns whether a running server was stopped; a missing or stale pid file is not an error.
    """
    state = Path(state_dir).resolve()
    running = _recorded_server(state)
    if running is None:
        _forget(state)
        return False
    pid, _ = running
    if not stop_group(pid, grace=timeout):
        raise RuntimeError(f"Spark Connect server pid {pid} survived SIGKILL")
    _forget(state)
    return True


def server_owner(state_dir: str | Path = DEFAULT_STATE_DIR) -> str | None:
    """Who started the server recorded in ``state_dir`` (``start_server``'s ``owner``), or None."""
    try:
        return (Path(state_dir).resolve() / OWNER_FILE).read_text().strip() or None
    except OSError:
        return None


def record_owner(state_dir: str | Path, owner: str) -> None:
    """Make ``owner`` the recorded owner of the server in ``state_dir`` (e.g. a ``make ui`` adopting the
    server a killed ``make ui`` left running)."""
    (Path(state_dir).resolve() / OWNER_FILE).write_text(f"{owner}\n")


def running_server(state_dir: str | Path = DEFAULT_STATE_DIR) -> ServerHandle | None:
    """The server recorded in ``state_dir`` if its process is alive (ready or still starting), else None."""
    state = Path(state_dir).resolve()
    running = _recorded_server(state)
    return None if running is None else _handle(running[0], running[1], state)


def jvm_pid(handle: ServerHandle) -> int:
    """The pid of the server's JVM, e.g. for its peak RSS (``VmHWM`` in ``/proc/<pid>/status``).

    ``spark-submit`` and ``spark-class`` ``exec`` the JVM, so this is ``handle.pid`` itself once the
    launcher is done; while it is not, the JVM is looked for among the process's descendants.
    """
    if is_java(handle.pid):
        return handle.pid
    for pid in descendants(handle.pid):
        if is_java(pid) and SERVER_CLASS in command_line(pid):
            return pid
    raise LookupError(f"no JVM found for the Spark Connect server pid {handle.pid}")


def probe(port: int, timeout: float = 10, token: str | None = None) -> dict[str, str]:
    """Run ``SELECT 1`` on the server and read a few confs over raw gRPC; returns the confs.

    Uses pyspark's generated gRPC stubs and no SparkSession, so it works in a process that holds a classic
    SparkSession (where pyspark refuses to create a Connect one) and needs no pandas. ``token``, the
    server's, goes as a bearer token in each call's metadata.
    """
    import grpc
    from pyspark.sql.connect.proto import base_pb2, base_pb2_grpc

    session_id = str(uuid.uuid4())
    common: dict[str, Any] = {
        "session_id": session_id, "client_type": "cdc_assets.connect_server", "user_context": base_pb2.UserContext(user_id="cdc_assets_probe"),
    }
    metadata = [] if token is None else [("authorization", f"Bearer {token}")]
    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        stub = base_pb2_grpc.SparkConnectServiceStub(channel)
        request = base_pb2.ExecutePlanRequest(**common)
        request.plan.root.sql.query = "SELECT 1 AS ok"
        responses = stub.ExecutePlan(request, timeout=timeout, metadata=metadata)
        rows = sum(response.arrow_batch.row_count for response in responses if response.HasField("arrow_batch"))
        if rows != 1:
            raise RuntimeError(f"SELECT 1 on the Spark Connect server returned {rows} rows")
        keys = ["spark.master", "spark.app.id", "spark.sql.session.timeZone", "spark.driver.memory", "spark.sql.shuffle.partitions", "spark.scheduler.mode"]
        config = base_pb2.ConfigRequest(**common)
        config.operation.get_option.keys.extend(keys)
        pairs = {pair.key: pair.value for pair in stub.Config(config, timeout=timeout, metadata=metadata).pairs}
        stub.ReleaseSession(base_pb2.ReleaseSessionRequest(**common), timeout=timeout, metadata=metadata)
    return pairs


# -- internals -------------------------------------------------------------------------------------


def _handle(pid: int, port: int, state: Path) -> ServerHandle:
    return ServerHandle(url=f"sc://{HOST}:{port}", pid=pid, port=port, state_dir=state, log_path=state / LOG_FILE, token=_read_token(state))


def _recorded_server(state: Path) -> tuple[int, int] | None:
    """(pid, port) of the live server recorded in ``state``, or None."""
    pid, port = recorded_pid(state / PID_FILE, SERVER_CLASS), read_number_file(state / PORT_FILE)
    if pid is None or port is None:
        return None
    return pid, port


def _forget(state: Path) -> None:
    for name in (PID_FILE, PORT_FILE, OWNER_FILE, TOKEN_FILE, server_settings.SETTINGS_FILE):
        (state / name).unlink(missing_ok=True)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(f"{text}\n")


def _read_token(state: Path) -> str | None:
    try:
        return (state / TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def _wait_until_ready(handle: ServerHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        if not process_alive(handle.pid):
            _forget(handle.state_dir)
            raise RuntimeError(f"the Spark Connect server exited while starting; end of {handle.log_path}:\n{log_tail(handle.log_path)}")
        if port_accepts(handle.port):
            try:
                probe(handle.port, timeout=max(1.0, min(30.0, deadline - time.monotonic())), token=handle.token)
                return
            except Exception as error:  # noqa: BLE001 - listening but not serving yet; retried until the deadline
                last_error = error
        if time.monotonic() > deadline:
            detail = f" (last probe: {last_error})" if last_error else ""
            raise TimeoutError(f"the Spark Connect server was not ready within {timeout:g} s{detail}; end of {handle.log_path}:\n{log_tail(handle.log_path)}")
        time.sleep(0.25)


def main(argv: list[str] | None = None) -> int:
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.engines.connect_server", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"pid file and log (default: {DEFAULT_STATE_DIR})")
    parser.add_argument("--port", type=int, default=None, help=f"start: the port (default: ${PORT_ENV} or {DEFAULT_PORT})")
    parser.add_argument("--master", default=None, help="start: the Spark master (default: $CDC_SPARK_MASTER or local[*])")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait: start, for the server (120); stop, before SIGKILL (30)")
    args = parser.parse_args(argv)

    if args.command == "start":
        port = args.port or configured_port()
        began = time.monotonic()
        already = running_server(args.state_dir)
        started = start_server(port=port, state_dir=args.state_dir, master=args.master, timeout=args.timeout or 120, owner="make spark-server")
        how = "already running" if already is not None and already.pid == started.pid else f"ready in {time.monotonic() - began:.1f} s"
        token = started.state_dir / TOKEN_FILE
        print(f"Spark Connect server {how}: pid {started.pid}, log {started.log_path}; clients need its token, in {token}", file=sys.stderr)
        print(started.url)
        return 0
    if args.command == "stop":
        stopped = stop_server(args.state_dir, timeout=args.timeout or 30)
        print("stopped" if stopped else "not running", file=sys.stderr)
        return 0
    handle = running_server(args.state_dir)
    if handle is None:
        print("not running")
        return 1
    try:
        confs = probe(handle.port, token=handle.token)
    except Exception as error:  # noqa: BLE001
        print(f"{handle.url} pid {handle.pid}: process alive but not answering ({error.__class__.__name__}); log {handle.log_path}")
        return 1
    print(f"{handle.url} pid {handle.pid} " + " ".join(f"{key}={value}" for key, value in confs.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
