"""The CDC step's body, without Dagster: a range of dates classified against the state as of the day
before, guarded, and turned into what each output stores.

The Dagster step (``cdc_assets/defs/factory.py``) gathers what only Dagster knows (the run's id and start,
its run config, the dates its backfill targets), calls :func:`decide_rerun` and :func:`capture_changes`,
records the :class:`Capture`'s figures on the materializations, and hands each of :meth:`Capture.outputs`
to the IO manager. A script or a test calls the same two functions with a ``logging.Logger``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, TypeVar, cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_assets.core.capture import changes as cdc
from cdc_assets.core.capture.changeset import ChangeSetRules
from cdc_assets.core.capture.guards import MassDeleteError, deletion_problem
from cdc_assets.core.capture.plan import ChangePlan, plan_changes
from cdc_assets.core.capture.corrections import CHANGED, SAMPLE, class_changes
from cdc_assets.core.capture.rerun import LaterDatesStoredError, RerunDecision, require_wholly_stored, rerun_decision
from cdc_assets.core.capture.schema import migrate_state, values_for_added_columns, with_hash_spec
from cdc_assets.core.capture.state import StateSince, compaction_due, untouched_operation
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.hashing import KEY_HASH
from cdc_assets.core.intake.columns import CHANGE_SEQUENCE
from cdc_assets.core.intake.incoming import rejected_keys
from cdc_assets.model.config import DuplicateKeyPolicy, LoadType, Retention, TableConfig
from cdc_assets.model.masking import ValueMask
from cdc_assets.model.names import (
    APPLIED_SEQUENCES,
    CLASSIFICATION,
    CURRENT,
    DELETES,
    HASHED_INCOMING,
    HISTORY,
    INSERTS,
    LATE_CHANGES,
    REJECTS,
    UPDATES,
    cdc_outputs,
    day_before,
    pool_name,
)
from cdc_assets.usecases.schema_changes import SchemaEvolution, configured_spec, evolution_since
from cdc_assets.usecases.step_log import StageClock, StepLog, span
from resources.session.spark_session import SCHEDULER_POOL
from resources.storage import WarehouseStorage
from resources.storage.rollback import require_no_unfinished_rollback
from resources.storage.state import (
    CHANGE_DATES_SINCE_FULL_COPY,
    CHANGE_ROWS_SINCE_FULL_COPY,
    FULL_COPY_ROWS,
    state_rows,
    state_since_full,
)
from resources.storage.writes import DatedRows, StateRows


T = TypeVar("T")


def _planned(value: T | None, what: str) -> T:
    """A part of the plan that its kind of table always has (a change set's sequences, an incremental state's changes)."""
    if value is None:
        raise RuntimeError(f"the plan has no {what}")
    return value


@dataclass(frozen=True)
class CaptureRun:
    """What the run says of itself: its id and start (stamped on the rows it writes), its run config's
    switches, and the dates of current_table its backfill targets (None outside a backfill: :func:`decide_rerun`)."""

    run_id: str
    started_at: datetime  # timezone-aware, UTC
    rebaseline: bool = False
    allow_mass_delete: bool = False
    backfill_dates: set[str] | None = None
    # A re-run of dates that later stored dates were computed from recomputes those too (from their stored
    # intake) and writes them in the same commits, instead of being refused (cdc_assets/core/capture/rerun.py).
    carry_forward: bool = False


@dataclass
class Capture:
    """A planned range: per date, its counts by operation and its other figures; the schema change it
    applies (on its first date); the mass deletes the run accepted; and each output's rows (:meth:`outputs`).
    :meth:`release` frees what the plan cached, once every output is written."""

    table: TableConfig
    days: list[str]
    run: CaptureRun
    plan: ChangePlan
    storage: WarehouseStorage
    previous_rows: int
    has_previous: bool
    evolution: SchemaEvolution | None
    log: StepLog
    # A re-run inside a backfill that recomputes the later stored dates: each output drops those after
    # this date in the commit that writes the run's dates.
    drop_stored_after: str | None = None
    # A correction that flows forward: the later stored dates this run recomputes (in ``days`` too, after the run's own).
    carried: list[str] = field(default_factory=list)
    # Per date the correction rewrote: the keys whose class changed against what was stored, and a sample of their hashes.
    corrections: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    figures: dict[str, dict[str, int]] = field(default_factory=dict)
    mass_deletes_accepted: dict[str, str] = field(default_factory=dict)  # {date: the guard's problem}
    guarded: bool = False

    def guard(self) -> None:
        """Every date against the table's deletion guards: a mass delete the run does not allow raises
        :class:`MassDeleteError`, one it allows is kept in :attr:`mass_deletes_accepted`. Nothing is written
        until every date of the range has passed (:meth:`outputs` guards first)."""
        if self.guarded:
            return
        for day in self.days:
            problem = deletion_problem(self.table, day, self.counts[day])
            if problem is None:
                continue
            if not self.run.allow_mass_delete:
                raise MassDeleteError(
                    f"{problem}. No CDC output was written for this date (hashed_incoming holds the extract as "
                    "read). If the source really deleted these rows, re-run with run config "
                    f"ops: {{{self.table.name}__cdc: {{config: {{allow_mass_delete: true}}}}}}."
                )
            self.log.warning(f"{problem}; accepted because the run sets allow_mass_delete")
            self.mass_deletes_accepted[day] = problem
        self.guarded = True

    @property
    def schema_changed(self) -> bool:
        return self.evolution is not None and self.evolution.applies

    @property
    def rebaselined(self) -> bool:
        """Whether the first date applies a re-baseline the run declared."""
        return self.evolution is not None and self.evolution.applies and self.evolution.rebaseline

    def schema_change(self) -> dict[str, Any] | None:
        """The first date's change of columns (and whether it was a declared re-baseline), or None."""
        if self.evolution is None or not self.evolution.applies:
            return None
        return {**self.evolution.change.describe(), "rebaseline": self.evolution.rebaseline}

    def operation_counts(self, day: str) -> dict[str, int]:
        """What a date's classification, current_table and history materializations record."""
        counts = self.counts[day]
        return {
            "inserts": counts[cdc.INSERT],
            "updates": counts[cdc.UPDATE],
            "deletes": counts[cdc.DELETE],
            "not_supplied": counts[cdc.NOT_SUPPLIED],
            "unchanged": counts[cdc.UNCHANGED],
            **self.figures.get(day, {}),  # a changeset's winners, superseded, late, duplicate events, deletes of unknown keys
        }

    def correction_figures(self, day: str) -> dict[str, Any]:
        """What a correction changed on a date it rewrote (its classification's metadata); empty otherwise."""
        return dict(self.corrections.get(day, {}))

    def _carried_metadata(self, name: str) -> dict[str, dict[str, Any]]:
        """The figures each carried date's materialization of output ``name`` records (the run's own dates'
        the Dagster step records)."""
        if name not in (CLASSIFICATION, CURRENT, HISTORY):
            return {}
        extra = self.correction_figures if name == CLASSIFICATION else (lambda day: {})
        return {day: {**self.operation_counts(day), **extra(day)} for day in self.carried}

    def summary(self) -> str:
        return "\n".join(
            f"{self.table.name} {day}: " + ", ".join(f"{op}={n}" for op, n in {**self.counts[day], **self.figures.get(day, {})}.items())
            for day in self.days
        )

    def outputs(self) -> Iterator[tuple[str, DatedRows | StateRows]]:
        """Each output's rows for every date of the range, in the order they are written (an incremental
        state's after the staging outputs, and a change set's sequences after it). Guards the range first."""
        self.guard()
        table, plan, drop_after = self.table, self.plan, self.drop_stored_after
        spec = configured_spec(table)
        frames: dict[str, DataFrame | None] = {
            CLASSIFICATION: plan.classification,
            INSERTS: plan.inserts,
            UPDATES: plan.updates,
            DELETES: plan.deletes,
            CURRENT: plan.current,
            HISTORY: plan.history,
            LATE_CHANGES: plan.late,
            APPLIED_SEQUENCES: plan.sequences,
        }
        # retention.current_days drops current_table and, beside it, a change set's applied_sequences (both
        # are a whole state per date, read as of the day before); retention.staging_days the classification
        # and late_changes, which no later date reads. History is never dropped, nor inserts/updates/deletes.
        kept = table.retention or Retention()
        state: StateRows | None = None
        for name in cdc_outputs(table):
            dropped = kept.current_days if name in (CURRENT, APPLIED_SEQUENCES) else None
            if name == CURRENT and table.storage.incremental:
                state = self._incremental_state(spec, dropped, kept.snapshot_days)
                yield name, state
            elif name == APPLIED_SEQUENCES and table.storage.incremental:
                # Compacted together with current_table (written before it): full copies on the same dates.
                state = _planned(state, CURRENT)
                sequences = _planned(plan.sequences, APPLIED_SEQUENCES)
                full = sequences.filter(F.col(BUSINESS_DATE).isin(*state.full_dates)) if state.full_dates else None
                yield name, StateRows(
                    _planned(plan.sequence_changes, "sequence changes"), full, state.full_dates, untouched=state.untouched, retention_current_days=dropped,
                    retention_snapshot_days=kept.snapshot_days, drop_stored_after=drop_after, carried=tuple(self.carried),
                )
            else:
                # current_table carries the columns its hashes cover, for the next date to compare with.
                planned = _planned(frames[name], name)
                frame = with_hash_spec(planned, spec) if name == CURRENT else planned
                staging = kept.staging_days if name in (CLASSIFICATION, LATE_CHANGES) else None
                yield name, DatedRows(
                    frame, retention_current_days=dropped, retention_staging_days=staging,
                    retention_snapshot_days=kept.snapshot_days, drop_stored_after=drop_after,
                    carried=tuple(self.carried), carried_metadata=self._carried_metadata(name),
                )  # fmt: skip

    def _incremental_state(self, spec, current_days: int | None, snapshot_days: int | None) -> StateRows:
        """What an incremental (merged) current_table stores for each date: its changes, applied with one
        MERGE, or the whole state when ``storage.compact_after_share`` / ``compact_after_dates`` say so
        (compaction: a copy without position deletes), when there is no earlier state, or when the date's
        columns changed (a date's changes have the columns of the date before)."""
        table, plan, days = self.table, self.plan, self.days
        since = state_since_full(self.storage, table.name, CURRENT, day_before(days[0])) if self.has_previous else None
        rows, full_dates, metadata, properties, notes = self.previous_rows, [], {}, {}, []
        for day in days:
            counts = plan.counts[date.fromisoformat(day)]
            change_rows = sum(n for op, n in counts.items() if op != untouched_operation(table.load_type))
            rows += counts[cdc.INSERT] - counts[cdc.DELETE]
            grown = None if since is None else StateSince(since.full_rows, since.change_dates + 1, since.change_rows + change_rows)
            # A truncate changes the whole state (and a change set's floor): stored as a full copy.
            truncated = plan.figures.get(date.fromisoformat(day), {}).get("truncates", 0) > 0
            new_schema = self.schema_changed and day == days[0]
            if grown is None or compaction_due(grown, table.storage) or truncated or new_schema:
                full_dates.append(day)
                reason = "no earlier state" if grown is None else "a truncate" if truncated else "a schema change" if new_schema else (
                    f"{grown.change_rows} change rows over {grown.change_dates} date(s) since the last full copy "
                    f"({grown.full_rows} rows)"
                )
                notes.append(f"{table.name} {day}: compaction, storing a full copy of the state ({rows} rows): {reason}")
                since = StateSince(rows, 0, 0)
            else:
                since = grown
            metadata[day] = {
                "state_rows": rows,
                "change_rows_since_full_copy": since.change_rows,
                "change_dates_since_full_copy": since.change_dates,
            }
            # Recorded in the date's snapshot, for the next run's compaction decision (resources/storage/state.py).
            properties[day] = {
                FULL_COPY_ROWS: str(since.full_rows),
                CHANGE_DATES_SINCE_FULL_COPY: str(since.change_dates),
                CHANGE_ROWS_SINCE_FULL_COPY: str(since.change_rows),
            }
        if notes:
            self.log.info("\n".join(notes))
        for day in self.carried:  # their materializations are the IO manager's to record, with these figures
            metadata[day] = {**metadata[day], **self.operation_counts(day)}
        full = _planned(plan.full_states, "full states")([date.fromisoformat(day) for day in full_dates]) if full_dates else None
        return StateRows(
            changes=with_hash_spec(_planned(plan.state_changes, "state changes"), spec),
            full=None if full is None else with_hash_spec(full, spec),
            full_dates=tuple(full_dates),
            untouched=untouched_operation(table.load_type),
            retention_current_days=current_days,
            retention_snapshot_days=snapshot_days,
            metadata=metadata,
            properties=properties,
            drop_stored_after=self.drop_stored_after,
            carried=tuple(self.carried),
        )

    def release(self) -> None:
        self.plan.release()


