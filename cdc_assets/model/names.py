"""Asset names shared by the factory, the checks, the readers, the schedule and the sensor: plain strings, no
Dagster (their keys: ``asset_keys.py``)."""

from datetime import date, timedelta

from cdc_assets.model.config import TableConfig

HASHED_INCOMING = "hashed_incoming"
REJECTS = "rejects"
CLASSIFICATION = "hash_join_classification"
INSERTS = "inserts"
DELETES = "deletes"
UPDATES = "updates"
CURRENT = "current_table"
HISTORY = "history_partition"
CDC_OUTPUTS = (CLASSIFICATION, INSERTS, DELETES, UPDATES, CURRENT, HISTORY)
# A changeset's CDC step also writes its late records and the state late records are told by.
LATE_CHANGES = "late_changes"
APPLIED_SEQUENCES = "applied_sequences"
CHANGESET_OUTPUTS = (LATE_CHANGES, APPLIED_SEQUENCES)
# The step that publishes a run's staged outputs once its blocking checks passed (docs/publishing.md): an
# asset of its own, stored nowhere, whose materialization of a date says the date is published.
PUBLISHED = "published"


def cdc_outputs(config: TableConfig) -> tuple[str, ...]:
    """The assets a table's CDC step writes, in the order it yields them (it writes them side by side)."""
    return CDC_OUTPUTS + CHANGESET_OUTPUTS if config.changes is not None else CDC_OUTPUTS


def day_before(day: str) -> str:
    return (date.fromisoformat(day) - timedelta(days=1)).isoformat()


def pool_name(config: TableConfig) -> str:
    """One concurrency pool per table; instance/dagster.yaml makes it one run per table at a time."""
    return f"cdc_{config.name}"
