"""The pipeline through Spark Connect, as a daily run uses it: the Dagster CLI with SPARK_REMOTE set.

A Connect server runs in its own process (the session-scoped ``connect_server`` fixture); the runs are
real ``dagster asset materialize`` processes that reach it through ``SPARK_REMOTE``, and their outputs
must equal, row for row, what the classic session writes for the same input. Also here: a run killed
(kill -9) during a commit through Connect, and two runs of one table started at once, through Connect
and through the classic session, where the second waits for the first's writer lock.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, partition_dir, read_stored, run_dates, sorted_rows, stored_asset, write_table_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
ASSETS = ("hashed_incoming", "rejects", "hash_join_classification", "inserts", "deletes", "updates",
          "current_table", "history_partition")


def _tables(tmp_path: Path):
    """``synth`` (full loads from the generator; day 3 is day 1 again) and ``orders`` (the checked-in deltas)."""
    data = tmp_path / "landing"
    subprocess.run(
        [str(REPO / ".venv/bin/cdc-generate"), "600", "600", "5", "10", "0.2", "0.4", "0.4",
         str(data / DAYS[0]), str(data / DAYS[1]), "--seed", "3"],
        check=True, capture_output=True,
    )
    shutil.copytree(data / DAYS[0], data / DAYS[2])  # a full snapshot equal to day 1's: I, U and D again
    configs = tmp_path / "configs"
    synth = write_table_config(configs, "synth", f"{data}/{{date}}", start_date=DAYS[0])
    orders_doc = yaml.safe_load((REPO / "table_configs" / "orders.yaml").read_text())
    orders_doc["source"]["path"] = str(REPO / "samples" / "orders" / "{date}.csv")
    (configs / "orders.yaml").write_text(yaml.safe_dump(orders_doc))
    return configs, synth


def _environment(tmp_path: Path, name: str, configs: Path, remote: str | None, **extra) -> dict:
    home = tmp_path / f"dagster_home_{name}"
    home.mkdir(exist_ok=True)
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    # Create the instance's storage now: two runs started at once would both try (SQLite schema race).
    with DagsterInstance.from_config(str(home)):
        pass
    env = {key: value for key, value in os.environ.items() if key != "SPARK_REMOTE"}
    env.update(
        PYTHONPATH=str(REPO), DAGSTER_HOME=str(home), CDC_TABLE_CONFIGS=str(configs),
        CDC_WAREHOUSE=str(tmp_path / f"warehouse_{name}"),
        CDC_SPARK_CONF='{"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "spark.driver.memory": "1g"}',
        **extra,
    )
    if remote:
        env["SPARK_REMOTE"] = remote
    return env


def _materialize(env: dict, selection: str, day: str, log: Path | None = None) -> subprocess.Popen:
    """``dagster asset materialize`` of one date, or of a range given as ``first...last``."""
    command = [str(REPO / ".venv/bin/dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions",
               "--select", selection, *(["--partition-range", day] if "..." in day else ["--partition", day])]
    output = open(log, "w") if log else subprocess.PIPE
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _run(env: dict, selection: str, day: str) -> str:
    process = _materialize(env, selection, day)
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-6000:]
    return output


def _outputs(spark, warehouse: Path, table: str) -> dict:
    """Every row of every asset (all dates), sorted: a comparison independent of file layout."""
    return {
        asset: sorted_rows(spark, stored_asset(warehouse, table, asset))
        for asset in ASSETS
    }


def _outputs_of(spark, warehouse: Path, table: str, day: str) -> dict:
    """Every row of every asset of one date, sorted."""
    return {asset: sorted_rows(spark, partition_dir(warehouse, table, asset, day)) for asset in ASSETS}


@pytest.fixture(scope="module")
def classic(spark, tmp_path_factory):
    """``synth`` and ``orders`` (:func:`_tables`) over DAYS through the classic session (this process's), one
    run per date: the rows every run of these inputs must write, through Connect or not. Read only."""
    root = tmp_path_factory.mktemp("classic")
    configs, synth = _tables(root)
    warehouse = root / "warehouse_classic"
    from cdc_assets.model.config import load_table_config

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_WAREHOUSE", str(warehouse))
        defs = definitions_for(synth, load_table_config(configs / "orders.yaml"))
        assert all(result.success for result in run_dates(defs, DAYS, DagsterInstance.ephemeral()))
    return configs, warehouse


def _operations(spark, warehouse: Path, table: str, asset: str) -> set[str]:
    return {row["operation"] for row in read_stored(spark, stored_asset(warehouse, table, asset)).select("operation").distinct().collect()}


def test_seed_scenario_and_a_rerun_through_connect_equal_the_classic_session(spark, tmp_path, connect_server, classic):
    configs, classic_warehouse = classic
    connect = _environment(tmp_path, "connect", configs, connect_server.client_url)
    # Both shapes of run, one process each (each costs seconds): the first two dates as one range, then the last.
    for days in (f"{DAYS[0]}...{DAYS[1]}", DAYS[2]):
        output = _run(connect, "group:synth,group:orders", days)
        assert "RUN_SUCCESS" in output
    warehouse = Path(connect["CDC_WAREHOUSE"])
    first_pass = {table: _outputs(spark, warehouse, table) for table in ("synth", "orders")}
    # Re-running the middle date (in one run with the date after it, which was computed from it: a run
    # of the middle date alone recomputes it too) replaces those dates' partitions with the same rows.
    _run(connect, "group:synth,group:orders", f"{DAYS[1]}...{DAYS[-1]}")
    assert {table: _outputs(spark, warehouse, table) for table in ("synth", "orders")} == first_pass

    # The same dates through the classic session (this process's), with the same code.
    for table in ("synth", "orders"):
        expected = _outputs(spark, classic_warehouse, table)
        assert first_pass[table] == expected, table
    # The seed's shape on day 2 of the full load, and X rows kept by the delta.
    assert _operations(spark, warehouse, "synth", "history_partition") == {"I", "U", "D"}
    assert "X" in _operations(spark, warehouse, "orders", "current_table")


def test_an_incremental_state_through_connect_equals_the_classic_session(spark, tmp_path, connect_server, classic):
    """``orders`` stored incrementally, its first two dates in one run through Connect: each date a commit of
    the one table. The run's checks read both dates' states in one query; through Connect that query once
    read the first date's snapshot twice (fixed: reads name the snapshot as Spark's ``versionAsOf``), and a
    full copy failed (``withColumns`` of no column). Every date's state equals the classic session's."""
    configs, classic_warehouse = classic
    incremental = tmp_path / "configs"
    incremental.mkdir()
    document = yaml.safe_load((configs / "orders.yaml").read_text())
    (incremental / "orders.yaml").write_text(yaml.safe_dump({**document, "storage": {"current": "incremental"}}))
    env = _environment(tmp_path, "incremental", incremental, connect_server.client_url)
    assert "RUN_SUCCESS" in _run(env, "group:orders", f"{DAYS[0]}...{DAYS[1]}")
    warehouse = Path(env["CDC_WAREHOUSE"])
    storage = WarehouseStorage(str(warehouse))
    assert storage.merged.holds("orders", "current_table")
    for day in DAYS[:2]:
        assert sorted_rows(spark, partition_dir(warehouse, "orders", "current_table", day)) == sorted_rows(
            spark, partition_dir(classic_warehouse, "orders", "current_table", day)
        ), day


def test_a_run_killed_during_a_commit_through_connect_keeps_the_stored_outputs(spark, tmp_path, connect_server):
    configs, _ = _tables(tmp_path)
    marker = tmp_path / "paused.marker"
    env = _environment(tmp_path, "killed", configs, connect_server.client_url)
    for day in DAYS[:2]:
        _run(env, "group:synth", day)
    warehouse = Path(env["CDC_WAREHOUSE"])
    before = _outputs(spark, warehouse, "synth")
    tables = WarehouseStorage(str(warehouse)).tables
    snapshot_before = tables.load("synth", "current_table").current_snapshot().snapshot_id
    incoming_before = tables.load("synth", "hashed_incoming").current_snapshot().snapshot_id

    paused = {**env, "CDC_PAUSE_BEFORE_COMMIT": "synth/current_table", "CDC_PAUSE_MARKER": str(marker)}
    process = _materialize(paused, "group:synth", DAYS[1], log=tmp_path / "killed.log")
    try:
        deadline = time.monotonic() + 600
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert marker.exists(), (tmp_path / "killed.log").read_text()[-4000:]
        # Paused before current_table's commit: the run staged its earlier outputs on its branch, and published
        # nothing (docs/publishing.md): main is where it was in every output.
        assert tables.load("synth", "current_table").current_snapshot().snapshot_id == snapshot_before
        assert tables.load("synth", "hashed_incoming").current_snapshot().snapshot_id == incoming_before
        [staged] = WarehouseStorage(str(warehouse)).staging_branches("synth")
        assert "hashed_incoming" in [asset for asset in WarehouseStorage(str(warehouse)).stored_assets("synth")
                                     if staged in tables.staging_branches("synth", asset)]
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    after_kill = _outputs(spark, warehouse, "synth")
    # What readers see of current_table and history is the version from before the killed run.
    assert after_kill["current_table"] == before["current_table"]
    assert after_kill["history_partition"] == before["history_partition"]
    assert tables.load("synth", "current_table").current_snapshot().snapshot_id == snapshot_before

    _run(env, "group:synth", DAYS[1])  # the next run takes the dead run's lock
    assert _outputs(spark, warehouse, "synth") == before


def _wait_for(condition, process, log: Path, timeout: float = 600) -> None:
    """Poll until ``condition()`` holds; fail with the log's tail if the process ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
        time.sleep(0.5)


