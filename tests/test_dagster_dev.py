"""The code location as an operator runs it: ``dagster dev`` (webserver + daemon), a backfill of each of two
tables (a delta and a change set) launched through GraphQL, the daemon turning each into one single-run
backfill, Parquet on disk and every check passed.

Runs in the normal suite: it starts real servers on a free port with a throwaway DAGSTER_HOME and
warehouse, and stops every process it started (by process group, then by the unique DAGSTER_HOME in
each process's environment), whatever the outcome.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import requests
from dagster import AssetCheckKey, AssetKey, DagsterEventType, DagsterInstance

from resources.storage import WarehouseStorage
from tests.pipeline import stored_arrow
from cdc_assets.engines.process import free_port
from tests.processes import stop_process_tree, tail

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DAGSTER = Path(sys.executable).parent / "dagster"
ORDERS_ASSETS = [
    "hashed_incoming",
    "rejects",
    "hash_join_classification",
    "inserts",
    "deletes",
    "updates",
    "current_table",
    "history_partition",
]
ORDERS_CHECKS = {
    ("hashed_incoming", "rows_read_reconcile"),
    ("hashed_incoming", "keys_unique"),
    ("hashed_incoming", "no_erased_keys_in_extract"),
    ("hash_join_classification", "incoming_reconciles"),
    ("hash_join_classification", "previous_state_reconciles"),
    ("current_table", "row_count_reconciles"),
    ("current_table", "key_hash_unique"),
    ("current_table", "keys_not_null"),
    ("current_table", "stored_state_reconciles"),  # storage.current unset: defined in either layout
    ("history_partition", "row_count_reconciles"),
    ("updates", "no_update_without_change"),
}
ORDERS_EXPECTED = {
    ("current_table", "2024-01-01"): {"I": 6},
    ("history_partition", "2024-01-01"): {"I": 6},
    ("current_table", "2024-01-02"): {"I": 1, "U": 2, "N": 1, "X": 3},
    ("history_partition", "2024-01-02"): {"I": 1, "U": 2},
    ("current_table", "2024-01-03"): {"U": 2, "I": 1, "X": 5},
    ("history_partition", "2024-01-03"): {"U": 2, "I": 1},
}
# A changeset (seed 003's shape): a second self-dependent output, applied_sequences, in the same
# multi-asset; the UI's backfill of every asset must still launch as one single run.
ACCOUNTS_CHECKS = {
    ("hashed_incoming", "rows_read_reconcile"),
    ("hashed_incoming", "no_erased_keys_in_extract"),
    ("hash_join_classification", "records_reconcile"),
    ("hash_join_classification", "previous_state_reconciles"),
    ("current_table", "previous_plus_changes"),
    ("current_table", "row_count_reconciles"),
    ("current_table", "key_hash_unique"),
    ("current_table", "keys_not_null"),
    ("current_table", "stored_state_reconciles"),  # storage.current unset: defined in either layout
    ("history_partition", "row_count_reconciles"),
    ("updates", "no_update_without_change"),
}
CASES = {
    "orders": {
        "dates": ["2024-01-01", "2024-01-02", "2024-01-03"],
        "assets": ORDERS_ASSETS,
        "checks": ORDERS_CHECKS,
        "expected": ORDERS_EXPECTED,
    },
    "accounts": {
        "dates": ["2024-02-01", "2024-02-02", "2024-02-03"],
        "assets": [*ORDERS_ASSETS, "late_changes", "applied_sequences"],
        "checks": ACCOUNTS_CHECKS,
        "expected": {
            ("current_table", "2024-02-01"): {"I": 4},
            ("current_table", "2024-02-02"): {"U": 1, "N": 1, "X": 1},
            ("history_partition", "2024-02-02"): {"U": 1, "D": 1},
            ("current_table", "2024-02-03"): {"I": 1, "U": 1, "X": 2},
            ("history_partition", "2024-02-03"): {"I": 1, "U": 1},
        },
    },
}

SERVER_TIMEOUT = 180
LOCATION_TIMEOUT = 180
BACKFILL_TIMEOUT = 15 * 60

WORKSPACE_QUERY = """
query {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { repositories { name } }
          ... on PythonError { message stack }
        }
      }
    }
    ... on PythonError { message }
  }
}
"""

LAUNCH_BACKFILL = """
mutation LaunchBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId launchedRunIds }
    ... on PythonError { message stack }
    ... on PartitionSetNotFoundError { message }
    ... on PartitionKeysNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
  }
}
"""

BACKFILL_STATUS = """
query BackfillStatus($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id
      status
      error { message stack }
      runs { runId status tags { key value } }
    }
    ... on BackfillNotFoundError { message }
    ... on PythonError { message }
  }
}
"""

RUN_FAILURES = """
query RunFailures($runId: ID!) {
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on ExecutionStepFailureEvent { stepKey error { message } }
        ... on RunFailureEvent { message }
      }
    }
  }
}
"""


_STARTED = time.monotonic()


def _progress(message: str) -> None:
    """Phase timings, shown by pytest when the test fails (or with -s)."""
    print(f"[{time.monotonic() - _STARTED:7.1f}s] {message}", flush=True)


def _graphql(url: str, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
    response = requests.post(url, json={"query": query, "variables": variables or {}}, timeout=timeout)
    response.raise_for_status()
    body = response.json()
    assert not body.get("errors"), f"GraphQL errors: {body['errors']}"
    return body["data"]


def test_dagster_dev_backfills(tmp_path):
    """One ``dagster dev`` serving both tables; a backfill of each, launched together, runs as one single run.

    The two backfills share the servers and the daemon's passes (a backfill completes on a pass of the
    daemon, every 30 s), so the second costs no extra start or wait.
    """
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    # Only the tables under test: the test does not depend on (or load) whatever other configs exist.
    configs = tmp_path / "table_configs"
    configs.mkdir()
    for table in CASES:
        shutil.copy(REPO / "table_configs" / f"{table}.yaml", configs / f"{table}.yaml")
    log_path = tmp_path / "dagster_dev.log"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/graphql"

    env = dict(os.environ)
    env.update(
        {
            "DAGSTER_HOME": str(dagster_home),
            "CDC_WAREHOUSE": str(warehouse),
            "CDC_DATA_ROOT": str(REPO),
            "CDC_TABLE_CONFIGS": str(configs),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # A small local JVM: three tiny CSV files do not need the 4g default.
            "CDC_SPARK_CONF": '{"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}',
        }
    )
    for name in ("CDC_SPARK_MASTER", "SPARK_REMOTE"):
        env.pop(name, None)

    global _STARTED
    _STARTED = time.monotonic()
    known: dict[int, psutil.Process] = {}
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed in finally
    process = subprocess.Popen(
        [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )

    def fail(message: str) -> None:
        raise AssertionError(f"{message}\n--- dagster dev log (tail) ---\n{tail(log_path)}")

    def remember_children() -> None:
        try:
            for proc in psutil.Process(process.pid).children(recursive=True):
                known.setdefault(proc.pid, proc)
        except psutil.NoSuchProcess:
            pass

    backfills: dict[str, dict | None] = dict.fromkeys(CASES)
    runs: dict[str, list[dict]] = {}
    finished = False
    try:
        # 1. The webserver answers.
        deadline = time.monotonic() + SERVER_TIMEOUT
        while True:
            if process.poll() is not None:
                fail(f"dagster dev exited with {process.returncode} before serving")
            try:
                if requests.get(f"{base}/server_info", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                fail(f"webserver did not answer on {base} within {SERVER_TIMEOUT}s")
            time.sleep(1)
        _progress("webserver answers")

        # 2. The code location has loaded (a load error fails at once, with its message).
        deadline = time.monotonic() + LOCATION_TIMEOUT
        while True:
            remember_children()
            workspace = _graphql(url, WORKSPACE_QUERY)["workspaceOrError"]
            entries = workspace.get("locationEntries", []) if workspace["__typename"] == "Workspace" else []
            entry = next((e for e in entries if e["name"] == "cdc_assets"), None)
            if entry and entry["loadStatus"] == "LOADED":
                location = entry["locationOrLoadError"]
                if location is None or location["__typename"] == "PythonError":
                    fail(f"code location failed to load: {location}")
                if location["repositories"]:
                    break
            if time.monotonic() > deadline:
                fail(f"code location did not load within {LOCATION_TIMEOUT}s: {workspace}")
            time.sleep(1)
        _progress("code location loaded")

        # 3. Launch, for each table, the backfill of every one of its assets over its three dates.
        backfill_ids = {}
        for table, case in CASES.items():
            params = {
                "assetSelection": [{"path": [table, asset]} for asset in case["assets"]],
                "partitionNames": case["dates"],
                "title": f"test_dagster_dev {table}",
            }
            launched = _graphql(url, LAUNCH_BACKFILL, {"backfillParams": params})["launchPartitionBackfill"]
            if launched["__typename"] != "LaunchBackfillSuccess":
                fail(f"launchPartitionBackfill of {table} returned {launched}")
            backfill_ids[table] = launched["backfillId"]
            assert backfill_ids[table]
            _progress(f"{table}: backfill {backfill_ids[table]} launched")

        # 4. The daemon runs both to completion.
        deadline = time.monotonic() + BACKFILL_TIMEOUT
        while True:
            remember_children()
            if process.poll() is not None:
                fail(f"dagster dev exited with {process.returncode} during the backfills")
            for table, backfill_id in backfill_ids.items():
                result = _graphql(url, BACKFILL_STATUS, {"backfillId": backfill_id})["partitionBackfillOrError"]
                if result["__typename"] != "PartitionBackfill":
                    fail(f"partitionBackfillOrError of {table} returned {result}")
                backfill = backfills[table]
                if backfill is None or (result["status"], [r["status"] for r in result["runs"]]) != (
                    backfill["status"],
                    [r["status"] for r in backfill["runs"]],
                ):
                    _progress(f"{table}: backfill {result['status']}, runs {[r['status'] for r in result['runs']]}")
                backfills[table] = backfill = result
                if backfill["status"] in ("FAILED", "COMPLETED_FAILED", "CANCELED", "FAILING", "CANCELING"):
                    failures = [
                        (run["runId"], run["status"], _graphql(url, RUN_FAILURES, {"runId": run["runId"]})["logsForRun"])
                        for run in backfill["runs"]
                        if run["status"] != "SUCCESS"
                    ]
                    fail(f"{table}: backfill ended {backfill['status']}: {backfill['error']}; failed runs: {failures}")
            if all(backfill["status"] in ("COMPLETED", "COMPLETED_SUCCESS") for backfill in backfills.values()):
                break
            if time.monotonic() > deadline:
                fail(f"backfills not completed after {BACKFILL_TIMEOUT}s: {backfills}")
            time.sleep(3)

        for table, backfill in backfills.items():
            runs[table] = backfill["runs"]
            dates = CASES[table]["dates"]
            assert runs[table], f"{table}: the backfill completed without launching a run"
            assert all(run["status"] == "SUCCESS" for run in runs[table]), f"{table}: not every run succeeded: {runs[table]}"
            # BackfillPolicy.single_run: the whole range in one run.
            assert len(runs[table]) == 1, f"{table}: expected one single-run backfill run, got {len(runs[table])}: {runs[table]}"
            run_tags = {tag["key"]: tag["value"] for tag in runs[table][0]["tags"]}
            assert run_tags.get("dagster/backfill") == backfill_ids[table], run_tags
            assert run_tags.get("dagster/asset_partition_range_start") == dates[0], run_tags
            assert run_tags.get("dagster/asset_partition_range_end") == dates[-1], run_tags
        finished = True
    finally:
        stop_process_tree(process, str(dagster_home), known)
        log_file.close()
        _progress("servers stopped")
    leftovers = [proc for proc in known.values() if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE]
    assert not leftovers, f"processes left behind: {[(p.pid, p.name()) for p in leftovers]}"
    assert finished

    for table, case in CASES.items():
        DATES, ASSETS, CHECKS, EXPECTED = (case[name] for name in ("dates", "assets", "checks", "expected"))
        # 5. The outputs stored, read with pyiceberg (no Spark in the test process).
        storage = WarehouseStorage(str(warehouse))
        for asset in ASSETS:
            for day in DATES:
                assert storage.has_partition(table, asset, day), f"{table} {asset} {day} was not written"
        for (asset, day), expected in EXPECTED.items():
            stored = stored_arrow(warehouse, table, asset, day, ("operation",))
            counts = dict(Counter(stored.column("operation").to_pylist()))
            assert counts == expected, f"{table} {asset} {day}: {counts} != {expected}"

        # 6. Every asset check passed, once per date, in the backfill's run.
        with DagsterInstance.from_config(str(dagster_home)) as instance:
            evaluations = []
            for run in runs[table]:
                records = instance.get_records_for_run(run["runId"], of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records
                for record in records:
                    data = record.event_log_entry.dagster_event.event_specific_data
                    evaluations.append((data.asset_key.path[-1], data.check_name, data.partition, data.passed))
            # The check state the UI shows: one SUCCEEDED execution per check and date, none left planned.
            statuses = {
                (asset, name): sorted(
                    (record.partition, record.status.value)
                    for record in instance.event_log_storage.get_asset_check_execution_history(
                        AssetCheckKey(AssetKey([table, asset]), name), limit=100
                    )
                )
                for asset, name in CHECKS
            }
        assert len(evaluations) == len(CHECKS) * len(DATES), f"{table}: {len(evaluations)} evaluations: {sorted(evaluations)}"
        assert {(asset, name, day) for asset, name, day, _ in evaluations} == {
            (asset, name, day) for asset, name in CHECKS for day in DATES
        }, sorted(evaluations)
        failed = [evaluation for evaluation in evaluations if not evaluation[3]]
        assert not failed, f"{table}: failed checks: {failed}"
        expected_statuses = [(day, "SUCCEEDED") for day in DATES]
        assert all(value == expected_statuses for value in statuses.values()), (table, statuses)
