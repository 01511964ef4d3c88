"""The Iceberg runtime on every Spark the project starts (cdc_assets/engines/iceberg_runtime.py, the
Makefile's ``jars``): a table the project's own session writes in the embedded catalog reads back the
same in Spark, in pyiceberg without Spark, and in DuckDB offline (cdc_assets/engines/duckdb_iceberg.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
from pyiceberg.catalog import load_catalog
from pyspark.sql import functions as F

from cdc_assets.engines.duckdb_iceberg import duckdb_connection, extension_directory
from cdc_assets.engines import iceberg_runtime
from cdc_assets.engines.iceberg_runtime import ICEBERG_EXTENSIONS, IcebergRuntimeMissing, iceberg_jars, with_iceberg_runtime
from resources.session.spark_session import session_conf, spark_config
from resources.storage.lake import pyiceberg_properties, use_catalog

REPO = Path(__file__).resolve().parent.parent
SCHEMA = "id INT, name STRING, amount DECIMAL(10,2), business_date DATE"
DAY_1, DAY_2 = date(2024, 1, 1), date(2024, 1, 2)


def _rows(day: date, *rows: tuple) -> list[tuple]:
    return [(*row, day) for row in rows]


def test_the_project_session_writes_an_iceberg_table_that_pyiceberg_and_duckdb_read_alike(spark, tmp_path):
    # A session of its own: a session keeps the first warehouse's catalog it opens.
    session = spark.newSession()
    root = str(tmp_path / "warehouse")
    os.makedirs(root)
    use_catalog(session, root)
    session.sql("CREATE NAMESPACE lake.ns")
    session.sql(
        f"CREATE TABLE lake.ns.t ({SCHEMA}) USING iceberg PARTITIONED BY (business_date) TBLPROPERTIES ('format-version' = '2')"
    )
    first = _rows(DAY_1, (1, "a", Decimal("1.10")), (2, "b", Decimal("2.20")))
    second = _rows(DAY_2, (1, "a", Decimal("1.10")), (2, None, Decimal("9.99")), (3, "c", Decimal("3.30")))
    session.createDataFrame(first + second, SCHEMA).writeTo("lake.ns.t").append()
    # Day 2 again, corrected: replaced in one commit, day 1 untouched.
    corrected = _rows(DAY_2, (2, "b2", Decimal("2.22")), (4, "d", Decimal("4.40")))
    session.createDataFrame(corrected, SCHEMA).writeTo("lake.ns.t").overwrite(F.col("business_date") == F.lit(DAY_2))
    session.sql("ALTER TABLE lake.ns.t CREATE TAG `day-2`")
    expected = sorted(first + corrected)

    snapshots = session.sql("SELECT snapshot_id, operation FROM lake.ns.t.snapshots ORDER BY committed_at").collect()
    assert [row.operation for row in snapshots] == ["append", "overwrite"]
    assert session.sql("SHOW TBLPROPERTIES lake.ns.t ('format-version')").first().value == "2"

    in_spark = sorted(tuple(row) for row in session.table("lake.ns.t").collect())
    at_tag = sorted(tuple(row) for row in session.sql("SELECT * FROM lake.ns.t VERSION AS OF 'day-2'").collect())
    assert in_spark == expected
    assert at_tag == expected

    # pyiceberg, no Spark: the same catalog file, the same rows, the same tag.
    table = load_catalog("lake", **pyiceberg_properties(root)).load_table("ns.t")
    assert table.format_version == 2
    assert [field.name for field in table.spec().fields] == ["business_date"]
    in_pyiceberg = sorted(tuple(row.values()) for row in table.scan().to_arrow().to_pylist())
    assert in_pyiceberg == expected
    tag = table.metadata.refs["day-2"]
    assert tag.snapshot_ref_type == "tag" and tag.snapshot_id == snapshots[-1].snapshot_id
    assert sorted(tuple(row.values()) for row in table.scan(snapshot_id=tag.snapshot_id).to_arrow().to_pylist()) == expected

    # DuckDB, offline: the extension files of the PyPI packages, the table's current metadata file.
    with duckdb_connection() as duck:
        in_duckdb = sorted(duck.execute(f"SELECT id, name, amount, business_date FROM iceberg_scan('{table.metadata_location}')").fetchall())
    assert in_duckdb == expected

    # Every live data file is Parquet, by the catalog and by its bytes; day 1's file was never rewritten.
    files = session.sql("SELECT file_path, file_format, partition.business_date AS day FROM lake.ns.t.files").collect()
    assert sorted(row.day for row in files) == [DAY_1, DAY_2]
    for row in files:
        assert row.file_format == "PARQUET"
        path = Path(row.file_path.removeprefix("file:"))
        assert path.is_relative_to(root)
        with path.open("rb") as handle:
            assert handle.read(4) == b"PAR1"


def test_a_cold_session_starts_with_the_runtime_and_a_connect_client_leaves_it_to_the_server():
    conf = spark_config("local[2]", {"spark.jars": "/opt/extra.jar"}, None, remote=False)
    jars = conf["spark.jars"].split(",")
    assert jars == [*iceberg_jars(), "/opt/extra.jar"]  # a user's jar is added to the runtime, not in its place
    assert all(os.path.isabs(jar) and os.path.isfile(jar) for jar in jars[:-1])
    assert conf["spark.sql.extensions"] == ICEBERG_EXTENSIONS
    remote = spark_config(None, {"spark.jars": "/opt/extra.jar"}, None, remote=True)
    assert "spark.jars" not in remote and "spark.sql.extensions" not in remote
    assert "spark.jars" not in session_conf(conf, remote=True)


def test_extensions_a_user_names_are_kept_after_icebergs():
    conf = with_iceberg_runtime({"spark.sql.extensions": f"com.example.Ext, {ICEBERG_EXTENSIONS}"})
    assert conf["spark.sql.extensions"] == f"{ICEBERG_EXTENSIONS},com.example.Ext"


def test_missing_jars_are_named_with_make_install(tmp_path, monkeypatch):
    monkeypatch.setattr(iceberg_runtime, "jars_folder", lambda: tmp_path)
    (tmp_path / "sqlite-jdbc-3.51.1.0.jar").write_bytes(b"")
    with pytest.raises(IcebergRuntimeMissing, match=r"the Iceberg Spark runtime for Spark is not in .*: run `make install`"):
        iceberg_jars()
    with pytest.raises(IcebergRuntimeMissing, match="make install"):
        spark_config("local[2]", {}, None, remote=False)


def test_duckdb_never_downloads_an_extension(tmp_path):
    with duckdb_connection() as duck:
        settings = dict(duck.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ('autoinstall_known_extensions', 'extension_directory')"
        ).fetchall())  # fmt: skip
        loaded = {name for name, in duck.execute("SELECT extension_name FROM duckdb_extensions() WHERE loaded").fetchall()}
    assert settings == {"autoinstall_known_extensions": "false", "extension_directory": str(extension_directory())}
    assert {"iceberg", "avro"} <= loaded


# -- make jars --------------------------------------------------------------------------------------


def _make_jars(jars_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(REPO), "jars", f"JARS_DIR={jars_dir}", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture()
def installed_jars(tmp_path) -> Path:
    """A copy of the project's installed jars folder (``make install`` made it)."""
    folder = tmp_path / "jars"
    folder.mkdir()
    for jar in iceberg_jars():
        shutil.copy(jar, folder)
    return folder