def decide_rerun(
    storage: WarehouseStorage, table: TableConfig, days: list[str], backfill_dates: set[str] | None, carry_forward: bool = False
) -> RerunDecision:
    """Whether a run may write ``days`` while current_table stores later dates (cdc_assets/core/capture/rerun.py),
    given the dates of current_table its backfill targets (None outside a backfill). Takes the table's
    writer lock first and keeps it for the run: no run adds a date between this look and the run's writes.
    A rollback of the table that stopped half-way refuses the run (resources/storage/rollback.py)."""
    storage.hold_writer_lock(table.name)
    require_no_unfinished_rollback(storage, table.name)
    stored = storage.stored_dates(table.name, CURRENT)
    later = bool(stored) and stored[-1] > max(days)
    intake = set(storage.stored_dates(table.name, HASHED_INCOMING)) if carry_forward and later else set()
    return rerun_decision(table.name, days, stored, backfill_dates, carry_forward, intake)


def require_previous_wholly_stored(storage: WarehouseStorage, table: TableConfig, days: list[str]) -> None:
    """Refuse to build ``days`` on a day before whose run stopped after committing current_table but before
    an output it commits later (history_partition, a change set's late_changes and applied_sequences):
    checked from the tables, not from Dagster's records. A table's first date builds on nothing."""
    previous = day_before(days[0])
    if date.fromisoformat(previous) < table.start_date or not storage.has_partition(table.name, CURRENT, previous):
        return
    outputs = cdc_outputs(table)
    after_current = outputs[outputs.index(CURRENT) + 1:]
    missing = [
        name for name in after_current
        if not storage.has_partition(table.name, name, previous) and storage.dropped_partition(table.name, name, previous) is None
    ]  # fmt: skip
    require_wholly_stored(table.name, days, previous, missing)


