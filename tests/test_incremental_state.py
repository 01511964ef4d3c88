"""``storage: {current: incremental}`` against ``snapshot``: the same five dates, the same states. And on the
snapshot chain, pyiceberg and DuckDB read ``current_table`` and ``history_partition`` of every date as Spark
does (``tests/engines.py``).

For each load type (full, delta, change set, Debezium) one table is run in both modes, each in a
warehouse of its own, and every date's state read through ``cdc-current`` / :func:`current_state` and
DuckDB from the incremental warehouse must equal, row for row, the snapshot warehouse's current_table
folder (audit columns aside: two runs are two writers). History must be equal too, and every check
pass. ``compact_after_dates: 2`` (and a share too large to matter) makes the incremental table store dates 1, 3 and 5 as full copies
and dates 2 and 4 as changes, so the chain is compacted in its middle. Dates 1-3 run one by one (a
one-date run of an incremental delta or change set reads only the keys it touches, and date 3 compacts
on that path); the last two run as one single-run backfill, which plans a range of incremental dates
in one step. The change sets keep a tombstone one date, so untouched keys' tombstones expire. The full
loads carry an untracked batch id that changes every date, and date 4 changes nothing tracked: the state as
of each date shows that date's batch (issue 34: the incremental state showed the previous date's).
"""

from __future__ import annotations

import csv
import json
import random
from datetime import date, timedelta
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance

from cdc_assets.usecases.catalog_ddl import asset_views
from cdc_assets.cli.read import current_main
from cdc_assets.usecases.readers import current_duckdb_sql, current_state
from cdc_assets.model.names import APPLIED_SEQUENCES, CLASSIFICATION, CURRENT, DELETES, HISTORY
from resources.storage.state import read_state
from resources.storage import WarehouseStorage
from tests.engines import assert_engines_read_as_spark
from tests.pipeline import AUDIT_COLUMNS, definitions_for, partition_dir, read_stored, run_dates, run_range, sorted_rows, write_table_config

# Slow (about 13 minutes of runs, one of them a killed process of its own): `make test` runs them in its
# second session, which the first outlasted by 18 minutes with them (docs/testing.md).
pytestmark = pytest.mark.slow

FIRST = date(2021, 3, 1)
DAYS = [(FIRST + timedelta(days=n)).isoformat() for n in range(5)]
COLUMNS = {"keys": [{"name": "id", "type": "int"}], "non_keys": [{"name": "value", "type": "int"}, {"name": "name", "type": "string"}]}
LOAD_TYPES = ("full", "delta", "changeset", "debezium")


def _evolve(rng: random.Random, table: dict[int, tuple[int, str]], next_key: list[int]) -> list[tuple[str, int, tuple | None]]:
    """One day of changes to ``table`` (applied in place): (flag, key, row or None for a delete)."""
    changes = []
    keys = sorted(table)
    for key in rng.sample(keys, k=min(len(keys), 6)):
        if rng.random() < 0.3:
            changes.append(("D", key, None))
            del table[key]
        else:
            table[key] = (table[key][0] + rng.randint(1, 9), table[key][1])
            changes.append(("U", key, table[key]))
    for _ in range(4):
        key = next_key[0]
        next_key[0] += 1
        table[key] = (rng.randint(0, 99), f"n{key}")
        changes.append(("I", key, table[key]))
    return changes


