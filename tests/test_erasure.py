"""Erasing a key everywhere (cdc-erase, the erase job) through real Dagster runs on a change set.

One warehouse carries the story: a key with updates, a rejected record and a late record is erased by
the table's erase job; then verified gone from every stored file; an extract that brings it back is set
aside (erased_keys: drop), also when an old date is re-run; and taken in under erased_keys: keep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance, EventRecordsFilter

from cdc_assets.core.capture.erasure import RAW_KEY_HASH, KeysFileError, erased_key_hashes, with_raw_key_hash
from cdc_assets.usecases.erasure import read_keys_file, verify_erased
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates, run_range, write_table_config

TABLE = "people"
KEY = "987654"
NAME = "Zelda Erasmus"  # the erased key's personal data, looked for byte by byte in every stored file
HEADER = "op,account_id,owner,balance,status,changed_at"
EXTRACTS = {
    "2024-02-01": ["I,1001,Ada Lovelace,120.00,open,2024-02-01 08:00:00", f"I,{KEY},{NAME},50.00,open,2024-02-01 08:05:00",
                   "I,1003,Grace Hopper,300.00,open,2024-02-01 08:10:00"],
    "2024-02-02": [f"U,{KEY},{NAME},60.00,open,2024-02-02 09:00:00", "U,1001,Ada Lovelace,125.00,open,2024-02-02 09:30:00",
                   f"U,{KEY},{NAME},not-a-number,open,2024-02-02 10:00:00",  # rejected: its key parses
                   "U,1003,Grace Hopper,1.00"],  # malformed, of another key: its fields hold no erased key's value
    "2024-02-03": [f"U,{KEY},{NAME},55.00,open,2024-02-02 08:00:00",  # older than what 02-02 applied: late
                   "U,1003,Grace Hopper,310.00,open,2024-02-03 09:00:00"],
    "2024-02-04": [f"U,{KEY},{NAME},70.00,open,2024-02-04 09:00:00", "I,1005,Alan Turing,10.00,open,2024-02-04 09:10:00"],
    "2024-02-05": [f"I,{KEY},{NAME},80.00,open,2024-02-05 09:00:00"],
}
COLUMNS = {
    "keys": [{"name": "account_id", "type": "int"}],
    "non_keys": [{"name": "owner", "type": "string"}, {"name": "balance", "type": "decimal(12,2)"}, {"name": "status", "type": "string"}],
    "untracked_columns": [{"name": "changed_at", "type": "timestamp"}],
    "changes": {"operation_column": "op", "insert_values": ["I"], "update_values": ["U"], "delete_values": ["D"],
                "sequence_columns": ["changed_at"]},
}


def _config(tmp_path: Path, **fields):
    # Stored per date: which dates hold a key is each date's partition. An incremental state's erase (its
    # data files, every tag) is tests/test_erasure_incremental.py's.
    return write_table_config(
        tmp_path / "configs", TABLE, str(tmp_path / "landing" / "{date}.csv"), load_type="changeset", start_date="2024-02-01",
        **COLUMNS, **{"storage": {"current": "snapshot"}, **fields},
    )


def _files_holding(root: Path, text: str) -> list[str]:
    """Every file under the table's folder (data, Iceberg metadata, the ledger) whose bytes hold ``text``."""
    return sorted(str(path.relative_to(root)) for path in (root / TABLE).rglob("*") if path.is_file() and text.encode() in path.read_bytes())


def _latest_checks(instance: DagsterInstance) -> dict[tuple[str, str, str], tuple[bool, str]]:
    """(asset, check, date) -> (passed, severity) of each check's latest evaluation, in a run or reported."""
    records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ASSET_CHECK_EVALUATION), ascending=True)
    latest = {}
    for record in records:
        check = record.event_log_entry.dagster_event.event_specific_data
        latest[(check.asset_key.path[-1], check.check_name, check.partition)] = (check.passed, check.severity.value)
    return latest


def _land(tmp_path: Path, day: str) -> None:
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    (landing / f"{day}.csv").write_text("\n".join([HEADER, *EXTRACTS[day]]) + "\n")


def _materialization(instance: DagsterInstance, asset: str, day: str) -> dict:
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey([TABLE, asset]), asset_partitions=[day]), limit=1).records
    return {name: value.value for name, value in records[0].asset_materialization.metadata.items()}


