"""The SCD type 2 view: hand-written history, rows written out by hand, Spark and DuckDB alike."""

from __future__ import annotations

import csv
from datetime import date
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
import yaml
from pyspark.sql import functions as F

from cdc_assets.cli import read as cli
from cdc_assets.model.config import TableConfig
from cdc_assets.usecases.readers import scd2_duckdb_sql, scd2_view
from cdc_assets.core.hashing import add_hashes
from cdc_assets.core.views.scd2 import scd2_sql
from resources.storage import WarehouseStorage

TABLE = "scd2_demo"
D1, D2, D3, D4 = date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3), date(2024, 1, 4)
HIGH_DATE = date(9999, 12, 31)
OPEN = "open"  # stands for valid_to of an open version in the rows below: NULL or HIGH_DATE

CONFIG = {
    "name": TABLE,
    "start_date": "2024-01-01",
    "load_type": "changeset",
    "source": {"path": "data/scd2_demo/{date}.csv"},
    "changes": {"operation_column": "flag", "sequence_columns": ["seq"]},
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}, {"name": "amount", "type": "decimal(10,2)"}],
    "untracked_columns": [{"name": "note", "type": "string"}, {"name": "seq", "type": "int"}],
}

# history_partition of a change set (it has both deletes and keys not supplied), one row per change:
#   D1  keys 1, 2, 3 inserted
#   D2  1 updated, 2 deleted                 (3 unchanged: N, not in history)
#   D3  2 inserted again                     (1 and 3 not supplied: X, not in history)
#   D4  3 updated, 1 deleted
# (id, name, amount, note, seq, operation, business_date)
HISTORY = [
    (1, "ann", "10.00", "n1", 1, "I", D1),
    (2, "bob", "20.00", "n1", 1, "I", D1),
    (3, "cy", "30.00", "n1", 1, "I", D1),
    (1, "ann", "11.00", "n2", 2, "U", D2),
    (2, "bob", "20.00", "n1", 1, "D", D2),
    (2, "bob", "21.00", "n3", 3, "I", D3),
    (3, "cyd", "30.00", "n4", 4, "U", D4),
    (1, "ann", "11.00", "n2", 2, "D", D4),
]

# As of D4: (id, name, amount, note, seq, valid_from, valid_to, is_current)
VERSIONS_D4 = [
    (1, "ann", "10.00", "n1", 1, D1, D2, False),
    (1, "ann", "11.00", "n2", 2, D2, D4, False),  # closed by its delete
    (2, "bob", "20.00", "n1", 1, D1, D2, False),
    (2, "bob", "21.00", "n3", 3, D3, OPEN, True),  # the key's return
    (3, "cy", "30.00", "n1", 1, D1, D4, False),  # N on D2 and X on D3 did not close it
    (3, "cyd", "30.00", "n4", 4, D4, OPEN, True),
]
# hard_deletes new_record adds a row per delete, open until the key returns.
DELETIONS_D4 = [
    (2, "bob", "20.00", "n1", 1, D2, D3, False),
    (1, "ann", "11.00", "n2", 2, D4, OPEN, True),
]
# As of D2 nothing after D2 is seen: 1's second version and 3's first are open.
VERSIONS_D2 = [
    (1, "ann", "10.00", "n1", 1, D1, D2, False),
    (1, "ann", "11.00", "n2", 2, D2, OPEN, True),
    (2, "bob", "20.00", "n1", 1, D1, D2, False),
    (3, "cy", "30.00", "n1", 1, D1, OPEN, True),
]
DELETIONS_D2 = [(2, "bob", "20.00", "n1", 1, D2, OPEN, True)]
# As of D3 with new_record: the deletion row of 2 is closed by its return on D3.
VERSIONS_D3 = [
    (1, "ann", "10.00", "n1", 1, D1, D2, False),
    (1, "ann", "11.00", "n2", 2, D2, OPEN, True),
    (2, "bob", "20.00", "n1", 1, D1, D2, False),
    (2, "bob", "21.00", "n3", 3, D3, OPEN, True),
    (3, "cy", "30.00", "n1", 1, D1, OPEN, True),
]
DELETIONS_D3 = [(2, "bob", "20.00", "n1", 1, D2, D3, False)]


def table_config(open_end: date | None = None, hard_deletes: str = "invalidate") -> TableConfig:
    return TableConfig.model_validate({**CONFIG, "scd2": {"open_end": open_end, "hard_deletes": hard_deletes}})


def expected(versions, deletions, open_end: date | None, hard_deletes: str) -> list[tuple]:
    """The rows as the view returns them: OPEN resolved, decimals typed, is_deleted with new_record."""

    def row(values, deleted):
        *payload, valid_from, valid_to, is_current = values
        payload[2] = Decimal(payload[2])
        resolved = [*payload, valid_from, open_end if valid_to == OPEN else valid_to, is_current]
        return tuple(resolved + [deleted]) if hard_deletes == "new_record" else tuple(resolved)

    rows = [row(values, False) for values in versions]
    if hard_deletes == "new_record":
        rows += [row(values, True) for values in deletions]
    return sorted(rows, key=repr)


