"""Trino on loopback, read-only, over the warehouse's Iceberg catalog: how a Trino user reads the outputs
(docs/consumers.md).

    python -m cdc_assets.cli.trino_server start [--state-dir D] [--port N]
    python -m cdc_assets.cli.trino_server status|stop [--state-dir D]
    python -m cdc_assets.cli.trino_server sql "QUERY" [--state-dir D]   # the pinned CLI, CSV rows

The server and its CLI are Maven Central's ``io.trino:trino-server`` (the tarball) and ``trino-cli``
(the executable jar), pinned and sha256-checked by ``make trino-install`` into ``.trino/`` (ignored by
git), the server unpacked with its Iceberg plugin only and the project's SQLite JDBC driver in that
plugin's folder (in ``lib/`` the catalog is silently not loaded). Trino 476 does not run on Java 17:
:func:`java_home` finds a Java 24 or later (``CDC_TRINO_JAVA_HOME``, else the newest under
``/usr/lib/jvm``) or names what to set.

What it serves: one catalog, ``lake``, the warehouse of the project's settings (``CDC_WAREHOUSE``): its
embedded JDBC catalog (the SQLite file), or the REST catalog of a lake (``CDC_CATALOG_URI``, signed with
SigV4 as the project signs it, the objects through Trino's native S3 with ``CDC_S3_ENDPOINT``), with
``iceberg.security=read_only`` (Trino refuses every write and DDL). It listens on 127.0.0.1 only
(``node.bind-ip``), on a port chosen free unless given,
with a small heap. The generated ``etc/`` is in the state folder (default ``~/.local/state/cdc_assets/trino``,
``CDC_TRINO_DIR``), 0700; it holds no secret: a lake's keys are ``${ENV:AWS_ACCESS_KEY_ID}`` and
``${ENV:AWS_SECRET_ACCESS_KEY}``, which Trino reads from its environment. No Dagster or Spark import.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from cdc_assets.engines.process import (
    HOST,
    free_port,
    log_tail,
    port_is_free,
    read_number_file,
    recorded_pid,
    start_detached,
    stop_group,
    wait_for_port,
    write_number_file,
)
from cdc_assets.model import settings
from cdc_assets.model.file_modes import apply_umask
from resources.storage import warehouse_root
from resources.storage.lake import CATALOG_NAME, LakeCatalog, catalog_file
from resources.storage.object_store import DEFAULT_REGION

REPO = Path(__file__).resolve().parents[2]
# What `make trino-install` unpacks (the Makefile pins the version and the sha256 of both files).
TRINO_VERSION = "476"
INSTALL_DIR = REPO / ".trino"
SERVER_HOME = INSTALL_DIR / f"trino-server-{TRINO_VERSION}"
CLI_JAR = INSTALL_DIR / f"trino-cli-{TRINO_VERSION}-executable.jar"
# Trino 476's launcher refuses an older Java.
MIN_JAVA = 24
PID_FILE = "trino.pid"
PORT_FILE = "trino.port"
LOG_FILE = "server.log"
# The server's main class: what a live pid in the pid file must be running to be ours.
MAIN_CLASS = "io.trino.server.TrinoServer"
START_TIMEOUT = 300.0


class TrinoSetupError(RuntimeError):
    """Trino cannot start here: not installed, no suitable Java, or a warehouse it cannot serve yet."""


class TrinoQueryError(RuntimeError):
    """A query the server refused or failed (its message, e.g. ``Access Denied: Cannot delete from table ...``)."""


def default_state_dir() -> Path:
    configured = settings.TRINO_DIR.value()
    return Path(configured) if configured else Path.home() / ".local" / "state" / "cdc_assets" / "trino"


def java_home() -> Path:
    """A Java home whose ``bin/java`` is version :data:`MIN_JAVA` or later: ``CDC_TRINO_JAVA_HOME``, else the
    newest such JDK under ``/usr/lib/jvm``. Raises :class:`TrinoSetupError` naming what to set."""
    configured = settings.TRINO_JAVA_HOME.value()
    candidates = [Path(configured)] if configured else sorted(Path("/usr/lib/jvm").glob("*"), key=_java_version, reverse=True)
    for home in candidates:
        if _java_version(home) >= MIN_JAVA:
            return home
    where = f"{settings.TRINO_JAVA_HOME.name}={configured} is" if configured else "no JDK under /usr/lib/jvm is"
    raise TrinoSetupError(f"Trino {TRINO_VERSION} needs Java {MIN_JAVA} or later and {where} one: set {settings.TRINO_JAVA_HOME.name} to such a JDK's home")


def _java_version(home: Path) -> int:
    """The feature version of ``home``'s Java from its ``release`` file (0 when it has none)."""
    try:
        release = (home / "release").read_text()
    except OSError:
        return 0
    found = re.search(r'^JAVA_VERSION="(\d+)', release, re.MULTILINE)
    return int(found.group(1)) if found else 0


