"""Where a run's Spark runs: the project's warm Connect server, another server, or a session of its own.

Chosen when a run first needs Spark (never when the code location loads), from the environment:

- ``SPARK_REMOTE=sc://host:port``: that Spark Connect server, whatever else is set.
- ``CDC_SPARK=local``: a session of the run's own (``CDC_SPARK_MASTER``, default ``local[*]``); the JVM
  starts cold. The opt-out everywhere.
- ``CDC_SPARK=server``: the project's Connect server, started if it is not running (``make ui`` sets this
  for every run it launches, so the next run after a crash starts a fresh server).
- ``CDC_SPARK=auto`` (the default): the project's server if one is running, else a session of its own;
  with ``CDC_SPARK_MASTER`` set (a cluster), a session of its own on that master.

The project's server is the one recorded in ``CDC_SPARK_SERVER_DIR`` (default ``./.spark-server``, where
``make spark-server`` and ``make ui`` keep its pid and port), so no ``SPARK_REMOTE`` is needed to find it.

A found server serves the run only if it was started with the run's settings where a session cannot change
them (:mod:`cdc_assets.engines.server_settings`: the S3 keys of its environment for a run on an object store,
``CDC_SPARK_CONF``, the master, the jars, the umask). Otherwise, in ``auto`` mode, the run starts a session
of its own and its description says why; where the run asked for that server (``SPARK_REMOTE`` naming it,
``CDC_SPARK=server``), :class:`ServerCannotServeRunError` fails it before any work, naming both settings.

A Connect client retries an unreachable server for about ten minutes by default. A run here gives up after
``CDC_SPARK_CONNECT_TIMEOUT`` seconds (default 30) and fails with :class:`SparkServerGoneError`, which says
the server died and how to get a new one, instead of hanging.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cdc_assets.model import settings

MODE_ENV = settings.SPARK_MODE.name
MASTER_ENV = settings.SPARK_MASTER.name
SERVER_DIR_ENV = settings.SPARK_SERVER_DIR.name
OWNER_ENV = settings.SPARK_SERVER_OWNER.name
CONNECT_TIMEOUT_ENV = settings.SPARK_CONNECT_TIMEOUT.name
MODES = ("auto", "server", "local")
# The mode of a target named by SPARK_REMOTE, whatever CDC_SPARK says.
REMOTE_MODE = "remote"


@dataclass(frozen=True)
class SparkTarget:
    """Where the run's session lives. ``url`` is None for a session of the run's own.

    ``url`` is the connection string, which may hold a server's token: it is never shown. ``shown_url``
    is what logs and messages say (the project's server as ``sc://127.0.0.1:<port>``, any other URL with
    its token hidden).
    """

    mode: str
    url: str | None = field(repr=False)
    description: str
    server_pid: int | None = None
    server_log: Path | None = None
    shown_url: str | None = None
    # Why the project's running server was not used (it cannot serve this run), for a command to say.
    refusal: str | None = None

    @property
    def is_remote(self) -> bool:
        return self.url is not None

    @property
    def display_url(self) -> str | None:
        if self.url is None:
            return None
        from cdc_assets.engines.connect_server import redacted_url

        return self.shown_url or redacted_url(self.url)


class SparkServerGoneError(RuntimeError):
    """The Spark Connect server the run used stopped answering: the run cannot go on."""


class ServerCannotServeRunError(RuntimeError):
    """The run asked for the project's server, which was started with settings the run does not have."""


def spark_mode() -> str:
    mode = settings.SPARK_MODE.value().lower()
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def spark_master_from_env() -> str:
    """``CDC_SPARK_MASTER``, the master of a session of the run's own (empty when unset): the one reading of
    the variable, for what runs outside a Dagster run; a run gets it from the Spark resource's field."""
    return settings.SPARK_MASTER.value()


def server_state_dir() -> Path:
    """Where the project's server records its pid, port and log."""
    return Path(settings.SPARK_SERVER_DIR.value()).resolve()


