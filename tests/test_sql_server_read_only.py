"""The SQL server only reads, asks for a password, keeps its Connect port closed, holds no secret a query could
read, and logs no statement's text; its state is outside the warehouse, its folder 0700, its files 0600
(docs/consumers.md, "The SQL server reads only"). One server start for the whole module.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cdc_assets.cli.sql_server import CONNECT_PORT_FILE, CONNECT_TOKEN_FILE, PASSWORD_FILE, PID_FILE, beeline_command
from cdc_assets.engines.process import free_port
from cdc_assets.engines.spark_home import spark_env
from resources.storage import WarehouseStorage

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"
TABLE = "tiny"
DAY = "2024-01-01"
CONFIG = {
    "name": TABLE,
    "start_date": DAY,
    "load_type": "full",
    "source": {"path": "data/{date}.csv", "format": "csv"},
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}],
}
ROWS = [(1, "alice-7f3e", "h1", "I"), (2, "bob", "h2", "I")]
SCHEMA = "id int, name string, key_hash string, operation string"
# A secret in the environment of `cdc-catalog server start`: the server's environment must not hold it.
FAKE_SECRET = "fake-secret-9d2c41b7e0"
# Literals of statements sent to the server: none may reach a file the server writes.
_NOISE = re.compile(r"^(null\s*)+")  # what beeline prints for each prompt of a batch (no value here is NULL)
LOGGED_LITERALS = ("needle-ok-5a1f9c", "needle-bad-8e2d7b", "needle-refused-3c6a0d")


@pytest.fixture(scope="module")
def server(spark, tmp_path_factory):
    """A warehouse holding one date of a tiny table, and its SQL server: (env, port, state folder)."""
    root = tmp_path_factory.mktemp("sql_read_only")
    configs = root / "configs"
    configs.mkdir()
    (configs / f"{TABLE}.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    warehouse = root / "warehouse"
    storage = WarehouseStorage(str(warehouse))
    for asset in ("current_table", "history_partition"):
        storage.write(spark.createDataFrame(ROWS, SCHEMA), TABLE, asset, [DAY])
    storage.release()
    (warehouse / "_runs").mkdir()
    pq.write_table(pa.table({"table": [TABLE], "business_date": [DAY], "status": ["succeeded"]}), warehouse / "_runs" / f"{TABLE}-1.parquet")
    state = root / "server-state"
    env = {key: value for key, value in os.environ.items() if key != "SPARK_REMOTE"}
    env.update(
        PYTHONPATH=str(REPO), CDC_TABLE_CONFIGS=str(configs), CDC_WAREHOUSE=str(warehouse), CDC_SPARK_MASTER="local[1]",
        CDC_SQL_SERVER_DIR=str(state), AWS_SECRET_ACCESS_KEY=FAKE_SECRET, AWS_ACCESS_KEY_ID="fake-key-id",
        CDC_SPARK_CONF='{"spark.sql.shuffle.partitions": "1", "spark.driver.memory": "1g", '
                       '"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}',
    )  # fmt: skip
    port = free_port()
    started = _cli(env, "server", "start", "--port", str(port))
    assert started.returncode == 0, started.stderr[-5000:]
    assert started.stdout.strip() == f"jdbc:hive2://127.0.0.1:{port}/cdc"
    assert f"the password in {state / PASSWORD_FILE}" in started.stderr
    yield env, port, state
    _cli(env, "server", "stop")


def _cli(env, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "cdc-catalog"), *args], env=env, capture_output=True, text=True, timeout=timeout)


def _beeline(env, port: int, state: Path, statements: list[str]) -> list[str]:
    """Each statement's output, run in order by one beeline that goes on after errors: the text between the
    markers that follow each statement (results and errors alike, in one stream)."""
    script = "\n".join(f"{statement};\nSELECT 'marker-{index}';" for index, statement in enumerate(statements))
    path = state.parent / "statements.sql"  # beside the server's folder, not in it: it holds the statements
    path.write_text(script + "\n")
    command = beeline_command(port, "cdc", ["--silent=true", "--showHeader=false", "--outputformat=tsv2", "--force=true", "-f", str(path)],
                              state / PASSWORD_FILE)  # fmt: skip
    done = subprocess.run(command, env={**env, **spark_env()}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    path.unlink()
    outputs, current = [], []
    for line in done.stdout.splitlines():
        line = _NOISE.sub("", line)
        # The JVM's own notes (stderr is in the stream): the incubator module, the suite's JDK_JAVA_OPTIONS.
        if not line.strip() or line.startswith(("WARNING: Using incubator modules", "NOTE: Picked up JDK_JAVA_OPTIONS")):
            continue
        marker = re.search(r"marker-(\d+)$", line)
        if marker:
            outputs.append("\n".join(current))
            current = []
        else:
            current.append(line)
    assert len(outputs) == len(statements), done.stdout[-5000:]
    return outputs


REFUSED = {
    "drop": f"DROP TABLE lake.{TABLE}.current_table",
    "drop_view": f"DROP VIEW cdc.{TABLE}_current",
    "insert": f"INSERT INTO lake.{TABLE}.current_table SELECT * FROM lake.{TABLE}.current_table",
    "delete": f"DELETE FROM lake.{TABLE}.current_table WHERE id = 1",
    "create": "CREATE TABLE cdc.stolen AS SELECT 1 AS one",
    "create_view": f"CREATE VIEW cdc.mine AS SELECT * FROM cdc.{TABLE}_current",
    "transform": "SELECT TRANSFORM('x') USING 'sh -c env' AS (out string)",
    "add_jar": "ADD JAR /tmp/nothing.jar",
    "add_file": "ADD FILE /etc/hostname",
    "function": "CREATE FUNCTION cdc.f AS 'org.apache.hadoop.hive.ql.udf.UDFToString'",
    "temporary_function": "CREATE TEMPORARY FUNCTION f AS 'org.apache.hadoop.hive.ql.udf.UDFToString'",
    "reflect": "SELECT reflect('java.lang.System', 'getenv', 'AWS_SECRET_ACCESS_KEY')",
    "file_path": "SELECT * FROM text.`/etc/hostname`",
    "set_catalog": "SET spark.sql.catalog.other=org.apache.iceberg.spark.SparkCatalog",
    "call": f"CALL lake.system.expire_snapshots('{TABLE}.current_table')",
}


def test_every_write_is_refused_and_select_by_name_reads(server):
    env, port, state = server
    outputs = dict(zip(REFUSED, _beeline(env, port, state, list(REFUSED.values()))))
    accepted = {name: output for name, output in outputs.items() if "READ_ONLY" not in output}
    assert not accepted, accepted
    assert FAKE_SECRET not in "".join(outputs.values())

    # What a reader does works: every documented object by name, and a look at the catalog.
    count, current, names, described, shown_set = _beeline(env, port, state, [
        f"SELECT count(*) FROM cdc.{TABLE}_current",
        f"SELECT id, name FROM {TABLE}_latest ORDER BY id",
        "SHOW TABLES IN cdc",
        f"DESCRIBE TABLE cdc.{TABLE}_history",
        "SET spark.sql.session.timeZone=UTC",
    ])  # fmt: skip
    assert count.strip() == "2"
    assert current.split() == ["1", "alice-7f3e", "2", "bob"]
    assert {f"{TABLE}_current", f"{TABLE}_history", f"{TABLE}_latest", f"{TABLE}_scd2", "runs_log"} <= set(names.split())
    assert "business_date" in described
    assert "READ_ONLY" not in shown_set
    scd2, runs = _beeline(env, port, state, [f"SELECT count(*) FROM cdc.{TABLE}_scd2", "SELECT count(*) FROM cdc.runs_log"])
    assert (scd2.strip(), runs.strip()) == ("2", "1")

    # Nothing was dropped, and the server's own sync, through its Connect port, still defines objects.
    synced = _cli(env, "sync")
    assert synced.returncode == 0, synced.stderr[-5000:]
    (count,) = _beeline(env, port, state, [f"SELECT count(*) FROM lake.{TABLE}.current_table"])
    assert count.strip() == "2"


def test_a_client_without_the_password_is_refused(server, tmp_path):
    env, port, state = server
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    empty = tmp_path / "empty"
    empty.write_text("")
    for password in (wrong, empty):
        command = beeline_command(port, "cdc", ["--silent=true", "-e", "SELECT 1"], password)
        done = subprocess.run(command, env={**env, **spark_env()}, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0, done.stdout
        assert re.search(r"wrong user name or password|Peer indicated failure|Could not open client transport", done.stdout + done.stderr), done.stderr[-3000:]


def test_the_connect_port_refuses_a_client_without_the_token(server):
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    env, port, state = server
    connect_port = int((state / CONNECT_PORT_FILE).read_text())
    for url in (f"sc://127.0.0.1:{connect_port}", f"sc://localhost:{connect_port}/;token=not-the-token"):
        with pytest.raises(Exception) as refused:  # noqa: PT011 - gRPC's and pyspark's errors alike
            session = ConnectSession.builder.remote(url).create()
            try:
                session.sql("SELECT 1").collect()
            finally:
                session.stop()
        assert re.search(r"UNAUTHENTICATED|Invalid authentication|token", str(refused.value), re.IGNORECASE), str(refused.value)[:2000]


def test_the_server_holds_no_secret_a_query_could_read(server):
    env, port, state = server
    pid = int((state / PID_FILE).read_text())
    token = (state / CONNECT_TOKEN_FILE).read_text().strip()
    password = (state / PASSWORD_FILE).read_text().strip()
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    for secret in (FAKE_SECRET, token, password):
        assert secret.encode() not in environ
        assert secret.encode() not in cmdline
    assert b"CDC_SPARK_CONF" not in environ and b"AWS_" not in environ
    shown = "\n".join(_beeline(env, port, state, ["SET", "SET -v", "SET spark.connect.authenticate.token"]))
    assert "spark.connect.authenticate.token" in shown
    assert token not in shown and password not in shown


def test_no_statement_text_reaches_a_file_the_server_writes_and_its_files_are_the_owners(server):
    env, port, state = server
    ok, bad, refused = LOGGED_LITERALS
    outputs = _beeline(env, port, state, [
        f"SELECT count(*) FROM cdc.{TABLE}_current WHERE name = '{ok}'",
        f"SELECT '{bad}' FROMM nowhere",
        f"DROP TABLE cdc.`{refused}`",
    ])  # fmt: skip
    assert outputs[0].strip() == "0" and "Error" in outputs[1] and "READ_ONLY" in outputs[2]
    _cli(env, "sync")  # the syncs' log too
    warehouse, catalog = Path(env["CDC_WAREHOUSE"]), Path(env["CDC_WAREHOUSE"]) / "_catalog"
    assert not (catalog / "sql-server").exists()  # the server's state is not in the warehouse
    written = [path for folder in (state, warehouse) for path in folder.rglob("*") if path.is_file()]
    assert any(path.name == "server.log" for path in written)
    holding = {str(path): literal for path in written for literal in LOGGED_LITERALS if literal.encode() in path.read_bytes()}
    assert not holding, holding
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    # Nobody else reads or writes anything in it (Spark sets a+x on the jars it copies into tmp/: no read).
    loose = {str(path): oct(stat.S_IMODE(path.stat().st_mode)) for path in state.rglob("*")
             if stat.S_IMODE(path.stat().st_mode) & 0o066}  # fmt: skip
    assert not loose, loose
