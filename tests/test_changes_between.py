"""Changes between two dates, from history_partition, and the same from two stored current_table states."""

from __future__ import annotations

import csv
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from cdc_assets.cli import read as cli
from cdc_assets.model.config import TableConfig
from cdc_assets.usecases.readers import changes_between
from cdc_assets.core.views.between import changes_between_states
from cdc_assets.core.hashing import add_hashes
from resources.storage import WarehouseStorage
from tests.pipeline import partition_dir, read_stored

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
    # 4: only its untracked note changes: no change (and not in history)
    (4, "dan", "40.00", "a", D1), (4, "dan", "40.00", "b", D2), (4, "dan", "40.00", "c", D3),
    # 5: deleted on D3
    (5, "eve", "50.00", "a", D1), (5, "eve", "50.00", "a", D2),
    # 6: inserted on D3
    (6, "fay", "60.00", "c", D3),
    # 7: NULL name gets a value
    (7, None, "70.00", "a", D1), (7, None, "70.00", "a", D2), (7, "gus", "70.00", "c", D3),
    # 8: both non-keys change
    (8, "hal", "80.00", "a", D1), (8, "hal", "80.00", "a", D2), (8, "hai", "81.00", "c", D3),
    # 9: deleted on D2, re-inserted on D3 with another amount: an update from D1 to D3
    (9, "ivy", "90.00", "a", D1), (9, "ivy", "99.00", "c", D3),
    # 10: deleted on D2, re-inserted on D3 as it was (only its note differs): no change from D1 to D3
    (10, "jo", "100.00", "a", D1), (10, "jo", "100.00", "c", D3),
]

# history_partition of the same dates, as the pipeline writes it: (id, name, amount, note, operation, business_date);
# a D row carries the payload the key had the day before.
HISTORY = [
    (1, "ann", "10.00", "a", "I", D1), (1, "ann", "11.00", "b", "U", D2), (1, "ann", "12.00", "c", "U", D3),
    (2, "bob", "20.00", "a", "I", D1),
    (3, "cat", "30.00", "b", "I", D2), (3, "cat", "30.00", "b", "D", D3),
    (4, "dan", "40.00", "a", "I", D1),
    (5, "eve", "50.00", "a", "I", D1), (5, "eve", "50.00", "a", "D", D3),
    (6, "fay", "60.00", "c", "I", D3),
    (7, None, "70.00", "a", "I", D1), (7, "gus", "70.00", "c", "U", D3),
    (8, "hal", "80.00", "a", "I", D1), (8, "hai", "81.00", "c", "U", D3),
    (9, "ivy", "90.00", "a", "I", D1), (9, "ivy", "90.00", "a", "D", D2), (9, "ivy", "99.00", "c", "I", D3),
    (10, "jo", "100.00", "a", "I", D1), (10, "jo", "100.00", "a", "D", D2), (10, "jo", "100.00", "c", "I", D3),
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
    (9, "ivy", "90.00", "a", "update_preimage", D1, D3, ["amount"]),
    (9, "ivy", "99.00", "c", "update_postimage", D1, D3, ["amount"]),
]


def typed(rows) -> list[tuple]:
    return sorted(((*row[:2], Decimal(row[2]), *row[3:]) for row in rows), key=repr)


def rows_of(frame) -> list[tuple]:
    return sorted((tuple(row) for row in frame.collect()), key=repr)


def _write(spark, config: TableConfig, rows, schema: str, root: Path, asset: str) -> None:
    """``rows`` hashed and stored as the pipeline stores an asset's dates D1, D2 and D3."""
    frame = spark.createDataFrame(rows, schema).withColumn("amount", F.col("amount").cast("decimal(10,2)"))
    hashed = add_hashes(frame, [(c.name, c.type) for c in config.keys], [(c.name, c.type) for c in config.non_keys])
    operation = F.col("operation") if "operation" in frame.columns else F.lit("N")
    stored = hashed.select(
        *(c.name for c in config.columns), "key_hash", "non_key_hash", operation.alias("operation"),
        F.col("business_date").alias("eff_start_date"), F.lit("run-1").alias("process_id"), "business_date",
    )
    storage = WarehouseStorage(str(root))
    try:
        storage.write(stored, TABLE, asset, [day.isoformat() for day in (D1, D2, D3)])
    finally:
        storage.release()


@pytest.fixture(scope="module")
def states_warehouse(spark, tmp_path_factory) -> Path:
    """A warehouse holding the table's current_table and history_partition on D1, D2 and D3."""
    root = tmp_path_factory.mktemp("between_warehouse")
    config = TableConfig.model_validate(CONFIG)
    columns = "id int, name string, amount string, note string"
    _write(spark, config, STATES, f"{columns}, business_date date", root, "current_table")
    _write(spark, config, HISTORY, f"{columns}, operation string, business_date date", root, "history_partition")
    return root