def _land(source: Path, load_type: str) -> dict:
    """Five dates of extracts of one evolving table, in the form of ``load_type``; the config fields."""
    rng = random.Random(23)
    table = {key: (rng.randint(0, 99), f"n{key}") for key in range(1, 21)}
    next_key = [21]
    source.mkdir(parents=True)
    sequence = 0
    for index, day in enumerate(DAYS):
        if index == 0:
            changes = [("I", key, row) for key, row in sorted(table.items())]
        elif load_type == "full" and index == 3:
            changes = []  # a full load that changes nothing tracked: every key N, with a new batch
        else:
            changes = _evolve(rng, table, next_key)
        if load_type == "full":  # every row carries the extract's batch (untracked): its latest value is the state's
            rows = [(key, *row, index + 1) for key, row in sorted(table.items())]
        elif load_type == "delta":  # a delta carries the changed and new rows; a deleted key is left out (X)
            rows = [(key, *row) for flag, key, row in changes if row is not None]
            rows += [(3, *table[3])] if 3 in table and index % 2 == 0 else []  # supplied again unchanged: N
        if load_type in ("full", "delta"):
            with open(source / f"{day}.csv", "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["id", "value", "name", "batch"] if load_type == "full" else ["id", "value", "name"])
                writer.writerows(sorted(set(rows)))
        elif load_type == "changeset":
            with open(source / f"{day}.csv", "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["flag", "id", "value", "name", "seq"])
                for flag, key, row in changes:
                    sequence += 1
                    if flag == "U" and rng.random() < 0.5:  # an earlier record of the key the same day, superseded
                        writer.writerow(["U", key, -1, "superseded", sequence])
                        sequence += 1
                    value, name = row if row is not None else ("", "")
                    writer.writerow([flag, key, value, name, sequence])
        else:
            with open(source / f"{day}.jsonl", "w") as handle:
                for flag, key, row in changes:
                    sequence += 1
                    after = None if row is None else {"id": key, "value": row[0], "name": row[1]}
                    op = {"I": "c" if index else "r", "U": "u", "D": "d"}[flag]
                    event = {"before": {"id": key} if flag == "D" else None, "after": after, "op": op, "source": {"lsn": sequence}}
                    handle.write(json.dumps(event) + "\n")
    if load_type == "full":
        return {
            "load_type": "full",
            "source": {"path": f"{source}/{{date}}.csv", "format": "csv", "options": {"header": True}},
            "untracked_columns": [{"name": "batch", "type": "int"}],
        }
    if load_type == "delta":
        return {"load_type": "delta", "source": {"path": f"{source}/{{date}}.csv", "format": "csv", "options": {"header": True}}}
    if load_type == "changeset":
        return {
            "load_type": "changeset",
            "source": {"path": f"{source}/{{date}}.csv", "format": "csv", "options": {"header": True}},
            "untracked_columns": [{"name": "seq", "type": "bigint"}],
            "changes": {"operation_column": "flag", "sequence_columns": ["seq"], "tombstone_retention_days": 1},
        }
    return {
        "load_type": "changeset",
        "source": {"path": f"{source}/{{date}}.jsonl", "format": "debezium"},
        "changes": {"sequence_columns": ["source.lsn"], "tombstone_retention_days": 1},
    }


def _checks_passed(results) -> list[bool]:
    return [e.event_specific_data.passed for r in results for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]


def _rows(frame) -> list[tuple]:
    return sorted((tuple(row) for row in frame.drop(*AUDIT_COLUMNS).collect()), key=repr)


@pytest.mark.parametrize("load_type", LOAD_TYPES)
def test_incremental_and_snapshot_states_are_equal_date_by_date(spark, tmp_path, monkeypatch, load_type):
    fields = _land(tmp_path / "source", load_type)
    warehouses = {mode: tmp_path / mode for mode in ("snapshot", "incremental")}
    configs = {}
    for mode, root in warehouses.items():
        root.mkdir()
        monkeypatch.setenv("CDC_WAREHOUSE", str(root))
        storage = {"current": mode, "compact_after_dates": 2, "compact_after_share": 10.0}
        configs[mode] = write_table_config(
            tmp_path / f"configs-{mode}", "t", fields["source"]["path"], start_date=DAYS[0], storage=storage, **COLUMNS, **fields
        )
        defs = definitions_for(configs[mode])
        instance = DagsterInstance.ephemeral()
        if mode == "snapshot":  # the reference, as one range run (a range equals its dates run one by one)
            results = [run_range(defs, DAYS[0], DAYS[-1], instance)]
        else:
            results = run_dates(defs, DAYS[:3], instance) + [run_range(defs, DAYS[3], DAYS[-1], instance)]
        passed = _checks_passed(results)
        assert passed and all(passed), f"{mode}: a check failed"

    incremental, snapshot = warehouses["incremental"], warehouses["snapshot"]
    # Issue 34: pyiceberg and DuckDB read every date of the snapshot chain as Spark does.
    monkeypatch.setenv("CDC_WAREHOUSE", str(snapshot))
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(tmp_path / "configs-snapshot"))
    operations = assert_engines_read_as_spark(spark, snapshot, "t", DAYS)
    # The chain is the one described: inserts, updates and deletes (a delta has none: its deleted keys are
    # not supplied), a full load's unchanged keys N, a delta's or change set's keys not supplied X.
    assert operations[HISTORY] == ({"I", "U"} if load_type == "delta" else {"I", "U", "D"}), operations
    assert operations[CURRENT] == ({"I", "U", "N"} if load_type == "full" else {"I", "U", "X"}), operations
    monkeypatch.setenv("CDC_WAREHOUSE", str(incremental))
    storage = WarehouseStorage(str(incremental))
    # One table, a tag per date, compacted in the middle: whole states on dates 1, 3, 5, MERGEs on 2 and 4.
    assert storage.stored_dates("t", CURRENT) == DAYS
    stored_as = ["full", "changes", "full", "changes", "full"]
    assert [storage.stored_as("t", CURRENT, day) for day in DAYS] == stored_as
    for day in DAYS:
        expected = sorted_rows(spark, partition_dir(snapshot, "t", CURRENT, day))
        state = current_state(spark, configs["incremental"], day)
        assert _rows(state) == expected, f"current_table as of {day}"
        assert state.columns == read_stored(spark, partition_dir(snapshot, "t", CURRENT, day)).columns
        # DuckDB reads the same state from the same files.
        columns = [name for name in state.columns if name not in AUDIT_COLUMNS]
        found = duckdb.sql(f"SELECT {', '.join(columns)} FROM ({current_duckdb_sql(configs['incremental'], as_of=day)})")
        assert sorted(found.fetchall(), key=repr) == expected, f"DuckDB, as of {day}"
        assert sorted_rows(spark, partition_dir(incremental, "t", HISTORY, day)) == sorted_rows(
            spark, partition_dir(snapshot, "t", HISTORY, day)
        ), f"history_partition of {day}"
        for root in (incremental, snapshot):  # X is counted, not written
            assert read_stored(spark, partition_dir(root, "t", DELETES, day)).filter("operation <> 'D'").count() == 0
            assert read_stored(spark, partition_dir(root, "t", CLASSIFICATION, day)).filter("operation = 'X'").count() == 0
    stored = storage.merged.touched(spark, "t", CURRENT, DAYS[1])  # the rows date 2's MERGE wrote
    if load_type == "full":
        # A full load's unchanged keys came with a new batch (untracked): their N rows are state changes,
        # stored, and the state as of date 4 (nothing tracked changed) holds date 4's batch on every row.
        unchanged = read_stored(spark, partition_dir(snapshot, "t", CLASSIFICATION, DAYS[1])).filter("operation = 'N'").count()
        assert stored.filter("operation = 'N'").count() == unchanged > 0
        assert {row.batch for row in current_state(spark, configs["incremental"], DAYS[3]).collect()} == {4}
    else:  # the changes stored for date 2 are the touched keys only
        assert stored.count() and stored.filter("operation = 'X'").count() == 0
        assert stored.count() < current_state(spark, configs["incremental"], DAYS[1]).count()

    if load_type in ("changeset", "debezium"):  # a change set's own state, applied_sequences, likewise
        for day in DAYS:
            state = read_state(storage, spark, "t", APPLIED_SEQUENCES, day)
            expected = sorted_rows(spark, partition_dir(snapshot, "t", APPLIED_SEQUENCES, day))
            assert _rows(state) == expected, f"applied_sequences as of {day}"
        assert [storage.stored_as("t", APPLIED_SEQUENCES, day) for day in DAYS] == stored_as

    # Every date's state in SQL: the catalog's view, over the table's tags.
    lake = storage.tables.session_for(spark)
    view = next(view for view in asset_views(configs["incremental"], storage) if view.asset == CURRENT).view()
    every_state = lake.sql(view.query)
    for day in DAYS:
        expected = sorted_rows(spark, partition_dir(snapshot, "t", CURRENT, day))
        assert _rows(every_state.filter(f"business_date = DATE'{day}'").drop("business_date")) == expected, f"SQL, {day}"

    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(tmp_path / "configs-incremental"))
    out = tmp_path / "cdc-current"
    assert current_main(["t", "--as-of", DAYS[3], "--out", str(out)]) == 0
    assert _rows(read_stored(spark, out)) == sorted_rows(spark, partition_dir(snapshot, "t", CURRENT, DAYS[3]))


