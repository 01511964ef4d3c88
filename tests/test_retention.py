"""``retention.current_days``: old current_table partitions are dropped, history is kept, and whatever needs a
dropped state fails naming the setting. ``retention.snapshot_days``: replaced table versions are expired, and
the files only they read (a dropped date's) deleted.

Two tables with the same source run side by side in the same Dagster runs, one date per run: ``retained``
(``retention: {current_days: 2, snapshot_days: 0}``) and ``kept`` (no retention: versions kept 7 days), so every output of ``retained`` that is
still stored can be compared with ``kept``'s. A small full load with key ``id``:

    day 1  I 1, 2, 3
    day 2  U 1 | D 3 | I 4
    day 3  U 2 | I 5
    day 4  D 1 | U 4 | I 6
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
from pyspark.sql import functions as F

from cdc_assets.cli import read as cli
from cdc_assets.cli import report
from cdc_assets.model.config import TableConfigError, load_table_config
from cdc_assets.usecases.readers import changes_between, scd2_view
from cdc_assets.core.views.between import changes_between_states
from resources.storage import DroppedPartitionError, MissingPartitionError, WarehouseStorage
from tests.pipeline import definitions_for, partition_dir, read_stored, run_dates, run_range, sorted_rows, write_table_config

D1, D2, D3, D4 = "2024-05-01", "2024-05-02", "2024-05-03", "2024-05-04"
HEADER = "id,name,amount"
DAYS = {
    D1: ["1,ann,1.0", "2,bob,2.0", "3,cy,3.0"],
    D2: ["1,ann,1.5", "2,bob,2.0", "4,di,4.0"],
    D3: ["1,ann,1.5", "2,bobby,2.0", "4,di,4.0", "5,ed,5.0"],
    D4: ["2,bobby,2.0", "4,di,4.5", "5,ed,5.0", "6,flo,6.0"],
}
RETAINED, KEPT = "retained", "kept"
CDC_OUTPUTS = ("hash_join_classification", "inserts", "deletes", "updates", "current_table", "history_partition")


def _write_config(folder: Path, name: str, source: Path, **fields):
    return write_table_config(
        folder,
        name,
        f"{source}/{{date}}.csv",
        start_date=D1,
        load_type="full",
        keys=[{"name": "id", "type": "int"}],
        non_keys=[{"name": "name", "type": "string"}, {"name": "amount", "type": "double"}],
        **fields,
    )


@pytest.fixture(scope="module")
def chain(spark, tmp_path_factory):
    """Days 1 to 4 of both tables, one run per date."""
    root = tmp_path_factory.mktemp("retention")
    source, warehouse, configs = root / "source", root / "warehouse", root / "configs"
    source.mkdir()
    for day, lines in DAYS.items():
        (source / f"{day}.csv").write_text("\n".join([HEADER, *lines]) + "\n")
    retained = _write_config(configs, RETAINED, source, retention={"current_days": 2, "snapshot_days": 0})
    kept = _write_config(configs, KEPT, source)
    patch = pytest.MonkeyPatch()
    patch.setenv("CDC_WAREHOUSE", str(warehouse))
    patch.setenv("CDC_TABLE_CONFIGS", str(configs))
    instance = DagsterInstance.ephemeral()
    try:
        defs = definitions_for(retained, kept)
        results = run_dates(defs, [D1, D2, D3], instance)
        planted = _plant_killed_write_leftovers(warehouse)
        results += run_dates(defs, [D4], instance)
        assert all(result.success for result in results)
        yield {"warehouse": warehouse, "retained": retained, "kept": kept, "instance": instance, "runs": results, "planted": planted}
    finally:
        patch.undo()


def _plant_killed_write_leftovers(warehouse: Path) -> dict[str, list[Path]]:
    """What a write killed inside its commit leaves under each table's current_table (a data file, a
    manifest, a metadata file none names), as copies of real ones dated two days back; and, under the
    retained table, one such manifest written just now (a write of another host may still commit it)."""
    storage = WarehouseStorage(str(warehouse))
    planted = {}
    for table in (RETAINED, KEPT):
        loaded = storage.tables.load(table, "current_table")
        location = Path(storage.tables.location(table, "current_table"))
        data_file = next(iter(storage.tables.live_files(table, "current_table", [D3])))
        manifest = next(location.glob("metadata/*-m0.avro"))
        copies = {
            location / "data" / f"business_date={D3}" / "00000-9-killed-00001.parquet": Path(data_file),
            location / "metadata" / "killed-m0.avro": manifest,
            location / "metadata" / "00099-killed.metadata.json": Path(loaded.metadata_location.removeprefix("file:")),
        }
        two_days_ago = loaded.current_snapshot().timestamp_ms / 1000 - 2 * 86400
        for copy, original in copies.items():
            copy.write_bytes(original.read_bytes())
            os.utime(copy, (two_days_ago, two_days_ago))
        planted[table] = list(copies)
    fresh = Path(storage.tables.location(RETAINED, "current_table")) / "metadata" / "fresh-m0.avro"
    fresh.write_bytes(planted[RETAINED][1].read_bytes())
    planted["fresh"] = [fresh]
    return planted


def _stored(warehouse: Path, table: str, asset: str) -> list[str]:
    """The dates the asset's Iceberg table holds now (its current snapshot)."""
    return WarehouseStorage(str(warehouse)).stored_dates(table, asset)


