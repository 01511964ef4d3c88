"""The erase ledger's durability: key hashes synced before the record names them, and a torn ledger
(a key hash file missing, cut short or altered, a record that cannot be read) an error that names the
request and its repair, which ``cdc-erase`` with the same keys file then makes (docs/erasure.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from cdc_assets.cli.erase import main as erase_main
from resources.storage import TornLedgerError, WarehouseStorage
from resources.storage.erasure import KEY_HASH_FILES, KEY_HASHES_FOLDER, REQUEST_FILE, TORN
from tests.pipeline import definitions_for, run_dates, write_table_config

TABLE = "ledgered"
DAY1, DAY2 = "2024-06-01", "2024-06-02"


def _request(spark, storage: WarehouseStorage, table: str, record: dict | None = None) -> Path:
    hashes = spark.createDataFrame([("a" * 32,), ("b" * 32,)], "key_hash string")
    try:
        request_id = storage.start_erasure(hashes, table, "f" * 32, record or {"status": "erasing", "fingerprint": "f" * 32})
    finally:
        storage.release()
    return Path(storage.layout.erasures_path(table, request_id))


def test_the_key_hashes_reach_the_disk_before_the_request_names_them(spark, warehouse, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(descriptor):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        return real_fsync(descriptor)

    def rename(source, destination):
        events.append(("rename", str(destination)))
        return real_rename(source, destination)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    folder = _request(spark, WarehouseStorage(str(warehouse)), TABLE)
    named = events.index(("rename", f"{folder}/{REQUEST_FILE}"))
    before = events[:named]
    staged = f"{folder}/.{KEY_HASHES_FOLDER}.staged"
    (part,) = [name for name in os.listdir(folder / KEY_HASHES_FOLDER) if name.endswith(".parquet")]
    assert ("fsync", f"{staged}/{part}") in before  # the file's bytes
    assert before.index(("rename", f"{folder}/{KEY_HASHES_FOLDER}")) < max(
        i for i, event in enumerate(before) if event == ("fsync", str(folder))
    )  # the rename that puts them in place
    assert ("fsync", str(folder.parent)) in before  # the request's folder in the ledger


def test_a_torn_ledger_is_told_from_a_whole_one_and_named_with_its_repair(spark, warehouse):
    storage = WarehouseStorage(str(warehouse))
    whole = _request(spark, storage, TABLE)
    (request,) = storage.erasure_requests(TABLE)
    assert TORN not in request and set(request[KEY_HASH_FILES]) == {p.name for p in (whole / KEY_HASHES_FOLDER).glob("*.parquet")}
    assert storage.erased_key_folders(TABLE) == [str(whole / KEY_HASHES_FOLDER)]

    def torn(tear) -> str:
        table = f"torn_{len(list(warehouse.iterdir()))}"
        target = warehouse / table / "_erasures" / whole.name
        shutil.copytree(whole, target)
        tear(target)
        (found,) = storage.erasure_requests(table)
        with pytest.raises(TornLedgerError) as raised:
            storage.erased_key_folders(table)
        message = str(raised.value)
        assert str(target) in message and f"cdc-erase {table} --keys FILE" in message and "remove the request's folder" in message
        return found[TORN]

    def part(folder: Path) -> Path:
        return next((folder / KEY_HASHES_FOLDER).glob("*.parquet"))

    def truncate(folder: Path) -> None:
        data = part(folder).read_bytes()
        part(folder).write_bytes(data[: len(data) // 2])

    def alter(folder: Path) -> None:
        data = bytearray(part(folder).read_bytes())
        data[len(data) // 2] ^= 0xFF
        part(folder).write_bytes(bytes(data))

    def unrecorded(folder: Path) -> None:  # a record an earlier release wrote: no sizes or SHA-256
        record = json.loads((folder / REQUEST_FILE).read_text())
        (folder / REQUEST_FILE).write_text(json.dumps({k: v for k, v in record.items() if k != KEY_HASH_FILES}))
        truncate(folder)

    assert "bytes where" in torn(truncate)
    assert "SHA-256 differs" in torn(alter)
    assert "is missing" in torn(lambda folder: part(folder).unlink())
    assert "key_hashes folder is missing" in torn(lambda folder: shutil.rmtree(folder / KEY_HASHES_FOLDER))
    assert "cannot be read" in torn(lambda folder: (folder / REQUEST_FILE).write_text('{"status": "comp'))
    assert "not a whole Parquet file" in torn(unrecorded)


def _materialization(instance: DagsterInstance, asset: str, day: str) -> dict:
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey([TABLE, asset]), asset_partitions=[day]), limit=1).records
    return {name: value.value for name, value in records[0].asset_materialization.metadata.items()}


def _failure(result) -> tuple[list[str], str]:
    """The class names of a failed run's step error and its causes, and their messages."""
    (event,) = [event for event in result.all_events if event.event_type_value == "STEP_FAILURE"]
    names, messages, error = [], [], event.step_failure_data.error
    while error is not None:
        names.append(error.cls_name)
        messages.append(error.message)
        error = error.cause
    return names, "\n".join(messages)


