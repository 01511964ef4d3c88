"""The processes that hold the SQL catalog: spark-sql (``cdc-catalog sql``, ``make sql``) or the SQL server,
a Spark Thrift server on 127.0.0.1 (``cdc-catalog server``, ``make sql-server``) that beeline and JDBC
clients query; and the lock that lets only one of them open the metastore at a time.

**One writer, and no writer in the runs.** Spark's embedded Derby metastore admits one JVM at a time,
and a pipeline run is a JVM of its own (several at once when tables run side by side). So runs never
open the metastore: it holds only views over the warehouse's Iceberg tables (``lake.<table>.<asset>``,
:mod:`cdc_assets.usecases.catalog_ddl`), and each query reads the snapshot a run committed last. Every catalog
session opens ``lake`` on the warehouse, with Iceberg's table cache off, so that a commit is seen by the
next query (:func:`catalog_conf`). Only the process that holds the catalog writes definitions:
``cdc-catalog sql`` (spark-sql) for as long as it runs, or the SQL server, which then syncs for every
other client, ``make sql`` included. A per-catalog lock file, held by that process (:func:`hold_catalog`),
makes a second opener fail with a message naming the holder instead of Derby's. A table whose first date
was committed after the holder synced appears at the next sync (``cdc-catalog sync`` asks a running
server to sync).

**No name goes missing while the SQL server serves.** The catalog is synced before the server starts,
by this module under spark-submit in a JVM of its own that holds the metastore until it exits
(:func:`first_sync`), so the first client finds every name. The server is then Spark's own Thrift server
(``HiveThriftServer2`` under spark-submit, no Python driver), with Spark Connect as a plugin in the same
JVM on a second loopback port. Later syncs (:func:`request_sync`, ``cdc-catalog sync``) run through that
Connect session, in the JVM that holds the metastore, one at a time, and change objects in place
(:func:`~cdc_assets.usecases.catalog_ddl.sync_in_place`) rather than dropping them. spark-sql, which holds the
metastore alone, defines them afresh (:func:`~cdc_assets.usecases.catalog_ddl.sync_statements`).

**It only reads.** Every client of the Thrift port logs in with the password in the server's
``password`` file (mode 0600, generated at the first start; Thrift's ``CUSTOM`` authentication,
``cdc.sqlserver.PasswordFileAuthenticator``), and every statement it sends is checked before it runs by
the read-only rule (``cdc.sqlserver.ReadOnlyExtension``, a Spark SQL extension): only queries of named
tables and views, SHOW, DESCRIBE, EXPLAIN, USE and a few SETs run; DDL, DML, ``TRANSFORM ... USING``,
``ADD JAR``, functions, reflection and file paths are refused. Both are Java, in ``java/sql-server/``,
built by ``make install`` into ``.build/sql-server.jar`` (:func:`server_jar`). The Connect port, the
syncs' way in, asks for a token made at each start (``spark.connect.authenticate.token``, in the 0600
conf and ``connect.token``); a session that presents it to the read-only rule as well
(``spark.cdc.sql.writerToken``) is the one that may write the catalog's definitions. The server's
environment holds no secret (:func:`server_env`): keys are in its 0600 conf, which ``SET`` shows redacted.

**Its state is outside the warehouse**, in ``CDC_SQL_SERVER_DIR`` (default
``~/.local/state/cdc_assets/sql-server/<catalog>``, :func:`server_state_dir`), a 0700 folder whose files
are 0600: the password, pid, ports, conf (``server.properties``), the logs (``server.log``, ``sync.log``,
query texts never logged at INFO: ``log4j2.properties``) and the JVM's temporary files (``tmp/``). The
process handling is :mod:`cdc_assets.engines.process`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from cdc_assets.model import settings
from cdc_assets.usecases.catalog_ddl import catalog_database, catalog_dir, sync_in_place, sync_statements, write_sync_file
from cdc_assets.model.config import TABLE_CONFIGS_ENV, TableConfigError, load_table_configs, table_configs_dir
from cdc_assets.engines.iceberg_runtime import with_iceberg_runtime
from cdc_assets.engines.process import (
    HOST,
    command_line,
    free_port,
    log_tail,
    port_is_free,
    process_alive,
    read_number_file,
    recorded_pid,
    start_detached,
    stop_group,
    wait_for_port,
    write_number_file,
)
from cdc_assets.engines.spark_conf import LOCAL_DEFAULTS, LOOPBACK_DEFAULTS, NO_UI, PIPELINE_DEFAULTS, file_mode_conf, spark_conf_from_env
from cdc_assets.engines.spark_home import launcher, spark_env, write_properties_file
from resources.storage import WAREHOUSE_ENV, WarehouseStorage, warehouse_root
from resources.storage.lake import CATALOG_NAME, LakeCatalog
from resources.storage.object_store import is_object_store

SQL_PORT_ENV = settings.SQL_PORT.name
DEFAULT_SQL_PORT = int(settings.SQL_PORT.default)
# The SQL server's application name, also how its process is recognized.
SERVER_NAME = "cdc_assets SQL server"
# The server is Spark's own Thrift server; the syncs reach its JVM through Spark Connect, a plugin there.
THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
FIRST_SYNC_NAME = "cdc_assets SQL server: first sync"
LOCK_FILE = "catalog.lock"
PID_FILE = "server.pid"
PORT_FILE = "server.port"
CONNECT_PORT_FILE = "connect.port"  # the server's Spark Connect port, on 127.0.0.1
LOG_FILE = "server.log"
PROPERTIES_FILE = "server.properties"  # the server's conf, mode 0600
PASSWORD_FILE = "password"  # the Thrift clients' password, mode 0600, kept across starts
CONNECT_TOKEN_FILE = "connect.token"  # the Connect port's token, mode 0600, new at each start
CATALOG_FILE = "catalog"  # the catalog folder this state belongs to
LOG4J_FILE = "log4j2.properties"
TMP_FOLDER = "tmp"  # the server JVM's java.io.tmpdir and spark.local.dir
# The read-only rule and the password check, built from java/sql-server/ by `make install`.
REPO = Path(__file__).resolve().parent.parent.parent
JAVA_SOURCES = REPO / "java" / "sql-server"
SERVER_JAR = REPO / ".build" / "sql-server.jar"
READ_ONLY_EXTENSION = "cdc.sqlserver.ReadOnlyExtension"
PASSWORD_AUTHENTICATOR = "cdc.sqlserver.PasswordFileAuthenticator"
PASSWORD_FILE_KEY = "cdc.sql.server.passwordFile"  # the system property that names it to the password check
# What the read-only rule reads: the Connect session's claim to be the writer, and the catalog it reads.
WRITER_TOKEN_KEY = "spark.cdc.sql.writerToken"
CONNECT_TOKEN_KEY = "spark.connect.authenticate.token"
# Redacted wherever Spark shows conf (SET, SET -v): Spark's default, and Iceberg's "-key" names.
REDACTION_REGEX = r"(?i)secret|password|token|access[.-]?key|session[.-]?token"
# The server's environment: what a JVM and Spark's launcher need, and nothing a query could use.
_SERVER_ENV_KEYS = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "JAVA_HOME", "SPARK_HOME", "SPARK_LOCAL_IP",
                    "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "SPARK_SCALA_VERSION")  # fmt: skip
SYNC_PROPERTIES_FILE = "first-sync.properties"  # the first sync's conf, mode 0600, while it runs
# What the first sync left, written before the server starts; the syncs' output; one sync at a time.
STARTED_FILE = "started.json"
SYNC_LOG_FILE = "sync.log"
SYNC_LOCK_FILE = "sync.lock"
BEELINE_ATTEMPTS = 3
# Rejections after which beeline ran nothing, and those a single statement may not meet a second time.
_REJECTED_CONNECTION = re.compile(r"Could not open client transport|Connection refused|Invalid SessionHandle", re.IGNORECASE)
_REJECTED_STATEMENT = re.compile(
    r"Invalid OperationHandle|FileNotFoundException|FAILED_READ_FILE|PATH_NOT_FOUND|File does not exist", re.IGNORECASE
)


class CatalogBusy(RuntimeError):
    """Another process holds the catalog's Derby metastore."""


