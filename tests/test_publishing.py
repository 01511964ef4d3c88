"""Write, audit, publish (docs/publishing.md): a run writes every output to its own Iceberg branch, its checks
read the branch, and its ``published`` step moves each table's ``main`` there only when every blocking check
passed. Real Dagster runs of a copy of the shipped ``orders`` table with a declared check that a bad extract
of date 3 fails; readers (pyiceberg polled while the run goes on, Spark and DuckDB after) never see date 3
until its fixed extract publishes it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from cdc_assets.model.config import load_table_config
from cdc_assets.usecases.publishing import publish_run
from cdc_assets.usecases.readers import current_duckdb_sql
from resources.storage import WarehouseStorage
from resources.storage.tables import STAGING_PREFIX, WRITTEN_DATES, ConcurrentWriteError
from tests.pipeline import definitions_for, failed_checks, run_dates

REPO = Path(__file__).resolve().parent.parent
DAY1, DAY2, DAY3 = "2024-01-01", "2024-01-02", "2024-01-03"
MAX_ROWS = 40
T = TypeVar("T")


def _setup(tmp_path: Path, monkeypatch) -> Path:
    data = tmp_path / "data"
    shutil.copytree(REPO / "samples" / "orders", data / "samples" / "orders")
    document = yaml.safe_load((REPO / "table_configs" / "orders.yaml").read_text())
    document["checks"] = [{"type": "volume", "name": "state_size", "max_rows": MAX_ROWS}]
    # Stored per date: the tests read each date's partition by business_date. An incremental state's
    # staging and tags are test_an_incremental_state_is_staged_and_each_date_is_tagged_at_its_own_commit_when_published's.
    document["storage"] = {"current": "snapshot"}
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "orders.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))
    monkeypatch.setenv("CDC_DATA_ROOT", str(data))
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    return configs / "orders.yaml"


def _bad_extract(path: Path) -> str:
    """Date 3's extract with many more new orders than the state may hold (the declared volume check fails)."""
    good = path.read_text()
    extra = "".join(f"LON,{5000 + n},bulk,1,1.00,2024-01-03,,,2024-01-03 23:00:00\n" for n in range(MAX_ROWS))
    path.write_text(good + extra)
    return good


def _main_dates(root: str) -> dict[str, list[str]]:
    """Each output's dates as a reader of main sees them now (pyiceberg, a fresh catalog: no cache)."""
    storage = WarehouseStorage(root)
    return {asset: sorted(storage.tables.stored("orders", asset, storage.tables.load("orders", asset).current_snapshot()))
            for asset in storage.stored_assets("orders")}


def _date_tags(root: str) -> dict[str, dict[str, int]]:
    """Each output's date tags (a published date -> its snapshot), each checked to be kept 7 days
    (retention.snapshot_days' default)."""
    storage = WarehouseStorage(root)
    found = {}
    for asset in storage.stored_assets("orders"):
        refs = storage.tables.load("orders", asset).metadata.refs
        found[asset] = storage.tables.date_tags("orders", asset)
        assert all(refs[day].max_ref_age_ms == 7 * 24 * 3600 * 1000 for day in found[asset]), (asset, refs)
    return found


def _duckdb_current_rows(root: str) -> int:
    return duckdb.sql(f"SELECT count(*) FROM ({current_duckdb_sql('orders', root)})").fetchall()[0][0]


def _run_polling(defs, day: str, instance, look: Callable[[], T]) -> tuple[Any, list[T]]:
    """Run ``day`` (failures allowed) while another thread calls ``look`` every 0.1 s; the run's result and
    what each look saw."""
    seen: list[T] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            seen.append(look())
            time.sleep(0.1)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        [result] = run_dates(defs, [day], instance, raise_on_error=False)
    finally:
        done.set()
        poller.join()
    return result, seen