def capture_changes(
    spark: SparkSession,
    storage: WarehouseStorage,
    table: TableConfig,
    days: list[str],
    incoming: DataFrame,
    previous_state: DataFrame | None,
    previous_sequences: DataFrame | None,
    run: CaptureRun,
    log: StepLog,
) -> Capture:
    """Plan ``days`` (oldest first; ``incoming`` their hashed rows, dated) against ``previous_state``, the
    state as of the day before the first (None on a table's first date), once :func:`decide_rerun` lets
    the run write them. :meth:`Capture.guard` (which
    :meth:`Capture.outputs` calls first) refuses a mass delete the run does not allow."""
    first_previous, clock, rules = day_before(days[0]), StageClock(log, table.name, days), change_set_rules(table)
    if table.storage.current is None:  # NEW_TABLE_STATE_FORM for a table with no state stored yet, else the layout it has
        table = table.with_state_stored(storage.stored_state_form(table.name))
    # A run that later stored dates were computed from: refused, or (inside a backfill that recomputes
    # them) each output drops them in the same commit as it writes the run's dates.
    decision = decide_rerun(storage, table, days, run.backfill_dates, run.carry_forward)
    require_previous_wholly_stored(storage, table, days)
    if decision.dropped:
        log.info(
            f"{table.name}: this run is part of a backfill that recomputes {', '.join(decision.dropped)}; each output "
            f"drops them in the commit that writes {span(days)}, and the backfill's later runs write them again"
        )
    run_days, carried = list(days), list(decision.carried)
    if carried:
        log.info(
            f"{table.name}: a correction of {span(run_days)}: the stored dates {span(carried)} were computed from it, so "
            f"they are recomputed here from their stored hashed_incoming and written in the same commits"
        )
        incoming = incoming.unionByName(stored_intake(spark, storage, table, run_days, carried, incoming))
        days = run_days + carried
    spark.conf.set(SCHEDULER_POOL, pool_name(table))
    incremental = table.storage.incremental
    # An incremental state's rows are counted from what is stored, not by reading the state.
    previous_rows = state_rows(storage, table.name, CURRENT, first_previous) if incremental and previous_state is not None else 0
    evolution = evolution_since(storage, table, first_previous, rebaseline=run.rebaseline) if previous_state is not None else None
    if previous_state is not None and evolution is not None and evolution.applies:
        previous_state = _in_new_schema(log, table, previous_state, incoming, evolution, days[0])
    with clock.timed("classification"):
        plan = plan_changes(
            incoming,
            previous_state,
            [date.fromisoformat(day) for day in days],
            table.load_type,
            [column.name for column in table.columns],
            max_write_tasks=int(cast(str, spark.conf.get("spark.sql.shuffle.partitions"))),
            previous_sequences=previous_sequences,
            change_set_rules=rules,
            audit=cdc.RunAudit(run.run_id, run.started_at),
            non_key_columns=[column.name for column in table.non_keys],
            touched_keys_only=incremental,
            previous_rows=previous_rows,
            untracked_columns=[column.name for column in table.untracked_columns],
            held_keys=keys_held_by_rejects(spark, storage, table, days),
        )
    capture = Capture(
        table, list(days), run, plan, storage, previous_rows, previous_state is not None, evolution, log,
        drop_stored_after=days[-1] if decision.dropped else None, carried=carried,
    )
    try:
        if carried:
            with clock.timed("comparing with what was stored"):
                capture.corrections = correction_figures(spark, storage, table, days, plan.classification)
        capture.counts = {day.isoformat(): by_op for day, by_op in plan.counts.items()}
        capture.figures = {day.isoformat(): found for day, found in plan.figures.items()}
        if table.load_type is LoadType.full:  # a full load's X: a key kept as it was for its rejected record
            for day in days:
                capture.figures.setdefault(day, {})[HELD_BY_REJECT] = capture.counts[day][cdc.NOT_SUPPLIED]
        log.info(capture.summary())
    except BaseException:
        capture.release()
        raise
    return capture