# -- the server's own folder, outside the warehouse ------------------------------------------------


def server_state_dir(location: Path) -> Path:
    """``CDC_SQL_SERVER_DIR``, else ``~/.local/state/cdc_assets/sql-server/<catalog>``: the folder of the SQL
    server of the catalog at ``location`` (mode 0700, created). Not in the warehouse, which others may be
    given to read, and not in the catalog folder beside it: the server's logs and password stay its owner's."""
    configured = settings.SQL_SERVER_DIR.value()
    if configured:
        state = Path(os.path.abspath(configured))
    else:
        digest = hashlib.sha256(str(location).encode()).hexdigest()[:12]
        state = Path.home() / ".local" / "state" / "cdc_assets" / "sql-server" / f"{location.parent.name or 'root'}-{digest}"
    _private_dir(state)
    return state


def _private_dir(path: Path) -> Path:
    """``path`` and the parents it needs, each one created 0700; ``path`` itself made 0700."""
    missing = [parent for parent in (path, *path.parents) if not parent.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _private_file(path: Path, text: str | None = None) -> Path:
    """``path`` as a file only its owner reads (0600), written with ``text`` when given, else created empty
    if missing (a log a child process then opens keeps the mode)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if text is not None else 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
        if text is not None:
            os.write(fd, text.encode())
    finally:
        os.close(fd)
    return path


@contextlib.contextmanager
def _owner_only_files():
    """Every file and folder this process and the processes it starts meanwhile create is its owner's
    only (umask 077): the server JVM's logs, temporary files and metastore files included."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def password_file(state: Path) -> Path:
    """The Thrift clients' password (mode 0600): generated at the first start, kept across restarts."""
    path = state / PASSWORD_FILE
    if not path.exists() or not path.read_text().strip():
        _private_file(path, secrets.token_urlsafe(24))
    os.chmod(path, 0o600)
    return path


def server_jar() -> Path:
    """The read-only rule's and the password check's jar, which ``make install`` builds from
    ``java/sql-server/``; raises ``RuntimeError`` when it is missing or older than its sources."""
    sources = sorted(JAVA_SOURCES.rglob("*.java"))
    if not SERVER_JAR.exists():
        raise RuntimeError(f"the SQL server's jar {SERVER_JAR} is missing: run `make install` (it compiles {JAVA_SOURCES} with javac)")
    if sources and max(source.stat().st_mtime for source in sources) > SERVER_JAR.stat().st_mtime:
        raise RuntimeError(f"the SQL server's jar {SERVER_JAR} is older than {JAVA_SOURCES}: run `make install` to rebuild it")
    return SERVER_JAR


def server_env() -> dict[str, str]:
    """The SQL server's environment: :func:`spark_env` cut to what the JVM and Spark's launcher need.
    No key, token or ``CDC_SPARK_CONF`` (which may hold credentials): they are in the 0600 conf."""
    return {key: value for key, value in spark_env().items() if key in _SERVER_ENV_KEYS or key.startswith("LC_")}


def credentials_conf(root: str, lake: LakeCatalog) -> dict[str, str]:
    """The S3 keys of this process's environment as the server's conf, for a warehouse in a bucket or a REST
    catalog: S3A's (``fs.s3a.*``), Iceberg's S3FileIO's (``s3.*``) and the REST catalog's signer's
    (``rest.*``). In the 0600 conf file, never in the server's environment; Spark shows them redacted."""
    key, secret, token = settings.ACCESS_KEY.value(), settings.SECRET_KEY.value(), settings.SESSION_TOKEN.value()
    if not (key and secret) or (lake.embedded and not is_object_store(root)):
        return {}
    prefix = f"spark.sql.catalog.{CATALOG_NAME}"
    conf = {
        "spark.hadoop.fs.s3a.access.key": key, "spark.hadoop.fs.s3a.secret.key": secret,
        f"{prefix}.s3.access-key-id": key, f"{prefix}.s3.secret-access-key": secret,
        f"{prefix}.rest.access-key-id": key, f"{prefix}.rest.secret-access-key": secret,
    }  # fmt: skip
    if token:
        conf.update({"spark.hadoop.fs.s3a.session.token": token, f"{prefix}.s3.session-token": token, f"{prefix}.rest.session-token": token})
    return conf


# The server's log4j2 conf: warnings and errors, and the server's start and stop. Never a statement's text:
# the operations that run statements log each one at INFO ("Submitting query ..."), and a failed one's
# error, often with its text, at WARN/ERROR (the client is told the error all the same).
LOG4J_CONF = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.started.name = org.apache.spark.sql.hive.thriftserver.HiveThriftServer2
logger.started.level = info
logger.statements.name = org.apache.spark.sql.hive.thriftserver.SparkExecuteStatementOperation
logger.statements.level = off
logger.operations.name = org.apache.spark.sql.hive.thriftserver.SparkSQLOperationManager
logger.operations.level = off
logger.thriftcli.name = org.apache.hive.service.cli
logger.thriftcli.level = error
logger.connect.name = org.apache.spark.sql.connect
logger.connect.level = error
"""


def catalog_conf(location: Path, root: str) -> dict[str, str]:
    """Spark conf of a session on the catalog at ``location`` (spark-sql, the Thrift server) over the
    warehouse under ``root``: the Hive metastore, the Iceberg runtime, and ``lake`` opened on the warehouse."""

    # Hadoop's writes ignore the process's umask: file_mode_conf gives them CDC_UMASK (docs/operations.md, File modes).
    conf = {**PIPELINE_DEFAULTS, **LOOPBACK_DEFAULTS, **file_mode_conf()}
    master = settings.SPARK_MASTER.value() or "local[*]"
    conf["spark.master"] = master
    if master.startswith("local"):
        conf.update(LOCAL_DEFAULTS)
    conf.update(spark_conf_from_env())
    conf = with_iceberg_runtime(conf)
    lake = LakeCatalog.from_environment(root)
    conf.update(
        {
            "spark.sql.catalogImplementation": "hive",
            "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={location}/metastore_db;create=true",
            # Managed tables a user creates in the catalog; the pipeline's tables are in lake.
            "spark.sql.warehouse.dir": str(location / "spark-warehouse"),
            # The runs log's files are listed again a second after a query listed them (runs add files).
            "spark.sql.metadataCacheTTLSeconds": "1",
            # derby.log goes beside the metastore, not into the working directory.
            "spark.driver.extraJavaOptions": f"{conf.get('spark.driver.extraJavaOptions', '')} -Dderby.system.home={location}".strip(),
            # The views read lake.<table>.<asset>: every session of this JVM (each JDBC client's too) opens it,
            # the embedded catalog or the REST one; a bucket's files through S3A and S3FileIO (keys from the
            # JVM's environment, never in this conf; the SQL server's own are in its 0600 conf, server_conf).
            **lake.spark_conf(),
            **(lake.store.spark_conf() if is_object_store(root) else {}),
            # A long-lived session would otherwise go on reading the snapshot it loaded first, for as long
            # as queries keep the cached table in use: each query loads the table's current snapshot.
            f"spark.sql.catalog.{CATALOG_NAME}.cache-enabled": "false",
        }
    )
    return conf


# -- the one holder of the metastore ---------------------------------------------------------------


def hold_catalog(location: Path, holder: str) -> int:
    """Lock the catalog for this process (and the children it passes the fd to); returns the fd.

    Raises :class:`CatalogBusy` naming the current holder.
    """
    location.mkdir(parents=True, exist_ok=True)
    fd = os.open(location / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        current = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise CatalogBusy(
            f"the SQL catalog in {location} is open in {current}. Spark's embedded Derby metastore admits one "
            "process at a time: close that one, or use `make sql-server`, through which every `make sql` goes"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode(), 0)
    return fd


def _conf_args(conf: dict[str, str], properties: Path) -> list[str]:
    """spark-submit's arguments for ``conf``: the master, and the rest in the file ``properties`` (mode 0600),
    not on the command line, which any local user reads (``CDC_SPARK_CONF`` may hold credentials)."""
    master = conf.pop("spark.master")
    write_properties_file(properties, conf)
    return ["--master", master, "--properties-file", str(properties)]


# -- spark-sql, or beeline through the SQL server -------------------------------------------------


def spark_sql_command(location: Path, root: str, init_file: Path, args: Sequence[str], properties: Path) -> list[str]:
    """``spark-sql`` from the installed pyspark on the catalog at ``location`` over the warehouse under
    ``root``, running ``init_file`` first; its conf is
    written to ``properties``. A command line's session has no web UI: nobody looks at it."""

    return [launcher("spark-sql"), *_conf_args({**catalog_conf(location, root), **NO_UI}, properties), "-i", str(init_file), *args]


def run_spark_sql(storage: WarehouseStorage, args: Sequence[str], configs_dir: Path | None = None) -> int:
    """``cdc-catalog sql``: sync, then spark-sql with ``args``; beeline through the SQL server if one runs."""
    location = catalog_dir(storage)
    configs_dir = Path(configs_dir or table_configs_dir()).resolve()
    server = running_sql_server(location)
    if server is not None:
        request_sync(storage, server[0], configs_dir)
        return run_beeline(server[1], catalog_database(), args, password_file(server_state_dir(location)))
    init_file = write_sync_file(sync_statements(load_table_configs(configs_dir), storage, catalog_database()), location / "tmp")
    properties = init_file.with_suffix(".properties")  # init_file's name is unique
    try:
        fd = hold_catalog(location, f"pid {os.getpid()} (cdc-catalog sql)")
        try:
            process = subprocess.Popen(spark_sql_command(location, storage.root, init_file, args, properties), env=spark_env())
            return _wait_forwarding_signals(process)
        finally:
            os.close(fd)
    finally:
        init_file.unlink(missing_ok=True)
        properties.unlink(missing_ok=True)


def _beeline_args(args: Sequence[str]) -> list[str]:
    # spark-sql's -e/-f mean the same to beeline; its -S (silent) is beeline's --silent=true, always on.
    return ["--silent=true", "--showHeader=true", "--outputformat=tsv2", *(arg for arg in args if arg not in ("-S", "--silent"))]


def run_beeline(port: int, database: str, args: Sequence[str], password: Path, attempts: int = BEELINE_ATTEMPTS) -> int:
    """beeline with spark-sql's ``args`` on the SQL server; a batch the server rejects transiently runs again.

    Interactive use runs as it is. With ``-e``/``-f`` the output is passed on once the batch is done;
    a failed connection is retried, and so is a single statement the server failed on a handle it lost
    or on a file a commit replaced while the query ran (several statements are not: some may have run).
    """
    command = beeline_command(port, database, _beeline_args(args), password)
    if not {"-e", "-f"} & set(args):
        return subprocess.call(command, env=spark_env())
    for attempt in range(1, attempts + 1):
        done = subprocess.run(command, env=spark_env(), capture_output=True, text=True)
        rejection = transient_rejection(args, done.stdout + done.stderr) if done.returncode != 0 else None
        if rejection is None or attempt == attempts:
            sys.stdout.write(done.stdout)
            sys.stdout.flush()
            sys.stderr.write(done.stderr)
            return done.returncode
        print(f"cdc-catalog: the SQL server rejected the statement ({rejection}); trying again", file=sys.stderr)
        time.sleep(attempt)
    raise AssertionError("unreachable")


def transient_rejection(args: Sequence[str], output: str) -> str | None:
    """The transient error in beeline's ``output``, if it is one that running ``args`` again may not meet."""
    found = _REJECTED_CONNECTION.search(output)
    if found is None and _single_statement(args):
        found = _REJECTED_STATEMENT.search(output)
    return found.group(0) if found else None


def _single_statement(args: Sequence[str]) -> bool:
    if "-f" in args or "-e" not in args or args.index("-e") + 1 >= len(args):
        return False
    return ";" not in args[args.index("-e") + 1].strip().rstrip(";")


def _wait_forwarding_signals(process: subprocess.Popen) -> int:
    """Wait for ``process``; a SIGINT/SIGTERM to this process is passed on, so the JVM stops too."""

    def forward(signum, _frame):
        if process.poll() is None:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- the SQL server (Spark Thrift server) ----------------------------------------------------------


def beeline_command(port: int, database: str, args: Sequence[str], password: Path) -> list[str]:
    """pyspark's ``bin/beeline`` connected to the SQL server on 127.0.0.1:``port``, logging in with the
    password in the file ``password`` (beeline's ``-w``: never on the command line)."""
    url = f"jdbc:hive2://{HOST}:{port}/{database}"
    return [launcher("beeline"), "-u", url, "-n", getpass.getuser(), "-w", str(password), *args]


def running_sql_server(location: Path) -> tuple[int, int] | None:
    """(pid, port) of the SQL server holding the catalog at ``location``, if it is alive."""
    state = server_state_dir(location)
    if _read_text(state / CATALOG_FILE) != str(location):
        return None  # CDC_SQL_SERVER_DIR names the folder of another catalog's server
    pid, port = recorded_pid(state / PID_FILE, SERVER_NAME), read_number_file(state / PORT_FILE)
    if pid is None or port is None:
        return None
    return pid, port


def start_sql_server(storage: WarehouseStorage, port: int = DEFAULT_SQL_PORT, timeout: float = 300,
                     configs_dir: Path | None = None) -> tuple[int, int]:
    """Start the SQL server on 127.0.0.1:``port`` holding the catalog; returns (pid, port) once it serves.

    The catalog is synced before the server starts (:func:`first_sync`), so the first client finds every
    name. The server is Spark's own ``HiveThriftServer2`` under spark-submit, with Spark Connect on a
    second loopback port through which later syncs run (:func:`request_sync`). It runs detached in a
    session of its own and keeps the catalog's lock (inherited) until it exits. An already running server
    is synced and returned as it is. Raises ``RuntimeError`` when some object could not be registered;
    the server then serves the others.
    """
    location = catalog_dir(storage)
    configs_dir = Path(configs_dir or table_configs_dir()).resolve()
    running = running_sql_server(location)
    if running is not None:
        request_sync(storage, running[0], configs_dir)
        return running
    if not port_is_free(port):
        raise RuntimeError(f"port {HOST}:{port} is in use by another process")
    load_table_configs(configs_dir)  # a config error is told here, before a JVM starts
    jar = server_jar()  # missing: told before the catalog is locked
    state = server_state_dir(location)
    fd = hold_catalog(location, f"the SQL server on {HOST}:{port} (cdc-catalog server, started by pid {os.getpid()})")
    try:
        with _owner_only_files():
            for name in (STARTED_FILE, PID_FILE, PORT_FILE, CONNECT_PORT_FILE, CONNECT_TOKEN_FILE):
                (state / name).unlink(missing_ok=True)
            _private_file(state / CATALOG_FILE, str(location))
            first_sync(storage, configs_dir, fd)
            log_path = _private_file(state / LOG_FILE, "")
            connect_port = free_port()
            connect_token = secrets.token_urlsafe(32)
            _private_file(state / CONNECT_TOKEN_FILE, connect_token)
            conf = server_conf(location, storage.root, state, jar, port, connect_port, connect_token)
            command = [launcher("spark-submit"), "--class", THRIFT_SERVER_CLASS, "--name", SERVER_NAME,
                       *_conf_args(conf, state / PROPERTIES_FILE), "spark-internal"]  # fmt: skip
            pid = start_detached(command, log_path, server_env(), cwd=state, pass_fds=(fd,), keep_previous_log=False)
            write_number_file(state / PORT_FILE, port)
            write_number_file(state / CONNECT_PORT_FILE, connect_port)
            write_number_file(state / PID_FILE, pid)
    finally:
        os.close(fd)  # the server's inherited copy keeps the lock
    try:
        _wait_until_serving(pid, port, log_path, timeout)
        _wait_until_serving(pid, connect_port, log_path, timeout)
    except BaseException:
        stop_sql_server(storage)
        raise
    started = json.loads((state / STARTED_FILE).read_text())
    if started["errors"]:
        raise RuntimeError("the SQL server serves, but registering these objects failed:\n" + "\n".join(started["errors"]))
    return pid, port


def server_conf(location: Path, root: str, state: Path, jar: Path, port: int, connect_port: int, connect_token: str) -> dict[str, str]:
    """The SQL server's Spark conf: :func:`catalog_conf`, Thrift on 127.0.0.1:``port`` behind the password,
    the read-only rule, Spark Connect on 127.0.0.1:``connect_port`` behind ``connect_token``, the S3 keys
    (:func:`credentials_conf`), no web UI, and logs and temporary files in ``state``."""
    conf = catalog_conf(location, root)
    java_options = " ".join([
        conf.get("spark.driver.extraJavaOptions", ""), f"-Dlog4j2.configurationFile={_private_file(state / LOG4J_FILE, LOG4J_CONF)}",
        f"-Djava.io.tmpdir={_private_dir(state / TMP_FOLDER)}",
        # Hive's password check reads its class and file from a HiveConf of its own, which takes system
        # properties but not Spark's conf: the names of a class and of the 0600 file, never the password.
        f"-Dhive.server2.custom.authentication.class={PASSWORD_AUTHENTICATOR}", f"-D{PASSWORD_FILE_KEY}={password_file(state)}",
    ]).strip()  # fmt: skip
    hive = "spark.hadoop.hive.server2"
    conf.update({
        f"{hive}.thrift.bind.host": HOST, f"{hive}.thrift.port": str(port),
        # Every client logs in with the password of the 0600 file; the file is named here, not the password.
        f"{hive}.authentication": "CUSTOM",
        # Hive's per-statement operation logs would hold every statement's text.
        f"{hive}.logging.operation.enabled": "false",
        # Every statement is checked by the read-only rule, in every session of this JVM; the jar on the JVM's
        # own class path, where Hive's service finds the password check too.
        "spark.sql.extensions": ",".join(filter(None, [conf.get("spark.sql.extensions", ""), READ_ONLY_EXTENSION])),
        "spark.driver.extraClassPath": ":".join(filter(None, [conf.get("spark.driver.extraClassPath", ""), str(jar)])),
        # Spark Connect in the server's JVM, on loopback, behind a token: the syncs' way into the metastore it holds.
        "spark.plugins": ",".join(filter(None, [conf.get("spark.plugins", ""), CONNECT_PLUGIN])),
        "spark.connect.grpc.binding.address": HOST, "spark.connect.grpc.binding.port": str(connect_port),
        CONNECT_TOKEN_KEY: connect_token,
        # The web UI shows every statement's text and the environment to any local user: none.
        "spark.ui.enabled": "false", "spark.redaction.regex": REDACTION_REGEX,
        "spark.driver.extraJavaOptions": java_options, "spark.local.dir": str(state / TMP_FOLDER),
        **credentials_conf(root, LakeCatalog.from_environment(root)),
    })  # fmt: skip
    return conf


def first_sync(storage: WarehouseStorage, configs_dir: Path, lock_fd: int) -> None:
    """Sync the catalog before the SQL server starts: this module under spark-submit, in a JVM of its own
    that holds the metastore (and inherits the catalog's lock, ``lock_fd``) until it exits. It leaves its
    result in ``started.json`` and its output in a new ``sync.log``; raises ``RuntimeError`` if it failed to run."""

    location = catalog_dir(storage)
    state = server_state_dir(location)
    properties = state / SYNC_PROPERTIES_FILE
    # Nobody looks at the web UI of a JVM that lives for one sync.
    command = [launcher("spark-submit"), "--name", FIRST_SYNC_NAME, *_conf_args({**catalog_conf(location, storage.root), **NO_UI}, properties), __file__]
    env = {
        **spark_env(), WAREHOUSE_ENV: storage.root, TABLE_CONFIGS_ENV: str(configs_dir),
        # The driver is this module under spark-submit: its own folder must not shadow top-level modules.
        "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONSAFEPATH": "1",
    }  # fmt: skip
    log_path = state / SYNC_LOG_FILE
    try:
        with open(_private_file(log_path, ""), "wb") as log:  # a log per start: later syncs append to it
            done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=location, pass_fds=(lock_fd,))
    finally:
        properties.unlink(missing_ok=True)
    if done.returncode != 0 or not (state / STARTED_FILE).exists():
        raise RuntimeError(f"the SQL server's first sync failed (exit code {done.returncode}); end of {log_path}:\n{log_tail(log_path)}")


