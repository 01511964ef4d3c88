"""Issue 12 end to end: a 4-day change set through real Dagster runs, then what consumers read of it.

One backfill run writes the 4 dates (so the runs log gets a row per date), a failed run adds a failed
row, and the stored outputs are read back as an auditor, an analyst (SCD2 view, ``cdc-scd2``) and a
downstream job (``cdc-changes``) would.

The chain (key ``id``; non-keys name, score (double), balance (decimal), joined (date); ``changed_at``
untracked, the sequence):

    day 1  I 1, I 2, I 3 (joined NULL), I 4
    day 2  U 1 score 1.5 -> 2.5 | D 2 | U 3 joined NULL -> 2024-02-03 | I 5 | 4 not supplied (X)
    day 3  U 1 balance 10.00 -> 11.00 | I 2 again (re-insert) | D 5 | U 4 with only changed_at new (N)
    day 4  U 4 joined 2024-01-04 -> 2024-04-04 | 1, 2, 3, 5 not supplied
"""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance

from cdc_assets.cli import read as cli
from cdc_assets.usecases.readers import changes_between, scd2_duckdb_sql, scd2_view
from tests.pipeline import definitions_for, partition_dir, read_stored, run_dates, run_range, write_table_config

D1, D2, D3, D4, D5 = "2024-03-01", "2024-03-02", "2024-03-03", "2024-03-04", "2024-03-05"
HEADER = "op,id,name,score,balance,joined,changed_at"
DAYS = {
    D1: ["I,1,Ann,1.5,10.00,2024-01-01,2024-03-01 08:00:00", "I,2,Bob,2.0,20.00,2024-01-02,2024-03-01 08:00:01",
         "I,3,Cy,3.0,30.00,,2024-03-01 08:00:02", "I,4,Di,4.0,40.00,2024-01-04,2024-03-01 08:00:03"],
    D2: ["U,1,Ann,2.5,10.00,2024-01-01,2024-03-02 08:00:00", "D,2,Bob,2.0,20.00,2024-01-02,2024-03-02 08:00:01",
         "U,3,Cy,3.0,30.00,2024-02-03,2024-03-02 08:00:02", "I,5,Ed,5.0,50.00,2024-01-05,2024-03-02 08:00:03"],
    D3: ["U,1,Ann,2.5,11.00,2024-01-01,2024-03-03 08:00:00", "I,2,Bob,2.0,22.00,2024-01-02,2024-03-03 08:00:01",
         "D,5,Ed,5.0,50.00,2024-01-05,2024-03-03 08:00:03", "U,4,Di,4.0,40.00,2024-01-04,2024-03-03 09:00:00"],
    D4: ["U,4,Di,4.0,40.00,2024-04-04,2024-03-04 08:00:00"],
}
TABLE = "members"
ANN1, ANN2, ANN3 = ("Ann", 1.5, Decimal("10.00")), ("Ann", 2.5, Decimal("10.00")), ("Ann", 2.5, Decimal("11.00"))


def write_members_config(folder: Path, source: Path, **fields):
    return write_table_config(
        folder,
        TABLE,
        f"{source}/{{date}}.csv",
        start_date=D1,
        load_type="changeset",
        keys=[{"name": "id", "type": "int"}],
        non_keys=[
            {"name": "name", "type": "string"},
            {"name": "score", "type": "double"},
            {"name": "balance", "type": "decimal(10,2)"},
            {"name": "joined", "type": "date"},
        ],
        untracked_columns=[{"name": "changed_at", "type": "timestamp"}],
        changes={"operation_column": "op", "sequence_columns": ["changed_at"]},
        **fields,
    )


@pytest.fixture(scope="module")
def chain(spark, tmp_path_factory):
    """The 4 dates in one backfill run, then a run of day 5 that fails (its extract never landed)."""
    root = tmp_path_factory.mktemp("consumers")
    source, warehouse = root / "source", root / "warehouse"
    source.mkdir()
    for day, lines in DAYS.items():
        (source / f"{day}.csv").write_text("\n".join([HEADER, *lines]) + "\n")
    config = write_members_config(root / "configs", source)
    patch = pytest.MonkeyPatch()
    patch.setenv("CDC_WAREHOUSE", str(warehouse))
    patch.setenv("CDC_TABLE_CONFIGS", str(root / "configs"))
    instance = DagsterInstance.ephemeral()
    try:
        backfill = run_range(definitions_for(config), D1, D4, instance)
        assert backfill.success
        (failed,) = run_dates(definitions_for(config), [D5], instance, raise_on_error=False)
        assert not failed.success
        yield {"root": root, "warehouse": warehouse, "config": config, "backfill": backfill, "failed": failed,
               "instance": instance}
    finally:
        patch.undo()