def catalog_properties(catalog: LakeCatalog) -> dict[str, str]:
    """``etc/catalog/lake.properties`` for the warehouse's catalog, read-only: the embedded one (its SQLite file
    in a local warehouse) or a REST catalog over object storage, signed as the project signs it. No secret is
    written: the keys are Trino's ``${ENV:...}`` references to the server's environment."""
    common = {
        "connector.name": "iceberg",
        # Readers never write: INSERT, DELETE, UPDATE, MERGE and DDL are refused ("Access Denied").
        "iceberg.security": "read_only",
    }
    if catalog.embedded:
        root = Path(catalog.root).resolve()
        return {
            **common,
            "iceberg.catalog.type": "jdbc",
            "iceberg.jdbc-catalog.driver-class": "org.sqlite.JDBC",
            "iceberg.jdbc-catalog.connection-url": f"jdbc:sqlite:{catalog_file(str(root))}",
            # The catalog's name inside the SQLite file: any other reads as an empty catalog, without an error.
            "iceberg.jdbc-catalog.catalog-name": CATALOG_NAME,
            "iceberg.jdbc-catalog.default-warehouse-dir": f"file://{root}",
            # The tables' files are local paths (file:///...).
            "fs.native-local.enabled": "true",
            "local.location": "/",
        }
    missing = [setting.name for setting in (settings.ACCESS_KEY, settings.SECRET_KEY) if not setting.value()]
    if missing:
        raise TrinoSetupError(f"the REST catalog {catalog.uri} needs the lake's keys in {' and '.join(missing)} (eval \"$(make -s lake-env)\")")
    store = catalog.store
    properties = {
        **common,
        "iceberg.catalog.type": "rest",
        "iceberg.rest-catalog.uri": catalog.uri,
        "iceberg.rest-catalog.warehouse": catalog.warehouse,
        "fs.native-s3.enabled": "true",
        "s3.region": store.region or DEFAULT_REGION,
        # Substituted by Trino from its own environment when it starts: the file holds the variables' names only.
        "s3.aws-access-key": f"${{ENV:{settings.ACCESS_KEY.name}}}",
        "s3.aws-secret-key": f"${{ENV:{settings.SECRET_KEY.name}}}",
    }
    if catalog.signing_name:
        # SigV4 on the catalog's requests too, with the S3 keys and region (SeaweedFS and S3 Tables: s3tables).
        properties.update({"iceberg.rest-catalog.sigv4-enabled": "true", "iceberg.rest-catalog.signing-name": catalog.signing_name})
    if store.endpoint:
        properties.update({"s3.endpoint": store.endpoint, "s3.path-style-access": "true"})
    return properties


