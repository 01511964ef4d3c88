"""What every experiment of docs/design/iceberg-commits.md shares: a Spark session on the project's
Iceberg catalog (``resources/storage/lake.py``), pyiceberg on the same catalog, a lock held on the
catalog's SQLite file by another process, and a Spark worker started as a process of its own.

Standalone scripts, not part of the suite. Run from the repository's root with the project's venv:

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.experiments.q1_q2_concurrent_writers

The jars are the ones the issue-34 prototype pins (``ICEBERG_JAR``, ``SQLITE_JAR``; override with the
environment variables of the same names).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from resources.storage.lake import CATALOG_NAME, catalog_file, pyiceberg_properties, spark_catalog_conf

ICEBERG_JAR = os.environ.get("ICEBERG_JAR", "/tmp/mvnchk/j2/iceberg-spark-runtime-4.0_2.13-1.11.0.jar")
SQLITE_JAR = os.environ.get("SQLITE_JAR", "/tmp/mvnchk/jars/sqlite-jdbc-3.51.1.0.jar")
REPO = Path(__file__).resolve().parents[2]
CATALOG_PREFIX = f"spark.sql.catalog.{CATALOG_NAME}"

# A Java exception's class as Spark's Python errors quote it (classic and Connect alike: no JVM handle needed).
_PY4J_PREFIX = re.compile(r"^An error occurred while calling o\d+\.\w+\. : ")
_JAVA_EXCEPTION = re.compile(r"((?:org\.apache\.iceberg|java\.sql|org\.sqlite|java\.io|java\.lang)[\w.$]*(?:Exception|Error))")


def spark_session(root: str, catalog_props: Mapping[str, str] | None = None, app: str = "iceberg-experiment"):
    """A local[2] session, UI off, UTC, on loopback, with the catalog ``lake`` on ``root``'s SQLite file.

    ``catalog_props`` are extra catalog properties without the ``spark.sql.catalog.lake.`` prefix
    (e.g. ``{"jdbc.busy_timeout": "60000", "cache-enabled": "false"}``).
    """
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.jars", f"{ICEBERG_JAR},{SQLITE_JAR}")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in spark_catalog_conf(root).items():
        builder = builder.config(key, value)
    for key, value in (catalog_props or {}).items():
        builder = builder.config(f"{CATALOG_PREFIX}.{key}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def pyiceberg_catalog(root: str, uri_query: str = ""):
    """pyiceberg's SqlCatalog on ``root``'s catalog; ``uri_query`` is appended to the SQLAlchemy URL
    (e.g. ``"timeout=30"``: pysqlite's busy wait, in seconds)."""
    from pyiceberg.catalog import load_catalog

    properties = pyiceberg_properties(root)
    if uri_query:
        properties = {**properties, "uri": f"{properties['uri']}?{uri_query}"}
    return load_catalog(CATALOG_NAME, **properties)


def describe_error(error: BaseException) -> dict[str, str]:
    """The Python class, the Java class quoted in the message (if any) and the message's first line(s)."""
    text = str(error)
    java = _JAVA_EXCEPTION.search(text)
    first = " ".join(line.strip() for line in text.strip().splitlines()[:3])
    # The classic session's "An error occurred while calling o123.overwrite. : " names a JVM object, different every time.
    first = _PY4J_PREFIX.sub("", first)
    causes = [line.strip().removeprefix("Caused by: ") for line in text.splitlines() if line.strip().startswith("Caused by:")]
    described = {"python": type(error).__name__, "java": java.group(1) if java else "", "message": first[:400]}
    if causes:
        described["root_cause"] = causes[-1][:300]
    return described


class CatalogLock:
    """A transaction held on the catalog's SQLite file by this (non-JVM) process (rollback journal, the
    file's mode as the JDBC catalog and pyiceberg leave it).

    ``EXCLUSIVE``: every other connection's read or write of the catalog waits (its busy timeout) or gets
    SQLITE_BUSY. ``IMMEDIATE`` (a RESERVED lock): others still read, but their writes wait: a commit
    passes its refresh, writes its manifests and metadata file, and waits at the catalog's UPDATE.
    """

    def __init__(self, root: str, mode: str = "EXCLUSIVE"):
        self.path = catalog_file(root)
        self.mode = mode
        self.connection: sqlite3.Connection | None = None

    def acquire(self) -> None:
        self.connection = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self.connection.execute(f"BEGIN {self.mode}")

    def release(self) -> None:
        if self.connection is not None:
            self.connection.execute("ROLLBACK")
            self.connection.close()
            self.connection = None


def start_worker(module: str, args: list[str], log: Path) -> subprocess.Popen:
    """``python -m benchmarks.experiments.<module> args``, its own process (and JVM), output in ``log``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1", "TZ": "UTC"}
    handle = open(log, "w")
    return subprocess.Popen(
        [sys.executable, "-m", f"benchmarks.experiments.{module}", *args],
        cwd=REPO,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        # Its own process group: kill -9 of the group kills the Python driver and its JVM at once.
        start_new_session=True,
    )


def wait_for_file(path: Path, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"worker exited with {process.returncode} before {path} appeared")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.1)


def files_under(folder: Path) -> set[str]:
    """Every file under ``folder``, as paths relative to it."""
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


def live_files(table) -> set[str]:
    """The data files pyiceberg's scan of the table's current snapshot reads (absolute local paths)."""
    return {task.file.file_path.removeprefix("file:") for task in table.scan().plan_files()}


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
