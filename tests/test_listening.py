"""What listens where (docs/operations.md): every Spark the project starts listens on 127.0.0.1 only, its
web UI cannot kill jobs, a command line's session has no UI, and CDC_SPARK_CONF never reaches a command
line (``ps`` shows any process's to every local user).

The test session itself sets SPARK_LOCAL_IP (tests/conftest.py), which would hide a JVM that binds to every
interface: the processes here are started without it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance

from cdc_assets.engines.connect_server import PROPERTIES_FILE, jvm_pid, probe, start_server, stop_server
from cdc_assets.engines.process import free_port
from tests.pipeline import write_table_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DAY = "2024-01-01"
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
UI_PORTS = (4040, 4040 + 16)
SECRET_KEY = "spark.hadoop.fs.s3a.secret.key"

# cdc-current's own entry point, then what the session it left behind says about its UI and its JVM.
CURRENT_THEN_UI = """
import sys
from pyspark import SparkContext
from cdc_assets.cli.read import current_main

code = current_main(sys.argv[1:])
context = SparkContext._active_spark_context
print("exit", code)
print("ui", context.uiWebUrl)
print("ui_enabled", context.getConf().get("spark.ui.enabled"))
"""


def _secret() -> str:
    return f"not-for-ps-{uuid.uuid4().hex}"


def _environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A cold run's environment, without the test session's SPARK_LOCAL_IP."""
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    with DagsterInstance.from_config(str(home)):
        pass
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_LOCAL_IP", "SPARK_REMOTE", "CDC_SPARK_MASTER")}
    env.update(PYTHONPATH=str(REPO), DAGSTER_HOME=str(home), CDC_WAREHOUSE=str(tmp_path / "warehouse"), CDC_SPARK="local", **extra)
    return env


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _listening(processes: list[psutil.Process]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of ``processes``."""
    found = []
    for process in processes:
        try:
            connections = process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        found += [(process.pid, conn.laddr.ip, conn.laddr.port) for conn in connections if conn.status == psutil.CONN_LISTEN]
    return found


def _command_lines(processes: list[psutil.Process]) -> str:
    lines = []
    for process in processes:
        try:
            lines.append(" ".join(process.cmdline()))
        except psutil.Error:
            continue
    return "\n".join(lines)


def _spark_ui(ports: set[int]) -> tuple[int, str]:
    """(port, application id) of the one Spark web UI among ``ports``: on spark.ui.port (4040) or one of the
    next spark.port.maxRetries (16) ports, where its REST API answers (slowly the first time)."""
    [port] = [port for port in ports if UI_PORTS[0] <= port <= UI_PORTS[1]]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/applications", timeout=180) as response:
        [app] = json.load(response)
    return port, app["id"]


def _ui_properties(port: int, app_id: str) -> dict[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/applications/{app_id}/environment", timeout=180) as response:
        return dict(json.load(response)["sparkProperties"])


def test_a_cold_run_listens_on_loopback_only_and_keeps_its_conf_off_the_command_line(tmp_path):
    landing, configs = tmp_path / "landing", tmp_path / "configs"
    landing.mkdir()
    (landing / f"{DAY}.csv").write_text("id,a\n1,x\n2,y\n")
    write_table_config(configs, "listened", f"{landing}/{{date}}.csv", start_date=DAY, keys=[{"name": "id", "type": "int"}],
                       non_keys=[{"name": "a", "type": "string"}])  # fmt: skip
    secret, marker, release, log = _secret(), tmp_path / "paused.marker", tmp_path / "release", tmp_path / "run.log"
    # The UI on, as a user's cold run has it; a conf value that must not show in `ps`.
    conf = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g", SECRET_KEY: secret}
    env = _environment(tmp_path, CDC_TABLE_CONFIGS=str(configs), CDC_SPARK_CONF=json.dumps(conf),
                       CDC_PAUSE_BEFORE_COMMIT="listened/current_table", CDC_PAUSE_MARKER=str(marker), CDC_PAUSE_RELEASE=str(release))  # fmt: skip
    command = [str(REPO / ".venv/bin/dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions", "--select", "group:listened",
               "--partition", DAY]  # fmt: skip
    with log.open("w") as output:
        run = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not marker.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert marker.exists(), log.read_text()[-6000:]
        processes = _tree(run.pid)
        assert any(process.name() == "java" for process in processes), [process.name() for process in processes]
        listening = _listening(processes)
        # The driver's RPC, its block manager, its UI and py4j's gateway: each on loopback, none on every interface.
        assert len(listening) >= 3, listening
        assert {address for _, address, _ in listening} <= LOOPBACK, listening
        port, app_id = _spark_ui({port for _, _, port in listening})
        properties = _ui_properties(port, app_id)
        assert properties["spark.ui.killEnabled"] == "false"
        # The run's conf took effect (the UI shows a secret's key, never its value).
        assert properties["spark.sql.shuffle.partitions"] == "2" and SECRET_KEY in properties
        assert secret not in _command_lines(processes)
        release.touch()
        assert run.wait(timeout=600) == 0, log.read_text()[-6000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=60)
    assert "RUN_SUCCESS" in log.read_text()

    # A command line's session (cdc-current) has no UI at all.
    env.pop("CDC_PAUSE_BEFORE_COMMIT")
    done = subprocess.run([sys.executable, "-c", CURRENT_THEN_UI, "listened", "--as-of", DAY, "--out", str(tmp_path / "current")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    printed = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert printed.get("exit") == "0", done.stdout[-3000:] + done.stderr[-3000:]
    assert printed["ui"] == "None" and printed["ui_enabled"] == "false"
    assert (tmp_path / "current" / "_SUCCESS").exists()


def test_a_connect_server_reads_its_conf_from_a_file_only_its_owner_reads(tmp_path, monkeypatch):
    secret = _secret()
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setenv("CDC_SPARK_CONF", json.dumps({SECRET_KEY: secret, "spark.sql.shuffle.partitions": "3"}))
    state = tmp_path / "server"
    # The UI stays on: it must bind to loopback and be unable to kill jobs.
    handle = start_server(port=free_port(), state_dir=state, master="local[1]", conf={"spark.driver.memory": "1g"})
    try:
        properties = state / PROPERTIES_FILE
        assert stat.S_IMODE(properties.stat().st_mode) == 0o600
        assert secret in properties.read_text()
        everyone = list(psutil.process_iter())
        assert secret not in _command_lines(everyone)
        assert str(properties) in " ".join(psutil.Process(handle.pid).cmdline())
        listening = _listening([psutil.Process(jvm_pid(handle))])
        assert handle.port in {port for _, _, port in listening}
        assert {address for _, address, _ in listening} <= LOOPBACK, listening
        port, app_id = _spark_ui({port for _, _, port in listening} - {handle.port})
        ui = _ui_properties(port, app_id)
        # The conf took effect (the UI shows a secret's key, never its value), and reaches the Connect sessions.
        assert SECRET_KEY in ui and ui["spark.ui.killEnabled"] == "false"
        assert probe(handle.port, token=handle.token)["spark.sql.shuffle.partitions"] == "3"
    finally:
        stop_server(state)