def _dates_in_rows(spark, warehouse: Path, table: str, asset: str) -> list[str]:
    """The dates of the rows the asset's Iceberg table reads now, through Spark's catalog."""
    lake = WarehouseStorage(str(warehouse)).tables.session_for(spark)
    return sorted(str(row[0]) for row in lake.table(f"lake.{table}.{asset}").select("business_date").distinct().collect())


def test_only_the_newest_current_days_states_remain_and_history_keeps_every_date(spark, chain):
    warehouse = chain["warehouse"]
    assert _stored(warehouse, RETAINED, "current_table") == [D3, D4]
    assert _stored(warehouse, KEPT, "current_table") == [D1, D2, D3, D4]
    for asset in set(CDC_OUTPUTS) - {"current_table"}:
        assert _stored(warehouse, RETAINED, asset) == [D1, D2, D3, D4], asset
    # The drops are Iceberg commits: the table read as a whole (as any engine reads it) holds no dropped date.
    assert _dates_in_rows(spark, warehouse, RETAINED, "current_table") == [D3, D4]
    assert _dates_in_rows(spark, warehouse, KEPT, "current_table") == [D1, D2, D3, D4]


def test_what_is_kept_equals_a_run_without_retention(spark, chain):
    warehouse = chain["warehouse"]
    stored = {asset: _stored(warehouse, RETAINED, asset) for asset in CDC_OUTPUTS}
    # What the loop below compares: every output on every date, but current_table on the newest two only.
    assert stored == {asset: [D3, D4] if asset == "current_table" else [D1, D2, D3, D4] for asset in CDC_OUTPUTS}
    for asset, days in stored.items():
        for day in days:
            assert sorted_rows(spark, partition_dir(warehouse, RETAINED, asset, day)) == sorted_rows(
                spark, partition_dir(warehouse, KEPT, asset, day)
            ), (asset, day)


def test_snapshot_days_expires_replaced_versions_and_deletes_a_dropped_dates_files(chain):
    storage = WarehouseStorage(str(chain["warehouse"]))
    for asset in (*CDC_OUTPUTS, "hashed_incoming", "rejects"):
        # snapshot_days 0: each run leaves only its own last version; by default a week of them stays.
        assert len(storage.tables.load(RETAINED, asset).snapshots()) == 1, asset
        # One per date, and the empty one the first run's staging branch started the new table from.
        assert len(storage.tables.load(KEPT, asset).snapshots()) == len(DAYS) + 1, asset
    # No file of a date current_days dropped is left under the table, nor any file no version reads.
    retained_files = storage.data_files(RETAINED)
    assert retained_files and all(live for *_, live in retained_files)
    assert {day for asset, day, _, _ in retained_files if asset == "current_table"} == {D3, D4}
    kept_current = {day for asset, day, _, _ in storage.data_files(KEPT) if asset == "current_table"}
    assert kept_current == set(DAYS)