def test_a_failed_check_publishes_nothing_and_the_fixed_rerun_publishes(spark, tmp_path, monkeypatch):
    config_path = _setup(tmp_path, monkeypatch)
    root = str(tmp_path / "warehouse")
    defs = definitions_for(load_table_config(config_path))
    instance = DagsterInstance.ephemeral()
    assert all(result.success for result in run_dates(defs, [DAY1, DAY2], instance))
    published = _main_dates(root)
    assert len(published) >= 8 and all(days == [DAY1, DAY2] for days in published.values()), published
    # No run left a branch: each published and dropped its own.
    assert WarehouseStorage(root).staging_branches("orders") == {}
    # Each published date is tagged on each output; time travel by date reads the table as that date published it.
    tags = _date_tags(root)
    assert all(sorted(days) == [DAY1, DAY2] for days in tags.values()), tags
    sql = WarehouseStorage(root).tables.session_for(spark).sql
    as_of_day1 = sql(f"SELECT DISTINCT business_date FROM lake.orders.current_table VERSION AS OF '{DAY1}'").collect()
    assert [row[0].isoformat() for row in as_of_day1] == [DAY1]

    # Date 3's bad extract: a reader of main, polled all along the run, never sees date 3 in any output.
    extract = tmp_path / "data" / "samples" / "orders" / f"{DAY3}.csv"
    good = _bad_extract(extract)
    # DuckDB's current state is the newest date published: date 3's would hold more than MAX_ROWS.
    failed, polled = _run_polling(defs, DAY3, instance, lambda: (_main_dates(root), _duckdb_current_rows(root)))
    assert not failed.success and failed_checks(failed) == ["state_size"]
    assert len(polled) > 5
    assert all(DAY3 not in days for snapshot, _ in polled for days in snapshot.values())
    assert max(rows for _, rows in polled) < MAX_ROWS, polled
    assert _main_dates(root) == published
    assert _date_tags(root) == tags  # the failed date has no tag
    assert not instance.get_latest_materialization_event(AssetKey(["orders", "published"])).asset_materialization.partition == DAY3
    # Readers of every engine: the newest date is 2. (Spark: a session with this warehouse's catalog as `lake`;
    # the test session keeps the first warehouse it opened.)
    assert {row[0].isoformat() for row in sql("SELECT DISTINCT business_date FROM lake.orders.current_table").collect()} == {DAY1, DAY2}
    day2_rows = sql(f"SELECT count(*) FROM lake.orders.current_table WHERE business_date = '{DAY2}'").collect()[0][0]
    assert _duckdb_current_rows(root) == day2_rows and day2_rows < MAX_ROWS

    # The staged date is readable on the run's branch, named in the outputs' metadata.
    branch = f"{STAGING_PREFIX}{failed.run_id}"
    assert set(WarehouseStorage(root).staging_branches("orders")) == {branch}
    staged = sql(f"SELECT count(*) FROM lake.orders.current_table VERSION AS OF '{branch}' WHERE business_date = '{DAY3}'").collect()[0][0]
    assert staged > MAX_ROWS
    metadata = instance.get_latest_materialization_event(AssetKey(["orders", "current_table"])).asset_materialization.metadata
    assert metadata["cdc/publication"].value == f"staged on branch {branch}"
    # Each staged output, and `published`, say why date 3 is not published (the UI's events of the partition).
    for asset in ("published", "current_table", "hashed_incoming"):
        observed = instance.fetch_observations(AssetRecordsFilter(asset_key=AssetKey(["orders", asset]), asset_partitions=[DAY3]), limit=1)
        said = observed.records[0].asset_observation.metadata["cdc/publication"].value
        assert said.startswith(f"staged on branch {branch}, not published: blocking check(s) did not pass:") and "state_size" in said, said

    # The runs log: the CDC step's row (it logs as it ends, before the checks), then the checks' verdict.
    logged = [row for row in pq.read_table(Path(root) / "_runs").to_pylist() if row["run_id"] == failed.run_id]
    assert sorted((row["step"], row["status"]) for row in logged) == [("cdc", "succeeded"), ("checks", "failed")], logged
    [verdict] = [row["error"] for row in logged if row["step"] == "checks"]
    assert verdict.startswith(f"NotPublished: not published, kept on branch {branch}: blocking check(s) did not pass:") and "state_size" in verdict

    # The next date's run is refused: date 3 is not published (the refusal reads the tables, not Dagster).
    (extract.parent / "2024-01-04.csv").write_text(good.replace("2024-01-03 23:00:00", "2024-01-04 23:00:00"))
    [refused] = run_dates(defs, ["2024-01-04"], instance, raise_on_error=False)
    assert not refused.success
    failure = next(event for event in refused.all_events if event.is_step_failure).step_failure_data.error
    said = failure.cause.message if failure.cause else failure.message
    assert f"{DAY3} is not published: run {failed.run_id} staged it" in said, said
    assert _main_dates(root) == published
    # The extract fixed, date 3 runs again and publishes.
    extract.write_text(good)
    [fixed] = run_dates(defs, [DAY3], instance)
    assert fixed.success
    assert all(days == [DAY1, DAY2, DAY3] for days in _main_dates(root).values())
    # Date 3 is tagged now, at the snapshot each output's main reads; the earlier tags are unchanged.
    storage = WarehouseStorage(root)
    retagged = _date_tags(root)
    assert all(retagged[asset] == {**tags[asset], DAY3: storage.tables.load("orders", asset).current_snapshot().snapshot_id} for asset in tags)
    event = instance.get_latest_materialization_event(AssetKey(["orders", "published"])).asset_materialization
    assert event.partition == DAY3 and event.metadata["cdc/publication"].value == "published"
    observed = instance.fetch_observations(AssetRecordsFilter(asset_key=AssetKey(["orders", "current_table"]), asset_partitions=[DAY3]), limit=1)
    assert observed.records[0].asset_observation.metadata["cdc/publication"].value == f"published from branch {STAGING_PREFIX}{fixed.run_id}"
    storage = WarehouseStorage(root)
    # The failed run's branch stays for keep_failed_days, with the refused run's (it staged its intake).
    left = {branch, f"{STAGING_PREFIX}{refused.run_id}"}
    assert set(storage.staging_branches("orders")) == left

    # After the grace period the next publication drops it (and what only it kept goes at the next expiry).
    later = datetime.now(timezone.utc) + timedelta(days=8)
    publication = publish_run(storage, load_table_config(config_path), [DAY3], now=later)
    assert publication.dropped_branches == sorted(left) and publication.snapshots == {}
    assert WarehouseStorage(root).staging_branches("orders") == {}