def _read(spark, chain, asset, day):
    return read_stored(spark, partition_dir(chain["warehouse"], TABLE, asset, day))


def _history(spark, chain, day):
    return _read(spark, chain, "history_partition", day)


def test_changed_columns_name_the_non_keys_that_changed(spark, chain):
    def changed(day):
        return {(r["id"], r["operation"]): r["changed_columns"] for r in _history(spark, chain, day).collect()}

    assert changed(D1) == {(1, "I"): [], (2, "I"): [], (3, "I"): [], (4, "I"): []}
    # A double, and NULL -> value on a date; the delete and the insert list nothing.
    assert changed(D2) == {(1, "U"): ["score"], (2, "D"): [], (3, "U"): ["joined"], (5, "I"): []}
    # A decimal; key 4's record changed only changed_at (untracked): N, so it is not in history at all.
    assert changed(D3) == {(1, "U"): ["balance"], (2, "I"): [], (5, "D"): []}
    assert changed(D4) == {(4, "U"): ["joined"]}
    updates = read_stored(spark, partition_dir(chain["warehouse"], TABLE, "updates", D2))
    assert {r["id"]: r["changed_columns"] for r in updates.collect()} == {1: ["score"], 3: ["joined"]}
    current = read_stored(spark, partition_dir(chain["warehouse"], TABLE, "current_table", D3))
    assert "changed_columns" not in current.columns
    assert {r["id"]: r["operation"] for r in current.collect()}[4] == "N"


def test_audit_columns_after_a_backfill(spark, chain):
    run_id = chain["backfill"].run_id
    started = chain["instance"].get_run_record_by_id(run_id).start_time
    for day in (D1, D2, D3, D4):
        for asset in ("current_table", "history_partition"):
            frame = read_stored(spark, partition_dir(chain["warehouse"], TABLE, asset, day))
            stamps = {(r["process_id"], r["processed_at"].timestamp()) for r in frame.collect()}
            assert len(stamps) == 1, (asset, day)
            (process_id, processed_at), = stamps
            assert process_id == run_id and processed_at == pytest.approx(started, abs=1e-3), (asset, day)


def test_runs_log_has_a_row_per_date_of_the_backfill_and_the_failed_run(spark, chain):
    runs = read_stored(spark, chain["warehouse"] / "_runs").orderBy("business_date").collect()
    backfill = [row for row in runs if row["run_id"] == chain["backfill"].run_id]
    assert [row["business_date"].isoformat() for row in backfill] == [D1, D2, D3, D4]
    assert {(row["status"], row["step"], row["table"]) for row in backfill} == {("succeeded", "cdc", TABLE)}
    assert {(row["run_first_date"], row["run_last_date"]) for row in backfill} == {(date(2024, 3, 1), date(2024, 3, 4))}
    counts = {row["business_date"].isoformat(): (row["inserts"], row["updates"], row["deletes"], row["not_supplied"],
                                                 row["unchanged"]) for row in backfill}
    assert counts == {D1: (4, 0, 0, 0, 0), D2: (1, 2, 1, 1, 0), D3: (1, 1, 1, 1, 1), D4: (0, 1, 0, 3, 0)}
    assert {row["config_hash"] for row in runs} == {_config_hash(chain)}
    assert all(row["code_version"] and row["error"] is None for row in backfill)

    (failed,) = [row for row in runs if row["run_id"] == chain["failed"].run_id]
    assert (failed["business_date"].isoformat(), failed["status"], failed["step"]) == (D5, "failed", "intake")
    assert D5 in failed["error"] and failed["inserts"] is None
    # DuckDB reads the same folder as one dataset.
    assert duckdb.sql(f"select count(*) from read_parquet('{chain['warehouse']}/_runs/*.parquet')").fetchall() == [(5,)]