def test_a_run_that_expires_versions_removes_what_killed_writes_left_once_a_day_old(chain):
    """Files no table version names (planted before day 4: a killed write's data file, manifest and
    metadata file) are removed by the next run that expires versions, once a day old; a newer one stays
    (it may be a write in progress elsewhere), and a table whose run expired nothing is not swept."""
    planted, storage = chain["planted"], WarehouseStorage(str(chain["warehouse"]))
    assert not any(path.exists() for path in planted[RETAINED])
    assert all(path.exists() for path in planted["fresh"] + planted[KEPT])
    assert [Path(path) for path in storage.tables.unreferenced_files(RETAINED, "current_table")] == planted["fresh"]
    assert {Path(path) for path in storage.tables.unreferenced_files(KEPT, "current_table")} == set(planted[KEPT])
    # Nothing any version reads was removed: every table still reads whole.
    for table in (RETAINED, KEPT):
        for asset in CDC_OUTPUTS:
            storage.tables.load(table, asset).scan().to_arrow()


def test_materializations_and_the_run_log_say_what_was_dropped(chain):
    instance = chain["instance"]

    def metadata(table: str, day: str, asset: str = "current_table") -> dict:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey([table, asset]), asset_partitions=[day]), limit=1
        ).records
        return records[0].asset_materialization.metadata

    dropped = {day: metadata(RETAINED, day)["dropped_current_partitions"].value for day in DAYS}
    assert dropped == {D1: [], D2: [], D3: [D1], D4: [D2]}
    assert metadata(RETAINED, D4)["retention_current_days"].value == 2
    # Day 4's publication (snapshot_days applies once a run's dates are published, docs/publishing.md) expired
    # the version of current_table readers saw before it and day 4's write, which its drop replaced.
    published = {table: metadata(table, D4, "published") for table in (RETAINED, KEPT)}
    assert published[RETAINED]["expired_snapshots"].value["current_table"] == 2
    assert published[KEPT]["retention_snapshot_days"].value == 7
    assert set(published[KEPT]["expired_snapshots"].value.values()) == {0}
    assert published[RETAINED]["removed_unreferenced_files"].value["current_table"] == 3  # the planted leftovers
    assert set(published[KEPT]["removed_unreferenced_files"].value.values()) == {0}
    assert "dropped_current_partitions" not in metadata(KEPT, D4)
    # Dagster still shows the dropped dates as materialized: retention does not touch the instance.
    assert metadata(RETAINED, D1)["dagster/row_count"].value == 3

    messages = [entry.user_message for entry in instance.all_logs(chain["runs"][2].run_id)]
    assert f"retained/current_table: retention.current_days=2 dropped 1 partition(s): {D1}" in messages


def test_consumers_still_read_history_and_the_kept_states(spark, chain, tmp_path, capsys):
    warehouse = str(chain["warehouse"])

    def versions(frame):
        return sorted((tuple(row) for row in frame.drop("process_id", "processed_at").collect()), key=repr)

    assert versions(scd2_view(spark, chain["retained"], warehouse=warehouse)) == versions(
        scd2_view(spark, chain["kept"], warehouse=warehouse)
    )
    out = tmp_path / "scd2"
    assert cli.scd2_main([RETAINED, "--out", str(out)]) == 0
    assert read_stored(spark, out).count() == 9  # 6 keys; 1, 2 and 4 changed once each

    # cdc-changes reads history, which retention keeps: from day 1, whose current_table retention dropped,
    # it gives what comparing kept's two stored states gives.
    assert not partition_dir(chain["warehouse"], RETAINED, "current_table", D1).exists()
    kept_states = [read_stored(spark, partition_dir(chain["warehouse"], KEPT, "current_table", day)) for day in (D1, D4)]
    from_states = sorted(map(tuple, changes_between_states(*kept_states, chain["kept"], D1, D4).collect()))
    assert {row[-4] for row in from_states} == {"insert", "delete", "update_preimage", "update_postimage"}
    retained_changes = changes_between(spark, chain["retained"], D1, D4, warehouse=warehouse)
    assert sorted(map(tuple, retained_changes.collect())) == from_states

    assert report.main([RETAINED]) == 0
    printed = capsys.readouterr().out
    assert f"current_table of {RETAINED} as of {D4}:" in printed