def test_make_jars_checks_the_pins_without_maven_when_the_jars_are_there(installed_jars):
    names = sorted(path.name for path in installed_jars.glob("*.jar"))
    (installed_jars / "sqlite-jdbc-3.0.0.jar").write_bytes(b"an older pin")
    done = _make_jars(installed_jars, "MVN=/nonexistent/mvn")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "removing" in done.stdout and "sqlite-jdbc-3.0.0.jar" in done.stdout
    assert sorted(path.name for path in installed_jars.glob("*.jar")) == names


def test_make_jars_refuses_a_jar_that_is_not_the_pinned_one(installed_jars):
    runtime = next(installed_jars.glob("iceberg-spark-runtime-*.jar"))
    runtime.write_bytes(b"not the runtime")
    done = _make_jars(installed_jars, "MVN=/nonexistent/mvn")
    assert done.returncode != 0
    assert f"{runtime} is not the pinned org.apache.iceberg:iceberg-spark-runtime" in done.stderr


def test_make_jars_without_maven_says_what_to_do(installed_jars):
    missing = next(installed_jars.glob("sqlite-jdbc-*.jar"))
    missing.unlink()
    done = _make_jars(installed_jars, "MVN=/nonexistent/mvn")
    assert done.returncode != 0
    assert f"{missing} is missing and Maven (/nonexistent/mvn) is not installed" in done.stderr
    assert "Without Maven Central" in done.stderr


# -- the Spark Connect server ---------------------------------------------------------------------

CONNECT_CLIENT = """
import sys
from pyspark.sql import SparkSession
from resources.storage.lake import use_catalog

spark = SparkSession.builder.getOrCreate()
use_catalog(spark, sys.argv[1])
spark.sql("CREATE NAMESPACE lake.ns")
spark.sql("CREATE TABLE lake.ns.t (id INT, business_date DATE) USING iceberg PARTITIONED BY (business_date)")
spark.sql("INSERT INTO lake.ns.t VALUES (1, DATE'2024-01-01'), (2, DATE'2024-01-02')")
spark.sql("ALTER TABLE lake.ns.t CREATE TAG `day-2`")
print("module", type(spark).__module__)
print("rows", sorted(row.id for row in spark.sql("SELECT id FROM lake.ns.t VERSION AS OF 'day-2'").collect()))
spark.stop()
"""


@pytest.mark.slow
def test_a_connect_client_writes_and_reads_an_iceberg_table(connect_server, tmp_path):
    root = tmp_path / "warehouse"
    root.mkdir()
    completed = subprocess.run(
        [sys.executable, "-c", CONNECT_CLIENT, str(root)],
        cwd=REPO,
        env={**os.environ, "SPARK_REMOTE": connect_server.client_url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    printed = dict(line.split(" ", 1) for line in completed.stdout.splitlines() if " " in line)
    assert printed == {"module": "pyspark.sql.connect.session", "rows": "[1, 2]"}
    # Written by the server's JVM into this warehouse's catalog: pyiceberg reads it without Spark.
    table = load_catalog("lake", **pyiceberg_properties(str(root))).load_table("ns.t")
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2]
