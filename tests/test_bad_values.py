"""Bad values end to end (issue 46, points 9 and 10): a typed extract's lossy cast is a bad record, and a
full load holds a key whose record was rejected instead of deleting it.

Real Dagster runs with the project's IO manager, real Spark, tiny hand-written files in tmp_path.
"""

from __future__ import annotations

from pathlib import Path

from dagster import AssetCheckSeverity, AssetKey, AssetRecordsFilter, DagsterInstance

from tests.pipeline import definitions_for, partition_dir, read_stored, run_dates, run_range, write_table_config

TABLE = "scores"
DAY1, DAY2, DAY3 = "2024-01-01", "2024-01-02", "2024-01-03"
HEADER = "id,name,score\n"
COLUMNS = {
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}, {"name": "score", "type": "int"}],
}


def _table(tmp_path: Path, **fields):
    source = f"{tmp_path / 'landing'}/{{date}}.csv"
    return write_table_config(tmp_path / "configs", TABLE, source, start_date=DAY1, **{**COLUMNS, **fields})


def _land(tmp_path: Path, day: str, text: str) -> Path:
    path = tmp_path / "landing" / f"{day}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _metadata(instance: DagsterInstance, asset: str, day: str) -> dict:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey([TABLE, asset]), asset_partitions=[day]), limit=1
    ).records
    assert records, f"{asset} has no materialization for {day}"
    return {key: value.value for key, value in records[0].asset_materialization.metadata.items()}


def _checks(result, day: str) -> dict[str, tuple[bool, AssetCheckSeverity, dict]]:
    found = {}
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION" and event.event_specific_data.partition == day:
            data = event.event_specific_data
            found[f"{data.asset_key.path[-1]}.{data.check_name}"] = (
                data.passed, data.severity, {key: value.value for key, value in data.metadata.items()},
            )
    return found


def _current(spark, warehouse: Path, day: str) -> dict[int, tuple]:
    rows = read_stored(spark, partition_dir(warehouse, TABLE, "current_table", day)).collect()
    return {row["id"]: (row["name"], row["score"], row["operation"], row["eff_start_date"].isoformat()) for row in rows}


def _failure(result) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "expected a failed step"
    return "\n".join(e.step_failure_data.error.to_string() for e in failures)


def test_a_full_load_holds_a_key_whose_record_is_rejected(spark, warehouse, tmp_path):
    _land(tmp_path, DAY1, HEADER + "1,a,10\n2,b,20\n3,c,30\n")
    _land(tmp_path, DAY2, HEADER + "1,a,11\n2,b,oops\n3,c,30\n")  # key 2: a bad value, not a delete
    _land(tmp_path, DAY3, HEADER + "1,a,11\n2,b,25\n3,c,30\n")
    instance = DagsterInstance.ephemeral()
    defs = definitions_for(_table(tmp_path))

    first, second = run_dates(defs, [DAY1, DAY2], instance)

    assert first.success and second.success
    # Key 2 is kept as it was on day 1, neither deleted nor updated; the other keys are classified as usual.
    assert _current(spark, warehouse, DAY2) == {
        1: ("a", 11, "U", DAY2), 2: ("b", 20, "X", DAY1), 3: ("c", 30, "N", DAY1),
    }
    assert read_stored(spark, partition_dir(warehouse, TABLE, "deletes", DAY2)).count() == 0
    counts = _metadata(instance, "hash_join_classification", DAY2)
    assert (counts["inserts"], counts["updates"], counts["deletes"], counts["unchanged"]) == (0, 1, 0, 1)
    assert (counts["not_supplied"], counts["held_by_reject"]) == (1, 1)
    checks = _checks(second, DAY2)
    held = checks.pop("hash_join_classification.no_key_held_by_reject")
    assert held[:2] == (False, AssetCheckSeverity.WARN) and held[2]["held_by_reject"] == 1
    # Every count still adds up: D + U + N + X = 3 keys before, current = I + U + N + X.
    assert checks and all(passed for passed, _, _ in checks.values()), checks
    assert checks["hash_join_classification.previous_state_reconciles"][2]["left"] == 3

    # The next good extract updates the held key from its held version, and nothing is held any more.
    [third] = run_dates(defs, [DAY3], instance)
    assert third.success
    assert _current(spark, warehouse, DAY3)[2] == ("b", 25, "U", DAY3)
    assert _checks(third, DAY3)["hash_join_classification.no_key_held_by_reject"][0] is True


