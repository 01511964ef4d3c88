"""An erase matches keys exactly as the intake hashes them: spaces and case are part of a string key,
a key part may hold the hash framing's ``:`` and the CSV delimiter, and ``--verify`` looks for the key
values themselves as well as their hashes (docs/erasure.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from cdc_assets.core.intake.incoming import prepare_incoming_dates
from cdc_assets.core.intake.source import read_source
from cdc_assets.cli.erase import main as erase_main
from cdc_assets.usecases.erasure import read_keys_file
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates, write_table_config

TABLE = "codes"
KEYS = [{"name": "code", "type": "string"}, {"name": "part", "type": "string"}]
NON_KEYS = [{"name": "amount", "type": "decimal(10,2)"}]
DAY1, DAY2 = "2024-05-01", "2024-05-02"
# (code, part) of the keys erased, and of their near twins, which stay. ':' is the hash framing's
# separator (core/hashing.py) and ',' the CSV delimiter: ("a:1", "b,c") and ("a", "1:b,c") would be
# one key to an encoding that joined the parts with ':'.
ERASED = [("C001  ", "x"), (" C002", "x"), ("c001", "x"), ("a:1", "b,c")]
KEPT = [("C001", "x"), ("C002", "x"), ("a", "1:b,c")]
REJECTED = ("C003  ", "x")  # only ever a rejected record: erased from the rejects
# The keys file: the header in another order and case; values unquoted (trailing spaces kept) or quoted.
KEYS_FILE = 'part,CODE\nx,C001  \nx," C002"\nx,c001\nx,C003  \n"b,c",a:1\n'


def _csv_line(code: str, part: str, amount: str) -> str:
    """A CSV line as an extract holds it: a value quoted only when it holds the delimiter (spaces unquoted)."""
    return ",".join(f'"{value}"' if "," in value else value for value in (code, part, amount))


def _stored_keys(spark, storage: WarehouseStorage, asset: str, day: str) -> list[tuple[str, str]]:
    return sorted((row["code"], row["part"]) for row in storage.read(spark, TABLE, asset, [day]).select("code", "part").collect())


def _materialization(instance: DagsterInstance, asset: str, day: str) -> dict:
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey([TABLE, asset]), asset_partitions=[day]), limit=1).records
    return {name: value.value for name, value in records[0].asset_materialization.metadata.items()}


def test_cdc_erase_removes_padded_case_variant_and_composite_keys_exactly_and_verify_looks_for_values(
    spark, warehouse, tmp_path, monkeypatch, capsys
):
    landing = tmp_path / "landing"
    landing.mkdir()
    day1 = [_csv_line(code, part, amount) for (code, part), amount in zip([*ERASED, *KEPT], ["1.00", "2.00", "3.00", "4.00", "5.00", "6.00", "7.00"])]
    (landing / f"{DAY1}.csv").write_text("\n".join(["code,part,amount", *day1, _csv_line(*REJECTED, "oops")]) + "\n")
    config = write_table_config(
        tmp_path / "configs", TABLE, str(landing / "{date}.csv"), load_type="delta", start_date=DAY1, keys=KEYS, non_keys=NON_KEYS
    )
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(tmp_path / "configs"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    defs, instance = definitions_for(config), DagsterInstance.ephemeral()
    assert all(result.success for result in run_dates(defs, [DAY1], instance))
    storage = WarehouseStorage(str(warehouse))
    assert _stored_keys(spark, storage, "current_table", DAY1) == sorted([*ERASED, *KEPT])  # stored as read
    keys = tmp_path / "erase.csv"
    keys.write_text(KEYS_FILE)

    assert erase_main([TABLE, "--keys", str(keys), "--reason", "ticket 1"]) == 0
    capsys.readouterr()
    for asset in ("current_table", "hashed_incoming", "inserts", "history_partition"):
        assert _stored_keys(spark, storage, asset, DAY1) == sorted(KEPT), asset
    assert storage.row_counts(TABLE, "rejects", [DAY1]).get(DAY1, 0) == 0
    (request,) = storage.erasure_requests(TABLE)
    assert request["keys"] == 5 and request["partitions"]["current_table/" + DAY1] == 4
    assert request["partitions"]["rejects/" + DAY1] == 1
    assert erase_main([TABLE, "--verify", "--keys", str(keys)]) == 0
    assert "0 stored files hold the keys" in capsys.readouterr().out

    # A row that holds an erased key under another key_hash (written by other code, here planted in
    # the table's data folder, where no snapshot reads it) is found by its key values, and --verify
    # fails naming its file.
    planted = Path(storage.partition_path(TABLE, "current_table", DAY1)) / "planted"
    spark.createDataFrame([("0" * 32, "c001", "x")], "key_hash string, code string, part string").coalesce(1).write.parquet(str(planted))
    (planted_file,) = planted.glob("*.parquet")
    assert erase_main([TABLE, "--verify", "--keys", str(keys)]) == 1
    out = capsys.readouterr().out
    assert f"current_table {DAY1}: 1 row(s) in a replaced file {planted_file}" in out
    assert "1 of them found by key value only" in out and "does not remove them" in out
    shutil.rmtree(planted)

    # A later extract with the padded key: set aside (erased_keys: drop); its trimmed twin is taken.
    (landing / f"{DAY2}.csv").write_text("code,part,amount\nC001  ,x,9.00\nC001,x,10.00\n")
    assert all(result.success for result in run_dates(defs, [DAY2], instance))
    figures = _materialization(instance, "hashed_incoming", DAY2)
    assert figures["rows_read"] == 2 and figures["erased_records_set_aside"] == 1 and figures["rows_accepted"] == 1
    assert _stored_keys(spark, storage, "hashed_incoming", DAY2) == [("C001", "x")]
    assert _stored_keys(spark, storage, "current_table", DAY2) == sorted(KEPT)
    assert erase_main([TABLE, "--verify", "--keys", str(keys)]) == 0


def _intake_hashes(spark, config, day: str) -> set[str]:
    prepared = prepare_incoming_dates(config, {day: read_source(spark, config, day)})
    try:
        return {row["key_hash"] for row in prepared.accepted.select("key_hash").collect()}
    finally:
        prepared.release()


def _keys_file_hashes(spark, config, tmp_path: Path) -> set[str]:
    keys = tmp_path / f"keys-{config.name}.csv"
    keys.write_text('code,part\nC001  ,x\n C002,x\nc001,x\n"a:1","b,c"\n')
    return {row["key_hash"] for row in read_keys_file(spark, config, str(keys)).collect()}


def _debezium_event(code: str, part: str, lsn: int) -> str:
    return json.dumps({"op": "c", "before": None, "after": {"code": code, "part": part, "amount": "1.00"}, "source": {"lsn": lsn}})


def test_the_keys_file_hashes_a_key_as_the_intake_of_each_source_format_does(spark, tmp_path):
    """For CSV as read by default, CSV whose table trims whitespace, and Debezium events,
    the keys file's hashes of the same keys are the ones the intake stores (and no other)."""
    day = "2024-05-01"
    padded = [("C001  ", "x"), (" C002", "x"), ("c001", "x"), ("a:1", "b,c")]
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / f"{day}.csv").write_text("code,part,amount\n" + "".join(_csv_line(c, p, "1.00") + "\n" for c, p in padded))
    (tmp_path / "dbz").mkdir()
    (tmp_path / "dbz" / f"{day}.jsonl").write_text("".join(_debezium_event(c, p, n) + "\n" for n, (c, p) in enumerate(padded, 1)))
    common = {"load_type": "delta", "start_date": day, "keys": KEYS, "non_keys": NON_KEYS}
    configs = {
        "csv": write_table_config(tmp_path / "c", "t_csv", str(tmp_path / "csv" / "{date}.csv"), **common),
        "debezium": write_table_config(
            tmp_path / "c", "t_dbz", "unused", **{**common, "load_type": "changeset"},
            source={"path": str(tmp_path / "dbz" / "{date}.jsonl"), "format": "debezium"}, changes={"sequence_columns": ["source.lsn"]},
        ),
    }
    for name, config in configs.items():
        stored = _intake_hashes(spark, config, day)
        assert len(stored) == 4 and _keys_file_hashes(spark, config, tmp_path) == stored, name

    # A CSV table that trims whitespace never sees it: the keys file is read with the same trimming.
    trimming = write_table_config(
        tmp_path / "c", "t_trim", "unused", **common,
        source={"path": str(tmp_path / "csv" / "{date}.csv"), "format": "csv",
                "options": {"header": True, "ignoreLeadingWhiteSpace": True, "ignoreTrailingWhiteSpace": True}},
    )
    stored = _intake_hashes(spark, trimming, day)
    assert stored != _intake_hashes(spark, configs["csv"], day)
    assert _keys_file_hashes(spark, trimming, tmp_path) == stored