def _incremental_delta(tmp_path: Path):
    """The delta table of the tests above, incremental, full copies on dates 1, 3 and 5."""
    fields = _land(tmp_path / "source", "delta")
    return write_table_config(
        tmp_path / "configs", "t", fields["source"]["path"], start_date=DAYS[0],
        storage={"current": "incremental", "compact_after_dates": 2, "compact_after_share": 10.0}, **COLUMNS, **fields,
    )


@pytest.fixture(scope="module")
def delta_chain(spark, tmp_path_factory):
    """That table run over dates 1-4 as one range (a full copy on date 3, changes on 4), and each
    date's state as read right after: (config, its folder, warehouse, states). The states are the
    reference; the warehouse is the reader test's to rewrite."""
    root = tmp_path_factory.mktemp("delta_chain")
    warehouse = root / "warehouse"
    warehouse.mkdir()
    config = _incremental_delta(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_WAREHOUSE", str(warehouse))
        assert run_range(definitions_for(config), DAYS[0], DAYS[3], DagsterInstance.ephemeral()).success
        states = {day: _rows(current_state(spark, config, day)) for day in DAYS[:4]}
    return config, root / "configs", warehouse, states


RUN_ONE_DATE = """
import sys
from dagster import DagsterInstance
from cdc_assets.model.config import load_table_config
from tests.pipeline import definitions_for, run_dates
run_dates(definitions_for(load_table_config(sys.argv[1])), [sys.argv[2]], DagsterInstance.ephemeral())
"""


def test_a_kill_during_compaction_then_a_rerun_leaves_every_date_state_as_without_the_kill(spark, tmp_path, monkeypatch, delta_chain):
    import os
    import signal
    import subprocess
    import sys
    import time

    killed = tmp_path / "killed"
    killed.mkdir()
    config, configs, _, expected = delta_chain  # the states without a kill

    monkeypatch.setenv("CDC_WAREHOUSE", str(killed))
    instance = DagsterInstance.ephemeral()
    assert run_range(definitions_for(config), DAYS[0], DAYS[1], instance).success  # one run: dates 1-2 are not the point
    before = {day: _rows(current_state(spark, config, day)) for day in DAYS[:2]}
    marker = tmp_path / "paused"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "CDC_WAREHOUSE": str(killed),
        # Date 3 is a compaction: paused just before its full copy's Iceberg write.
        "CDC_PAUSE_BEFORE_COMMIT": "t/current_table",
        "CDC_PAUSE_MARKER": str(marker),
        "CDC_SPARK_CONF": json.dumps({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}),
    }
    run = subprocess.Popen(
        [sys.executable, "-c", RUN_ONE_DATE, str(configs / "t.yaml"), DAYS[2]],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert marker.exists(), f"the run never paused (exit code {run.poll()})"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    assert run.returncode == -signal.SIGKILL
    # Nothing of date 3's state was committed; dates 1 and 2 read as before.
    assert {day: _rows(current_state(spark, config, day)) for day in DAYS[:2]} == before
    with pytest.raises(ValueError, match=DAYS[2]):
        current_state(spark, config, DAYS[2])

    run_dates(definitions_for(config), DAYS[2:4], instance)
    storage = WarehouseStorage(str(killed))
    assert DAYS[2] in storage.stored_dates("t", CURRENT)  # the re-run compacted
    assert {day: _rows(current_state(spark, config, day)) for day in DAYS[:4]} == expected
    # A re-run of a middle date (with the later dates, computed from it) with its input unchanged leaves
    # every date's state as it was.
    assert run_range(definitions_for(config), DAYS[1], DAYS[3], instance).success
    assert {day: _rows(current_state(spark, config, day)) for day in DAYS[:4]} == expected


def test_a_reader_of_the_state_never_sees_a_missing_or_mixed_state_while_compaction_commits(spark, tmp_path, monkeypatch, delta_chain):
    import threading

    from pyspark.sql import functions as F

    config, configs, warehouse, _ = delta_chain  # whole state on date 3, a MERGE on 4; date 4 rewritten here
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    storage = WarehouseStorage(str(warehouse))
    frame = storage.read_one(spark, "t", CURRENT, DAYS[3]).localCheckpoint()
    versions, failures, seen, done = 12, [], set(), threading.Event()
    expected_rows = {day: current_state(spark, config, day).count() for day in (DAYS[2], DAYS[3])}
    first = WarehouseStorage(str(warehouse))
    first.write_state(frame.withColumn("name", F.lit("v0")).repartition(2), "t", CURRENT, DAYS[3], True, "X", rerun_of=[DAYS[3]])
    first.release()

    def compact() -> None:
        writer = WarehouseStorage(str(warehouse))
        try:
            for version in range(1, versions):
                # Each compaction replaces date 4's state with its number in `name` (over two files, so a
                # torn read would show two numbers) and moves the date's tag.
                versioned = frame.withColumn("name", F.lit(f"v{version}")).repartition(2)
                writer.write_state(versioned, "t", CURRENT, DAYS[3], True, "X", rerun_of=[DAYS[3]])
        finally:
            writer.release()
            done.set()

    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))
    thread = threading.Thread(target=compact)
    thread.start()
    try:
        reads = 0
        while not done.is_set():
            for day in (DAYS[2], DAYS[3]):
                # The reader is cdc-current itself (in this process, so on the test's session): it writes the
                # state to a folder of its own, which is then read back.
                reads += 1
                out = tmp_path / f"read-{reads}"
                try:
                    assert current_main(["t", "--as-of", day, "--out", str(out)]) == 0
                    rows = read_stored(spark, out).select("id", "name").collect()
                except Exception as error:  # noqa: BLE001 - any failed read is what the test looks for
                    failures.append(f"{day}: {error!r}")
                    continue
                names = {row.name for row in rows}
                if len(rows) != expected_rows[day] or (day == DAYS[3] and len(names) != 1):
                    failures.append(f"{day}: {len(rows)} rows, versions {sorted(map(str, names))}")
                if day == DAYS[3]:
                    seen |= names
    finally:
        thread.join()
    assert failures == []
    assert len(seen) >= 3, seen  # the reader did see compactions commit


