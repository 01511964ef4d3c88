"""A snapshot of everything the factory generates from table_configs/, so a graph change fails loudly.

After an intended change, regenerate with ``UPDATE_SNAPSHOTS=1 make test`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

from cdc_assets.definitions import defs

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.txt"


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


def test_generated_definitions_match_snapshot():
    current = describe_definitions()
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(current)
    assert SNAPSHOT.exists(), "no snapshot yet: run with UPDATE_SNAPSHOTS=1"
    assert current == SNAPSHOT.read_text(), (
        "The generated assets/checks/dependencies changed. If intended, regenerate with UPDATE_SNAPSHOTS=1 "
        "and commit the new snapshot.\n" + current
    )