def _config_hash(chain) -> str:
    from cdc_assets.defs.runs_log import config_hash

    return config_hash(chain["config"])


def _versions(rows, *extra):
    return sorted(
        ((r["id"], r["name"], r["score"], r["balance"], r["valid_from"].isoformat(),
          r["valid_to"].isoformat() if r["valid_to"] else None, r["is_current"], *(r[name] for name in extra))
         for r in rows),
        key=repr,
    )


def test_scd2_view_of_the_chain(spark, chain):
    expected = [  # id, name, score, balance, valid_from, valid_to, is_current
        (1, *ANN1, D1, D2, False), (1, *ANN2, D2, D3, False), (1, *ANN3, D3, None, True),
        (2, "Bob", 2.0, Decimal("20.00"), D1, D2, False), (2, "Bob", 2.0, Decimal("22.00"), D3, None, True),
        (3, "Cy", 3.0, Decimal("30.00"), D1, D2, False), (3, "Cy", 3.0, Decimal("30.00"), D2, None, True),
        # Not supplied on day 2 and unchanged on day 3 close nothing: day 4's update does.
        (4, "Di", 4.0, Decimal("40.00"), D1, D4, False), (4, "Di", 4.0, Decimal("40.00"), D4, None, True),
        (5, "Ed", 5.0, Decimal("50.00"), D2, D3, False),
    ]
    view = scd2_view(spark, TABLE, warehouse=str(chain["warehouse"]))
    assert _versions(view.collect()) == sorted(expected, key=repr)
    joined = {(r["id"], r["valid_from"].isoformat()): r["joined"] for r in view.collect()}
    assert joined[(3, D1)] is None and joined[(3, D2)] == date(2024, 2, 3)
    # The same query in DuckDB over the same files gives the same rows.
    duck = duckdb.sql(scd2_duckdb_sql(TABLE, str(chain["warehouse"])))
    duck_rows = [dict(zip(duck.columns, row)) for row in duck.fetchall()]
    assert _versions(duck_rows, "joined") == _versions(view.collect(), "joined")
    # As of day 2, day 3's changes are not seen.
    as_of_d2 = scd2_view(spark, TABLE, as_of=D2, warehouse=str(chain["warehouse"])).collect()
    assert _versions(as_of_d2) == sorted([
        (1, *ANN1, D1, D2, False), (1, *ANN2, D2, None, True), (2, "Bob", 2.0, Decimal("20.00"), D1, D2, False),
        (3, "Cy", 3.0, Decimal("30.00"), D1, D2, False), (3, "Cy", 3.0, Decimal("30.00"), D2, None, True),
        (4, "Di", 4.0, Decimal("40.00"), D1, None, True), (5, "Ed", 5.0, Decimal("50.00"), D2, None, True),
    ], key=repr)


def test_untracked_columns_are_as_of_the_start_of_the_version(spark, chain):
    """Key 4's record of day 3 changed only changed_at (untracked): an N, so not in history. The view's open
    version and cdc-changes' preimage keep day 1's changed_at, while current_table has day 3's."""
    warehouse = str(chain["warehouse"])

    def changed_at_of_4(asset, day):
        [value] = [row["changed_at"] for row in _read(spark, chain, asset, day).collect() if row["id"] == 4]
        return value

    started, updated = changed_at_of_4("history_partition", D1), changed_at_of_4("history_partition", D4)
    assert changed_at_of_4("current_table", D3) != started  # current_table took day 3's record
    as_of_d3 = scd2_view(spark, TABLE, as_of=D3, warehouse=warehouse).collect()
    assert [(row["valid_from"].isoformat(), row["changed_at"]) for row in as_of_d3 if row["id"] == 4] == [(D1, started)]
    changes = changes_between(spark, TABLE, D3, D4, warehouse=warehouse).collect()
    assert {(row["id"], row["_change_type"]): row["changed_at"] for row in changes} == {
        (4, "update_preimage"): started,
        (4, "update_postimage"): updated,
    }