def write_history(spark, root: Path) -> None:
    """The table's four history dates, as the pipeline stores them, in the warehouse under ``root``.

    D1 is written before the audit columns existed (no process_id, processed_at, changed_columns), as
    in a warehouse that predates them: both readers must take dates of either shape.
    """
    config = table_config()
    frame = spark.createDataFrame(
        HISTORY, "id int, name string, amount string, note string, seq int, operation string, business_date date"
    ).withColumn("amount", F.col("amount").cast("decimal(10,2)"))
    hashed = add_hashes(frame, [(c.name, c.type) for c in config.keys], [(c.name, c.type) for c in config.non_keys])
    history = hashed.select(
        *(c.name for c in config.columns), "key_hash", "non_key_hash", "operation",
        F.col("business_date").alias("eff_start_date"), "business_date",
    )
    storage = WarehouseStorage(str(root))
    try:
        storage.write(history.filter(F.col("business_date") == D1), TABLE, "history_partition", [D1.isoformat()])
        later = history.filter(F.col("business_date") > D1).withColumns(
            {
                "process_id": F.lit("run-1"),
                "processed_at": F.current_timestamp(),
                "changed_columns": F.array().cast("array<string>"),
            }
        )
        storage.write(later, TABLE, "history_partition", [day.isoformat() for day in (D2, D3, D4)])
    finally:
        storage.release()


@pytest.fixture(scope="module")
def history_warehouse(spark, tmp_path_factory) -> Path:
    """A warehouse holding the table's four history dates (:func:`write_history`)."""
    root = tmp_path_factory.mktemp("scd2_warehouse")
    write_history(spark, root)
    return root


def spark_rows(frame) -> list[tuple]:
    return sorted((tuple(row) for row in frame.collect()), key=repr)


def duckdb_rows(sql: str) -> list[tuple]:
    return sorted(duckdb.sql(sql).fetchall(), key=repr)


@pytest.mark.parametrize("hard_deletes", ["invalidate", "new_record"])
@pytest.mark.parametrize("open_end", [None, HIGH_DATE])
def test_four_day_chain_in_spark_and_duckdb(spark, history_warehouse, open_end, hard_deletes):
    config = table_config(open_end, hard_deletes)
    want = expected(VERSIONS_D4, DELETIONS_D4, open_end, hard_deletes)

    view = scd2_view(spark, config, warehouse=str(history_warehouse))  # as of the newest date, D4
    columns = ["id", "name", "amount", "note", "seq", "valid_from", "valid_to", "is_current"]
    columns += ["is_deleted"] if hard_deletes == "new_record" else []
    assert view.columns == columns
    types = dict(view.dtypes)
    assert (types["valid_from"], types["valid_to"], types["is_current"]) == ("date", "date", "boolean")
    assert spark_rows(view) == want

    sql = scd2_duckdb_sql(config, str(history_warehouse))
    assert duckdb.sql(sql).columns == columns
    assert duckdb_rows(sql) == want


@pytest.mark.parametrize(
    ("as_of", "hard_deletes", "versions", "deletions"),
    [(D2, "invalidate", VERSIONS_D2, DELETIONS_D2), (D3, "new_record", VERSIONS_D3, DELETIONS_D3)],
)
def test_as_of_a_middle_date_ignores_later_history(spark, history_warehouse, as_of, hard_deletes, versions, deletions):
    config = table_config(None, hard_deletes)
    want = expected(versions, deletions, None, hard_deletes)
    assert spark_rows(scd2_view(spark, config, as_of=as_of.isoformat(), warehouse=str(history_warehouse))) == want
    assert duckdb_rows(scd2_duckdb_sql(config, str(history_warehouse), as_of)) == want


