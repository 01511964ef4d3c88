"""A snapshot of everything the factory generates from table_configs/, so a graph change fails loudly.

After an intended change, regenerate with ``UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest
tests/test_definitions_snapshot.py``: the run rewrites the snapshot and fails, saying so (a run that
rewrites what it checks has checked nothing). Review the diff, then run the test again without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdc_assets.defs.definitions import defs

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.txt"
UPDATE_ENV = "UPDATE_SNAPSHOTS"


def describe_definitions() -> str:
    graph = defs.resolve_asset_graph()
    lines = ["# assets: key <- parents (partition mapping where not identity)"]
    for key in sorted(graph.get_all_asset_keys()):
        node = graph.get(key)
        parents = []
        for parent in sorted(node.parent_keys):
            mapping = graph.get_partition_mapping(key, parent)
            label = parent.to_user_string()
            if type(mapping).__name__ == "TimeWindowPartitionMapping" and (mapping.start_offset, mapping.end_offset) != (0, 0):
                label += f" [offset {mapping.start_offset}]"
            parents.append(label)
        lines.append(f"{key.to_user_string()} (group {node.group_name}) <- {', '.join(parents) or '-'}")
    lines.append("# asset checks (blocking)")
    for check_key in sorted(graph.asset_check_keys):
        spec = graph.get_check_spec(check_key)
        lines.append(f"{check_key.asset_key.to_user_string()}:{check_key.name} blocking={spec.blocking}")
    lines.append("# jobs, schedules, sensors")
    lines += sorted(f"job {job.name}" for job in defs.jobs)
    lines += sorted(f"schedule {s.name} {s.cron_schedule} {s.execution_timezone or 'UTC'}" for s in defs.schedules)
    lines += sorted(f"sensor {s.name}" for s in defs.sensors)
    return "\n".join(lines) + "\n"


def check_snapshot(current: str, snapshot: Path, update: bool) -> None:
    """Fail unless ``snapshot`` holds ``current``. With ``update`` a differing (or missing) snapshot is
    rewritten first, and the check still fails: only a run that finds the snapshot as it is passes."""
    stored = snapshot.read_text() if snapshot.exists() else None
    if stored == current:
        return
    if update:
        snapshot.write_text(current)
        pytest.fail(
            f"{UPDATE_ENV}=1: rewrote {snapshot}. Review the diff (git diff -- {snapshot}) and run the test "
            f"again without {UPDATE_ENV}; a run that rewrites the snapshot does not pass.",
            pytrace=False,
        )
    if stored is None:
        pytest.fail(f"no snapshot at {snapshot} yet: create it with {UPDATE_ENV}=1", pytrace=False)
    assert current == stored, (
        f"The generated assets/checks/dependencies changed. If intended, regenerate with {UPDATE_ENV}=1 "
        "and commit the new snapshot.\n" + current
    )


def test_generated_definitions_match_snapshot():
    check_snapshot(describe_definitions(), SNAPSHOT, update=os.environ.get(UPDATE_ENV) == "1")


def test_updating_the_snapshot_rewrites_it_and_fails(tmp_path):
    snapshot = tmp_path / "definitions.txt"
    snapshot.write_text("an older graph\n")
    with pytest.raises(pytest.fail.Exception, match=f"{UPDATE_ENV}=1: rewrote {snapshot}"):
        check_snapshot("the graph now\n", snapshot, update=True)
    assert snapshot.read_text() == "the graph now\n"
    check_snapshot("the graph now\n", snapshot, update=True)  # found as it is: passes, even when updating
    with pytest.raises(AssertionError):
        check_snapshot("another graph\n", snapshot, update=False)
    assert snapshot.read_text() == "the graph now\n"