def test_cdc_scd2_command_with_deletion_rows_and_a_high_end_date(spark, chain, tmp_path, monkeypatch):
    configs = tmp_path / "configs"
    write_members_config(configs, chain["root"] / "source", scd2={"open_end": "9999-12-31", "hard_deletes": "new_record"})
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))
    monkeypatch.setenv("CDC_WAREHOUSE", str(chain["warehouse"]))
    out = tmp_path / "scd2"
    assert cli.scd2_main([TABLE, "--out", str(out)]) == 0
    rows = read_stored(spark, out).collect()
    deletions = _versions([r for r in rows if r["is_deleted"]])
    # Bob's deletion row runs until he comes back; Ed's is still open, at the high date.
    assert deletions == sorted(
        [(2, "Bob", 2.0, Decimal("20.00"), D2, D3, False), (5, "Ed", 5.0, Decimal("50.00"), D3, "9999-12-31", True)], key=repr
    )
    versions = _versions([r for r in rows if not r["is_deleted"]])
    assert [v for v in versions if v[0] == 1] == [(1, *ANN1, D1, D2, False), (1, *ANN2, D2, D3, False),
                                                 (1, *ANN3, D3, "9999-12-31", True)]
    assert len(versions) == 10


def test_cdc_changes_from_day_1_to_day_3(spark, chain, tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(chain["root"] / "configs"))
    monkeypatch.setenv("CDC_WAREHOUSE", str(chain["warehouse"]))
    out = tmp_path / "changes"
    assert cli.changes_main([TABLE, "--from", D1, "--to", D3, "--out", str(out), "--format", "parquet"]) == 0
    rows = sorted(
        (r["id"], r["_change_type"], r["name"], r["balance"], r["changed_columns"], r["_from_date"].isoformat(),
         r["_to_date"].isoformat())
        for r in read_stored(spark, out).collect()
    )
    assert rows == [
        # Updated twice in between: one preimage (day 1) and one postimage (day 3).
        (1, "update_postimage", "Ann", Decimal("11.00"), ["balance", "score"], D1, D3),
        (1, "update_preimage", "Ann", Decimal("10.00"), ["balance", "score"], D1, D3),
        # Deleted on day 2 and back on day 3 with another balance: an update between the two states.
        (2, "update_postimage", "Bob", Decimal("22.00"), ["balance"], D1, D3),
        (2, "update_preimage", "Bob", Decimal("20.00"), ["balance"], D1, D3),
        (3, "update_postimage", "Cy", Decimal("30.00"), ["joined"], D1, D3),
        (3, "update_preimage", "Cy", Decimal("30.00"), ["joined"], D1, D3),
        # Key 4 changed only its untracked column, key 5 came and went in between: no row for either.
    ]
    # The Python function gives the same rows.
    same = changes_between(spark, TABLE, D1, D3, warehouse=str(chain["warehouse"]))
    assert same.count() == len(rows)
    assert cli.changes_main([TABLE, "--from", D3, "--to", D1]) == 2