@pytest.mark.slow  # a chain of its own, in the other layout
@pytest.mark.in_process  # its runs are in this process, on the session's Spark: `make test`'s first session
def test_an_incremental_state_is_staged_and_each_date_is_tagged_at_its_own_commit_when_published(spark, tmp_path, monkeypatch):
    """``storage: {current: incremental}`` (one table, a tag per date: docs/incremental-state.md) stages each
    date's MERGE on the run's branch like any output: a failed check publishes no state and no tag; the
    fixed run publishes the date, tagged at its own commit, without RETAIN (the tag is the date's state)."""
    config_path = _setup(tmp_path, monkeypatch)
    document = yaml.safe_load(config_path.read_text())
    document["storage"] = {"current": "incremental"}
    config_path.write_text(yaml.safe_dump(document, sort_keys=False))
    root = str(tmp_path / "warehouse")
    defs = definitions_for(load_table_config(config_path))
    instance = DagsterInstance.ephemeral()
    assert all(result.success for result in run_dates(defs, [DAY1, DAY2], instance))

    def state() -> tuple[int, dict[str, int]]:
        """What a reader of the state sees now: main's snapshot and the date tags (pyiceberg, read fresh)."""
        storage = WarehouseStorage(root)
        return storage.tables.load("orders", "current_table").current_snapshot().snapshot_id, storage.tables.date_tags("orders", "current_table")

    head, tags = state()
    assert sorted(tags) == [DAY1, DAY2] and tags[DAY2] == head != tags[DAY1]
    loaded = WarehouseStorage(root).tables.load("orders", "current_table")
    assert all(loaded.metadata.refs[day].max_ref_age_ms is None for day in tags)  # kept until retention drops the date
    assert [loaded.snapshot_by_id(tags[day]).summary[WRITTEN_DATES] for day in (DAY1, DAY2)] == [DAY1, DAY2]
    assert WarehouseStorage(root).staging_branches("orders") == {}

    extract = tmp_path / "data" / "samples" / "orders" / f"{DAY3}.csv"
    good = _bad_extract(extract)
    failed, seen = _run_polling(defs, DAY3, instance, state)
    assert not failed.success and failed_checks(failed) == ["state_size"]
    assert len(seen) > 5 and all(polled == (head, tags) for polled in seen), seen[-1]
    assert state() == (head, tags)
    branch = f"{STAGING_PREFIX}{failed.run_id}"
    assert set(WarehouseStorage(root).staging_branches("orders")) == {branch}

    def rows(ref: str = "main") -> int:
        """The state's rows at ``ref`` (its MERGE's position deletes applied), as pyiceberg reads them afresh.
        Not through the test session's Spark: read here through it, in a session that had served other
        warehouses first, `lake` once missed the branch the warehouse held, and once the next run's first
        commit then failed (docs/testing.md). The cause is not found; the runs before wrote correctly."""
        loaded = WarehouseStorage(root).tables.load("orders", "current_table")
        return loaded.scan(snapshot_id=loaded.snapshot_by_name(ref).snapshot_id).count()

    staged, published = rows(branch), rows()
    assert staged > MAX_ROWS >= published

    extract.write_text(good)
    [fixed] = run_dates(defs, [DAY3], instance)
    assert fixed.success
    head, retagged = state()
    assert retagged == {**tags, DAY3: head}
    storage = WarehouseStorage(root)
    assert storage.stored_dates("orders", "current_table") == [DAY1, DAY2, DAY3]
    now = rows()
    assert storage.row_counts("orders", "current_table", [DAY3]) == {DAY3: now} and now < MAX_ROWS
    # The failed run's branch is kept (keep_failed_days); this run's is gone.
    assert set(storage.staging_branches("orders")) == {branch}