def connect_timeout() -> float:
    raw = settings.SPARK_CONNECT_TIMEOUT.value()
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{CONNECT_TIMEOUT_ENV}={raw!r}: expected seconds, e.g. 30") from None
    if value <= 0:
        raise ValueError(f"{CONNECT_TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


def resolve_spark_target(start_server: bool | None = None, master: str | None = None, spark_conf: str | None = None) -> SparkTarget:
    """The run's :class:`SparkTarget` from the environment (see the module's docstring).

    In ``server`` mode a server that is not running is started here (``start_server`` overrides whether);
    if it cannot start, the run falls back to a session of its own and the description says why.
    ``master`` and ``spark_conf`` stand for ``CDC_SPARK_MASTER`` and ``CDC_SPARK_CONF`` (the Spark resource
    passes its fields). Raises :class:`ServerCannotServeRunError` when the run asked for the project's
    server and that server cannot serve it.
    """
    from cdc_assets.engines import connect_server

    state = server_state_dir()
    run_env = _run_environment(master, spark_conf)
    remote = settings.SPARK_REMOTE.value()
    if remote:
        shown = connect_server.redacted_url(remote)
        project_server = _project_server_at(remote, state)
        if project_server is not None:
            why = _why_not_served(project_server, run_env)
            if why:
                raise ServerCannotServeRunError(
                    f"{settings.SPARK_REMOTE.name}={shown} names the project's warm Spark Connect server, which cannot serve this run: {why}. "
                    f"{_RESTART_HINT} Or unset {settings.SPARK_REMOTE.name}: the run then starts a session of its own."
                )
        return SparkTarget(REMOTE_MODE, remote, f"the Spark Connect server SPARK_REMOTE={shown}")
    mode = spark_mode()
    if mode == "local":
        return SparkTarget(mode, None, f"a Spark session of the run's own ({MODE_ENV}=local; the JVM starts cold)")

    master = settings.SPARK_MASTER.value(run_env)
    if mode == "auto" and master:
        return SparkTarget(mode, None, f"a Spark session of the run's own on the master {master}")

    handle = connect_server.running_server(state)
    if handle is not None and _accepts(handle.url):
        why = _why_not_served(handle, run_env)
        if why and mode == "server":
            raise ServerCannotServeRunError(
                f"{MODE_ENV}=server, and the project's Spark Connect server cannot serve this run: {why}. {_RESTART_HINT} "
                f"Or set {MODE_ENV}=auto: the run then starts a session of its own."
            )
        if why:
            return SparkTarget(mode, None, f"a Spark session of the run's own (cold): {why}: starting a session of its own", refusal=why)
        description = f"the project's warm Spark Connect server {handle.url} (pid {handle.pid})"
        return SparkTarget(mode, handle.client_url, description, handle.pid, handle.log_path, handle.url)
    if start_server if start_server is not None else mode == "server":
        port = connect_server.configured_port()
        try:
            handle = connect_server.start_server(port=port, state_dir=state, owner=settings.SPARK_SERVER_OWNER.value() or None)
        except (RuntimeError, TimeoutError, OSError) as error:
            return SparkTarget(mode, None, f"a Spark session of the run's own (cold): the project's Connect server on port {port} did not start: {error}")
        description = f"the project's Spark Connect server {handle.url} (pid {handle.pid}), started for this run"
        return SparkTarget(mode, handle.client_url, description, handle.pid, handle.log_path, handle.url)
    return SparkTarget(
        mode, None, f"a Spark session of the run's own (cold: no project Connect server running in {state}; `make ui` or `make spark-server` keeps one warm)"
    )


_RESTART_HINT = (
    "Restart the server with this run's settings (`make spark-server-stop`, then `make spark-server` in the shell the "
    "run's settings are in)."
)


def _run_environment(master: str | None, spark_conf: str | None) -> dict[str, str]:
    """This process's environment with the Spark resource's fields where it passed them."""
    env = dict(os.environ)
    if master is not None:
        env[settings.SPARK_MASTER.name] = master
    if spark_conf is not None:
        env[settings.SPARK_CONF.name] = spark_conf
    return env


def _why_not_served(handle, run_env: dict[str, str]) -> str | None:
    from cdc_assets.engines.server_settings import why_not_served

    return why_not_served(handle.state_dir, handle.url, run_env)


def _project_server_at(url: str, state: Path):
    """The project's server recorded in ``state`` if ``url`` (``SPARK_REMOTE``) addresses it, else None."""
    from cdc_assets.engines import connect_server

    host, port = _address(url)
    handle = connect_server.running_server(state)
    if handle is None or handle.port != port or host not in ("localhost", "127.0.0.1", "::1"):
        return None
    return handle


def connect_session(url: str, conf: dict[str, str]):
    """A Spark Connect session on ``url`` with ``conf`` as session conf, giving up on a dead server in time.

    The retry policy is set before the first call to the server, so even the first one is bounded.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    _fail_if_nothing_listens(url)
    # pyspark's hints make `builder` a property, and a Connect session's client unknown to SparkSession.
    session: Any = SparkSession.builder.remote(url).getOrCreate()  # type: ignore[operator]
    session.client.set_retry_policies([bounded_retry_policy(DefaultPolicy, connect_timeout())])
    for key, value in conf.items():
        session.conf.set(key, value)
    return session


def bounded_retry_policy(policy_class, timeout: float):
    """``policy_class`` (pyspark's ``DefaultPolicy``) with as many retries as fit in about ``timeout`` s.

    pyspark's default is 15 retries with a backoff growing x4 from 50 ms up to 60 s: ten minutes of waiting
    on a server that is gone. Here the backoff stops growing at 5 s.
    """
    initial, multiplier, ceiling = 50.0, 4.0, 5000.0
    waited, backoff, retries = 0.0, initial, 0
    while waited < timeout * 1000:
        waited += min(backoff, ceiling)
        backoff *= multiplier
        retries += 1
    return policy_class(max_retries=retries, initial_backoff=int(initial), backoff_multiplier=multiplier, max_backoff=int(ceiling))


def server_is_gone(target: SparkTarget) -> bool:
    """Whether the run's server no longer answers: its process is dead, or nothing listens on its port."""
    if target.url is None:  # a session of the run's own
        return False
    if target.server_pid is not None:
        from cdc_assets.engines.process import process_alive

        if not process_alive(target.server_pid):
            return True
    return not _accepts(target.url)


def gone_message(target: SparkTarget) -> str:
    how = (
        "The next run starts a new server (under `make ui`, or with CDC_SPARK=server); otherwise start one with "
        "`make spark-server`, or run without a server with CDC_SPARK=local."
    )
    pid = f" (pid {target.server_pid})" if target.server_pid is not None else ""
    log = ""
    if target.server_log is not None:
        from cdc_assets.engines.process import log_tail

        log = f"\nIts log, {target.server_log}, ends:\n{log_tail(target.server_log, 15)}"
    return (
        f"The Spark Connect server {target.display_url}{pid} died or stopped answering during this run, so the run failed. "
        f"Nothing was committed half-way: a date's outputs are stored only by a completed commit. {how}{log}"
    )


@contextmanager
def explain_server_loss(target: SparkTarget | None) -> Iterator[None]:
    """Turn any failure while the run's Connect server is gone into :class:`SparkServerGoneError`."""
    try:
        yield
    except SparkServerGoneError:
        raise
    except Exception as error:
        if target is not None and server_is_gone(target):
            raise SparkServerGoneError(gone_message(target)) from error
        raise


def _address(url: str) -> tuple[str, int]:
    parsed = urlparse(url.split(";", 1)[0])
    return parsed.hostname or "localhost", parsed.port or 15002


def _accepts(url: str, timeout: float = 2.0) -> bool:
    host, port = _address(url)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _fail_if_nothing_listens(url: str) -> None:
    if not _accepts(url, timeout=5.0):
        host, port = _address(url)
        from cdc_assets.engines.connect_server import redacted_url

        raise SparkServerGoneError(
            f"No Spark Connect server answers at {redacted_url(url)} (nothing accepts connections on {host}:{port}). Start one with "
            "`make spark-server` (or `make ui`), point SPARK_REMOTE at a running one, or run with CDC_SPARK=local."
        )
