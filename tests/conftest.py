"""Shared fixtures: one real local SparkSession for the whole test session, and real temp folders."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile

import pytest

from tests.codegen import INTERPRETED_EXPRESSIONS, generated_code as _generated_code

# Dagster and Spark must not write into the repository or the user's home while tests run.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Runs find the project's Spark Connect server without being told (resources/session/spark_target.py). Tests
# start their own servers where they want one: a developer's `make spark-server` (or `make ui`) must not
# turn the suite's cold runs warm, nor its classic session into a Connect client. An empty folder of
# the test session's own: nothing runs there until a test starts it.
os.environ["CDC_SPARK_SERVER_DIR"] = tempfile.mkdtemp(prefix="cdc-tests-spark-server-")
atexit.register(shutil.rmtree, os.environ["CDC_SPARK_SERVER_DIR"], True)
os.environ.pop("CDC_SPARK", None)
# A shell pointed at a lake (`eval "$(make -s lake-env)"`) must not point the suite's local runs at it.
for _name in ("CDC_WAREHOUSE", "CDC_CATALOG_URI", "CDC_CATALOG_WAREHOUSE", "CDC_CATALOG_SIGNING_NAME", "CDC_S3_ENDPOINT", "CDC_DATA_ROOT", "CDC_CATALOG_DIR"):
    os.environ.pop(_name, None)
# The key pair of every lake the tests start (tests/lake.py), in the environment before the session's JVM
# starts: a JVM reads its environment once, and S3A and Iceberg's S3 client take their keys from it. A
# fresh secret per session, which the secret scans look for; never a real account's keys.
os.environ["AWS_ACCESS_KEY_ID"] = "cdctests"
os.environ["AWS_SECRET_ACCESS_KEY"] = f"cdc-tests-{secrets.token_hex(16)}"
os.environ["AWS_REGION"] = "us-east-1"
os.environ.pop("AWS_SESSION_TOKEN", None)
os.environ.pop("AWS_PROFILE", None)
# Every JVM the suite starts (the session's, each CLI run's, Connect and SQL servers, the cluster's daemons and
# executors) compiles with C1 only and collects with the serial collector: the suite's JVMs live minutes on tiny
# data, where C2's compiling and G1's threads cost more CPU than they save, and the suite is CPU-bound on two
# cores. tests/test_bad_values.py alone: 127 CPU-seconds -> 90, wall 198 s -> 160 (docs/testing.md). The JIT and
# the collector change no result. Not the product's default: a cold run of a big date wants C2.
#
# Spark in those JVMs interprets expressions instead of generating Java for each query: tests/codegen.py says
# why, and how a test runs generated code.
os.environ["JDK_JAVA_OPTIONS"] = " ".join(
    part
    for part in (
        os.environ.get("JDK_JAVA_OPTIONS", ""),
        "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        *(f"-D{key}={value}" for key, value in INTERPRETED_EXPRESSIONS.items()),
    )
    if part
)


@pytest.fixture(scope="session")
def spark():
    from resources.session.spark_session import build_spark_session

    # The pipeline's resource reuses this session through getOrCreate, so tests and runs share one JVM.
    session = build_spark_session(
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "spark.driver.memory": "2g"},
        app_name="cdc_assets_tests",
    )
    session.sparkContext.setLogLevel("ERROR")
    assert {key: session.conf.get(key) for key in INTERPRETED_EXPRESSIONS} == INTERPRETED_EXPRESSIONS
    yield session
    session.stop()


@pytest.fixture()
def generated_code(spark):
    """Generated code in the session (``spark``) for one test, as the product runs it (tests/codegen.py)."""
    with _generated_code(spark):
        yield


@pytest.fixture()
def warehouse(tmp_path, monkeypatch):
    """An empty warehouse root, set as CDC_WAREHOUSE for the test."""
    root = tmp_path / "warehouse"
    root.mkdir()
    monkeypatch.setenv("CDC_WAREHOUSE", str(root))
    return root


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """A Spark Connect server of the session's size on a free loopback port; yields its ServerHandle.

    pyspark refuses a Connect session in a process that holds a classic one (SESSION_ALREADY_EXIST), as
    this one may, so tests reach the server from subprocesses with ``SPARK_REMOTE=handle.url``.
    """
    from cdc_assets.engines.connect_server import start_server, stop_server
    from cdc_assets.engines.process import free_port

    state_dir = tmp_path_factory.mktemp("spark-server")
    handle = start_server(
        port=free_port(),
        state_dir=state_dir,
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "spark.driver.memory": "2g"},
    )
    try:
        yield handle
    finally:
        stop_server(state_dir)


@pytest.fixture()
def lake(tmp_path):
    """A lake of the test's own (tests/lake.py: SeaweedFS on free loopback ports), stopped when the test ends,
    however it ends."""
    from cdc_assets.engines import lake_server
    from tests.lake import start_lake

    handle = start_lake(tmp_path / "lake")
    try:
        yield handle
    finally:
        lake_server.stop(handle.state_dir)