def test_both_readers_read_the_snapshot_committed_when_they_start(spark, tmp_path):
    """A date written again leaves the replaced snapshot's files in its data folder until they are expired:
    readers read the table's snapshot, not the folder (a glob of it would read D2's rows twice). A query
    made, or a view built, before a commit reads the snapshot it started at, the commit notwithstanding."""
    config = table_config()
    write_history(spark, tmp_path)
    storage = WarehouseStorage(str(tmp_path))
    try:
        # In the table's column order: D1 made business_date precede the audit columns added after it.
        order = storage.tables.session_for(spark).table(f"lake.{TABLE}.history_partition").columns
        history = storage.read(spark, TABLE, "history_partition", [D2.isoformat()]).select(*order)
        storage.write(history, TABLE, "history_partition", [D2.isoformat()])  # the same rows, new files
        storage.release()
        files = storage.tables.data_file_paths(TABLE, "history_partition")
        assert len(files) > len(storage.tables.live_files(TABLE, "history_partition"))
        want = expected(VERSIONS_D4, DELETIONS_D4, None, "invalidate")
        assert duckdb_rows(scd2_duckdb_sql(config, str(tmp_path))) == want
        assert spark_rows(scd2_view(spark, config, warehouse=str(tmp_path))) == want

        query, view = scd2_duckdb_sql(config, str(tmp_path)), scd2_view(spark, config, warehouse=str(tmp_path))
        emptied = storage.read(spark, TABLE, "history_partition", [D4.isoformat()]).select(*order).limit(0)
        storage.write(emptied, TABLE, "history_partition", [D4.isoformat()])  # D4's changes are gone now
    finally:
        storage.release()
    assert duckdb_rows(query) == spark_rows(view) == want
    # Made after the commit, they read it: D4 changes nothing, so the versions are those of D3.
    assert storage.row_counts(TABLE, "history_partition", [D4.isoformat()]) == {D4.isoformat(): 0}
    after = expected(VERSIONS_D3, DELETIONS_D3, None, "invalidate")
    assert duckdb_rows(scd2_duckdb_sql(config, str(tmp_path))) == after
    assert spark_rows(scd2_view(spark, config, warehouse=str(tmp_path))) == after


def test_the_spark_and_duckdb_renderings_differ_only_in_quoting():
    arguments = (["id", "name"], "history", "2024-01-04", HIGH_DATE, "new_record")
    spark_sql, duckdb_sql = scd2_sql(*arguments, dialect="spark"), scd2_sql(*arguments, dialect="duckdb")
    assert "`id`" in spark_sql and '"id"' in duckdb_sql
    assert spark_sql.replace("`", '"') == duckdb_sql
    assert "DATE '9999-12-31'" in spark_sql and "DATE '2024-01-04'" in spark_sql


def test_as_of_before_the_first_stored_date_and_a_table_without_history(spark, history_warehouse, warehouse):
    with pytest.raises(ValueError, match=r"no history_partition on or before 2023-12-31.*2024-01-01 to 2024-01-04"):
        scd2_view(spark, table_config(), as_of="2023-12-31", warehouse=str(history_warehouse))
    with pytest.raises(ValueError, match="not a date"):
        scd2_view(spark, table_config(), as_of="2024-02-30", warehouse=str(history_warehouse))
    with pytest.raises(ValueError, match=f"{TABLE} has no stored history_partition"):
        scd2_view(spark, table_config())  # the empty warehouse fixture, through CDC_WAREHOUSE


@pytest.fixture()
def configs_folder(tmp_path, monkeypatch, history_warehouse):
    """The table's config in a folder of its own, and the warehouse, as the CLI finds them (environment)."""
    folder = tmp_path / "table_configs"
    folder.mkdir()
    (folder / f"{TABLE}.yaml").write_text(
        yaml.safe_dump({**CONFIG, "scd2": {"open_end": "9999-12-31", "hard_deletes": "new_record"}})
    )
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(folder))
    monkeypatch.setenv("CDC_WAREHOUSE", str(history_warehouse))
    return folder


def test_cli_writes_parquet_and_csv(spark, configs_folder, tmp_path, capsys):
    want = expected(VERSIONS_D4, DELETIONS_D4, HIGH_DATE, "new_record")

    assert cli.scd2_main([TABLE, "--out", str(tmp_path / "scd2_parquet")]) == 0
    assert spark_rows(spark.read.parquet(str(tmp_path / "scd2_parquet"))) == want

    out = tmp_path / "scd2_csv"
    assert cli.scd2_main([TABLE, "--as-of", "2024-01-04", "--out", str(out), "--format", "csv"]) == 0
    lines = []
    for part in sorted(out.glob("part-*.csv")):
        with part.open(newline="") as handle:
            lines += list(csv.reader(handle))
    header = ["id", "name", "amount", "note", "seq", "valid_from", "valid_to", "is_current", "is_deleted"]
    assert lines.count(header) == len(list(out.glob("part-*.csv")))
    as_text = sorted(tuple(str(value).lower() if isinstance(value, bool) else str(value) for value in row) for row in want)
    assert sorted(tuple(line) for line in lines if line != header) == as_text
    assert f"wrote csv to {out}" in capsys.readouterr().out


def test_cli_errors_are_one_line_and_exit_2(configs_folder, tmp_path, capsys):
    assert cli.scd2_main(["no_such_table", "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "unknown table 'no_such_table'" in error and TABLE in error

    assert cli.scd2_main([TABLE, "--as-of", "2023-12-31", "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("cdc-scd2: error: ") and "on or before 2023-12-31" in error

    assert cli.scd2_main([TABLE]) == 2  # --out is required: argparse's usage error
    assert "--out" in capsys.readouterr().err
