"""Undo: put every output of a table back to what it stored as of a business date, and undo that.

A rollback to D removes the dates after D from each of the table's Iceberg tables, with Iceberg's own
means, and keeps what it removed:

- a table stored per date (every output, and a snapshot-layout state): the table's current snapshot is
  first tagged ``cdc_rollback_<id>`` (``RETAIN`` the table's ``publish.keep_rolled_back_days``), each later
  date's tag becomes ``cdc_rollback_<id>_<date>``, then the later dates (and their tags) leave it in one
  commit whose summary names the rollback (``cdc.rollback-id``, ``cdc.rolled-back-to``);
- a merged state (``storage: {current: incremental}``): ``main`` is set to the snapshot tagged D, and
  each later date's tag becomes ``cdc_rollback_<id>_<date>`` (the head before gets ``cdc_rollback_<id>``).

``current_table`` goes first, so a reader of the current state never sees a date that the other outputs
no longer hold; an undo restores it last. What was done is recorded before it is done, in
``{root}/{table}/_rollbacks/<id>.json``: a rollback that stopped half-way is recorded ``started``, the
table's runs refuse to start until ``cdc-rollback TABLE --to D`` is run again (it completes the same
rollback), and an undo restores each table only if nothing was committed to it since the rollback.

An erase drops every undo point (:func:`forget_undo_points`): the snapshots they keep hold the erased
keys, and an erase is final. Nothing here knows Dagster; the caller holds the table's writer lock.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pyspark.sql import SparkSession

from cdc_assets.core.errors import SummarizedError
from resources.storage.lake import table_identifier
from resources.storage.merged import SCHEMA_PROPERTY
from resources.storage.tables import RUN_ID
from resources.storage.warehouse import WarehouseStorage

ROLLBACKS_FOLDER = "_rollbacks"
ROLLBACK_ID = "cdc.rollback-id"
ROLLED_BACK_TO = "cdc.rolled-back-to"
UNDO_TAG_PREFIX = "cdc_rollback_"
# A record's status: started (not every table rolled back yet), done, undone, and, once its undo points
# are gone, expired (publish.keep_rolled_back_days passed) or erased (an erase dropped them).
STARTED, DONE, UNDONE, ERASED = "started", "done", "undone", "erased"
# current_table first: what a reader of the current state sees is never ahead of the other outputs.
_FIRST = "current_table"


class RollbackError(SummarizedError, RuntimeError):
    """A rollback or an undo that cannot be done as asked: nothing was changed."""


class UnfinishedRollbackError(SummarizedError, RuntimeError):
    """A rollback of the table stopped half-way: no run may write the table until it is completed."""


@dataclass
class Rollback:
    """A rollback's record: what each of the table's Iceberg tables held before (``before``: its snapshot)
    and after it (``after``), the dates it removed, and for a merged state the tags it moved and the
    schema records (table properties) it unset."""

    id: str
    table: str
    to: str
    status: str = STARTED
    reason: str = ""
    requested_by: str = ""
    keep_days: int = 7
    started_at: str = ""
    finished_at: str = ""
    undone_at: str = ""
    note: str = ""
    assets: dict[str, dict] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return f"{UNDO_TAG_PREFIX}{self.id}"

    def removed(self) -> dict[str, list[str]]:
        """The dates the rollback removed, per asset."""
        return {asset: list(done.get("dropped", [])) for asset, done in self.assets.items() if done.get("dropped")}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _path(storage: WarehouseStorage, table: str, rollback_id: str | None = None) -> str:
    folder = f"{storage.root}/{table}/{ROLLBACKS_FOLDER}"
    return folder if rollback_id is None else f"{folder}/{rollback_id}.json"


def _save(storage: WarehouseStorage, record: Rollback) -> None:
    storage.layout.files.write_atomically(_path(storage, record.table, record.id), json.dumps(record.__dict__, indent=1).encode())


def rollbacks(storage: WarehouseStorage, table: str) -> list[Rollback]:
    """The table's rollbacks, oldest first (no Spark: a listing and small files)."""
    folder = _path(storage, table)
    if not storage.layout.files.exists(folder):
        return []
    found = [
        Rollback(**json.loads(storage.layout.files.read_bytes(f"{folder}/{name}")))
        for name in storage.layout.files.list_names(folder)
        if name.endswith(".json")
    ]
    return sorted(found, key=lambda record: (record.started_at, record.id))


def require_no_unfinished_rollback(storage: WarehouseStorage, table: str) -> None:
    """Raise :class:`UnfinishedRollbackError` if a rollback of the table stopped before every table was rolled back."""
    for record in rollbacks(storage, table):
        if record.status == STARTED:
            raise UnfinishedRollbackError(
                f"{table}: a rollback to {record.to} (id {record.id}, started {record.started_at}) stopped before every "
                f"output was rolled back, so the outputs disagree on the dates they hold; no run writes the table until "
                f"it is completed: cdc-rollback {table} --to {record.to} (or the {table}_rollback job with to: {record.to})."
            )