def test_an_intake_stops_on_a_torn_ledger_naming_it_and_cdc_erase_repairs_it(spark, warehouse, tmp_path, monkeypatch, capsys):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / f"{DAY1}.csv").write_text("id,name\n1,Ada\n2,Bea\n")
    (landing / f"{DAY2}.csv").write_text("id,name\n2,Bea\n3,Cy\n")
    config = write_table_config(
        tmp_path / "configs", TABLE, str(landing / "{date}.csv"), load_type="delta", start_date=DAY1,
        keys=[{"name": "id", "type": "int"}], non_keys=[{"name": "name", "type": "string"}],
    )
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(tmp_path / "configs"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    defs, instance = definitions_for(config), DagsterInstance.ephemeral()
    assert run_dates(defs, [DAY1], instance)[0].success
    keys = tmp_path / "erase.csv"
    keys.write_text("id\n2\n")
    assert erase_main([TABLE, "--keys", str(keys)]) == 0
    storage = WarehouseStorage(str(warehouse))
    (request,) = storage.erasure_requests(TABLE)
    folder = Path(storage.layout.erasures_path(TABLE, request["request_id"]))
    part = next((folder / KEY_HASHES_FOLDER).glob("*.parquet"))
    part.write_bytes(part.read_bytes()[:20])  # what a power loss leaves of a file that never reached the disk

    (failed,) = run_dates(defs, [DAY2], instance, raise_on_error=False)
    assert not failed.success
    names, message = _failure(failed)
    assert "TornLedgerError" in names, names
    assert str(folder) in message and f"cdc-erase {TABLE} --keys FILE" in message
    assert "org.apache.spark" not in message and "Py4J" not in message

    # An erase of other keys is not held up by it, and says that runs of the table are.
    capsys.readouterr()
    other = tmp_path / "other.csv"
    other.write_text("id\n1\n")
    assert erase_main([TABLE, "--keys", str(other)]) == 0
    assert f"cdc-erase: warning: table {TABLE}: the erase ledger's request {folder} is damaged" in capsys.readouterr().err

    assert erase_main([TABLE, "--keys", str(keys)]) == 0
    assert "(resumed)" in capsys.readouterr().out
    repaired, _ = storage.erasure_requests(TABLE)  # oldest first
    assert repaired["request_id"] == request["request_id"] and TORN not in repaired
    assert repaired["status"] == "complete" and len(repaired["repaired_at"]) == 1

    assert run_dates(defs, [DAY2], instance)[0].success
    figures = _materialization(instance, "hashed_incoming", DAY2)
    assert figures["erased_records_set_aside"] == 1 and figures["rows_accepted"] == 1