def _keys_file(tmp_path: Path) -> str:
    path = tmp_path / "erase.csv"
    path.write_text(f"account_id\n{KEY}\n")
    return str(path)


def test_an_erased_key_is_gone_from_every_file_stays_out_and_the_checks_stay_true(spark, warehouse, tmp_path, monkeypatch):
    config = _config(tmp_path)
    defs, instance = definitions_for(config), DagsterInstance.ephemeral()
    days = ["2024-02-01", "2024-02-02", "2024-02-03"]
    for day in days:
        _land(tmp_path, day)
    run_dates(defs, days, instance)
    storage = WarehouseStorage(str(warehouse))
    keys = _keys_file(tmp_path)
    before = verify_erased(spark, storage, config, keys)
    held = {(asset, day) for asset, day, _, current, _ in before.holding if current}
    # The key is everywhere a key can be: its records, its classification, its state, its reject and its late record.
    assert {("hashed_incoming", "2024-02-02"), ("rejects", "2024-02-02"), ("late_changes", "2024-02-03"),
            ("current_table", "2024-02-03"), ("applied_sequences", "2024-02-03"), ("history_partition", "2024-02-01"),
            ("hash_join_classification", "2024-02-02"), ("updates", "2024-02-02")} <= held
    assert _files_holding(warehouse, NAME), "the name must be findable in the stored bytes for its absence to mean anything"
    key_hash = read_keys_file(spark, config, keys).first()[0]
    assert _files_holding(warehouse, key_hash)
    # Only data files hold them: the tables' metadata keeps no stored value (manifests: counts, no min/max
    # bounds), so an erase need not reach it.
    assert [path for path in _files_holding(warehouse, NAME) + _files_holding(warehouse, key_hash) if "/data/" not in path] == []

    erased = defs.get_job_def(f"{TABLE}_erase").execute_in_process(
        run_config={"ops": {f"{TABLE}__erase": {"config": {"keys_file": keys, "reason": "ticket GDPR-17"}}}}, instance=instance
    )
    assert erased.success
    after = verify_erased(spark, storage, config, keys)
    assert after.holding == []
    # The files of the snapshots the erase replaced are gone: no file holds the name, nor the key's hash
    # but the ledger's record of what it erased.
    assert _files_holding(warehouse, NAME) == []
    assert [path for path in _files_holding(warehouse, key_hash) if not path.startswith(f"{TABLE}/_erasures/")] == []
    # The malformed line is checked (its fields hold no erased key's value), and kept.
    assert after.unverifiable_rejects == {} and after.unchecked == [] and after.passed
    assert storage.row_counts(TABLE, "rejects", ["2024-02-02"]) == {"2024-02-02": 1}

    ledger = storage.erasure_requests(TABLE)
    assert len(ledger) == 1 and ledger[0]["status"] == "complete" and ledger[0]["reason"] == "ticket GDPR-17"
    assert ledger[0]["keys"] == 1 and ledger[0]["requested_by"] == f"run {erased.run_id}"
    assert set(ledger[0]["partitions"]) == {f"{asset}/{day}" for asset, day in held}
    recorded = (warehouse / TABLE / "_erasures").rglob("*")
    assert not [path for path in recorded if path.is_file() and (KEY.encode() in path.read_bytes() or NAME.encode() in path.read_bytes())]

    # The UI shows the erase as materializations of what it rewrote, and the dates' checks, evaluated again, pass.
    incoming = _materialization(instance, "hashed_incoming", "2024-02-02")
    assert incoming["erased_rows"] == 1 and incoming["rows_read"] == 2 and "preview" not in incoming
    assert _materialization(instance, "rejects", "2024-02-02")["erased_rows"] == 1
    assert _materialization(instance, "late_changes", "2024-02-03")["erased_rows"] == 1
    checks = _latest_checks(instance)
    for day in days:
        failed = [key for key, (passed, _) in checks.items() if key[2] == day and not passed]
        assert failed == [], f"{day}: {failed}"

    # A later extract brings the key back: set aside (counted, not stored), and the warning check says so.
    _land(tmp_path, "2024-02-04")
    run_dates(defs, ["2024-02-04"], instance)
    assert verify_erased(spark, storage, config, keys).holding == []
    figures = _materialization(instance, "hashed_incoming", "2024-02-04")
    assert figures["erased_keys_in_extract"] == 1 and figures["erased_records_set_aside"] == 1 and figures["rows_read"] == 2
    checks = _latest_checks(instance)
    assert checks[("hashed_incoming", "no_erased_keys_in_extract", "2024-02-04")] == (False, "WARN")
    assert all(passed for (_, name, day), (passed, _) in checks.items() if day == "2024-02-04" and name != "no_erased_keys_in_extract")

    # A re-run of an old date (with the later dates, computed from it) re-reads its extract, which still
    # holds the key: it stays out.
    assert run_range(defs, "2024-02-02", "2024-02-04", instance).success
    assert verify_erased(spark, storage, config, keys).holding == []
    assert _materialization(instance, "hashed_incoming", "2024-02-02")["erased_records_set_aside"] == 2

    # erased_keys: keep takes the key back, as the source holds it again; the warning still says so.
    kept = _config(tmp_path, erased_keys="keep")
    _land(tmp_path, "2024-02-05")
    run_dates(definitions_for(kept), ["2024-02-05"], instance)
    back = verify_erased(spark, storage, kept, keys)
    assert ("current_table", "2024-02-05") in {(asset, day) for asset, day, _, _, _ in back.holding}
    assert _latest_checks(instance)[("hashed_incoming", "no_erased_keys_in_extract", "2024-02-05")] == (False, "WARN")


