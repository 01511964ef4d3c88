"""A ``kill -9`` in the middle of ``cdc-erase``, then the same command again: the erase completes.

Each asset is an Iceberg table: the kill leaves every one at a whole snapshot (the erased one or the
one before), and the run again completes the same request; then no file under the table, data or
metadata, holds the erased key's bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from cdc_assets.model.config import load_table_config
from cdc_assets.cli.erase import main as erase_main
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates

REPO = Path(__file__).resolve().parent.parent
TABLE = "orders"
DATES = ["2024-01-01", "2024-01-02", "2024-01-03"]
# bob's order: in every date's state, and in the first date's inserts and history.
KEY, NAME = ("LON", "1002"), "gift wrap"

pytestmark = pytest.mark.slow  # a killed cdc-erase process, with its own JVM


def _files_holding(root: Path, text: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / TABLE).rglob("*") if p.is_file() and text.encode() in p.read_bytes())


def _snapshots(storage: WarehouseStorage) -> dict[str, int]:
    """Each asset's current snapshot id."""
    return {asset: storage.tables.load(TABLE, asset).current_snapshot().snapshot_id for asset in storage.stored_assets(TABLE)}


def test_a_kill_during_an_erase_then_the_same_command_again_completes_it(spark, warehouse, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    # Stored per date: the erase rewrites each date's files of each table in turn, which the pause below
    # splits. (An incremental state's erase is tests/test_erasure_incremental.py's.)
    configs = tmp_path / "configs"
    configs.mkdir()
    document = yaml.safe_load((REPO / "table_configs" / f"{TABLE}.yaml").read_text())
    (configs / f"{TABLE}.yaml").write_text(yaml.safe_dump({**document, "storage": {"current": "snapshot"}}, sort_keys=False))
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config = load_table_config(configs / f"{TABLE}.yaml")
    assert all(result.success for result in run_dates(definitions_for(config), DATES, DagsterInstance.ephemeral()))
    keys = tmp_path / "keys.csv"
    keys.write_text("order_id,store_code\n" + f"{KEY[1]},{KEY[0]}\n")
    assert _files_holding(warehouse, NAME)
    storage = WarehouseStorage(str(warehouse))
    before = _snapshots(storage)
    rows_before = {asset: storage.row_counts(TABLE, asset, storage.stored_dates(TABLE, asset)) for asset in before}

    marker, log = tmp_path / "paused.marker", tmp_path / "erase.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        # Assets are erased in name order: current_table, deletes, hash_join_classification and hashed_incoming
        # are committed when history_partition's rewrite is about to commit.
        "CDC_PAUSE_BEFORE_COMMIT": f"{TABLE}/history_partition",
        "CDC_PAUSE_MARKER": str(marker),
        "CDC_SPARK_CONF": json.dumps({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}),
    }
    with log.open("w") as output:
        erase = subprocess.Popen(
            [sys.executable, "-m", "cdc_assets.cli.erase", TABLE, "--keys", str(keys), "--reason", "GDPR-42"],
            env=env, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and erase.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert marker.exists(), f"the erase never paused (exit code {erase.poll()}):\n{log.read_text()[-4000:]}"
    finally:
        if erase.poll() is None:
            os.killpg(erase.pid, signal.SIGKILL)
        erase.wait(timeout=60)
    assert erase.returncode == -signal.SIGKILL

    (request,) = storage.erasure_requests(TABLE)
    assert request["status"] == "erasing" and request["reason"] == "GDPR-42"
    assert {"current_table/2024-01-03", "hashed_incoming/2024-01-01"} <= set(request["partitions"])
    # Each table is at a whole snapshot: the ones erased at their erase's, history_partition (and those
    # after it) at the one they had; every stored date reads in full at it.
    after_kill = _snapshots(storage)
    assert after_kill["current_table"] != before["current_table"] and after_kill["hashed_incoming"] != before["hashed_incoming"]
    assert after_kill["history_partition"] == before["history_partition"]
    for asset in after_kill:
        days = storage.stored_dates(TABLE, asset)
        counts = storage.row_counts(TABLE, asset, days)
        if days:
            assert storage.read(spark, TABLE, asset, days).count() == sum(counts.values()), asset
        if asset >= "history_partition":
            assert counts == rows_before[asset], asset
    # Part-way: --verify names what still holds the key and exits 1: the assets not reached yet, and the
    # files of the snapshots the erase replaced (deleted only once every asset is done).
    assert erase_main([TABLE, "--verify", "--keys", str(keys)]) == 1
    listed = [line.strip() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert any(line.startswith("history_partition 2024-01-01") and "a live file" in line for line in listed), listed
    current_table = [line for line in listed if line.startswith("current_table ")]
    assert current_table and all("a replaced file" in line for line in current_table), listed

    assert erase_main([TABLE, "--keys", str(keys), "--reason", "GDPR-42"]) == 0
    assert "(resumed)" in capsys.readouterr().out
    (request,) = storage.erasure_requests(TABLE)  # the same request, completed
    assert request["status"] == "complete" and len(request["resumed_at"]) == 1
    assert {"history_partition/2024-01-01", "current_table/2024-01-03"} <= set(request["partitions"])
    assert erase_main([TABLE, "--verify", "--keys", str(keys)]) == 0
    assert "0 stored files hold the keys" in capsys.readouterr().out
    # Data and metadata files alike (manifests keep no min/max bounds), the replaced snapshots' files too.
    assert _files_holding(warehouse, NAME) == []