@pytest.mark.parametrize("through", ["classic", "connect"])
def test_two_runs_of_one_table_at_once_the_second_waits_for_the_first(spark, tmp_path, connect_server, classic, through):
    configs, classic_warehouse = classic
    remote = connect_server.client_url if through == "connect" else None
    env = _environment(tmp_path, through, configs, remote)
    marker, release = tmp_path / "first.marker", tmp_path / "first.release"
    # The first run holds the table's lock, with a staged current_table, until the test releases it.
    first_env = {**env, "CDC_PAUSE_BEFORE_COMMIT": "synth/current_table", "CDC_PAUSE_MARKER": str(marker),
                 "CDC_PAUSE_RELEASE": str(release)}
    first = _materialize(first_env, "group:synth", DAYS[0], log=tmp_path / "first.log")
    second = None
    try:
        _wait_for(lambda: marker.exists(), first, tmp_path / "first.log")
        second = _materialize(env, "group:synth", DAYS[0], log=tmp_path / "second.log")
        # The second run reaches its first write and waits for the lock the paused first run holds.
        _wait_for(lambda: "waiting for the writer lock" in (tmp_path / "second.log").read_text(), second,
                  tmp_path / "second.log")
        release.touch()
        assert first.wait(timeout=900) == 0, (tmp_path / "first.log").read_text()[-6000:]
        assert second.wait(timeout=900) == 0, (tmp_path / "second.log").read_text()[-6000:]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert marker.exists()
    second_log = (tmp_path / "second.log").read_text()
    assert "FileNotFoundException" not in second_log and "FileNotFoundException" not in (tmp_path / "first.log").read_text()
    # Both succeeded and the stored date is one whole version: the same rows a lone run writes (the lone
    # run of the classic session's; the seed scenario's test shows Connect's runs write the same rows).
    warehouse = Path(env["CDC_WAREHOUSE"])
    assert WarehouseStorage(str(warehouse)).stored_dates("synth", "current_table") == [DAYS[0]]
    assert _outputs_of(spark, warehouse, "synth", DAYS[0]) == _outputs_of(spark, classic_warehouse, "synth", DAYS[0])