def _undo_minutes(snapshot_ms: int, keep_days: int) -> int:
    """Iceberg counts a tag's age from its snapshot's commit, not from the tagging: the retention that keeps
    a tag of that snapshot ``keep_days`` days from now, in whole minutes."""
    age_minutes = max(0.0, (time.time() * 1000 - snapshot_ms) / 60000)
    return keep_days * 24 * 60 + math.ceil(age_minutes) + 1


def roll_back(
    spark: SparkSession, storage: WarehouseStorage, table: str, to: str, assets: list[str], keep_days: int, reason: str, requested_by: str,
) -> Rollback | None:
    """Roll ``assets`` (every Iceberg table of ``table``) back to ``to``; see the module docstring. An
    unfinished rollback to the same date is completed (its id kept); one to another date is refused.
    Returns the record, ``done``; None when no output stores a date after ``to``."""
    spark = storage.tables.session_for(spark)
    storage.hold_writer_lock(table)
    unfinished = [record for record in rollbacks(storage, table) if record.status == STARTED]
    if unfinished and unfinished[-1].to != to:
        raise RollbackError(
            f"{table}: a rollback to {unfinished[-1].to} (id {unfinished[-1].id}) is unfinished: complete it first "
            f"(cdc-rollback {table} --to {unfinished[-1].to}), then roll back to {to}"
        )
    record = unfinished[-1] if unfinished else Rollback(
        id=storage.run_id[:12], table=table, to=to, reason=reason, requested_by=requested_by, keep_days=keep_days, started_at=_now(),
    )
    ordered = sorted(assets, key=lambda asset: (asset != _FIRST, asset))
    # What each table holds before: recorded before the first change, so a stop half-way is known.
    for asset in ordered:
        if asset in record.assets:
            continue
        loaded = storage.tables.load(table, asset)
        snapshot = None if loaded is None else loaded.current_snapshot()
        later = [day for day in storage.stored_dates(table, asset) if day > to]
        if snapshot is None or not later:
            continue
        record.assets[asset] = {"before": snapshot.snapshot_id, "dropped": later, "merged": storage.merged.holds(table, asset)}
    if not record.assets and not unfinished:
        return None  # no output stores a date after ``to``: nothing to record
    _save(storage, record)
    for asset in ordered:
        done = record.assets.get(asset)
        if done is None or "after" in done:
            continue
        identifier = table_identifier(table, asset)
        before = storage.tables.load(table, asset).snapshot_by_id(done["before"])
        keep = _undo_minutes(before.timestamp_ms, keep_days)
        spark.sql(f"ALTER TABLE {identifier} CREATE OR REPLACE TAG `{record.tag}` AS OF VERSION {done['before']} RETAIN {keep} MINUTES")
        if done["merged"]:
            _roll_back_merged(spark, storage, table, asset, record, done)
        else:
            _keep_date_tags(spark, storage, table, asset, record, done)
            properties = {RUN_ID: storage.run_id, ROLLBACK_ID: record.id, ROLLED_BACK_TO: to}
            # Serializable from the snapshot recorded: a writer the lock does not reach fails it, not lost.
            storage.tables.drop_dates(spark, table, asset, done["dropped"], properties, read_snapshot=done["before"])
        done["after"] = storage.tables.load(table, asset).current_snapshot().snapshot_id
        _save(storage, record)
    record.status, record.finished_at = DONE, _now()
    _save(storage, record)
    return record


def _keep_date_tags(spark: SparkSession, storage: WarehouseStorage, table: str, asset: str, record: Rollback, done: dict) -> None:
    """A table stored per date: each later date's tag (docs/publishing.md) kept as an undo tag
    ``cdc_rollback_<id>_<date>``; the rollback's commit then drops the date tags themselves."""
    if "tags" not in done:  # recorded before anything moves, with each tag's own retention for the undo
        loaded = storage.tables.load(table, asset)
        tags = storage.tables.date_tags(table, asset)
        done["tags"] = {day: tags[day] for day in done["dropped"] if day in tags}
        done["tag_ages"] = {day: loaded.metadata.refs[day].max_ref_age_ms for day in done["tags"]}
        _save(storage, record)
    _undo_tags(spark, storage, table, asset, record, done["tags"])


def _undo_tags(spark: SparkSession, storage: WarehouseStorage, table: str, asset: str, record: Rollback, tags: dict[str, int]) -> None:
    """Tag each date's snapshot ``cdc_rollback_<id>_<date>``, kept ``record.keep_days`` from now: Iceberg
    counts each tag's age from its own snapshot, older than the rollback's head."""
    loaded = storage.tables.load(table, asset)
    identifier = table_identifier(table, asset)
    for day, snapshot in tags.items():
        keep = _undo_minutes(loaded.snapshot_by_id(snapshot).timestamp_ms, record.keep_days)
        spark.sql(f"ALTER TABLE {identifier} CREATE OR REPLACE TAG `{record.tag}_{day}` AS OF VERSION {snapshot} RETAIN {keep} MINUTES")