HELD_BY_REJECT = "held_by_reject"


def stored_intake(
    spark: SparkSession, storage: WarehouseStorage, table: TableConfig, run_days: list[str], carried: list[str], incoming: DataFrame
) -> DataFrame:
    """The stored hashed_incoming of ``carried`` (later dates a correction recomputes) with ``incoming``'s
    columns. Refused, naming the range to launch, when a date was stored with other columns: a correction
    carries forward within one definition of the table."""
    columns = sorted(f.name for f in incoming.schema.fields if f.name != BUSINESS_DATE)
    for day in carried:
        stored = sorted(f.name for f in storage.stored_schema(table.name, HASHED_INCOMING, day).fields)
        if stored != columns:
            raise LaterDatesStoredError(
                f"{table.name}: the run of {span(run_days)} is refused, nothing was written: it would recompute the later "
                f"stored dates {span(carried)}, but {day}'s hashed_incoming has other columns ({', '.join(stored)}) than "
                f"this run's ({', '.join(columns)}). Launch {run_days[0]}..{carried[-1]} as one run instead."
            )
    schema = StructType([f for f in incoming.schema.fields if f.name != BUSINESS_DATE])
    return storage.read(spark, table.name, HASHED_INCOMING, carried, schema).select(*incoming.columns)


def correction_figures(
    spark: SparkSession, storage: WarehouseStorage, table: TableConfig, days: list[str], classification: DataFrame | None
) -> dict[str, dict[str, Any]]:
    """Per date of ``days`` whose classification was stored: how many keys changed class against it, and
    up to 5 of their hashes (never values). Read before the run's writes replace it."""
    compared = [day for day in days if storage.has_partition(table.name, CLASSIFICATION, day)]
    if not compared or classification is None:
        return {}
    before = storage.read(spark, table.name, CLASSIFICATION, compared).select(KEY_HASH, cdc.OPERATION, BUSINESS_DATE)
    on_dates = F.col(BUSINESS_DATE).isin(*[F.lit(day).cast("date") for day in compared])
    after = classification.where(on_dates).select(KEY_HASH, cdc.OPERATION, BUSINESS_DATE)
    found = {row[BUSINESS_DATE].isoformat(): row for row in class_changes(before, after).collect()}
    return {
        day: {
            "correction_changed_keys": found[day][CHANGED] if day in found else 0,
            "correction_sample_key_hashes": list(found[day][SAMPLE] or []) if day in found else [],
        }
        for day in compared
    }