def test_cdc_changes_from_a_dropped_date_works_and_a_date_never_written_is_an_error(chain, tmp_path, capsys):
    out = tmp_path / "changes"
    assert cli.changes_main([RETAINED, "--from", D1, "--to", D2, "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"cdc-changes: wrote parquet to {out}\n"
    assert cli.changes_main([RETAINED, "--from", D3, "--to", "2024-05-09"]) == 2
    assert capsys.readouterr().err == (
        f"cdc-changes: error: {RETAINED} has no history_partition for 2024-05-09: stored dates run from {D1} to {D4}\n"
    )


def test_rerunning_the_date_after_a_dropped_one_fails_naming_the_setting(spark, chain):
    """Runs last in the module: the failed run rewrites the intake outputs of days 2 to 4 (with the same rows).
    Day 2 runs with the later days, computed from it (alone it is refused: tests/test_rerun.py)."""
    before = sorted_rows(spark, partition_dir(chain["warehouse"], RETAINED, "history_partition", D2))
    result = run_range(definitions_for(chain["retained"]), D2, D4, chain["instance"], raise_on_error=False)
    assert not result.success
    failure = next(event for event in result.all_events if event.event_type_value == "STEP_FAILURE")
    assert failure.step_key == f"{RETAINED}__cdc"
    message = failure.step_failure_data.error.to_string()
    assert "DroppedPartitionError" in message
    assert f"{RETAINED}/current_table has no partition for {D1}: retention.current_days (2, in the table config" in message
    # Nothing of the CDC step was rewritten.
    assert sorted_rows(spark, partition_dir(chain["warehouse"], RETAINED, "history_partition", D2)) == before
    assert _stored(chain["warehouse"], RETAINED, "current_table") == [D3, D4]


# -- the storage on its own ------------------------------------------------------------------------------


def _plain(spark, value: int):
    return spark.range(1).select(F.lit(str(value)).alias("key_hash"), F.lit(value).alias("amount"))


def test_a_run_never_drops_what_it_read_or_wrote_the_next_run_does(spark, tmp_path):
    root = str(tmp_path / "warehouse")
    first = WarehouseStorage(root, run_id="first")
    for number, day in enumerate((D1, D2, D3, D4)):
        first.write(_plain(spark, number), "t", "current_table", [day])
    # A range run wrote all four dates: its checks will read them, so none goes yet.
    assert first.drop_outside_retention("t", "current_table", 1) == []
    first.release()

    second = WarehouseStorage(root, run_id="second")
    second.read_one(spark, "t", "current_table", D2)  # a re-run of day 3 reads day 2
    assert second.drop_outside_retention("t", "current_table", 1) == [D1, D3]
    assert second.stored_dates("t", "current_table") == [D2, D4]
    second.release()

    third = WarehouseStorage(root, run_id="third")
    assert third.drop_outside_retention("t", "current_table", 1) == [D2]
    assert third.stored_dates("t", "current_table") == [D4]  # never the newest
    with pytest.raises(DroppedPartitionError, match=r"retention.current_days \(1, in the table config of t\)"):
        third.read_one(spark, "t", "current_table", D2)
    third.release()


def test_a_date_written_again_is_no_longer_a_dropped_one_and_a_drop_is_a_commit_whose_files_go_when_purged(spark, tmp_path):
    root = tmp_path / "warehouse"
    first = WarehouseStorage(str(root), run_id="first")
    for number, day in enumerate((D1, D2)):
        first.write(_plain(spark, number), "t", "current_table", [day])
    first.release()
    second = WarehouseStorage(str(root), run_id="second")
    assert second.drop_outside_retention("t", "current_table", 1) == [D1]
    assert second.dropped_partition("t", "current_table", D1)["newest"] == D2
    second.write(_plain(spark, 7), "t", "current_table", [D1])  # e.g. a re-run of the start date
    assert second.dropped_partition("t", "current_table", D1) is None
    assert [r["amount"] for r in second.read_one(spark, "t", "current_table", D1).collect()] == [7]
    second.release()

    # A drop is an Iceberg commit: readers see the date as dropped at once; a reader still on the snapshot
    # before it reads the date whole, until the table's replaced files are purged.
    third = WarehouseStorage(str(root), run_id="third")
    before_drop = third.tables.load("t", "current_table").current_snapshot().snapshot_id
    assert third.drop_outside_retention("t", "current_table", 1) == [D1]
    third.release()
    with pytest.raises(DroppedPartitionError):
        WarehouseStorage(str(root), run_id="reader").read_one(spark, "t", "current_table", D1)
    lake = third.tables.session_for(spark)
    assert [r["amount"] for r in lake.table("lake.t.current_table").collect()] == [1]  # D2's row only
    in_flight = lake.read.option("snapshot-id", before_drop).table("lake.t.current_table")
    assert sorted(r["amount"] for r in in_flight.collect()) == [1, 7]
    dropped_files = [path for asset, day, path, live in third.data_files("t") if day == D1]
    assert dropped_files and all(os.path.exists(path) for path in dropped_files)
    third.purge_unreferenced_files("t")
    third.release()
    assert not any(os.path.exists(path) for path in dropped_files)
    assert [day for _, day, _, _ in third.data_files("t")] == [D2]
    # A date that was never written is missing, not dropped.
    with pytest.raises(MissingPartitionError) as missing:
        WarehouseStorage(str(root), run_id="reader").read_one(spark, "t", "current_table", D4)
    assert not isinstance(missing.value, DroppedPartitionError)


# -- the config -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retention", "expected"),
    [
        ({"current_days": 1}, "greater than or equal to 2"),
        ({"current_days": 0}, "greater than or equal to 2"),
        ({"current_days": -3}, "greater than or equal to 2"),
        ({"current_days": "two"}, "valid integer"),
        ({"current_days": True}, "valid integer"),
        ({"current_days": 2.5}, "valid integer"),
        ({"current_day": 2}, "Extra inputs are not permitted"),
        ({"snapshot_days": -1}, "greater than or equal to 0"),
        ({"snapshot_days": "7"}, "valid integer"),
    ],
)
def test_invalid_retention_names_the_file_and_the_field(tmp_path, retention, expected):
    with pytest.raises(TableConfigError) as error:
        _write_config(tmp_path, "orders", tmp_path, retention=retention)
    message = str(error.value)
    assert str(tmp_path / "orders.yaml") in message
    field = f"retention.{next(iter(retention))}"
    assert f"field '{field}': " in message and expected in message


def test_retention_is_optional(tmp_path):
    assert _write_config(tmp_path, "orders", tmp_path).retention is None
    assert _write_config(tmp_path, "orders", tmp_path, retention=None).retention is None
    assert _write_config(tmp_path, "orders", tmp_path, retention={"current_days": None}).retention.current_days is None
    path = tmp_path / "orders.yaml"
    path.write_text(path.read_text() + "retention:\n  current_days: 30\n")
    assert load_table_config(path).retention.current_days == 30
    assert load_table_config(path).retention.snapshot_days == 7  # the default


# -- retention.staging_days: the staging outputs ----------------------------------------------------------

STAGING = ("hashed_incoming", "rejects", "hash_join_classification")
KEPT_WHOLE = ("inserts", "deletes", "updates", "current_table", "history_partition")


def _checks_passed(result) -> bool:
    evaluations = result.get_asset_check_evaluations()
    return bool(evaluations) and all(evaluation.passed for evaluation in evaluations)


def _staging_metadata(instance, day: str) -> dict:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(["staged", "hashed_incoming"]), asset_partitions=[day]), limit=1
    ).records
    return records[0].asset_materialization.metadata