def _wait_until_serving(pid: int, port: int, log_path: Path, timeout: float) -> None:
    def check_alive() -> None:
        if not process_alive(pid):
            raise RuntimeError(f"the SQL server exited while starting; end of {log_path}:\n{log_tail(log_path)}")

    if not wait_for_port(port, timeout, check=check_alive, interval=0.1):
        raise TimeoutError(f"the SQL server did not listen on {HOST}:{port} within {timeout:g} s; end of {log_path}:\n{log_tail(log_path)}")


def _run_first_sync(storage: WarehouseStorage, configs_dir: Path) -> None:
    """The first sync's driver: this file under spark-submit, as :func:`first_sync` launches it."""
    spark = SparkSession.builder.getOrCreate()
    try:
        _write_json(server_state_dir(catalog_dir(storage)) / STARTED_FILE, _sync_for_server(spark, storage, catalog_database(), configs_dir))
    finally:
        spark.stop()


def _sync_for_server(spark: SparkSession, storage: WarehouseStorage, database: str, configs_dir: Path) -> dict:
    began = time.monotonic()
    try:
        configs = load_table_configs(configs_dir)
    except TableConfigError as error:
        return {"statements": 0, "errors": [str(error)]}
    try:
        report = sync_in_place(spark, configs, storage, database)
    except Exception as error:  # noqa: BLE001 - e.g. the database could not be created: told to the requester, the server goes on
        return {"statements": 0, "errors": [f"{database}: {str(error).strip().splitlines()[0][:1000]}"]}
    changes = [statement[:300] for statement in report.statements if statement.startswith(("ALTER TABLE", "DROP", "CREATE TABLE"))]
    print(f"cdc-catalog: synced {len(configs)} table configs from {configs_dir} in {time.monotonic() - began:.1f} s: "
          f"{len(report.statements)} statements, {len(report.errors)} errors", *changes, *report.errors, sep="\n", flush=True)  # fmt: skip
    return {"statements": len(report.statements), "errors": report.errors}