@pytest.mark.slow  # a `dagster asset materialize` of its own, with its own JVM
@pytest.mark.parametrize("paused_at", ["deletes", "current_table"])
def test_a_run_killed_before_it_publishes_publishes_nothing_and_its_rerun_does(spark, tmp_path, monkeypatch, paused_at):
    """kill -9 of a `dagster asset materialize` paused at the named fault point before its first publication
    (``deletes``): every output's main is where it was; or before its last (``current_table``): every other
    output is published and a reader of the current state still sees the date before. The re-run publishes;
    the dead run's branch goes after the grace period."""
    config_path = _setup(tmp_path, monkeypatch)
    root = str(tmp_path / "warehouse")
    defs = definitions_for(load_table_config(config_path))
    assert all(result.success for result in run_dates(defs, [DAY1], DagsterInstance.ephemeral()))
    published = _main_dates(root)
    heads = {asset: WarehouseStorage(root).tables.load("orders", asset).current_snapshot().snapshot_id for asset in published}

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    marker, log = tmp_path / "paused.marker", tmp_path / "killed.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DAGSTER_HOME": str(home), "CDC_PAUSE_MARKER": str(marker),
           "CDC_PAUSE_BEFORE_PUBLISH": f"orders/{paused_at}",  # deletes is published first, current_table last
           "CDC_SPARK_CONF": '{"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.driver.memory": "1g"}'}
    command = [str(REPO / ".venv/bin/dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions",
               "--select", "group:orders", "--partition", DAY2]
    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert marker.exists(), log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    storage = WarehouseStorage(root)
    # Every output was written and checked on the dead run's branch; what was not published yet is still there.
    [branch] = storage.staging_branches("orders")
    now = _main_dates(root)
    if paused_at == "deletes":  # nothing of it reached main
        assert {asset: storage.tables.load("orders", asset).current_snapshot().snapshot_id for asset in published} == heads
        assert now == published
    else:  # every output but current_table published; the current state is still date 1's
        assert now["current_table"] == [DAY1] and all(days == [DAY1, DAY2] for asset, days in now.items() if asset != "current_table"), now
        assert [asset for asset in published if branch in storage.tables.staging_branches("orders", asset)] == ["current_table"]
    staged = storage.tables.load("orders", "current_table").snapshot_by_name(branch)
    assert DAY2 in storage.tables.stored("orders", "current_table", staged)

    [rerun] = run_dates(defs, [DAY2], DagsterInstance.ephemeral())
    assert rerun.success
    assert all(days == [DAY1, DAY2] for days in _main_dates(root).values())
    assert set(WarehouseStorage(root).staging_branches("orders")) == {branch}  # kept for keep_failed_days
    later = datetime.now(timezone.utc) + timedelta(days=8)
    assert publish_run(WarehouseStorage(root), load_table_config(config_path), [DAY2], now=later).dropped_branches == [branch]
    assert WarehouseStorage(root).staging_branches("orders") == {}


def test_publication_refuses_when_main_moved_after_the_branch_was_made(spark, tmp_path):
    """Another commit to main after a run staged (a writer the lock did not reach, a rollback): publishing the
    branch would drop that commit, so nothing is published and the error names the branch; what the run
    staged stays readable there."""
    root = str(tmp_path / "warehouse")
    frame = spark.createDataFrame([("a", 1)], "k string, v int").selectExpr("k", "v", f"DATE'{DAY1}' AS business_date")
    WarehouseStorage(root, run_id="first").write(frame, "t", "a", [DAY1])  # on main: no stage() asked
    staged = WarehouseStorage(root, run_id="second")
    staged.stage()
    staged.write(frame.selectExpr("k", "v", f"DATE'{DAY2}' AS business_date"), "t", "a", [DAY2])
    staged.release()
    assert WarehouseStorage(root).stored_dates("t", "a") == [DAY1]  # a reader of main
    assert staged.stored_dates("t", "a") == [DAY1, DAY2]  # the run reads its branch
    other = WarehouseStorage(root, run_id="other")
    other.write(frame.selectExpr("k", "v", f"DATE'{DAY3}' AS business_date"), "t", "a", [DAY3])
    other.release()
    with pytest.raises(ConcurrentWriteError, match=f"not published: main moved .* on branch {STAGING_PREFIX}second"):
        staged.publish("t", last="a")
    staged.release()
    assert WarehouseStorage(root).stored_dates("t", "a") == [DAY1, DAY3]
    assert set(WarehouseStorage(root).staging_branches("t")) == {f"{STAGING_PREFIX}second"}
    # Without the other commit, the same branch publishes, and is dropped.
    again = WarehouseStorage(root, run_id="third")
    again.stage()
    again.write(frame.selectExpr("k", "v", f"DATE'{DAY2}' AS business_date"), "t", "a", [DAY2])
    assert set(again.publish("t", last="a")) == {"a"}
    again.release()
    assert WarehouseStorage(root).stored_dates("t", "a") == [DAY1, DAY2, DAY3]
    assert set(WarehouseStorage(root).staging_branches("t")) == {f"{STAGING_PREFIX}second"}
