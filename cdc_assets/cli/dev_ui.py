"""``make ui``: ``dagster dev`` with every table's pool in place, Spark kept warm for every run it launches,
and Ctrl-C and SIGTERM working however it was started.

Warm Spark. Unless ``CDC_SPARK=local`` or ``SPARK_REMOTE`` says otherwise, ``make ui`` starts the project's
Spark Connect server (resources/session/spark_target.py; pid, port and log in ``CDC_SPARK_SERVER_DIR``,
``.spark-server/``) or reuses the one ``make spark-server`` left running, and every run it launches (from
the UI, the daemon's schedules and sensors, backfills) goes through it with ``CDC_SPARK=server``: a run
that finds the server dead starts a new one. When ``make ui`` stops, it stops the server it or its runs
started, and leaves alone one it found running. A server found running that was started with other settings
than the UI's (:mod:`cdc_assets.engines.server_settings`: the lake's keys, ``CDC_SPARK_CONF``, ...) is not
used: ``make ui`` says why, and each run starts a session of its own.

Pools. Each table's runs share the pool ``cdc_<table>`` (limit 1 from instance/dagster.yaml). Dagster
1.13.27 creates a pool's limit row on the daemon's first pass over it, after it has read the known
pools, so two queued runs of a table the instance has never seen could start together (found by
benchmarks/many_tables.py). Creating each table's limit before the daemon starts closes that gap;
a limit someone already set (``dagster instance concurrency set``) is left as it is.

Signals. A shell script that starts ``make ui &`` hands it SIGINT ignored (POSIX: a non-interactive
shell's background jobs ignore SIGINT and SIGQUIT). An ignored SIGINT survives ``exec``, so ``dagster dev``
would inherit it, and because it maps SIGTERM onto whatever SIGINT does, it then ignores SIGTERM too:
neither Ctrl-C, ``kill <pid>``, nor the SIGTERM that make passes on to its recipe would stop it. This
module runs ``dagster dev`` as its child, in a process group of its own, with both signals at their
defaults, and passes each signal it gets on to it: SIGINT to the child's group (what Ctrl-C does in a
terminal), SIGTERM to ``dagster dev`` itself (what make does); ``dagster dev`` then shuts its webserver,
daemon and code servers down. Only then does this module stop the Spark server.

    python -m cdc_assets.cli.dev_ui [dagster dev arguments]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_assets.model.file_modes import apply_umask
from cdc_assets.model import settings

if TYPE_CHECKING:
    from dagster import DagsterInstance


def create_table_pools(instance: DagsterInstance | None = None) -> list[str]:
    """Each configured table's pool limit at the instance default, unless it exists; the pools created.

    ``instance`` defaults to ``DagsterInstance.get()`` (``DAGSTER_HOME``); the tables are those of
    ``CDC_TABLE_CONFIGS``.

    Nothing here may keep the UI from starting: a table config that does not load is reported by the
    code location in the UI itself, and an instance without pool support just has no pools to create.
    """
    from cdc_assets.model.config import TableConfigError, load_table_configs
    from cdc_assets.model.names import pool_name

    try:
        configs = load_table_configs()
    except TableConfigError as error:
        print(f"dev_ui: no table pools created, the table configs do not load: {error}", file=sys.stderr)
        return []
    pools = [pool_name(config) for config in configs]
    if instance is None:
        from dagster import DagsterInstance

        with DagsterInstance.get() as owned:
            return _create_missing_pools(owned, pools)
    return _create_missing_pools(instance, pools)


def _create_missing_pools(instance: DagsterInstance, pools: list[str]) -> list[str]:
    storage = instance.event_log_storage
    known = storage.get_concurrency_keys()
    return [pool for pool in pools if pool not in known and storage.initialize_concurrency_limit_to_default(pool)]


def _say(message: str) -> None:
    print(f"dev_ui: {message}", file=sys.stderr, flush=True)


class WarmSpark:
    """The project's Connect server for the runs ``make ui`` launches, and the environment that sends them there."""

    def __init__(self) -> None:
        from resources.session.spark_target import MODE_ENV, OWNER_ENV, SERVER_DIR_ENV, server_state_dir, spark_mode

        self.owner = f"make ui (pid {os.getpid()})"
        self.state = server_state_dir()
        self.env = dict(os.environ)
        self.enabled = False
        if settings.SPARK_REMOTE.is_set():
            _say(f"runs use SPARK_REMOTE={settings.SPARK_REMOTE.value()}; no project Spark server started")
        elif spark_mode() == "local":
            _say("CDC_SPARK=local: each run starts a Spark session of its own (cold)")
        elif (why := self._running_server_refuses()) is not None:
            # Not sent to a server started for other settings (the lake's keys, CDC_SPARK_CONF, ...): each
            # run then starts a session of its own and its log says why; nothing fails for it.
            self.env.setdefault(MODE_ENV, "auto")
            _say(f"runs start Spark sessions of their own (cold): {why}")
        else:
            self.enabled = True
            self.env.update({MODE_ENV: "server", SERVER_DIR_ENV: str(self.state), OWNER_ENV: self.owner})
        self._starting: threading.Thread | None = None

    def _running_server_refuses(self) -> str | None:
        """Why the server already running in the state folder cannot serve this UI's runs, or None."""
        from cdc_assets.engines import connect_server
        from cdc_assets.engines.server_settings import why_not_served

        running = connect_server.running_server(self.state)
        return None if running is None else why_not_served(running.state_dir, running.url)

    def start(self) -> None:
        """Start (or find) the server in the background: the UI comes up meanwhile, and a run waits for it."""
        if self.enabled:
            self._starting = threading.Thread(target=self._start, name="spark-server", daemon=True)
            self._starting.start()

    def _start(self) -> None:
        from cdc_assets.engines import connect_server

        already = connect_server.running_server(self.state)
        try:
            handle = connect_server.start_server(port=connect_server.configured_port(), state_dir=self.state, owner=self.owner)
        except (RuntimeError, TimeoutError, OSError) as error:
            _say(f"the Spark Connect server did not start ({error}); each run tries again, else runs cold on its own")
            return
        if already is not None and already.pid == handle.pid and self._orphaned(connect_server.server_owner(self.state)):
            # Left running by a make ui that was killed (SIGKILL gives it no chance to stop it): ours now.
            connect_server.record_owner(self.state, self.owner)
            _say(f"runs use the Spark Connect server a stopped make ui left running at {handle.url} (pid {handle.pid}); it stops with this UI")
        elif already is not None and already.pid == handle.pid:
            _say(f"runs use the Spark Connect server already running at {handle.url} (pid {handle.pid}); it keeps running after the UI stops")
        else:
            _say(f"Spark Connect server ready at {handle.url} (pid {handle.pid}, log {handle.log_path}): every run goes through it, warm")

    @staticmethod
    def _orphaned(owner: str | None) -> bool:
        """Whether ``owner`` names a ``make ui`` whose process is gone."""
        from cdc_assets.engines.process import process_alive

        if not owner or not owner.startswith("make ui (pid ") or not owner.endswith(")"):
            return False
        try:
            return not process_alive(int(owner[len("make ui (pid ") : -1]))
        except ValueError:
            return False

    def stop(self) -> None:
        """Stop the server if this ``make ui`` or one of its runs started it."""
        if not self.enabled:
            return
        if self._starting is not None:
            self._starting.join(timeout=180)
        from cdc_assets.engines import connect_server

        if connect_server.server_owner(self.state) == self.owner and connect_server.stop_server(self.state):
            _say("stopped the Spark Connect server it started")


def main(argv: list[str] | None = None) -> None:
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
    args = sys.argv[1:] if argv is None else argv
    created = create_table_pools()
    if created:
        _say(f"created pool limits for {', '.join(created)}")
    spark = WarmSpark()
    spark.start()
    dagster = Path(sys.executable).parent / "dagster"
    child: subprocess.Popen | None = None

    def pass_on(signum: int, _frame) -> None:
        if child is None:
            raise KeyboardInterrupt
        try:
            if signum == signal.SIGINT:
                os.killpg(child.pid, signal.SIGINT)
            else:
                child.send_signal(signum)
        except ProcessLookupError:
            pass

    # Handlers, not SIG_IGN: the child starts with both signals at their defaults (exec resets handlers,
    # but would keep an ignored signal ignored).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, pass_on)
    code = 1
    try:
        child = subprocess.Popen([str(dagster), "dev", *args], env=spark.env, process_group=0)
        code = child.wait()
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            child.wait()
        spark.stop()
    sys.exit(code)


if __name__ == "__main__":
    main()