@pytest.mark.parametrize(("layout", "blocked", "said"), [
    # The step stores its dated outputs itself (side by side): the failure is the step's own, named by its type.
    ("snapshot", "history_partition", "Py4JJavaError"),
    # A merged state is stored by the IO manager, outside the step's code: the step is told when Dagster closes it.
    ("incremental", "current_table", "outputs were stored"),
])
def test_runs_log_records_a_run_that_failed_storing_an_output(spark, tmp_path, monkeypatch, layout, blocked, said):
    warehouse, source = tmp_path / "warehouse", tmp_path / "source"
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    source.mkdir()
    (source / f"{D1}.csv").write_text("\n".join([HEADER, *DAYS[D1]]) + "\n")
    config = write_members_config(tmp_path / "configs", source, storage={"current": layout})
    (warehouse / TABLE).mkdir(parents=True)
    (warehouse / TABLE / blocked).write_text("a file where the asset's folder belongs")
    (result,) = run_dates(definitions_for(config), [D1], DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    runs = read_stored(spark, warehouse / "_runs").collect()
    assert [(r["run_id"], r["status"], r["step"], r["inserts"]) for r in runs] == [(result.run_id, "failed", "cdc", 4)]
    assert said in runs[0]["error"]


# -- where --out may write (cdc-current, cdc-scd2 and cdc-changes share it) ------------------------------


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its content (None for a folder)."""
    return {str(path.relative_to(root)): None if path.is_dir() else path.read_bytes() for path in sorted(root.rglob("*"))}


def _a_project_folder(folder: Path) -> Path:
    (folder / "src").mkdir(parents=True)
    (folder / "notes.txt").write_text("not an export\n")
    (folder / "src" / "job.py").write_text("print('mine')\n")
    return folder


def test_out_refuses_a_folder_that_is_not_an_export_and_deletes_nothing(chain, tmp_path, capsys):
    project = _a_project_folder(tmp_path / "project")
    before = _tree(project)
    assert cli.current_main([TABLE, "--out", str(project)]) == 2
    assert capsys.readouterr().err == (
        f"cdc-current: error: --out {project} is a folder that is not empty and is not an earlier cdc-current export of "
        f"{TABLE} (it has no _cdc_export.json): nothing was written; pass --overwrite to replace the folder and everything in it\n"
    )
    assert _tree(project) == before
    # A file is not replaced either.
    notes = project / "notes.txt"
    assert cli.changes_main([TABLE, "--from", D1, "--to", D3, "--out", str(notes)]) == 2
    assert f"--out {notes} is a file, not a folder: nothing was written; pass --overwrite" in capsys.readouterr().err
    assert _tree(project) == before


def test_out_refuses_the_current_directory_its_parents_and_the_warehouse_even_with_overwrite(chain, tmp_path, monkeypatch, capsys):
    project = _a_project_folder(tmp_path / "project")
    monkeypatch.chdir(project / "src")
    before = _tree(tmp_path)
    warehouse = chain["warehouse"]
    refused = {
        ".": f"the current directory ({project / 'src'})",
        "..": f"a folder holding the current directory ({project / 'src'})",
        str(warehouse): f"the warehouse ({warehouse}) or inside it",
        str(warehouse / TABLE / "current_table"): f"the warehouse ({warehouse}) or inside it",
        str(warehouse.parent): f"a folder holding the warehouse ({warehouse})",
        "/": "the root of the file system",
    }
    for out, what in refused.items():
        assert cli.scd2_main([TABLE, "--out", out, "--overwrite"]) == 2, out
        err = capsys.readouterr().err
        assert f"is {what}: an export replaces its folder and everything in it, so this one is refused, even with --overwrite" in err
    assert _tree(tmp_path) == before
    assert partition_dir(warehouse, TABLE, "current_table", D4).exists()
    assert (warehouse / TABLE / "current_table" / "data").is_dir()


def test_out_replaces_an_earlier_export_of_the_same_command_and_table_only(spark, chain, tmp_path, capsys):
    out = tmp_path / "exports" / "members"
    assert cli.current_main([TABLE, "--as-of", D1, "--out", str(out)]) == 0
    marker = json.loads((out / "_cdc_export.json").read_text())
    assert (marker["command"], marker["table"], marker["format"]) == ("cdc-current", TABLE, "parquet")
    assert marker["files"] and all((out / name).exists() for name in marker["files"])
    assert read_stored(spark, out).count() == 4  # the marker is not read as data
    # An earlier export of the same command and table: replaced.
    assert cli.current_main([TABLE, "--as-of", D2, "--out", str(out), "--format", "csv"]) == 0
    assert spark.read.option("header", True).csv(str(out)).count() == 4  # day 2: 1, 3, 4, 5
    assert sorted(int(r["id"]) for r in spark.read.option("header", True).csv(str(out)).collect()) == [1, 3, 4, 5]
    assert json.loads((out / "_cdc_export.json").read_text())["format"] == "csv"
    capsys.readouterr()
    # Another command's: refused, and left as it was.
    before = _tree(out)
    assert cli.changes_main([TABLE, "--from", D1, "--to", D3, "--out", str(out)]) == 2
    assert f"(it holds an export of cdc-current {TABLE}): nothing was written; pass --overwrite" in capsys.readouterr().err
    assert _tree(out) == before
    # The same command's export with a file of someone else's added: refused.
    (out / "README.txt").write_text("what these files are\n")
    assert cli.current_main([TABLE, "--out", str(out)]) == 2
    assert "it holds files the export did not write: README.txt" in capsys.readouterr().err
    # --overwrite: replaced, README included, and marked as the new command's.
    assert cli.changes_main([TABLE, "--from", D1, "--to", D3, "--out", str(out), "--overwrite"]) == 0
    assert not (out / "README.txt").exists()
    assert json.loads((out / "_cdc_export.json").read_text())["command"] == "cdc-changes"
    assert read_stored(spark, out).count() == 6
