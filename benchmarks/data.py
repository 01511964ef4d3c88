"""Data and outputs: the synthetic tables' extracts and configs, and what the runs wrote (counts, bytes)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from datetime import date, timedelta
from pathlib import Path

import duckdb

from benchmarks.harness import REPO, OutputsWrong, StepFailed, tool

DAY1, DAY2 = "2019-06-18", "2019-06-19"
KEYS = [f"key_{i}" for i in range(1, 6)]
NON_KEYS = [f"nonkey_{i}" for i in range(1, 11)]


# The key columns' values of an integer id ``i``: dated_extracts' and the erase scenario's keys file.
KEY_COLUMNS = [f"lpad(i::varchar, 9, '0') AS {KEYS[0]}"] + [f"substr(md5(i::varchar || '/{n}'), 1, 10) AS {name}" for n, name in enumerate(KEYS[1:], 2)]


def business_dates(count: int, first: date = date(2024, 1, 1)) -> list[str]:
    return [(first + timedelta(days=i)).isoformat() for i in range(count)]


def dated_extracts(db, root: Path, rows: int, dates: list[str], churn: int, updated_one_in: int, seed: int) -> None:
    """A full snapshot of ``rows`` rows for each date, ``root/<date>/part-00000.csv`` (the synthetic columns), and
    the table ``present`` (id ``i``, date index ``d``, ``picked``, ``version``) in the duckdb connection ``db``.

    Date d holds ids [d*churn, rows + d*churn): the ``churn`` lowest go and as many new ones come each date; about
    one row in ``updated_one_in`` is picked for new non-key values on each later date (the values of an id are a
    function of its version)."""
    db.execute(f"""CREATE TABLE present AS
        WITH days AS (SELECT range AS d FROM range({len(dates)})),
             rows AS (SELECT r.range AS i, d, d > 0 AND hash(r.range, d, {seed}) % {updated_one_in} = 0 AS picked
                      FROM days, range({rows + (len(dates) - 1) * churn}) r WHERE r.range >= d * {churn} AND r.range < {rows} + d * {churn})
        SELECT i, d, picked, sum(picked::int) OVER (PARTITION BY i ORDER BY d) AS version FROM rows""")
    values = [f"(hash(i, version, {n}, {seed}) % 100000000) / 1000.0 AS {name}" for n, name in enumerate(NON_KEYS, 1)]
    for index, day in enumerate(dates):
        (root / day).mkdir(parents=True, exist_ok=True)
        db.execute(f"COPY (SELECT {', '.join(KEY_COLUMNS + values)} FROM present WHERE d = {index}) TO '{root / day / 'part-00000.csv'}' (HEADER)")


def generate(rows1: int, rows2: int, shares: tuple, day1: Path, day2: Path, seed: int) -> dict:
    """``cdc-generate`` in a process of its own (its memory is not the harness's); the generator's counts."""
    command = [tool("cdc-generate"), rows1, rows2, len(KEYS), len(NON_KEYS), *shares, day1, day2, "--seed", seed]
    started = time.perf_counter()
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    if done.returncode != 0:
        raise StepFailed(f"cdc-generate failed:\n{done.stderr[-3000:]}")
    return {"seconds": round(time.perf_counter() - started, 2), **{k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", done.stdout)}}


def write_config(folder: Path, table: str, data_root: Path, load_type: str = "full", extra: str = "", start: str = DAY1) -> Path:
    """``<folder>/<table>.yaml``: the synthetic columns (5 string keys, 10 double non-keys), CSV from ``data_root/{date}/``."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = "".join(f"  - {{name: {k}, type: string}}\n" for k in KEYS)
    non_keys = "".join(f"  - {{name: {c}, type: double}}\n" for c in NON_KEYS)
    (folder / f"{table}.yaml").write_text(f"name: {table}\nstart_date: '{start}'\nload_type: {load_type}\n"
                                          f"source:\n  path: {data_root}/{{date}}/\n  format: csv\nkeys:\n{keys}non_keys:\n{non_keys}{extra}")
    return folder


def operation_counts(stored: tuple[Path, str, str, str] | Path) -> dict[str, int]:
    """Rows per operation of a stored date ``(warehouse, table, asset, day)``, read with pyiceberg (no Spark),
    or of a folder of Parquet files (what ``cdc-current`` writes)."""
    from resources.storage import WarehouseStorage

    if isinstance(stored, Path):
        rows = duckdb.sql(f"select operation, count(*) from read_parquet('{stored}/**/*.parquet') group by all").fetchall()
        return dict(sorted(rows))
    warehouse, table, asset, day = stored
    storage = WarehouseStorage(str(warehouse))
    if storage.merged.holds(table, asset):  # an incremental state: its tag, labelled as of the date
        operations = storage.merged.operations(table, asset, day)
    else:
        operations = storage.tables.column(table, asset, [day], "operation")
    rows = duckdb.sql("select operation, count(*) from (select unnest(?) as operation) group by all", params=[operations.to_pylist()]).fetchall()
    return dict(sorted(rows))


def expected_day2(generated: dict) -> dict:
    """Day 2 of generated data: current_table I/U/N and history_partition I/U/D (zero counts left out)."""
    g = generated
    wanted = {"current_table": {"I": g["inserted"], "U": g["updated"], "N": g["unchanged"]},
              "history_partition": {"I": g["inserted"], "U": g["updated"], "D": g["deleted"]}}
    return {name: {op: n for op, n in ops.items() if n} for name, ops in wanted.items()}


def check_counts(label: str, folders: dict[str, tuple], expected: dict) -> dict:
    """Operation counts of each stored output date against ``expected``; raises OutputsWrong if they differ."""
    found = {name: operation_counts(folder) for name, folder in folders.items()}
    if found != expected:
        raise OutputsWrong(f"{label}: counts {found}, expected {expected}")
    return found


def dated(table_root: Path, names, day: str = DAY2) -> dict[str, tuple[Path, str, str, str]]:
    """The stored date ``day`` of each asset ``names`` of the table under ``table_root`` (``warehouse/table``)."""
    return {name: (table_root.parent, table_root.name, name, day) for name in names}


def folder_bytes(folder: Path) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files)


def partition_bytes(warehouse: Path, table: str, day: str) -> dict[str, int]:
    """Bytes of each asset's data files of ``day`` (its Iceberg table's live files of that date; for an
    incremental state, the files the date's commit added)."""
    from resources.storage import WarehouseStorage

    storage = WarehouseStorage(str(warehouse))
    return {
        # An incremental state's date is what its commit added (the table holds every date's rows).
        asset: storage.merged.bytes_written(table, asset, day) if storage.merged.holds(table, asset)
        else storage.bytes_stored(table, asset, [day]).get(day, 0)
        for asset in storage.stored_assets(table)
    }


def cdc_current(env: dict, table: str, day: str) -> Path:
    """``cdc-current TABLE --as-of DAY`` into a folder beside the run's warehouse: the state as a snapshot holds it."""
    out = Path(env["CDC_WAREHOUSE"]).parent / f"cdc_current_{table}_{day}"
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([tool("cdc-current"), table, "--as-of", day, "--out", str(out)], env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise StepFailed(f"cdc-current {table} --as-of {day} failed:\n{done.stderr[-3000:]}")
    return out