def test_a_range_of_full_loads_in_one_run_holds_the_key_as_day_by_day(spark, warehouse, tmp_path):
    _land(tmp_path, DAY1, HEADER + "1,a,10\n2,b,20\n3,c,30\n")
    _land(tmp_path, DAY2, HEADER + "1,a,11\n2,b,oops\n3,c,30\n")
    _land(tmp_path, DAY3, HEADER + "1,a,11\n2,b,25\n")  # key 3 deleted; key 2 updated from its held version
    instance = DagsterInstance.ephemeral()

    result = run_range(definitions_for(_table(tmp_path)), DAY1, DAY3, instance)

    assert result.success
    assert _current(spark, warehouse, DAY2) == {1: ("a", 11, "U", DAY2), 2: ("b", 20, "X", DAY1), 3: ("c", 30, "N", DAY1)}
    assert _current(spark, warehouse, DAY3) == {1: ("a", 11, "N", DAY2), 2: ("b", 25, "U", DAY3)}
    assert [_metadata(instance, "hash_join_classification", day)["held_by_reject"] for day in (DAY2, DAY3)] == [1, 0]
    blocking = {
        (name, day): passed for day in (DAY1, DAY2, DAY3) for name, (passed, severity, _) in _checks(result, day).items()
        if severity == AssetCheckSeverity.ERROR
    }
    assert blocking and all(blocking.values()), blocking


def test_a_full_loads_reject_without_a_key_fails_the_date_unless_quarantine_unkeyed(spark, warehouse, tmp_path):
    _land(tmp_path, DAY1, HEADER + "1,a,10\n2,b,20\n")
    source = _land(tmp_path, DAY2, HEADER + "1,a,10\n2,b,20,extra\n")  # record 2: no key can be read from it
    instance = DagsterInstance.ephemeral()
    [first] = run_dates(definitions_for(_table(tmp_path)), [DAY1], instance)
    assert first.success

    [failed] = run_dates(definitions_for(_table(tmp_path)), [DAY2], instance, raise_on_error=False)

    assert not failed.success
    message = _failure(failed)
    assert "1 bad record(s) whose key cannot be parsed" in message, message
    assert f"{source.name} record 2" in message and "malformed" in message
    assert "quarantine_unkeyed" in message

    [passed] = run_dates(definitions_for(_table(tmp_path, bad_records="quarantine_unkeyed")), [DAY2], instance)

    assert passed.success
    # The unkeyed record's key is unknown: key 2 counts as absent from the snapshot.
    assert {key: value[2] for key, value in _current(spark, warehouse, DAY2).items()} == {1: "N"}
    assert _metadata(instance, "hash_join_classification", DAY2)["held_by_reject"] == 0


def test_a_parquet_double_into_an_int_column_is_rejected_not_a_silent_no_change(spark, warehouse, tmp_path):
    landing = tmp_path / "parquet"
    for day, rows in ((DAY1, [(1, "a", 3.0), (2, "b", 5.0)]), (DAY2, [(1, "a", 3.7), (2, "b", 5.0)])):
        spark.createDataFrame(rows, "id int, name string, score double").coalesce(1).write.parquet(str(landing / day))
    config = write_table_config(
        tmp_path / "configs", TABLE, f"{landing}/{{date}}/", start_date=DAY1, source={"path": f"{landing}/{{date}}/", "format": "parquet"},
        **COLUMNS,
    )
    instance = DagsterInstance.ephemeral()

    first, second = run_dates(definitions_for(config), [DAY1, DAY2], instance)

    assert first.success and second.success
    # 3.7 would have become 3, equal to day 1's 3.0: no change. It is a bad record, and its key is held.
    [reject] = read_stored(spark, partition_dir(warehouse, TABLE, "rejects", DAY2)).collect()
    assert reject["reason"] == "lossy_cast: column score, from double to int: value '3.7'"
    assert _current(spark, warehouse, DAY2) == {1: ("a", 3, "X", DAY1), 2: ("b", 5, "N", DAY1)}
    assert _metadata(instance, "hash_join_classification", DAY2)["held_by_reject"] == 1