def server_files(port: int, state_dir: Path, catalog: LakeCatalog) -> dict[str, str]:
    """The ``etc/`` files (relative path -> text) of a single-node server on 127.0.0.1:``port``."""
    properties = catalog_properties(catalog)
    return {
        "node.properties": _properties({
            "node.environment": "cdc",
            "node.id": "cdc-trino",
            "node.data-dir": str(state_dir / "data"),
            # Listen on loopback only (Trino binds every interface otherwise).
            "node.bind-ip": HOST,
            "node.internal-address": HOST,
        }),
        "config.properties": _properties({
            "coordinator": "true",
            "node-scheduler.include-coordinator": "true",
            "http-server.http.port": str(port),
            "discovery.uri": f"http://{HOST}:{port}",
            "query.max-memory": "512MB",
            "query.max-memory-per-node": "512MB",
        }),
        "jvm.config": "\n".join(["-server", "-Xmx1G", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-Djdk.attach.allowAttachSelf=true"]) + "\n",
        "log.properties": "io.trino=WARN\n",
        f"catalog/{CATALOG_NAME}.properties": _properties(properties),
    }


def _properties(values: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in values.items())


def start(state_dir: Path, catalog: LakeCatalog, port: int | None = None, timeout: float = START_TIMEOUT) -> int:
    """Start the server (unless it runs) and wait until it answers; returns its port."""
    running = recorded_pid(state_dir / PID_FILE, MAIN_CLASS)
    if running is not None:
        recorded = read_number_file(state_dir / PORT_FILE)
        if recorded is not None:
            return recorded
    if not (SERVER_HOME / "bin" / "launcher").exists() or not CLI_JAR.exists():
        raise TrinoSetupError(f"Trino {TRINO_VERSION} is not installed in {INSTALL_DIR}: run make trino-install")
    java = java_home()
    port = port or free_port()
    if not port_is_free(port):
        raise TrinoSetupError(f"port {port} on {HOST} is taken: give another (--port) or leave it out for a free one")
    apply_umask()
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)
    for name, text in server_files(port, state_dir, catalog).items():
        path = state_dir / "etc" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {**os.environ, "JAVA_HOME": str(java), "PATH": f"{java / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [str(SERVER_HOME / "bin" / "launcher"), "run", f"--etc-dir={state_dir / 'etc'}"]
    pid = start_detached(command, state_dir / LOG_FILE, env, cwd=state_dir)
    write_number_file(state_dir / PID_FILE, pid)
    write_number_file(state_dir / PORT_FILE, port)
    if not wait_for_port(port, timeout) or not _answers(state_dir, port):
        stop_group(pid)
        raise TrinoSetupError(f"Trino did not start on {HOST}:{port} within {timeout:.0f} s:\n{log_tail(state_dir / LOG_FILE)}")
    return port


def _answers(state_dir: Path, port: int, attempts: int = 120) -> bool:
    """Whether the server runs queries: the port opens before the catalogs are loaded."""
    for _ in range(attempts):
        done = sql("SELECT 1", state_dir, port, check=False)
        if done.returncode == 0 and done.stdout.strip() == '"1"':
            return True
        time.sleep(1)
    return False


def stop(state_dir: Path) -> bool:
    """Stop the server; whether one was running."""
    pid = recorded_pid(state_dir / PID_FILE, MAIN_CLASS)
    if pid is None:
        return False
    stop_group(pid)
    (state_dir / PID_FILE).unlink(missing_ok=True)
    return True


def sql(query: str, state_dir: Path, port: int | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``query`` with the pinned CLI (CSV output, quoted); raises on a failed query unless ``check`` is off."""
    port = port or read_number_file(state_dir / PORT_FILE)
    if port is None:
        raise TrinoSetupError(f"no Trino server recorded in {state_dir}: start it first (make trino-up)")
    # No terminal and no native-access warnings: the CLI's stderr is then its error alone.
    java = [str(java_home() / "bin" / "java"), "--enable-native-access=ALL-UNNAMED", "-Dorg.jline.terminal.type=dumb", "-Dorg.jline.terminal.dumb=true"]
    command = [*java, "-jar", str(CLI_JAR), "--server", f"http://{HOST}:{port}", "--catalog", CATALOG_NAME, "--output-format", "CSV", "--execute", query]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if check and done.returncode != 0:
        raise TrinoQueryError(done.stderr.strip()[-2000:])
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.cli.trino_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status", "sql"])
    parser.add_argument("query", nargs="?", help="with sql: the query")
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    state_dir = args.state_dir or default_state_dir()
    try:
        if args.action == "start":
            port = start(state_dir, LakeCatalog.from_environment(warehouse_root()), args.port)
            print(f"trino: http://{HOST}:{port} (catalog {CATALOG_NAME}, read-only); CLI: {CLI_JAR}")
        elif args.action == "stop":
            print("trino: stopped" if stop(state_dir) else "trino: not running", file=sys.stderr)
        elif args.action == "status":
            pid = recorded_pid(state_dir / PID_FILE, MAIN_CLASS)
            print(f"trino: running, pid {pid}, port {read_number_file(state_dir / PORT_FILE)}" if pid else "trino: not running")
        else:
            if not args.query:
                parser.error("sql needs a query")
            print(sql(args.query, state_dir).stdout, end="")
    except TrinoSetupError as error:
        print(f"trino: {error}", file=sys.stderr)
        return 2
    except TrinoQueryError as error:
        print(f"trino: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
