"""Readers never write: every read path works on a read-only warehouse and leaves it exactly as it was.

A change set table (tests/test_consumers.py's chain) is materialized through real Dagster runs; then one
process, with the warehouse mounted read-only (a read-only bind mount in a mount namespace of its own
when the tests run as root, who ignores file modes; ``chmod -R a-w`` otherwise), reads it every way a
consumer does: the storage's reads and manifests, ``cdc-scd2``, ``cdc-changes``, the SCD2 view in
DuckDB, and a Dagster run of the table's asset checks alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance

from cdc_assets.usecases.readers import changes_between, scd2_view
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, partition_dir, read_stored, run_range
from tests.test_consumers import D1, D3, DAYS, HEADER, TABLE, write_members_config

REPO = Path(__file__).resolve().parent.parent

READ_EVERYTHING = r"""
import json, os, sys
warehouse, out = sys.argv[1], sys.argv[2]
try:
    open(os.path.join(warehouse, "probe"), "w")
    sys.exit("the warehouse is writable: the test would prove nothing")
except OSError:
    pass
from dagster import DagsterInstance
import duckdb
from cdc_assets.cli import read as cli
from cdc_assets.model.config import load_table_config
from cdc_assets.usecases.readers import scd2_duckdb_sql
from cdc_assets.defs.component import build_definitions
from cdc_assets.defs.factory import build_table_definitions
from resources.session.spark_session import build_spark_session
from resources.storage import WarehouseStorage

config = load_table_config(sys.argv[3])
first, last = sys.argv[4], sys.argv[5]
spark = build_spark_session(master="local[1]", conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
storage = WarehouseStorage(warehouse)
dates = storage.stored_dates(config.name, "current_table")
figures = {
    "dates": dates,
    "current_rows": storage.read(spark, config.name, "current_table", dates).count(),
    "last_rows": storage.read_one(spark, config.name, "current_table", last).count(),
    "footers": storage.row_counts(config.name, "history_partition", [first, "2024-03-02", last]),
    "has_last": storage.has_partition(config.name, "history_partition", last),
}
assert cli.scd2_main([config.name, "--out", f"{out}/scd2"]) == 0
assert cli.changes_main([config.name, "--from", first, "--to", last, "--out", f"{out}/changes"]) == 0
figures["scd2_rows"] = spark.read.parquet(f"{out}/scd2").count()
figures["changes_rows"] = spark.read.parquet(f"{out}/changes").count()
figures["duckdb_scd2_rows"] = len(duckdb.sql(scd2_duckdb_sql(config.name, warehouse)).fetchall())
defs = build_definitions([build_table_definitions(config)])
# What the UI's "Execute checks" launches: the table's job with its asset checks selected and no asset.
job = defs.resolve_job_def(f"{config.name}_job")
checks = set(defs.resolve_asset_graph().asset_check_keys)
assert checks
result = job.get_subset(asset_selection=set(), asset_check_selection=checks).execute_in_process(
    partition_key=last, instance=DagsterInstance.get()  # DAGSTER_HOME: the instance the dates were run in
)
figures["checks"] = sorted(
    (evaluation.check_name, evaluation.passed) for evaluation in result.get_asset_check_evaluations()
)
figures["checks_run_success"] = result.success
print("FIGURES " + json.dumps(figures))
"""


def _tree(root: Path) -> list[tuple[str, int, str]]:
    """Every path under ``root`` with its modification time and, for a symlink, its target."""
    return sorted((str(p), p.lstat().st_mtime_ns, os.readlink(p) if p.is_symlink() else "") for p in root.rglob("*"))


def _read_only_command(warehouse: Path, command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command  # the caller made the warehouse read-only with chmod
    if not shutil.which("unshare"):
        pytest.skip("running as root without unshare: no way to mount the warehouse read-only here")
    mount = f"mount --bind '{warehouse}' '{warehouse}' && mount -o remount,bind,ro '{warehouse}' && exec \"$@\""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", *command]


@pytest.mark.slow
def test_every_read_path_works_on_a_read_only_warehouse_and_changes_nothing(spark, tmp_path):
    source, warehouse, out = tmp_path / "source", tmp_path / "warehouse", tmp_path / "out"
    source.mkdir()
    for day in (D1, "2024-03-02", D3):
        (source / f"{day}.csv").write_text(HEADER + "\n" + "\n".join(DAYS[day]) + "\n")
    config = write_members_config(tmp_path / "configs", source)
    (tmp_path / "dagster_home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster_home"))  # the checks read its records
    os.environ["CDC_WAREHOUSE"] = str(warehouse)
    try:
        assert run_range(definitions_for(config), D1, D3, instance).success
    finally:
        del os.environ["CDC_WAREHOUSE"]
    # What writers leave in the tables' folders, which only a later writer may clean up: the data files of
    # a snapshot a later commit replaced (D3's history written again) and of a write killed before its
    # commit (a data file no snapshot names). Readers read each table's snapshot, never these.
    storage = WarehouseStorage(str(warehouse))
    try:
        storage.write(storage.read(spark, TABLE, "history_partition", [D3]), TABLE, "history_partition", [D3])
    finally:
        storage.release()
    live = storage.tables.live_files(TABLE, "history_partition", [D3])
    killed = Path(next(iter(live)))
    shutil.copyfile(killed, killed.with_name(f"killed-1-{killed.name}"))
    assert len(storage.tables.data_file_paths(TABLE, "history_partition")) > len(storage.tables.live_files(TABLE, "history_partition"))
    before = _tree(warehouse)
    command = [sys.executable, "-c", READ_EVERYTHING, str(warehouse), str(out), str(tmp_path / "configs" / f"{TABLE}.yaml"), D1, D3]
    env = {**os.environ, "PYTHONPATH": str(REPO), "CDC_WAREHOUSE": str(warehouse),
           "CDC_TABLE_CONFIGS": str(tmp_path / "configs"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(warehouse)], check=True)
    try:
        done = subprocess.run(_read_only_command(warehouse, command), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    finally:
        if os.geteuid() != 0:
            subprocess.run(["chmod", "-R", "u+w", str(warehouse)], check=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("FIGURES ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-6000:]
    figures = json.loads(lines[0].removeprefix("FIGURES "))
    assert _tree(warehouse) == before, "a reader created, deleted, renamed or touched something"

    assert figures["dates"] == [D1, "2024-03-02", D3]
    current = {day: read_stored(spark, partition_dir(warehouse, TABLE, "current_table", day)).count() for day in figures["dates"]}
    assert figures["current_rows"] == sum(current.values()) and figures["last_rows"] == current[D3] > 0
    history = {day: read_stored(spark, partition_dir(warehouse, TABLE, "history_partition", day)).count() for day in figures["dates"]}
    assert figures["footers"] == history and figures["has_last"] is True
    # The same views computed here, on the writable warehouse, give the same rows.
    assert figures["scd2_rows"] == figures["duckdb_scd2_rows"] == scd2_view(spark, config, warehouse=str(warehouse)).count() > 0
    assert figures["changes_rows"] == changes_between(spark, config, D1, D3, warehouse=str(warehouse)).count() > 0
    assert figures["checks_run_success"] is True
    assert figures["checks"] and all(passed for _, passed in figures["checks"]), figures["checks"]