def _roll_back_merged(spark: SparkSession, storage: WarehouseStorage, table: str, asset: str, record: Rollback, done: dict) -> None:
    """A merged state: ``main`` to the tag of ``record.to``; each later date's tag kept as an undo tag."""
    if "tags" not in done:  # recorded before anything moves: a rollback stopped after it completes from the record
        loaded = storage.tables.load(table, asset)
        tags = {day: storage.merged.tag_snapshot(table, asset, day) for day in done["dropped"]}
        done["tags"] = {day: snapshot for day, snapshot in tags.items() if snapshot is not None}
        done["properties"] = {
            key: loaded.properties[key] for day in done["dropped"] if (key := f"{SCHEMA_PROPERTY}{day}") in loaded.properties
        }
        _save(storage, record)
    _undo_tags(spark, storage, table, asset, record, done["tags"])
    target = storage.merged.tag_snapshot(table, asset, record.to)
    if target is None:
        raise RollbackError(f"{table}/{asset}: no state of {record.to} is stored (no tag {record.to}): nothing to roll back to")
    storage.tables.set_current_snapshot(spark, table, asset, target)
    storage.merged.drop_dates(spark, table, asset, done["dropped"])


def undo_last_rollback(spark: SparkSession, storage: WarehouseStorage, table: str) -> Rollback:
    """Undo the table's newest rollback that is done and not undone: each table back to the snapshot it had
    before it, current_table last. Refused, changing nothing, when a table was committed to since the
    rollback (a run of a later date: undoing would discard it) or its undo point is gone."""
    spark = storage.tables.session_for(spark)
    storage.hold_writer_lock(table)
    records = rollbacks(storage, table)
    if any(record.status == STARTED for record in records):
        require_no_unfinished_rollback(storage, table)
    undoable = [record for record in records if record.status == DONE]
    if not undoable:
        gone = [record for record in records if record.status == ERASED]
        why = f" (the undo point of the rollback to {gone[-1].to} is gone: {gone[-1].note})" if gone else ""
        raise RollbackError(f"{table}: no rollback to undo{why}")
    record = undoable[-1]
    problems = []
    for asset, done in record.assets.items():
        loaded = storage.tables.load(table, asset)
        now = None if loaded is None or loaded.current_snapshot() is None else loaded.current_snapshot().snapshot_id
        if now != done.get("after"):
            problems.append(f"{asset} was committed to since (its snapshot is {now}, the rollback left {done.get('after')})")
        elif record.tag not in loaded.metadata.refs:
            problems.append(f"{asset} has no undo point any more (tag {record.tag} expired after {record.keep_days} day(s))")
    if problems:
        raise RollbackError(
            f"{table}: the rollback to {record.to} (id {record.id}) cannot be undone, nothing was changed: {'; '.join(problems)}. "
            f"A run of a date after {record.to} since the rollback is the table's history now."
        )
    for asset in sorted(record.assets, key=lambda asset: (asset == _FIRST, asset)):
        done = record.assets[asset]
        identifier = table_identifier(table, asset)
        storage.tables.set_current_snapshot(spark, table, asset, done["before"])
        for day, snapshot in done.get("tags", {}).items():  # each date's tag back, with its own retention
            age_ms = done.get("tag_ages", {}).get(day)
            retain = "" if age_ms is None else f" RETAIN {math.ceil(age_ms / 60000)} MINUTES"
            spark.sql(f"ALTER TABLE {identifier} CREATE OR REPLACE TAG `{day}` AS OF VERSION {snapshot}{retain}")
            spark.sql(f"ALTER TABLE {identifier} DROP TAG IF EXISTS `{record.tag}_{day}`")
        if done.get("merged"):
            if done.get("properties"):
                listed = ", ".join(f"'{key}'='{value}'" for key, value in done["properties"].items())
                spark.sql(f"ALTER TABLE {identifier} SET TBLPROPERTIES ({listed})")
        spark.sql(f"ALTER TABLE {identifier} DROP TAG IF EXISTS `{record.tag}`")
    record.status, record.undone_at = UNDONE, _now()
    _save(storage, record)
    return record


def forget_undo_points(spark: SparkSession, storage: WarehouseStorage, table: str, why: str) -> list[str]:
    """Drop the undo tags of every rollback of the table that could still be undone (an erase: the
    snapshots they keep hold the keys); each such record says so. A rollback that stopped half-way loses
    its tags too and stays ``started`` (completing it is still owed). Returns the rollback ids."""
    spark = storage.tables.session_for(spark)
    forgotten = []
    for record in rollbacks(storage, table):
        if record.status not in (DONE, STARTED):
            continue
        for asset, done in record.assets.items():
            loaded = storage.tables.load(table, asset)
            if loaded is None:
                continue
            for name in list(loaded.metadata.refs):
                if name == record.tag or name.startswith(f"{record.tag}_"):
                    spark.sql(f"ALTER TABLE {table_identifier(table, asset)} DROP TAG IF EXISTS `{name}`")
        record.status, record.note = (ERASED if record.status == DONE else record.status), why
        _save(storage, record)
        forgotten.append(record.id)
    return forgotten