def test_retention_keeps_the_newest_states_tags(spark, tmp_path, monkeypatch):
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    fields = _land(tmp_path / "source", "delta")
    config = write_table_config(
        tmp_path / "configs", "t", fields["source"]["path"], start_date=DAYS[0],
        storage={"current": "incremental", "compact_after_dates": 2, "compact_after_share": 10.0},
        retention={"current_days": 2}, **COLUMNS, **fields,
    )
    instance = DagsterInstance.ephemeral()
    run_dates(definitions_for(config), DAYS[:4], instance)
    kept = {day: _rows(current_state(spark, config, day)) for day in DAYS[3:4]}
    results = run_dates(definitions_for(config), [DAYS[4]], instance)
    storage = WarehouseStorage(str(warehouse))
    # The newest two states are dates 4 and 5, each its own tag: the others' tags are gone.
    assert storage.stored_dates("t", CURRENT) == [DAYS[3], DAYS[4]]
    assert {day: _rows(current_state(spark, config, day)) for day in DAYS[3:4]} == kept
    assert current_state(spark, config, DAYS[4]).count() > 0
    for dropped in DAYS[:3]:
        with pytest.raises(ValueError, match="retention.current_days"):
            current_state(spark, config, dropped)
    assert all(_checks_passed(results))


def test_an_erase_of_keys_on_every_date_leaves_no_tag_and_no_file_holding_them(spark, tmp_path, monkeypatch):
    """The table's erase job (cdc-erase's use case) on an incremental delta chain: the keys leave every
    date's state (every tag) and every file under the table, the other keys' states are as before, and
    every date's checks, evaluated again, pass."""
    from dagster import DagsterEventType, EventRecordsFilter

    from cdc_assets.usecases.erasure import read_keys_file, verify_erased

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    config = _incremental_delta(tmp_path)
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(tmp_path / "configs"))
    defs, instance = definitions_for(config), DagsterInstance.ephemeral()
    assert run_range(defs, DAYS[0], DAYS[-1], instance).success  # one run: each date still stored and checked
    before = {day: {row.id: row for row in current_state(spark, config, day).collect()} for day in DAYS}
    on_every_date = sorted(set.intersection(*(set(rows) for rows in before.values())))
    erased = on_every_date[:2]
    keys = tmp_path / "erase.csv"
    keys.write_text("id\n" + "".join(f"{key}\n" for key in erased))
    hashes = [row[0] for row in read_keys_file(spark, config, str(keys)).collect()]

    def files_holding(text: str) -> list[str]:
        return sorted(
            str(path) for path in (warehouse / "t").rglob("*")
            if path.is_file() and "_erasures" not in path.parts and text.encode() in path.read_bytes()
        )

    assert all(files_holding(key_hash) for key_hash in hashes), "the hashes must be findable for their absence to mean anything"
    erase = defs.get_job_def("t_erase").execute_in_process(
        run_config={"ops": {"t__erase": {"config": {"keys_file": str(keys), "reason": "test"}}}}, instance=instance
    )
    assert erase.success

    storage = WarehouseStorage(str(warehouse))
    assert storage.stored_dates("t", CURRENT) == DAYS  # every date's tag is still there, without the keys
    for day in DAYS:
        after = {row.id: row for row in current_state(spark, config, day).collect()}
        assert after == {key: row for key, row in before[day].items() if key not in erased}, day
    assert verify_erased(spark, storage, config, str(keys)).holding == []
    assert [path for key_hash in hashes for path in files_holding(key_hash)] == []
    records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ASSET_CHECK_EVALUATION), ascending=True)
    latest = {}
    for record in records:
        check = record.event_log_entry.dagster_event.event_specific_data
        latest[(check.asset_key.path[-1], check.check_name, check.partition)] = check.passed
    assert {day for (_, _, day) in latest} == set(DAYS)
    assert [key for key, passed in latest.items() if not passed] == []