def test_changes_from_the_first_to_the_third_date(spark, states_warehouse):
    changes = changes_between(spark, TableConfig.model_validate(CONFIG), "2024-01-01", D3, warehouse=str(states_warehouse))
    assert changes.columns == ["id", "name", "amount", "note", "_change_type", "_from_date", "_to_date", "changed_columns"]
    assert dict(changes.dtypes)["_from_date"] == "date"
    assert dict(changes.dtypes)["changed_columns"] == "array<string>"
    assert rows_of(changes) == typed(CHANGES_1_TO_3)


@pytest.mark.parametrize(("from_date", "to_date"), [(D1, D2), (D1, D3), (D2, D3)])
def test_history_gives_what_comparing_the_two_current_states_gives(spark, states_warehouse, from_date, to_date):
    config = TableConfig.model_validate(CONFIG)
    before, after = (read_stored(spark, partition_dir(states_warehouse, TABLE, "current_table", day.isoformat())) for day in (from_date, to_date))
    from_states = changes_between_states(before, after, config, from_date, to_date)
    from_history = changes_between(spark, config, from_date, to_date, warehouse=str(states_warehouse))
    expected = rows_of(from_states)
    assert expected  # every pair of dates has changes
    assert rows_of(from_history) == expected


@pytest.mark.parametrize(
    ("from_date", "to_date", "message"),
    [
        ("2024-01-03", "2024-01-01", "the from date 2024-01-03 must be before the to date 2024-01-01"),
        ("2024-01-02", "2024-01-02", "the from date 2024-01-02 must be before the to date 2024-01-02"),
        ("2024-01-01", "2024-01-05",
         f"{TABLE} has no history_partition for 2024-01-05: stored dates run from 2024-01-01 to 2024-01-03"),
        ("2023-12-31", "2024-01-03",
         f"{TABLE} has no history_partition for 2023-12-31: the date is before the table's start_date 2024-01-01"),
        ("2024-01-01", "2024-1-3x", "'2024-1-3x' is not a date (expected YYYY-MM-DD)"),
    ],
)
def test_dates_that_cannot_be_compared(spark, states_warehouse, from_date, to_date, message):
    with pytest.raises(ValueError) as error:
        changes_between(spark, TableConfig.model_validate(CONFIG), from_date, to_date, warehouse=str(states_warehouse))
    assert str(error.value) == message


def test_a_history_date_missing_in_between_is_an_error(spark, tmp_path):
    storage = WarehouseStorage(str(tmp_path))
    try:  # D1 and D3 stored (without rows), D2 not
        storage.write(spark.createDataFrame([], "key_hash string, operation string, business_date date"), TABLE,
                      "history_partition", [D1.isoformat(), D3.isoformat()])
    finally:
        storage.release()
    with pytest.raises(ValueError) as error:
        changes_between(spark, TableConfig.model_validate(CONFIG), D1, D3, warehouse=str(tmp_path))
    assert str(error.value) == (
        f"{TABLE} has no history_partition for {D2}, between its first stored date {D1} and {D3}: "
        "materialize it first"
    )


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
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert cells[0] == ["id", "name", "amount", "note", "_change_type", "_from_date", "_to_date", "changed_columns"]
    # Ordered by key, an update's preimage first; NULL and the list as show() prints them.
    assert [tuple(row[:5]) + (row[7],) for row in cells[1:]] == [
        ("1", "ann", "11.00", "b", "update_preimage", "[amount]"),
        ("1", "ann", "12.00", "c", "update_postimage", "[amount]"),
        ("3", "cat", "30.00", "b", "delete", "[]"),
        ("5", "eve", "50.00", "a", "delete", "[]"),
        ("6", "fay", "60.00", "c", "insert", "[]"),
        ("7", "NULL", "70.00", "a", "update_preimage", "[name]"),
        ("7", "gus", "70.00", "c", "update_postimage", "[name]"),
        ("8", "hal", "80.00", "a", "update_preimage", "[amount, name]"),
        ("8", "hai", "81.00", "c", "update_postimage", "[amount, name]"),
        ("9", "ivy", "99.00", "c", "insert", "[]"),
        ("10", "jo", "100.00", "c", "insert", "[]"),
    ]
    assert {(row[5], row[6]) for row in cells[1:]} == {("2024-01-02", "2024-01-03")}

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
