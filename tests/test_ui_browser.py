"""The Dagster UI as a person uses it, in a real browser: ``make ui`` on the demo data, driven by Playwright in
Chromium. The group's assets on the page, one partition materialized with the Materialize button, a two-date
backfill launched from the same dialog, a partition's counts and check result read off the page, a third
date whose declared check fails (staged on the run's branch, the failed check, ``published`` failed), and
``make ui`` stopped by Ctrl-C (SIGINT to its process group) and by SIGTERM to make.

Chromium comes from Debian's package (``make browser``, which ``make test`` runs); Playwright's own browser
download cannot be reached here, so the test launches the system browser by path. Screenshots of each step
(and of a failure) are written under the test's temp folder; the path is printed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import duckdb
import psutil
import pytest
import requests
import yaml

from resources.storage import WarehouseStorage
from tests.pipeline import stored_arrow
from cdc_assets.engines.process import free_port
from tests.processes import our_processes, stop_process_tree, tail

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TABLE = "synthetic"
DAY1, DAY2 = "2019-06-18", "2019-06-19"
# A third date whose extract drops half the keys: the declared check below fails it, so it stays staged.
DAY3 = "2019-06-20"
DELETE_CHECK = "deletes_at_most_a_quarter"
ASSETS = [
    "hashed_incoming",
    "rejects",
    "hash_join_classification",
    "inserts",
    "deletes",
    "updates",
    "current_table",
    "history_partition",
]
# Written by the run itself, so they differ between two runs of the same inputs.
RUN_COLUMNS = {"process_id", "processed_at"}
SERVER_TIMEOUT = 240
RUN_TIMEOUT = 15 * 60
# A stop that takes longer than this is what a user calls hanging (dagster dev itself waits up to 60 s per child).
STOP_TIMEOUT = 30
# Chromium as root in a container, with nothing that phones home (the machine's network is closed).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str:
    for candidate in (os.environ.get("CDC_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip(
        "no Chromium: `make browser` installs Debian's chromium package (it needs apt-get and root); "
        "or set CDC_CHROMIUM to a Chromium binary"
    )


def _generate_demo_data(root: Path) -> None:
    """The demo's data (make demo's cdc-generate call): 10,000 + 10,000 rows, seed 42."""
    subprocess.run(
        [str(BIN / "cdc-generate"), "10000", "10000", "5", "10", "0.2", "0.4", "0.4",
         str(root / "data" / TABLE / DAY1), str(root / "data" / TABLE / DAY2), "--seed", "42"],
        check=True,
        capture_output=True,
    )


def _table_with_a_declared_check(root: Path) -> Path:
    """The demo table's config running to DAY3 with a declared volume check, and DAY3's extract: DAY2's with
    half of its rows (about 50% of the keys deleted, where the check allows 25%). Returns the configs folder."""
    document = yaml.safe_load((REPO / "table_configs" / f"{TABLE}.yaml").read_text())
    document["end_date"] = DAY3
    document["checks"] = [{"type": "volume", "name": DELETE_CHECK, "max_delete_share": 0.25}]
    configs = root / "configs"
    configs.mkdir()
    (configs / f"{TABLE}.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    source, target = root / "data" / TABLE / DAY2, root / "data" / TABLE / DAY3
    target.mkdir()
    for part in source.iterdir():
        lines = part.read_text().splitlines(keepends=True)
        if part.name.startswith(".") or not lines:
            continue
        (target / part.name).write_text("".join(lines[: 1 + (len(lines) - 1) // 2]))
    return configs


def _environment(tmp_path: Path, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CDC_SPARK_MASTER", "SPARK_REMOTE", "CDC_TABLE_CONFIGS")}
    env.update(
        {
            "DAGSTER_HOME": str(tmp_path / f"{name}_home"),
            "CDC_WAREHOUSE": str(tmp_path / f"{name}_warehouse"),
            "CDC_DATA_ROOT": str(tmp_path),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "CDC_SPARK_CONF": '{"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}',
            # make ui's warm Spark server, of this test's own (make ui stops it, tests/test_warm_server.py checks).
            "CDC_SPARK_SERVER_DIR": str(tmp_path / f"{name}_spark_server"),
            "SPARK_CONNECT_PORT": str(free_port()),
        }
    )
    return env


def _as_a_scripts_background_job() -> None:
    """What ``make ui &`` in a shell script hands the job (POSIX): SIGINT and SIGQUIT ignored. The harder case:
    dagster dev started this way used to ignore SIGINT and SIGTERM both (see cdc_assets/cli/dev_ui.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


class MakeUi:
    """``make ui`` on a free loopback port, in its own process group, started as a script's background job."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.env = env
        self.home = env["DAGSTER_HOME"]
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            ["make", "--no-print-directory", "ui", f"UI_PORT={self.port}", f"DAGSTER_HOME={self.home}"],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_as_a_scripts_background_job,
        )
        self.known: dict[int, psutil.Process] = {}

    def log_tail(self) -> str:
        return f"--- make ui log (tail) ---\n{tail(self.log_path)}"

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + SERVER_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"make ui exited with {self.process.returncode} before serving\n{self.log_tail()}")
            try:
                if requests.get(f"{self.base}/server_info", timeout=5).status_code == 200:
                    self.remember()
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise AssertionError(f"make ui did not serve {self.base} within {SERVER_TIMEOUT} s\n{self.log_tail()}")

    def remember(self) -> None:
        try:
            root = psutil.Process(self.process.pid)
        except psutil.NoSuchProcess:
            root = None
        for proc in our_processes(root, self.home):
            self.known.setdefault(proc.pid, proc)

    def alive(self) -> list[psutil.Process]:
        self.remember()
        return [
            proc
            for proc in self.known.values()
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and proc.pid != os.getpid()
        ]

    def stop_by(self, send) -> float:
        """Send a signal (the caller's ``send``), then wait for every process of the tree to end; the seconds taken."""
        self.remember()
        started = time.monotonic()
        send()
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        while self.alive() and time.monotonic() - started < STOP_TIMEOUT:
            time.sleep(0.5)
        left = self.alive()
        assert not left, (
            f"still running {STOP_TIMEOUT} s after the signal: {[(p.pid, ' '.join(p.cmdline())[:100]) for p in left]}\n"
            f"{self.log_tail()}"
        )
        return time.monotonic() - started

    def close(self) -> None:
        """Whatever happened: nothing of this server is left running."""
        stop_process_tree(self.process, self.home, self.known)
        self._log.close()


def _partition_rows(warehouse: Path, asset: str, day: str) -> list[tuple]:
    """An asset's rows for a date, without the columns each run writes for itself, in a stable order."""
    stored = stored_arrow(warehouse, TABLE, asset, day)
    columns = [name for name in stored.column_names if name not in RUN_COLUMNS]
    selected = ", ".join(f'"{name}"' for name in columns)
    return duckdb.sql(f"SELECT {selected} FROM stored ORDER BY ALL").fetchall()


def _operations(warehouse: Path, asset: str, day: str) -> Counter:
    table = stored_arrow(warehouse, TABLE, asset, day, ("operation",))
    return Counter(table.column("operation").to_pylist())


def _wait_for_run(page, base: str, short_id: str, fail, outcome: str = "Success") -> str:
    """Reload the Runs page until the run's row says ``outcome`` (Success, or Failure); its row text."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        page.goto(f"{base}/runs")
        # The runs list is a virtualized grid of divs, one per run (class RunsFeedRow_rowGrid__<hash>).
        row = page.locator("div[class*='RunsFeedRow_rowGrid']", has_text=short_id)
        try:
            row.first.wait_for(timeout=20_000)
            text = row.first.inner_text()
        except Exception:  # noqa: BLE001 - the page is still loading; look again
            text = ""
        if outcome in text:
            return text
        if any(word in text for word in ("Success", "Failure", "Canceled")):
            fail(f"run {short_id} ended otherwise than {outcome}: {text!r}")
        time.sleep(5)
    fail(f"run {short_id} did not end within {RUN_TIMEOUT} s")


def _launch_from_dialog(page, partitions: str, button: str) -> str:
    """Materialize all… on the group page, the partition dialog, then the launch button; the toast's text."""
    page.get_by_role("button", name="Materialize all…").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Partition selection").wait_for()
    # The demo table ends at DAY2 (end_date), so the dialog lists every partition and hides none behind
    # "Show all partitions" (which a table running up to today shows).
    assert dialog.get_by_role("button", name="Show all partitions").count() == 0, dialog.inner_text()
    # The partition box: the dialog's one text input (the others are checkboxes).
    selection = dialog.locator("input:not([type='checkbox'])").first
    selection.fill(partitions)
    selection.press("Enter")
    launch = dialog.get_by_role("button", name=button)
    launch.wait_for(timeout=10_000)
    launch.click()
    toast = page.get_by_text(re.compile(r"^(Launched run|Created backfill) \w+$"))
    toast.wait_for(timeout=60_000)
    return toast.inner_text()


def _metadata_value(page, label: str) -> int:
    """A number in the asset partition's metadata table, by its label."""
    row = page.locator("tr", has=page.locator("td", has_text=re.compile(rf"^{label}$"))).first
    row.wait_for(timeout=30_000)
    return int(row.locator("td").nth(1).inner_text().strip().replace(",", ""))


def test_materialize_and_backfill_from_the_ui(tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"screenshots: {shots}", flush=True)
    _generate_demo_data(tmp_path)
    env = {**_environment(tmp_path, "ui"), "CDC_TABLE_CONFIGS": str(_table_with_a_declared_check(tmp_path))}
    warehouse = Path(env["CDC_WAREHOUSE"])
    server = MakeUi(env, tmp_path / "make_ui.log")
    page = None

    def fail(message: str) -> None:
        raise AssertionError(f"{message}\n{server.log_tail()}")

    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)
            try:
                server.wait_until_serving()

                # 1. The group's lineage: every asset of the table, rejects included, and no welcome dialog on top.
                page.goto(f"{server.base}/locations/cdc_assets/asset-groups/{TABLE}")
                for asset in ASSETS:
                    page.get_by_text(asset, exact=True).first.wait_for()
                assert page.get_by_role("dialog").count() == 0, "a dialog covers the group page (nux not switched off?)"
                page.screenshot(path=shots / "1_group.png")

                # 2. One partition from the Materialize button: the dialog says "Launch 1 run".
                toast = _launch_from_dialog(page, DAY1, "Launch 1 run")
                page.screenshot(path=shots / "2a_launched.png")
                short_id = toast.split()[-1]
                row = _wait_for_run(page, server.base, short_id, fail)
                assert f"partition: {DAY1}" in row, row
                page.screenshot(path=shots / "2b_run_succeeded.png")
                assert _operations(warehouse, "current_table", DAY1) == Counter({"I": 10000})
                assert _operations(warehouse, "history_partition", DAY1) == Counter({"I": 10000})
                for asset in ASSETS:
                    assert WarehouseStorage(str(warehouse)).has_partition(TABLE, asset, DAY1), f"{asset} {DAY1} not written"

                # 3. A backfill of both dates from the same dialog, followed on its page until it completes.
                page.goto(f"{server.base}/locations/cdc_assets/asset-groups/{TABLE}")
                toast = _launch_from_dialog(page, f"[{DAY1}...{DAY2}]", "Launch backfill")
                backfill_id = toast.split()[-1]
                deadline = time.monotonic() + RUN_TIMEOUT
                status = ""
                while time.monotonic() < deadline:
                    page.goto(f"{server.base}/runs/b/{backfill_id}")
                    status_label = page.get_by_text("Status", exact=True).first
                    status_label.wait_for()
                    body = page.inner_text("body")
                    match = re.search(r"\nStatus\n([^\n]+)\n", body)
                    status = match.group(1) if match else ""
                    if status not in ("", "In progress", "Requested"):
                        break
                    time.sleep(5)
                page.screenshot(path=shots / "3_backfill.png")
                assert status == "Succeeded", f"backfill {backfill_id} ended as {status!r}"
                for asset in ASSETS:
                    assert WarehouseStorage(str(warehouse)).has_partition(TABLE, asset, DAY2), f"{asset} {DAY2} not written"

                # 4. current_table's partition DAY2: the counts on the page are the ones on disk; the check passed.
                page.goto(f"{server.base}/assets/{TABLE}/current_table?view=partitions&partition={DAY2}")
                page.get_by_text("Latest materialization").first.wait_for()
                on_page = {label: _metadata_value(page, label) for label in ("inserts", "updates", "deletes", "unchanged")}
                page.screenshot(path=shots / "4a_partition.png")
                current = _operations(warehouse, "current_table", DAY2)
                history = _operations(warehouse, "history_partition", DAY2)
                assert on_page == {
                    "inserts": current["I"],
                    "updates": current["U"],
                    "deletes": history["D"],
                    "unchanged": current["N"],
                }, (on_page, current, history)
                # The demo's day 2: 20% deleted, 40% updated, 40% unchanged, 2,000 new keys.
                assert on_page == {"inserts": 2000, "updates": 4000, "deletes": 2000, "unchanged": 4000}, on_page

                page.goto(f"{server.base}/assets/{TABLE}/current_table?view=checks&checkDetail=row_count_reconciles")
                page.get_by_text("Latest execution").first.wait_for()
                page.get_by_text("Evaluation result").first.wait_for()
                check_text = page.inner_text("body")
                page.screenshot(path=shots / "4b_check.png")
                assert re.search(r"Evaluation result\s+Passed", check_text), check_text[-1500:]
                assert re.search(rf"Partition\s+{DAY2}", check_text), check_text[-1500:]
                assert f"current_table rows ({sum(current.values())})" in check_text, check_text[-1500:]

                # 5. DAY3's extract drops half the keys: the declared check fails, nothing is published, and the
                # partition's page says the date is staged (on the run's branch) and why.
                page.goto(f"{server.base}/locations/cdc_assets/asset-groups/{TABLE}")
                toast = _launch_from_dialog(page, DAY3, "Launch 1 run")
                short_id = toast.split()[-1]
                _wait_for_run(page, server.base, short_id, fail, outcome="Failure")
                page.goto(f"{server.base}/assets/{TABLE}/current_table?view=partitions&partition={DAY3}")
                page.get_by_text("Latest materialization").first.wait_for()
                page.get_by_text(re.compile(r"staged on branch cdc_run_")).first.wait_for()
                page.screenshot(path=shots / "5a_staged.png")
                page.goto(f"{server.base}/assets/{TABLE}/hash_join_classification?view=checks&checkDetail={DELETE_CHECK}")
                page.get_by_text("Evaluation result").first.wait_for()
                check_text = page.inner_text("body")
                page.screenshot(path=shots / "5b_failed_check.png")
                assert re.search(r"Evaluation result\s+Failed", check_text), check_text[-1500:]
                assert re.search(rf"Partition\s+{DAY3}", check_text), check_text[-1500:]
                # The table's `published` asset: the date failed (its observations say why: tests/test_publishing.py).
                page.goto(f"{server.base}/assets/{TABLE}/published?view=partitions&partition={DAY3}")
                page.get_by_text(re.compile(rf"Run {short_id} failed, and did not materialize this asset")).first.wait_for()
                assert page.get_by_text(re.compile(r"^Failed \(1\)$")).count() == 1, page.inner_text("body")[-1500:]
                page.screenshot(path=shots / "5c_not_published.png")
                storage = WarehouseStorage(str(warehouse))
                assert DAY3 not in storage.tables.stored(TABLE, "current_table", storage.tables.load(TABLE, "current_table").current_snapshot())
            except BaseException:
                if page is not None:
                    try:
                        page.screenshot(path=shots / "failure.png")
                    except Exception:  # noqa: BLE001 - the original error matters more
                        pass
                raise
            finally:
                browser.close()

        # 6. Ctrl-C in the terminal: SIGINT to make's whole process group stops everything.
        seconds = server.stop_by(lambda: os.killpg(server.process.pid, signal.SIGINT))
        print(f"make ui stopped {seconds:.1f} s after SIGINT to its group", flush=True)
    finally:
        server.close()

    # The same dates through the CLI, as make demo runs them: every asset's rows are the UI's.
    cli_env = _environment(tmp_path, "cli")
    Path(cli_env["DAGSTER_HOME"]).mkdir()
    shutil.copy(REPO / "instance" / "dagster.yaml", Path(cli_env["DAGSTER_HOME"]) / "dagster.yaml")
    for day in (DAY1, DAY2):
        subprocess.run(
            [str(BIN / "dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions",
             "--select", f"group:{TABLE}", "--partition", day],
            cwd=REPO, env=cli_env, check=True, capture_output=True,
        )
    cli_warehouse = Path(cli_env["CDC_WAREHOUSE"])
    for asset in ASSETS:
        for day in (DAY1, DAY2):
            assert _partition_rows(warehouse, asset, day) == _partition_rows(cli_warehouse, asset, day), f"{asset} {day}"


def test_make_ui_stops_on_sigterm_to_make(tmp_path):
    """``kill <make's pid>`` (a service manager, a closed terminal): make passes SIGTERM on and nothing is left."""
    env = _environment(tmp_path, "term")
    server = MakeUi(env, tmp_path / "make_ui.log")
    try:
        server.wait_until_serving()
        assert len(server.alive()) >= 3, "expected make, dagster dev and its webserver and daemon"
        # make ui created every shipped table's pool before the daemon's first pass.
        from dagster import DagsterInstance

        from cdc_assets.model.config import load_table_configs

        with DagsterInstance.from_config(server.home) as instance:
            pools = instance.event_log_storage.get_concurrency_keys()
        assert {f"cdc_{config.name}" for config in load_table_configs(REPO / "table_configs")} <= pools, pools
        seconds = server.stop_by(lambda: os.kill(server.process.pid, signal.SIGTERM))
        print(f"make ui stopped {seconds:.1f} s after SIGTERM to make", flush=True)
        with pytest.raises(requests.RequestException):
            requests.get(f"{server.base}/server_info", timeout=5)
    finally:
        server.close()