def request_sync(storage: WarehouseStorage, server_pid: int, configs_dir: Path, timeout: float = 900) -> None:
    """Sync the tables of ``configs_dir`` in place through the running SQL server, and wait until done.

    The sync runs in a Spark Connect session of the server's JVM, the one holder of the metastore; one
    sync at a time (``sync.lock``), so that two never create the same view. Its output is appended to
    ``sync.log``. Raises ``RuntimeError`` naming what failed (the rest is synced), or if the server exits
    or cannot be reached first.
    """
    state = server_state_dir(catalog_dir(storage))
    connect_port = read_number_file(state / CONNECT_PORT_FILE)
    connect_token = _read_text(state / CONNECT_TOKEN_FILE)
    log_path = state / LOG_FILE

    def server_lost(why: str) -> RuntimeError:
        return RuntimeError(f"the SQL server (pid {server_pid}) {why}; end of {log_path}:\n{log_tail(log_path)}")

    if connect_port is None or not connect_token:
        raise server_lost("records no Spark Connect port or token (started by an older version? restart it)")
    fd = os.open(state / SYNC_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not process_alive(server_pid):
                    raise server_lost("exited") from None
                if time.monotonic() > deadline:
                    raise server_lost(f"did not sync within {timeout:g} s (another sync holds {state / SYNC_LOCK_FILE})") from None
                time.sleep(0.1)
        with open(_private_file(state / SYNC_LOG_FILE), "a", encoding="utf-8") as log, contextlib.redirect_stdout(log):
            # Connect's own builder: the generic one refuses a remote URL while MASTER is set.
            from pyspark.sql.connect.session import SparkSession as ConnectSession

            try:
                # The token as a bearer token ("localhost": pyspark sends one without TLS only there), and to the
                # read-only rule, which lets this session write the catalog's definitions.
                builder = ConnectSession.builder.remote(f"sc://localhost:{connect_port}/;token={connect_token}")
                spark: Any = builder.config(WRITER_TOKEN_KEY, connect_token).create()  # serves as a SparkSession
            except Exception as error:  # noqa: BLE001 - the server is gone or not reachable: say so, with its log
                raise server_lost(f"could not be reached on {HOST}:{connect_port} ({str(error).strip()[:300]})") from None
            try:
                result = _sync_for_server(spark, storage, catalog_database(), configs_dir)
            finally:
                try:
                    spark.stop()
                except Exception:  # noqa: BLE001, S110 - the server went meanwhile: the result says what failed
                    pass
    finally:
        os.close(fd)  # releases the sync lock
    if result["errors"]:
        if not process_alive(server_pid):
            raise server_lost("exited")
        raise RuntimeError("registering these objects through the SQL server failed:\n" + "\n".join(result["errors"]))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _write_json(path: Path, value: dict) -> None:
    """Written whole or not at all: readers poll for ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def stop_sql_server(storage: WarehouseStorage, timeout: float = 30) -> bool:
    """Stop the SQL server of this warehouse's catalog; whether one was running."""
    location = catalog_dir(storage)
    running = running_sql_server(location)
    state = server_state_dir(location)
    if running is not None:
        stop_group(running[0], grace=timeout)
        _wait_until_catalog_free(location, timeout)
    if _read_text(state / CATALOG_FILE) not in (None, str(location)):
        return False  # another catalog's server's folder: nothing of this catalog's to tidy
    for name in (PID_FILE, PORT_FILE, CONNECT_PORT_FILE, CONNECT_TOKEN_FILE, STARTED_FILE):
        (state / name).unlink(missing_ok=True)
    return running is not None


def _wait_until_catalog_free(location: Path, timeout: float) -> None:
    """Stopped means the catalog can be opened again: wait until no process holds its lock. The server's
    process group is gone by now, but a process it was starting may hold the lock's inherited descriptor a
    moment longer. Raises ``RuntimeError`` naming the holders if the lock is still held after ``timeout``."""
    path = location / LOCK_FILE
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the SQL server stopped, but {', '.join(_holders(path)) or 'a process'} still holds {path}") from None
        finally:
            os.close(fd)
        time.sleep(0.1)


def _holders(path: Path) -> list[str]:
    """The other processes with ``path`` open (their pids and command lines), as far as /proc shows them."""
    found = []
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            pid = int(fds.parent.name)
            if pid != os.getpid() and any(os.readlink(link) == str(path) for link in fds.iterdir()):
                found.append(f"pid {pid} ({command_line(pid).strip()[:200]})")
        except OSError:
            continue
    return found


def sync(storage: WarehouseStorage, configs_dir: Path | None = None) -> int:
    """``cdc-catalog sync``: register every table, through the SQL server if one runs."""
    location = catalog_dir(storage)
    server = running_sql_server(location)
    if server is not None:
        request_sync(storage, server[0], Path(configs_dir or table_configs_dir()).resolve())
        return 0
    return run_spark_sql(storage, ["-e", "SELECT 1"], configs_dir)


if __name__ == "__main__":
    # spark-submit runs this file as the driver of the SQL server's first sync (first_sync).
    try:
        _run_first_sync(WarehouseStorage(warehouse_root()), table_configs_dir())
    except (CatalogBusy, ValueError, RuntimeError, TimeoutError) as error:
        print(f"cdc-catalog: {error}", file=sys.stderr)
        raise SystemExit(2) from None