def test_staging_days_drops_old_staging_outputs_and_a_rerun_inside_or_outside_the_window_works(spark, tmp_path, monkeypatch):
    """``staging_days: 1`` over days 1 to 3, one run per date; then a re-run of day 1 (outside the window)
    and of day 3 (inside), and an erase of a key that the dropped dates held."""
    source, warehouse = tmp_path / "source", tmp_path / "warehouse"
    source.mkdir()
    for day in (D1, D2, D3):
        (source / f"{day}.csv").write_text("\n".join([HEADER, *DAYS[day]]) + "\n")
    staged = _write_config(tmp_path / "configs", "staged", source, retention={"staging_days": 1})
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(tmp_path / "configs"))
    defs, instance = definitions_for(staged), DagsterInstance.ephemeral()
    results = run_dates(defs, [D1, D2, D3], instance)
    assert all(result.success and _checks_passed(result) for result in results)

    for asset in STAGING:
        assert _stored(warehouse, "staged", asset) == [D3], asset
    for asset in KEPT_WHOLE:
        assert _stored(warehouse, "staged", asset) == [D1, D2, D3], asset
    assert {day: _staging_metadata(instance, day)["dropped_staging_partitions"].value for day in (D1, D2, D3)} == {
        D1: [], D2: [D1], D3: [D2]
    }
    assert _staging_metadata(instance, D3)["retention_staging_days"].value == 1
    storage = WarehouseStorage(str(warehouse))
    assert storage.dropped_partition("staged", "hash_join_classification", D1)["setting"] == "staging_days"
    with pytest.raises(DroppedPartitionError, match=rf"staged/rejects has no partition for {D1}: retention.staging_days \(1, in the table config of staged\)"):
        storage.read_one(spark, "staged", "rejects", D1)
    history = {day: sorted_rows(spark, partition_dir(warehouse, "staged", "history_partition", day)) for day in (D1, D2, D3)}
    current_d1 = sorted_rows(spark, partition_dir(warehouse, "staged", "current_table", D1))
    # Consumers read current_table and history, which staging_days leaves alone.
    assert cli.changes_main(["staged", "--from", D1, "--to", D3, "--out", str(tmp_path / "changes")]) == 0
    assert report.main(["staged"]) == 0

    # Day 1, outside the window (with the later days, computed from it: alone it is refused): its extract
    # is read again and its staging outputs are back, its CDC outputs the same rows; the run drops nothing
    # it wrote (its checks read them), the next run does.
    rerun = run_range(defs, D1, D3, instance)
    assert rerun.success and _checks_passed(rerun)
    assert _stored(warehouse, "staged", "hashed_incoming") == [D1, D2, D3]
    assert storage.row_counts("staged", "hashed_incoming", [D1]) == {D1: 3}
    assert storage.dropped_partition("staged", "hashed_incoming", D1) is None
    assert sorted_rows(spark, partition_dir(warehouse, "staged", "history_partition", D1)) == history[D1]
    assert sorted_rows(spark, partition_dir(warehouse, "staged", "current_table", D1)) == current_d1

    # Day 3, inside the window: as without retention, and day 1's staging outputs go again.
    [rerun] = run_dates(defs, [D3], instance)
    assert rerun.success and _checks_passed(rerun)
    assert _staging_metadata(instance, D3)["dropped_staging_partitions"].value == [D1, D2]
    for asset in STAGING:
        assert _stored(warehouse, "staged", asset) == [D3], asset
    for asset in KEPT_WHOLE:
        assert _stored(warehouse, "staged", asset) == [D1, D2, D3], asset
    assert sorted_rows(spark, partition_dir(warehouse, "staged", "history_partition", D3)) == history[D3]

    # An erase scans what is stored and checks again the dates it can: the dropped ones keep their checks.
    keys = tmp_path / "erase.csv"
    keys.write_text("id\n2\n")
    erased = defs.get_job_def("staged_erase").execute_in_process(
        run_config={"ops": {"staged__erase": {"config": {"keys_file": str(keys)}}}}, instance=instance
    )
    assert erased.success
    assert 2 not in {row["id"] for row in read_stored(spark, partition_dir(warehouse, "staged", "history_partition", D1)).collect()}


@pytest.mark.parametrize(
    ("staging_days", "expected"),
    [(0, "greater than or equal to 1"), ("1", "valid integer"), (True, "valid integer"), (1.5, "valid integer")],
)
def test_invalid_staging_days_names_the_file_and_the_field(tmp_path, staging_days, expected):
    with pytest.raises(TableConfigError) as error:
        _write_config(tmp_path, "orders", tmp_path, retention={"staging_days": staging_days})
    message = str(error.value)
    assert str(tmp_path / "orders.yaml") in message
    assert "field 'retention.staging_days': " in message and expected in message
    assert _write_config(tmp_path, "orders", tmp_path, retention={"staging_days": 1}).retention.staging_days == 1
