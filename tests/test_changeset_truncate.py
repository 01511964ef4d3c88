"""A truncate is a floor for the whole table, for good: through real Dagster runs, checked against the oracle.

Debezium events (the only source with a truncate, op ``t``) ordered by ``source.lsn``. After a truncate at
T, a record below T that arrives on a later date is late whatever its key; a record at T is taken to come
after the truncate, on its date and later; the floor lives in ``applied_sequences`` (its ``key_hash`` is
NULL), so a re-run of a middle date sees it, and it outlives ``tombstone_retention_days``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from dagster import DagsterInstance
from pyspark.sql import functions as F

from cdc_assets.model.config import load_table_config
from cdc_assets.model.names import APPLIED_SEQUENCES, CURRENT, HISTORY, LATE_CHANGES
from tests.changeset_reference import apply_days
from tests.pipeline import definitions_for, partition_dir, read_stored, run_range

TABLE = "events"
DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
OP = {"I": "c", "U": "u", "D": "d", "T": "t"}


def rec(flag: str, key: int | None, value: int | None, lsn: int) -> dict:
    return {"flag": flag, "id": key, "value": value, "cdc_timestamp": lsn}


EVENTS = {
    DAYS[0]: [
        rec("I", 1, 10, 100),
        rec("I", 2, 20, 110),
        rec("T", None, None, 200),
        rec("I", 3, 30, 210),
        rec("I", 4, 40, 200),  # at the truncate's sequence: after it, applied
    ],
    DAYS[1]: [
        rec("U", 5, 50, 150),  # below the floor, a key never held: late (was applied before the floor)
        rec("U", 1, 11, 190),  # below the floor: late
        rec("I", 6, 60, 200),  # at the floor on a later date: after the truncate, applied
        rec("U", 4, 40, 200),  # key 4's applied record again: late by its own entry
        rec("U", 4, 41, 205),
        rec("U", 3, 31, 220),
    ],
    DAYS[2]: [
        rec("I", 7, 70, 199),  # two dates on, tombstones long gone (retention 1): still below the floor
        rec("T", None, None, 250),  # deletes 3, 4 and 6, whose applied sequences are below it
        rec("I", 8, 80, 300),
    ],
}


def _event(record: dict) -> str:
    row = None if record["flag"] == "T" else {"id": record["id"], "value": record["value"]}
    return json.dumps({
        "before": row if record["flag"] == "D" else None,
        "after": row if record["flag"] in ("I", "U") else None,
        "source": {"lsn": record["cdc_timestamp"]},
        "op": OP[record["flag"]],
    })


def _config(tmp_path: Path):
    landing = tmp_path / "landing"
    landing.mkdir()
    for day, records in EVENTS.items():
        (landing / f"{day}.jsonl").write_text("\n".join(map(_event, records)) + "\n")
    document = {
        "name": TABLE,
        "start_date": DAYS[0],
        "load_type": "changeset",
        "source": {"path": str(landing / "{date}.jsonl"), "format": "debezium"},
        "keys": [{"name": "id", "type": "int"}],
        "non_keys": [{"name": "value", "type": "int"}],
        "changes": {"sequence_columns": ["source.lsn"], "tombstone_retention_days": 1},
        "max_delete_fraction": 1.0,  # the second truncate deletes every key it finds
    }
    path = tmp_path / f"{TABLE}.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_table_config(path)


def _read(spark, warehouse: Path, asset: str, day: str):
    return read_stored(spark, partition_dir(warehouse, TABLE, asset, day))


def _lsn(column: str):
    return F.col(f"{column}.source_lsn.number").cast("long")


def stored(spark, warehouse: Path, day: str) -> dict:
    current = {r["id"]: (r["value"], r["operation"]) for r in _read(spark, warehouse, CURRENT, day).collect()}
    history = sorted((r["id"], r["operation"]) for r in _read(spark, warehouse, HISTORY, day).collect())
    late = _read(spark, warehouse, LATE_CHANGES, day).select("id", _lsn("change_sequence"), _lsn("applied_sequence"), "reason")
    return {"current": current, "history": history, "late": sorted(tuple(r) for r in late.collect())}


def expected() -> dict[str, dict]:
    outputs = apply_days([(day, records) for day, records in EVENTS.items()], retention_days=1)
    return {
        day: {
            "current": {key: (row.value, row.operation) for key, row in current.items()},
            "history": sorted((key, row.operation) for key, row in history.items()),
            "late": sorted((r["id"], r["cdc_timestamp"], seq, "late") for r, seq in late),
        }
        for day, (current, history, late, _) in zip(EVENTS, outputs)
    }


def test_a_truncate_is_a_floor_for_every_key_for_good_and_a_rerun_sees_it(spark, warehouse, tmp_path):
    config = _config(tmp_path)
    instance = DagsterInstance.ephemeral()
    assert run_range(definitions_for(config), DAYS[0], DAYS[-1], instance).success
    oracle = expected()
    # The oracle's view, spelled out: keys 1 and 2 leave no trace; 4 and 6 at the floor are applied.
    assert oracle[DAYS[0]]["current"] == {3: (30, "I"), 4: (40, "I")}
    assert oracle[DAYS[1]]["current"] == {3: (31, "U"), 4: (41, "U"), 6: (60, "I")}
    assert oracle[DAYS[1]]["late"] == [(1, 190, 200, "late"), (4, 200, 200, "late"), (5, 150, 200, "late")]
    assert oracle[DAYS[2]]["current"] == {8: (80, "I")}
    assert oracle[DAYS[2]]["history"] == [(3, "D"), (4, "D"), (6, "D"), (8, "I")]
    assert oracle[DAYS[2]]["late"] == [(7, 199, 200, "late")]
    for day in DAYS:
        assert stored(spark, warehouse, day) == oracle[day], day

    # applied_sequences: the floor is the row whose key_hash is NULL; entries below it are gone.
    state = _read(spark, warehouse, APPLIED_SEQUENCES, DAYS[2]).select("key_hash", _lsn("sequence").alias("lsn"), "deleted")
    assert sorted((r["key_hash"] is None, r["lsn"], r["deleted"]) for r in state.collect()) == [
        (False, 300, False), (True, 250, True),
    ]

    # A re-run of the middle date (with the last, computed from it) reads applied_sequences of the first,
    # floor included: the same outputs.
    assert run_range(definitions_for(config), DAYS[1], DAYS[-1], instance).success
    for day in DAYS[1:]:
        assert stored(spark, warehouse, day) == oracle[day], day
