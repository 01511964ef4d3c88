"""A reject's key is parsed with the table's own source options, and ``--verify`` fails on what it cannot check
(issue 46, point 3).

A malformed CSV line (one field too many: a name with an unquoted delimiter) keeps the key, the name and
the email in the rejects. The erase splits it into fields with the table's CSV options, finds the key
among them and removes it. A line whose key cannot be told (an unclosed quote makes the whole line one
field) but whose text holds the key's value may be the key's record: it cannot be checked, so the
request is recorded ``incomplete`` and ``--verify`` exits 1, naming its file and why.
"""

from __future__ import annotations

from pathlib import Path

from dagster import DagsterInstance

from cdc_assets.cli.erase import main as erase_main
from cdc_assets.core.capture.erasure import (
    RAW_KEY_HASH,
    erased_keys_for_rejects,
    reject_holds_key,
    reject_may_hold_key,
    reject_separator,
    with_raw_fields,
    with_raw_key_hash,
)
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates, write_table_config

TABLE = "patrons"
DAY = "2024-06-01"
KEY, EMAIL = "987654", "zelda@example.org"
COLUMNS = {
    "keys": [{"name": "patron_id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}, {"name": "email", "type": "string"}, {"name": "points", "type": "int"}],
}


def _files_holding(root: Path, text: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / TABLE).rglob("*") if p.is_file() and text.encode() in p.read_bytes())


def test_a_reject_with_a_field_too_many_is_erased_and_verify_names_one_it_cannot_check(spark, warehouse, tmp_path, monkeypatch, capsys):
    landing = tmp_path / "landing"
    landing.mkdir()
    lines = [
        "patron_id,name,email,points",
        "1001,Ada Lovelace,ada@example.org,10",
        f"{KEY},Zelda,Erasmus,{EMAIL},50",  # one field too many: the unquoted comma in the name
        '"987654 Zelda (no closing quote),x,1',  # the whole line one field: its key cannot be told
    ]
    (landing / f"{DAY}.csv").write_text("\n".join(lines) + "\n")
    # A full load fails a date whose rejects' keys cannot be parsed unless told to set them aside: the lines
    # must be stored for their erase to be tested.
    config = write_table_config(tmp_path / "configs", TABLE, str(landing / "{date}.csv"), start_date=DAY, **COLUMNS,
                                bad_records="quarantine_unkeyed")
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(tmp_path / "configs"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert all(result.success for result in run_dates(definitions_for(config), [DAY], DagsterInstance.ephemeral()))
    storage = WarehouseStorage(str(warehouse))
    assert storage.row_counts(TABLE, "rejects", [DAY]) == {DAY: 2}
    assert _files_holding(warehouse, EMAIL), "the email must be in the stored rejects for its absence to mean anything"
    keys = tmp_path / "erase.csv"
    keys.write_text(f"patron_id\n{KEY}\n")

    # The erase removes the line holding the key, keeps the one it cannot check, and says it is incomplete.
    assert erase_main([TABLE, "--keys", str(keys), "--reason", "GDPR-3"]) == 1
    out = capsys.readouterr().out
    assert "1 reject(s) may hold a key and could not be checked (kept)" in out and "incomplete" in out
    assert _files_holding(warehouse, EMAIL) == []
    assert storage.row_counts(TABLE, "rejects", [DAY]) == {DAY: 1}
    (request,) = storage.erasure_requests(TABLE)
    assert request["status"] == "incomplete" and request["partitions"][f"rejects/{DAY}"] == 1
    (left,) = request["left"]
    assert left.startswith(f"rejects {DAY}: 1 record(s) not checked in a live file ") and "its key cannot be parsed" in left

    assert erase_main([TABLE, "--verify", "--keys", str(keys)]) == 1
    out = capsys.readouterr().out
    (listed,) = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert listed.startswith(f"rejects {DAY}: 1 record(s) in a live file {warehouse}/{TABLE}/rejects/data/") and listed.endswith(".parquet")
    assert "could not be checked (its key cannot be parsed and its text holds an erased key's value)" in out


def test_a_rejected_lines_fields_are_split_with_the_tables_own_csv_options(spark, tmp_path):
    config = write_table_config(tmp_path, "t", "/x/{date}.csv", **COLUMNS, source={"path": "/x/{date}.csv", "format": "csv",
                                "options": {"header": True, "sep": ";", "quote": "'"}})
    columns = [("patron_id", "int")]
    rejects = spark.createDataFrame(
        [
            (f"{KEY};'Zelda; Erasmus';{EMAIL};5;extra",),  # a field too many, a quoted delimiter: the key is a field
            (f"1001;Ada;{KEY}0;5;extra",),  # another key; 9876540 holds the key's text but is not it
            (f"'{KEY};Zelda",),  # unclosed quote: one field holding the key's text
            ('{"patron_id":"987654","points":"x"}',),  # the intake's JSON of a record that failed a cast
        ],
        ["raw_record"],
    )
    parsed = with_raw_fields(with_raw_key_hash(rejects, columns), config)
    keys = erased_keys_for_rejects(spark.createDataFrame([(int(KEY),)], "patron_id int"), columns)
    keys = keys.select(*(keys[name].alias(f"k_{name}") for name in keys.columns))

    def matched(condition) -> list[str]:
        return sorted(row.raw_record for row in parsed.join(keys, on=condition, how="left_semi").collect())

    assert matched(reject_holds_key(columns, "k_")) == sorted([rejects.collect()[0].raw_record, rejects.collect()[3].raw_record])
    assert matched(reject_may_hold_key(columns, "k_", reject_separator(config))) == [f"'{KEY};Zelda"]
    assert parsed.filter(parsed[RAW_KEY_HASH].isNotNull()).count() == 1