def test_a_keys_file_that_is_not_the_tables_keys_is_refused_naming_the_lines(spark, tmp_path):
    columns = [("store_code", "string"), ("order_id", "int")]
    wrong_header = spark.createDataFrame([("LON", "1")], ["store", "order_id"])
    with pytest.raises(KeysFileError, match=r"keys.csv: .*missing store_code; not a key column: store"):
        erased_key_hashes(wrong_header, columns, "orders", "keys.csv")
    bad_value = spark.createDataFrame([("LON", "1001"), ("PAR", "x12")], ["store_code", "order_id"])
    # The message may reach Dagster's event log (the erase job): it says what is wrong, not the values.
    with pytest.raises(KeysFileError, match=r"1 line\(s\) .*store_code=\(masked\), order_id=\(masked\) \(not a int\).*Nothing was erased") as refused:
        erased_key_hashes(bad_value, columns, "orders", "keys.csv")
    assert "x12" not in str(refused.value) and "PAR" not in str(refused.value)
    blank = spark.createDataFrame([("   ", "1001")], ["store_code", "order_id"])
    with pytest.raises(KeysFileError, match=r"1 line\(s\) .*store_code=\(empty\)"):  # the intake rejects a blank key
        erased_key_hashes(blank, columns, "orders", "keys.csv")
    rows = [(" LON", "1001"), ("LON", "1001"), ("LON", " 1001 "), ("lon", "1001")]
    hashes = erased_key_hashes(spark.createDataFrame(rows, ["ORDER_ID", "store_code"][::-1]), columns, "orders", "k")
    # A string's spaces and case are the key's (as the intake hashes it); a number is cast as the
    # intake casts it (Spark ignores the spaces around it); deduplicated; header in any order and case.
    assert hashes.count() == 3


def test_a_rejects_key_is_parsed_from_its_raw_record_or_counted_unverifiable(spark):
    columns = [("store_code", "string"), ("order_id", "int")]
    rejects = spark.createDataFrame(
        [
            ('{"store_code":"LON","order_id":"1001","amount":"x"}',),  # a record that failed a cast
            ('{"payload":{"after":{"store_code":"LON","order_id":1001}}}',),  # a Debezium event
            ('{"before":{"store_code":"LON","order_id":1001},"after":null}',),  # a Debezium delete, no envelope
            ("LON,1001,alice,2",),  # a malformed CSV line: which field is which is not known
            ('{"store_code":"LON","order_id":"not a number"}',),
        ],
        ["raw_record"],
    )
    parsed = [row[RAW_KEY_HASH] for row in with_raw_key_hash(rejects, columns).collect()]
    expected = erased_key_hashes(spark.createDataFrame([("LON", "1001")], ["store_code", "order_id"]), columns, "t", "k").first()[0]
    assert parsed == [expected, expected, expected, None, None]
