"""Debezium's placeholder for an unchanged large (TOASTed) column, through real Dagster runs.

PostgreSQL's connector sends ``unavailable.value.placeholder`` (``__debezium_unavailable_value`` by default,
``changes.unavailable_value_placeholder`` here) instead of a column it did not read. The column keeps its
previous value: from the key's earlier record of the day, else from current_table; with neither, the record
is set aside in late_changes with its reason, and counted.
"""

from __future__ import annotations

import json

import yaml
from dagster import DagsterInstance

from cdc_assets.model.config import DEBEZIUM_UNAVAILABLE_VALUE, load_table_config
from cdc_assets.model.names import CURRENT, HISTORY, LATE_CHANGES
from tests.pipeline import definitions_for, partition_dir, read_stored, run_dates

TABLE = "notes"
DAYS = ["2024-01-01", "2024-01-02"]
PLACEHOLDER = "__toast__"


def event(op: str, key: int, value: int, notes: str, lsn: int) -> str:
    return json.dumps({"before": None, "after": {"id": key, "value": value, "notes": notes}, "source": {"lsn": lsn}, "op": op})


EVENTS = {
    DAYS[0]: [event("c", 1, 1, "long A", 100), event("c", 2, 2, "long B", 110)],
    DAYS[1]: [
        event("u", 1, 10, PLACEHOLDER, 200),  # notes kept from current: U on value only
        event("u", 2, 2, PLACEHOLDER, 210),  # nothing but notes left out: N, the hash taken again
        event("c", 3, 3, "long C", 220),
        event("u", 3, 30, PLACEHOLDER, 230),  # notes from the key's earlier record of the day: I
        event("u", 4, 4, PLACEHOLDER, 240),  # no earlier record, not in current: set aside
        event("c", 5, 5, DEBEZIUM_UNAVAILABLE_VALUE, 250),  # not this table's placeholder: a value
    ],
}


def _metadata(results, asset: str, day: str) -> dict:
    for result in results:
        for found in result.get_asset_materialization_events():
            materialization = found.event_specific_data.materialization
            if materialization.asset_key.path[-1] == asset and materialization.partition == day:
                return {name: value.value for name, value in materialization.metadata.items()}
    raise AssertionError(f"no materialization of {asset} for {day}")


def test_a_left_out_column_keeps_its_previous_value(spark, warehouse, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    for day, lines in EVENTS.items():
        (landing / f"{day}.jsonl").write_text("\n".join(lines) + "\n")
    document = {
        "name": TABLE,
        "start_date": DAYS[0],
        "load_type": "changeset",
        "source": {"path": str(landing / "{date}.jsonl"), "format": "debezium"},
        "keys": [{"name": "id", "type": "int"}],
        "non_keys": [{"name": "value", "type": "int"}, {"name": "notes", "type": "string"}],
        "changes": {"sequence_columns": ["source.lsn"], "unavailable_value_placeholder": PLACEHOLDER},
    }
    path = tmp_path / f"{TABLE}.yaml"
    path.write_text(yaml.safe_dump(document))
    results = run_dates(definitions_for(load_table_config(path)), DAYS, DagsterInstance.ephemeral())
    checks = [e.event_specific_data for r in results for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert checks and all(check.passed for check in checks)

    def read(asset: str):
        return read_stored(spark, partition_dir(warehouse, TABLE, asset, DAYS[1]))

    current = {r["id"]: (r["value"], r["notes"], r["operation"]) for r in read(CURRENT).collect()}
    assert current == {
        1: (10, "long A", "U"),
        2: (2, "long B", "N"),
        3: (30, "long C", "I"),
        5: (5, DEBEZIUM_UNAVAILABLE_VALUE, "I"),
    }
    history = {r["id"]: (r["notes"], r["changed_columns"]) for r in read(HISTORY).collect()}
    assert history[1] == ("long A", ["value"])
    [set_aside] = read(LATE_CHANGES).collect()
    assert (set_aside["id"], set_aside["value"], set_aside["notes"], set_aside["unavailable_columns"]) == (4, 4, None, ["notes"])
    assert set_aside["reason"].startswith("no previous value: notes left out as unchanged")
    figures = _metadata(results, "hash_join_classification", DAYS[1])
    assert (figures["unavailable_filled"], figures["unavailable_set_aside"], figures["winners"]) == (3, 1, 4)
