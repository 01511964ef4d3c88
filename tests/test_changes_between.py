"""Changes between two dates: two stored current_table states compared by their hashes."""

from __future__ import annotations

import csv
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from cdc_assets import cli
from cdc_assets.config import TableConfig
from cdc_assets.consumers import changes_between
from cdc_assets.core.hashing import add_hashes

TABLE = "between_demo"
D1, D2, D3 = date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3)
CONFIG = {
    "name": TABLE,
    "start_date": "2024-01-01",
    "load_type": "full",
    "source": {"path": "data/between_demo/{date}.csv"},
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}, {"name": "amount", "type": "decimal(10,2)"}],
    "untracked_columns": [{"name": "note", "type": "string"}],
}

# current_table on three dates: (id, name, amount, note, business_date)
STATES = [
    # 1: updated on D2 and again on D3 (note too): one preimage (D1) and one postimage (D3)
    (1, "ann", "10.00", "a", D1), (1, "ann", "11.00", "b", D2), (1, "ann", "12.00", "c", D3),
    # 2: unchanged throughout
    (2, "bob", "20.00", "a", D1), (2, "bob", "20.00", "a", D2), (2, "bob", "20.00", "a", D3),
    # 3: inserted on D2, deleted on D3: not there on either date, so no change
    (3, "cat", "30.00", "b", D2),
    # 4: only its untracked note changes: no change
    (4, "dan", "40.00", "a", D1), (4, "dan", "40.00", "b", D2), (4, "dan", "40.00", "c", D3),
    # 5: deleted on D3
    (5, "eve", "50.00", "a", D1), (5, "eve", "50.00", "a", D2),
    # 6: inserted on D3
    (6, "fay", "60.00", "c", D3),
    # 7: NULL name gets a value
    (7, None, "70.00", "a", D1), (7, None, "70.00", "a", D2), (7, "gus", "70.00", "c", D3),
    # 8: both non-keys change
    (8, "hal", "80.00", "a", D1), (8, "hal", "80.00", "a", D2), (8, "hai", "81.00", "c", D3),
]

# From D1 to D3: (id, name, amount, note, _change_type, _from_date, _to_date, changed_columns)
CHANGES_1_TO_3 = [
    (1, "ann", "10.00", "a", "update_preimage", D1, D3, ["amount"]),
    (1, "ann", "12.00", "c", "update_postimage", D1, D3, ["amount"]),
    (5, "eve", "50.00", "a", "delete", D1, D3, []),
    (6, "fay", "60.00", "c", "insert", D1, D3, []),
    (7, None, "70.00", "a", "update_preimage", D1, D3, ["name"]),
    (7, "gus", "70.00", "c", "update_postimage", D1, D3, ["name"]),
    (8, "hal", "80.00", "a", "update_preimage", D1, D3, ["amount", "name"]),
    (8, "hai", "81.00", "c", "update_postimage", D1, D3, ["amount", "name"]),
]


def typed(rows) -> list[tuple]:
    return sorted(((*row[:2], Decimal(row[2]), *row[3:]) for row in rows), key=repr)


@pytest.fixture(scope="module")
def states_warehouse(spark, tmp_path_factory) -> Path:
    """A warehouse holding the table's current_table on D1, D2 and D3, as the pipeline writes it."""
    root = tmp_path_factory.mktemp("between_warehouse")
    config = TableConfig.model_validate(CONFIG)
    frame = spark.createDataFrame(STATES, "id int, name string, amount string, note string, business_date date")
    frame = frame.withColumn("amount", F.col("amount").cast("decimal(10,2)"))
    hashed = add_hashes(frame, [(c.name, c.type) for c in config.keys], [(c.name, c.type) for c in config.non_keys])
    hashed.select(
        *(c.name for c in config.columns), "key_hash", "non_key_hash", F.lit("N").alias("operation"),
        F.col("business_date").alias("eff_start_date"), F.lit("run-1").alias("process_id"), "business_date",
    ).write.partitionBy("business_date").parquet(f"{root}/{TABLE}/current_table")
    return root


def test_changes_from_the_first_to_the_third_date(spark, states_warehouse):
    changes = changes_between(spark, TableConfig.model_validate(CONFIG), "2024-01-01", D3, warehouse=str(states_warehouse))
    assert changes.columns == ["id", "name", "amount", "note", "_change_type", "_from_date", "_to_date", "changed_columns"]
    assert dict(changes.dtypes)["_from_date"] == "date"
    assert dict(changes.dtypes)["changed_columns"] == "array<string>"
    assert sorted((tuple(row) for row in changes.collect()), key=repr) == typed(CHANGES_1_TO_3)


@pytest.mark.parametrize(
    ("from_date", "to_date", "message"),
    [
        ("2024-01-03", "2024-01-01", "from date 2024-01-03 must be before the to date 2024-01-01"),
        ("2024-01-02", "2024-01-02", "from date 2024-01-02 must be before the to date 2024-01-02"),
        ("2024-01-01", "2024-01-05", "no current_table partition for 2024-01-05: stored dates run from 2024-01-01 to 2024-01-03"),
        ("2023-12-31", "2024-01-03", "no current_table partition for 2023-12-31: the date is before the table's start_date"),
        ("2024-01-01", "2024-1-3x", "'2024-1-3x' is not a date"),
    ],
)
def test_dates_that_cannot_be_compared(spark, states_warehouse, from_date, to_date, message):
    with pytest.raises(ValueError, match=message):
        changes_between(spark, TableConfig.model_validate(CONFIG), from_date, to_date, warehouse=str(states_warehouse))


@pytest.fixture()
def configs_folder(tmp_path, monkeypatch, states_warehouse):
    folder = tmp_path / "table_configs"
    folder.mkdir()
    (folder / f"{TABLE}.yaml").write_text(yaml.safe_dump(CONFIG))
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(folder))
    monkeypatch.setenv("CDC_WAREHOUSE", str(states_warehouse))
    return folder


def test_cli_prints_or_writes_csv(spark, configs_folder, tmp_path, capsys):
    assert cli.changes_main([TABLE, "--from", "2024-01-02", "--to", "2024-01-03"]) == 0
    printed = capsys.readouterr().out
    assert "update_postimage" in printed and "[amount, name]" in printed and "cat" in printed  # 3 deleted on D3

    out = tmp_path / "changes_csv"
    assert cli.changes_main([TABLE, "--from", "2024-01-01", "--to", "2024-01-03", "--out", str(out), "--format", "csv"]) == 0
    lines = []
    for part in sorted(out.glob("part-*.csv")):
        with part.open(newline="") as handle:
            lines += list(csv.reader(handle))
    header = ["id", "name", "amount", "note", "_change_type", "_from_date", "_to_date", "changed_columns"]
    rows = sorted(tuple(line) for line in lines if line != header)
    # NULL is an empty field; the list is one comma-separated field (quoted in the file, as it holds a comma).
    want = sorted(tuple("" if value is None else ",".join(value) if isinstance(value, list) else str(value) for value in row)
                  for row in CHANGES_1_TO_3)
    assert rows == want


def test_cli_error_for_dates_in_the_wrong_order(configs_folder, capsys):
    assert cli.changes_main([TABLE, "--from", "2024-01-03", "--to", "2024-01-01"]) == 2
    assert capsys.readouterr().err == "cdc-changes: error: the from date 2024-01-03 must be before the to date 2024-01-01\n"
