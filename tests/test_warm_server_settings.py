"""A warm Spark server serves only the runs it can serve (cdc_assets/engines/server_settings.py): a real warm
server started for the local default (no S3 keys in its environment, one ``CDC_SPARK_CONF``), a real
SeaweedFS lake, and real runs through the dagster CLI and the commands.

- A lake run beside it succeeds on a session of its own, and its log says why in one line.
- The same run with ``SPARK_REMOTE`` naming the server fails before any work, naming both settings.
- A local run still goes through the server; one with another ``CDC_SPARK_CONF`` does not.
- ``cdc-current`` on the lake says it runs cold and why; ``make -s lake-env`` says what the server serves;
  ``make ui`` beside a server it cannot use sends its runs elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cdc_assets.cli import dev_ui
from cdc_assets.engines import connect_server
from cdc_assets.model.names import CURRENT
from resources.session import spark_target
from resources.storage import WarehouseStorage
from tests.lake import lake_variables, pointed_at, upload
from tests.test_warm_server import DAGSTER, REPO, SERVER_CONF, _environment

pytestmark = pytest.mark.slow

DAY = "2024-01-01"
OTHER_CONF = '{"spark.sql.shuffle.partitions": "3", "spark.ui.enabled": "false"}'


def _materialize(env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [str(DAGSTER), "asset", "materialize", "-m", "cdc_assets.defs.definitions", "--select", "group:orders", "--partition", DAY]
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)


def _start_local_default_server(env: dict[str, str]) -> connect_server.ServerHandle:
    """``make spark-server`` in a shell that was never pointed at a lake: no S3 keys in the server's environment."""
    local_shell = {key: value for key, value in env.items() if not key.startswith("AWS_")}
    command = [sys.executable, "-m", "cdc_assets.engines.connect_server", "start", "--port", env["SPARK_CONNECT_PORT"],
               "--state-dir", env["CDC_SPARK_SERVER_DIR"]]  # fmt: skip
    started = subprocess.run(command, env=local_shell, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr[-4000:]
    handle = connect_server.running_server(env["CDC_SPARK_SERVER_DIR"])
    assert handle is not None
    return handle


def test_a_lake_run_beside_a_warm_server_for_the_local_default_runs_on_its_own_session_and_says_why(tmp_path, lake, monkeypatch):
    local = _environment(tmp_path, ["orders"])
    assert local["CDC_SPARK_CONF"] == SERVER_CONF
    server = _start_local_default_server(local)
    try:
        upload(REPO / "samples" / "orders", lake, prefix="landing/samples/orders")
        variables = lake_variables(lake)
        on_lake = {**local, **variables}

        # The lake run: a session of its own (the server has no S3 keys), and the log says why in one line.
        lake_run = _materialize(on_lake)
        output = lake_run.stdout + lake_run.stderr
        assert lake_run.returncode == 0, output[-6000:]
        why = (f"Spark for this run: a Spark session of the run's own (cold): the warm server at {server.url} serves "
               f"CDC_WAREHOUSE={local['CDC_WAREHOUSE']}, this run CDC_WAREHOUSE={variables['CDC_WAREHOUSE']}")  # fmt: skip
        assert why in output, output[-6000:]
        assert "AWS_ACCESS_KEY_ID (unset there, set here)" in output and "starting a session of its own" in output
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in output and server.token not in output
        with pointed_at(monkeypatch, variables):
            storage = WarehouseStorage(variables["CDC_WAREHOUSE"])
            assert storage.has_partition("orders", CURRENT, DAY)
            stored = storage.row_counts("orders", CURRENT, [DAY])[DAY]
        assert stored > 0

        # Asked for by name, the server refuses the run before any work: both warehouses named.
        named = _materialize({**on_lake, "SPARK_REMOTE": server.client_url})
        refused = named.stdout + named.stderr
        assert named.returncode != 0, refused[-6000:]
        assert f"SPARK_REMOTE=sc://localhost:{server.port}/;token=<redacted> names the project's warm Spark Connect server" in refused, refused[-6000:]
        assert f"CDC_WAREHOUSE={local['CDC_WAREHOUSE']}, this run CDC_WAREHOUSE={variables['CDC_WAREHOUSE']}" in refused
        assert "Spark session ready" not in refused  # no session, so no work
        assert server.token not in refused

        # A local run is still the server's.
        local_run = _materialize(local)
        assert local_run.returncode == 0, (local_run.stdout + local_run.stderr)[-6000:]
        assert f"Spark for this run: the project's warm Spark Connect server {server.url} (pid {server.pid})" in local_run.stdout + local_run.stderr

        # A command on the lake says why it runs cold.
        current = subprocess.run([str(REPO / ".venv/bin/cdc-current"), "orders", "--as-of", DAY, "--out", str(tmp_path / "current")],
                                 env=on_lake, cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert current.returncode == 0, current.stderr[-4000:]
        assert f"cdc-current: Spark: a Spark session of the run's own (cold): the warm server at {server.url}" in current.stderr, current.stderr

        # make -s lake-env says what the server serves.
        lake_env = subprocess.run([sys.executable, "-m", "cdc_assets.engines.lake_server", "env", "--state-dir", str(lake.state_dir)],
                                  env=local, cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
        comments = [line for line in lake_env.stdout.splitlines() if line.startswith("#")]
        assert len(comments) == 1, lake_env.stdout + lake_env.stderr
        assert f"# the warm Spark server of this checkout, {server.url} (pid {server.pid}), was started for " in comments[0]
        assert "without S3 keys: runs with these settings start sessions of their own" in comments[0], comments[0]

        # One CDC_SPARK_CONF the server was started with, another the run's: not sent there, or refused when asked for.
        with monkeypatch.context() as patch:
            for name, value in local.items():
                patch.setenv(name, value)
            patch.delenv("SPARK_REMOTE", raising=False)
            assert spark_target.resolve_spark_target().url == server.client_url
            patch.setenv("CDC_SPARK_CONF", OTHER_CONF)
            other = spark_target.resolve_spark_target()
            assert other.url is None and "CDC_SPARK_CONF (another value; not shown)" in other.description, other.description
            assert spark_target.resolve_spark_target(spark_conf=SERVER_CONF).url == server.client_url  # the resource's field
            # make ui beside it: its runs are not sent there (they start their own, saying why), unless it matches.
            assert not dev_ui.WarmSpark().enabled and dev_ui.WarmSpark().env["CDC_SPARK"] == "auto"
            patch.setenv("CDC_SPARK_CONF", SERVER_CONF)
            assert dev_ui.WarmSpark().enabled and dev_ui.WarmSpark().env["CDC_SPARK"] == "server"
            patch.setenv("CDC_SPARK_CONF", OTHER_CONF)
            patch.setenv("CDC_SPARK", "server")
            with pytest.raises(spark_target.ServerCannotServeRunError, match="CDC_SPARK=server, and the project's Spark Connect server cannot"):
                spark_target.resolve_spark_target()
    finally:
        connect_server.stop_server(local["CDC_SPARK_SERVER_DIR"])
