"""A re-run of a middle date leaves no later date computed from the old one (issue 34, point 4).

A run of dates D..E of a table whose current_table stores later dates recomputes them in the same run
(a correction that flows forward), or with ``carry_forward: false`` is refused before anything is
written, naming those dates and the range to launch; inside a backfill that recomputes them, its
writes drop them in the same commit as they write D..E, and the backfill's later runs write them again.
"""

from __future__ import annotations

import csv
from datetime import date, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance

from cdc_assets.core.capture.rerun import LaterDatesStoredError, RerunDecision, rerun_decision
from cdc_assets.model.names import CLASSIFICATION, CURRENT, DELETES, HISTORY, INSERTS, UPDATES
from resources.storage.state import read_state
from resources.storage import DroppedPartitionError, WarehouseStorage
from tests.pipeline import AUDIT_COLUMNS, add_backfill, definitions_for, run_dates, run_range, write_table_config

D = [(date(2024, 3, 1) + timedelta(days=n)).isoformat() for n in range(5)]
CDC_OUTPUTS = (CLASSIFICATION, INSERTS, UPDATES, DELETES, CURRENT, HISTORY)


# -- the decision, on tiny inputs ------------------------------------------------------------------------
def test_a_run_at_or_after_the_newest_stored_date_drops_nothing():
    assert rerun_decision("t", [D[2]], [D[0], D[1]], None) == RerunDecision()
    assert rerun_decision("t", [D[1]], [D[0], D[1]], None) == RerunDecision()  # the newest date itself
    assert rerun_decision("t", D[1:5], D[:4], None) == RerunDecision()  # a range reaching past the newest
    assert rerun_decision("t", [D[0]], [], None) == RerunDecision()


def test_a_middle_date_alone_is_refused_naming_the_later_dates_and_the_range_to_launch():
    with pytest.raises(LaterDatesStoredError) as refused:
        rerun_decision("orders", [D[1]], D, None)
    message = str(refused.value)
    assert f"current_table stores {D[2]}..{D[4]}," in message and "nothing was written" in message
    assert f"--partition-range {D[1]}...{D[4]}" in message and f"[{D[1]}...{D[4]}]" in message
    # A gap in the stored dates is named as it is; the range still runs up to the newest stored date.
    with pytest.raises(LaterDatesStoredError, match=f"stores {D[2]},{D[4]},.*--partition-range {D[0]}...{D[4]}"):
        rerun_decision("orders", [D[0], D[1]], [D[0], D[1], D[2], D[4]], None)


def test_carried_forward_only_when_every_later_day_and_its_intake_are_stored():
    assert rerun_decision("t", [D[1]], D, None, carry_forward=True, intake_stored=set(D)) == RerunDecision(carried=tuple(D[2:]))
    assert rerun_decision("t", [D[1]], D, set(D[1:]), carry_forward=True, intake_stored=set(D)) == RerunDecision(tuple(D[2:]))  # a backfill's
    with pytest.raises(LaterDatesStoredError, match=f"cannot recompute them itself: hashed_incoming lacks {D[3]} "):
        rerun_decision("t", [D[1]], D, None, carry_forward=True, intake_stored=set(D) - {D[3]})
    with pytest.raises(LaterDatesStoredError, match=f"cannot recompute them itself: current_table lacks {D[3]} "):
        rerun_decision("t", [D[1]], [D[0], D[1], D[2], D[4]], None, carry_forward=True, intake_stored=set(D))


def test_inside_a_backfill_the_later_dates_are_dropped_only_if_it_targets_each_of_them():
    assert rerun_decision("t", [D[1]], D, set(D[1:])) == RerunDecision((D[2], D[3], D[4]))
    assert rerun_decision("t", [D[1], D[2]], D, set(D)) == RerunDecision((D[3], D[4]))
    with pytest.raises(LaterDatesStoredError, match=f"leaves out {D[4]}"):
        rerun_decision("t", [D[1]], D, set(D[1:4]))