CHANGESETS = {"accounts": ("2024-02-01", "2024-02-03"), "customers_debezium": ("2024-03-01", "2024-03-03")}
CHANGESET_ASSETS = (*ASSETS, "late_changes", "applied_sequences")


def test_change_sets_through_connect_equal_the_classic_session(spark, tmp_path, connect_server, monkeypatch):
    """Both change-set formats (flagged CSV, Debezium JSON) as single-run ranges through Connect, then a
    re-run of a middle date, against one run per date on the classic session."""
    configs = tmp_path / "configs"
    configs.mkdir()
    for table in CHANGESETS:
        document = yaml.safe_load((REPO / "table_configs" / f"{table}.yaml").read_text())
        document["source"]["path"] = str(REPO / document["source"]["path"])
        (configs / f"{table}.yaml").write_text(yaml.safe_dump(document))
    env = _environment(tmp_path, "changesets", configs, connect_server.client_url)
    warehouse = Path(env["CDC_WAREHOUSE"])

    def stored(root: Path, table: str) -> dict:
        return {
            asset: sorted_rows(spark, stored_asset(root, table, asset))
            for asset in CHANGESET_ASSETS
        }

    for table, (first, last) in CHANGESETS.items():
        command = [str(REPO / ".venv/bin/dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions",
                   "--select", f"group:{table}", "--partition-range", f"{first}...{last}"]
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    through_connect = {table: stored(warehouse, table) for table in CHANGESETS}
    middle = {"accounts": "2024-02-02...2024-02-03", "customers_debezium": "2024-03-02...2024-03-03"}
    for table, days in middle.items():  # a middle date with the date after it (alone, it recomputes it too)
        _run(env, f"group:{table}", days)
        assert stored(warehouse, table) == through_connect[table], table

    classic = tmp_path / "warehouse_classic"
    monkeypatch.setenv("CDC_WAREHOUSE", str(classic))
    from cdc_assets.model.config import load_table_config

    for table, (first, last) in CHANGESETS.items():
        days = [f"{first[:-2]}{n:02d}" for n in range(int(first[-2:]), int(last[-2:]) + 1)]
        defs = definitions_for(load_table_config(configs / f"{table}.yaml"))
        assert all(result.success for result in run_dates(defs, days, DagsterInstance.ephemeral()))
        assert stored(classic, table) == through_connect[table], table
    # Not vacuous: the samples' late records and tombstones went through both sessions.
    assert len(through_connect["accounts"]["late_changes"]) == 2
    assert any(row[2] for row in through_connect["customers_debezium"]["applied_sequences"])  # a tombstone (deleted)


def test_a_schema_change_through_connect(spark, tmp_path, connect_server):
    """A date whose config adds a column and renames one, run through Spark Connect: the state's recorded
    columns (the schema recorded with the server's commit) are read back, and no key is re-versioned."""
    import csv

    from resources.storage.state import stored_fields
    from resources.storage import WarehouseStorage

    landing, configs = tmp_path / "landing", tmp_path / "configs"
    landing.mkdir()
    extracts = {DAYS[0]: (["id", "a", "b"], [(1, "x", 10), (2, "y", 20)]),
                DAYS[1]: (["id", "a", "b2", "c"], [(1, "x", 10, "c1"), (2, "y", 21, "c2")])}  # fmt: skip
    for day, (header, rows) in extracts.items():
        with open(landing / f"{day}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows([header, *rows])
    columns = {DAYS[0]: [{"name": "a", "type": "string"}, {"name": "b", "type": "int"}],
               DAYS[1]: [{"name": "a", "type": "string"}, {"name": "b2", "type": "int", "renamed_from": "b"},
                         {"name": "c", "type": "string"}]}  # fmt: skip
    env = _environment(tmp_path, "schema", configs, connect_server.client_url)
    for day in DAYS[:2]:
        write_table_config(configs, "evolving", f"{landing}/{{date}}.csv", start_date=DAYS[0], keys=[{"name": "id", "type": "int"}],
                           non_keys=columns[day])  # fmt: skip
        assert "RUN_SUCCESS" in _run(env, "group:evolving", day)
    storage = WarehouseStorage(env["CDC_WAREHOUSE"])
    history = storage.read_one(spark, "evolving", "history_partition", DAYS[1])
    assert [(row["id"], row["operation"], row["b2"], row["c"]) for row in history.collect()] == [(2, "U", 21, "c2")]
    # Erasing key 1 through the server rewrites both dates' states; what their hashes cover is kept.
    keys = tmp_path / "erase.csv"
    keys.write_text("id\n1\n")
    erase = [sys.executable, "-m", "cdc_assets.cli.erase", "evolving", "--keys", str(keys)]
    erased = subprocess.run(erase, env=env, capture_output=True, text=True, timeout=600)
    assert erased.returncode == 0 and "told the Dagster instance" in erased.stdout, erased.stdout[-3000:] + erased.stderr[-3000:]
    assert "all passed" in erased.stdout, erased.stdout[-3000:]
    verified = subprocess.run([*erase, "--verify"], env=env, capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0 and "0 stored files hold the keys" in verified.stdout, verified.stdout[-3000:]
    assert storage.row_counts("evolving", "current_table", DAYS[:2]) == {DAYS[0]: 1, DAYS[1]: 1}
    recorded = {field["name"]: field for field in stored_fields(storage, "evolving", "current_table", DAYS[1])}
    assert '"non_keys":[["a","string"],["b2","int"],["c","string"]]' in recorded["non_key_hash"]["metadata"]["cdc.hash_spec"]


def test_a_killed_runs_cached_intake_is_never_read_by_the_rerun_of_a_replaced_extract(spark, tmp_path, connect_server):
    """A run killed (kill -9) on the shared server while its intake is cached leaves that cache behind in the
    server: no teardown of the dead run ever releases it. The re-run, after the extract was replaced by one
    with other rows at the same path, builds the very same read of that path; it must read the new files,
    not the dead run's cached rows (core/caching.py: each cache is tagged as its own)."""
    landing, configs = tmp_path / "landing", tmp_path / "configs"
    landing.mkdir()
    extract = landing / f"{DAYS[0]}.csv"
    extract.write_text("id,a\n1,old1\n2,old2\n3,old3\n")
    write_table_config(configs, "replaced", f"{landing}/{{date}}.csv", start_date=DAYS[0], keys=[{"name": "id", "type": "int"}],
                       non_keys=[{"name": "a", "type": "string"}])  # fmt: skip
    env = _environment(tmp_path, "replaced", configs, connect_server.client_url)
    warehouse = Path(env["CDC_WAREHOUSE"])
    marker, log = tmp_path / "paused.marker", tmp_path / "killed.log"
    # Paused before hashed_incoming's commit: the intake was read (and cached), nothing of the date committed.
    paused = {**env, "CDC_PAUSE_BEFORE_COMMIT": "replaced/hashed_incoming", "CDC_PAUSE_MARKER": str(marker)}
    process = _materialize(paused, "group:replaced", DAYS[0], log=log)
    try:
        _wait_for(lambda: marker.exists(), process, log)
        assert not WarehouseStorage(str(warehouse)).has_partition("replaced", "hashed_incoming", DAYS[0])
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert "read 3 rows" in log.read_text()

    extract.write_text("id,a\n1,new1\n2,new2\n4,new4\n5,new5\n")  # other rows, other values, same path
    assert "RUN_SUCCESS" in _run(env, "group:replaced", DAYS[0])
    storage = WarehouseStorage(str(warehouse))
    current = storage.read_one(spark, "replaced", "current_table", DAYS[0])
    assert sorted((row["id"], row["a"]) for row in current.collect()) == [(1, "new1"), (2, "new2"), (4, "new4"), (5, "new5")]
    assert storage.row_counts("replaced", "hashed_incoming", [DAYS[0]]) == {DAYS[0]: 4}