def keys_held_by_rejects(spark: SparkSession, storage: WarehouseStorage, table: TableConfig, days: list[str]) -> DataFrame | None:
    """A full load's keys (``business_date``, ``key_hash``) with a rejected record on a date of ``days``: the
    CDC step keeps each as it was instead of deleting it (X, counted as held_by_reject). Read from the
    stored rejects, their keys parsed from the raw records; None for another load type or no rejects
    (counted from the footers, no Spark job)."""
    if table.load_type is not LoadType.full:  # a delta's or change set's absent key is X already
        return None
    if not any(storage.row_counts(table.name, REJECTS, days).values()):
        return None
    return rejected_keys(storage.read(spark, table.name, REJECTS, days), table)


def _in_new_schema(log: StepLog, table: TableConfig, previous_state: DataFrame, incoming: DataFrame, evolution, first_day: str) -> DataFrame:
    """The previous state brought into the config's columns (core/capture/schema.py), for a date whose columns changed."""
    what = "a declared re-baseline" if evolution.rebaseline else evolution.change.summary()
    log.info(
        f"{table.name} {first_day}: schema change since the state stored as of {evolution.stored_as_of} ({what}); "
        "the previous state is compared in the new schema, and this date stores a full copy"
    )
    first_rows = incoming.filter(F.col(BUSINESS_DATE) == F.lit(first_day).cast("date"))
    sequence = CHANGE_SEQUENCE if table.changes is not None else None
    values = values_for_added_columns(first_rows, evolution.change, evolution.configured, order_by=sequence)
    return migrate_state(previous_state, evolution.stored, evolution.configured, evolution.change, values, evolution.rebaseline)


def change_set_rules(table: TableConfig) -> ChangeSetRules | None:
    """A change set's rules from its table config; None for a table that is not one."""
    if table.changes is None:
        return None
    return ChangeSetRules(
        table=table.name,
        key_columns=tuple(table.key_names),
        tombstone_retention_days=table.changes.tombstone_retention_days,
        quarantine_ties=table.duplicate_keys is DuplicateKeyPolicy.quarantine,
        hashed_non_keys=tuple((column.name, column.type) for column in table.non_keys),
        mask=ValueMask.for_table(table),
    )