# -- through real Dagster runs -----------------------------------------------------------------------------
def _land(source: Path, day3: list[tuple[int, int]]) -> None:
    """A delta chain of five dates; date 3 as ``day3``."""
    extracts = {
        D[0]: [(1, 10), (2, 20), (3, 30), (4, 40)],
        D[1]: [(1, 11)],
        D[2]: day3,
        D[3]: [(3, 33), (6, 60)],
        D[4]: [(1, 12), (7, 70)],
    }
    source.mkdir(parents=True, exist_ok=True)
    for day, rows in extracts.items():
        with open(source / f"{day}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows([("id", "value"), *rows])


OLD_DAY3 = [(2, 21), (5, 50)]
CORRECTED_DAY3 = [(2, 22), (4, 44), (6, 66)]  # key 6 is new here, so date 4 updates it instead of inserting it


def _chain(tmp_path: Path, monkeypatch, name: str, day3, **fields):
    root = tmp_path / name
    root.mkdir()
    monkeypatch.setenv("CDC_WAREHOUSE", str(root))
    _land(tmp_path / f"{name}-source", day3)
    columns = {"keys": [{"name": "id", "type": "int"}], "non_keys": [{"name": "value", "type": "int"}]}
    config = write_table_config(
        tmp_path / f"{name}-configs", "t", f"{tmp_path}/{name}-source/{{date}}.csv", load_type="delta", start_date=D[0], **columns,
        **fields,
    )
    return root, definitions_for(config)


def _rows(spark, storage: WarehouseStorage, asset: str, day: str) -> list[tuple]:
    """A date's rows without the audit columns; current_table's as the state as of the date (either storage mode)."""
    if asset == CURRENT:
        frame = read_state(storage, spark, "t", asset, day)
    else:
        frame = storage.read_one(spark, "t", asset, day)
    return sorted(tuple(row) for row in frame.drop(*AUDIT_COLUMNS).collect())


def _snapshots(storage: WarehouseStorage) -> dict[str, list[int]]:
    return {asset: [s.snapshot_id for s in storage.tables.load("t", asset).snapshots()] for asset in storage.stored_assets("t")}


# An incremental current_table compacted every second date stores 1, 3 and 5 as full copies, 2 and 4 as
# changes: date 3's re-run writes a full copy and drops 5 from the full copies and 4 from the changes,
# a table it writes no date of.
INCREMENTAL = {"storage": {"current": "incremental", "compact_after_dates": 2, "compact_after_share": 10.0}}


@pytest.mark.parametrize("fields", [{}, INCREMENTAL], ids=["snapshot", "incremental"])
def test_a_rerun_of_a_middle_date_with_a_corrected_extract_leaves_no_later_date_from_the_old_one(spark, tmp_path, monkeypatch, fields):
    # What the chain holds when date 3's extract was the corrected one from the start.
    reference_root, reference_defs = _chain(tmp_path, monkeypatch, "reference", CORRECTED_DAY3, **fields)
    assert run_range(reference_defs, D[0], D[4]).success
    reference = WarehouseStorage(str(reference_root))
    expected = {(asset, day): _rows(spark, reference, asset, day) for asset in (CURRENT, HISTORY) for day in D[3:]}

    root, defs = _chain(tmp_path, monkeypatch, "warehouse", OLD_DAY3, **fields)
    instance = DagsterInstance.ephemeral()
    assert run_range(defs, D[0], D[4], instance).success
    storage = WarehouseStorage(str(root))
    assert _rows(spark, storage, CURRENT, D[4]) != expected[(CURRENT, D[4])]  # the old extract shows
    _land(tmp_path / "warehouse-source", CORRECTED_DAY3)  # the source corrects date 3
    before = _snapshots(storage)

    # Date 3 alone with carry_forward off: refused before anything is written, naming the later dates and
    # the range to launch.
    refused = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        partition_key=D[2], instance=instance, raise_on_error=False, run_config={"ops": {"t__cdc": {"config": {"carry_forward": False}}}}
    )
    assert not refused.success
    failure = next(event for event in refused.all_events if event.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.to_string()
    assert f"current_table stores {D[3]}..{D[4]}," in message, message
    assert f"--partition-range {D[2]}...{D[4]}" in message and "Launch backfill" in message
    assert _snapshots(storage) == before, "a refused run committed something"

    # Date 3 alone (carry_forward, the default) recomputes 4 and 5 in the same run: as if corrected from the start.
    [corrected] = run_dates(defs, [D[2]], instance)
    assert corrected.success
    storage = WarehouseStorage(str(root))
    for (asset, day), rows in expected.items():
        assert _rows(spark, storage, asset, day) == rows, f"{asset} of {day}, carried forward"
    summary = storage.tables.load("t", HISTORY).current_snapshot().summary
    assert dict(summary.additional_properties)["cdc.business-dates"] == ",".join(D[2:])  # one commit wrote 3..5
    before = _snapshots(storage)

    # A run of date 3 in a backfill of 3..5 drops 4 and 5 from each CDC output in the commit that writes 3
    # (an incremental current_table: their tags, before date 3's MERGE).
    outputs = [asset for asset in CDC_OUTPUTS if asset in before]
    later = {asset: [day for day in storage.stored_dates("t", asset) if day > D[2]] for asset in outputs}
    assert later[CURRENT] == D[3:]
    merged = storage.merged.holds("t", CURRENT)
    backfill = add_backfill(defs, D[2:], instance)
    [third] = run_dates(defs, [D[2]], instance, backfill_id=backfill)
    assert third.success
    after = _snapshots(storage)
    for asset in outputs:
        assert not set(storage.stored_dates("t", asset)) & set(D[3:]), asset
        summary = storage.tables.load("t", asset).current_snapshot().summary
        assert dict(summary.additional_properties)["cdc.dropped-dates"] == ",".join(later[asset]), asset
        if merged and asset == CURRENT:  # main went back to date 2's snapshot, then date 3's commit
            assert storage.stored_dates("t", asset) == D[:3]
            continue
        assert after[asset][: len(before[asset])] == before[asset] and len(after[asset]) == len(before[asset]) + 1, asset
    # A reader of a dropped date is told why and what to run.
    with pytest.raises(DroppedPartitionError, match=f"dropped by a re-run of {D[2]} .*Run {D[3]}..{D[4]}, oldest first"):
        storage.read_one(spark, "t", HISTORY, D[4])

    # The backfill's later runs find no later date and write them again: as if corrected from the start.
    assert all(result.success for result in run_dates(defs, D[3:], instance, backfill_id=backfill))
    for (asset, day), rows in expected.items():
        assert _rows(spark, storage, asset, day) == rows, f"{asset} of {day}"
