"""Planning a step's CDC over a date range: which strategy, what is cached, how the outputs are sized.

:func:`plan_changes` is what the CDC step runs, without Dagster: it takes the range's incoming rows
and the state before the range, and returns the six outputs as dated DataFrames ready to write,
with every date's operation counts (the guards and the metadata need them before anything is
written). The caller writes the outputs and then calls :meth:`ChangePlan.release`.

- A range of **full** loads is classified in one query (:func:`classify_full_loads`): after a full
  load the state is exactly that date's rows, so the previous state of date d is date d-1's rows.
- A **delta** load, and any single date, goes date by date, oldest first (:func:`classify_changes`):
  a key a delta does not supply keeps the payload of whichever date last supplied it, so a date's
  state is more than the date before's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.model.config import LoadType
from cdc_assets.core.caching import persist
from cdc_assets.core.capture import changes as cdc
from cdc_assets.core.capture.changeset import APPLIED_ON, DELETED, ChangeSetRules, apply_change_set
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.compare import CHANGED_COLUMNS
from cdc_assets.core.hashing import KEY_HASH
from cdc_assets.core.intake.columns import CHANGE_FLAG, TRUNCATE
from cdc_assets.core.capture.state import latest_rows, state_difference, stored_changes

# Rows per task when the outputs are written (at most the session's shuffle partitions). Each task
# writes a file per date it holds, so fewer tasks for fewer rows keeps a range of small dates from
# writing (tasks x dates) tiny files.
ROWS_PER_WRITE_TASK = 250_000


@dataclass
class ChangePlan:
    """A range's six CDC outputs, each a DataFrame dated by ``business_date``, and its counts by date."""

    classification: DataFrame
    inserts: DataFrame
    deletes: DataFrame
    updates: DataFrame
    current: DataFrame
    history: DataFrame
    counts: dict[date, dict[str, int]]  # every date of the range, all five operations
    # A changeset's late records and applied_sequences state, dated, and its figures by date.
    late: DataFrame | None = None
    sequences: DataFrame | None = None
    figures: dict[date, dict[str, int]] = field(default_factory=dict)
    # What an incremental state stores for each date (core/capture/state.py), dated; and, for the dates given,
    # the whole state (dated), as current holds it when it is the whole state.
    state_changes: DataFrame | None = None
    full_states: Callable[[Sequence[date]], DataFrame] | None = None
    # A change set's applied_sequences as an incremental state stores it: each date's changes, dated.
    sequence_changes: DataFrame | None = None
    _cached: list[DataFrame] = field(default_factory=list)

    def release(self) -> None:
        """Free what the plan cached; call it once the outputs are written (or the step failed)."""
        for frame in self._cached:
            frame.unpersist()
        self._cached.clear()


def write_tasks(rows: int, max_tasks: int) -> int:
    """How many tasks write ``rows`` rows: one per ``ROWS_PER_WRITE_TASK``, between 1 and ``max_tasks``."""
    return max(1, min(max_tasks, -(-rows // ROWS_PER_WRITE_TASK)))


def plan_changes(
    incoming: DataFrame,
    previous: DataFrame | None,
    business_dates: Sequence[date],
    load_type: LoadType,
    payload_columns: Sequence[str],
    max_write_tasks: int,
    previous_sequences: DataFrame | None = None,
    change_set_rules: ChangeSetRules | None = None,
    audit: cdc.RunAudit | None = None,
    non_key_columns: Sequence[str] | None = None,
    touched_keys_only: bool = False,
    previous_rows: int = 0,
    untracked_columns: Sequence[str] = (),
    held_keys: DataFrame | None = None,
) -> ChangePlan:
    """Classify every date of the range against the state the date before left; the outputs to write.

    ``incoming`` holds the range's accepted rows with a ``business_date`` column; ``previous`` is the
    stored ``current_table`` as of the day before the first date (None: no earlier state). With
    ``audit`` the outputs carry who wrote each row, with ``non_key_columns`` the changes carry
    ``changed_columns`` (see :func:`changes.classify_changes`). Runs the Spark jobs that classify and
    count (the outputs then read from a cache); nothing is written. A change set (``load_type:
    changeset``) needs ``previous_sequences`` (applied_sequences as of the day before) and its rules.

    A key a delta or change set does not supply (X) is counted, not written: ``classification`` holds
    the keys a date touched and ``deletes`` its D rows. With ``touched_keys_only`` (an incremental state,
    which stores a date's changes only) a delta, and a one-date change set without a truncate, read of
    the previous state only the keys the date supplies, and the X count is ``previous_rows`` (the
    previous state's rows) less the keys the date touched; ``current`` then holds the touched keys
    only, and ``full_states`` gives the whole state. ``untracked_columns`` name the payload columns that
    are neither keys nor tracked: a full load's N rows whose values of them changed are state changes too
    (:func:`state.stored_changes`). ``held_keys`` (``business_date``, ``key_hash``: a full load's keys with a
    rejected record on the date) are kept as they were, X, where the snapshot lacks them; with any, a range
    of full loads goes date by date.
    """
    dates = sorted(business_dates)
    # What every output row is annotated with: the run's audit stamp, and the non-key columns U rows name
    # in changed_columns.
    annotations = dict(audit=audit, non_key_columns=non_key_columns)
    if load_type is LoadType.changeset:
        one_date = previous is not None and previous_sequences is not None and len(dates) == 1
        if touched_keys_only and one_date and not _has_truncate(incoming):
            return _change_set_by_touched_keys(
                incoming, previous, previous_sequences, dates[0], payload_columns, max_write_tasks, change_set_rules,
                annotations, previous_rows,
            )
        return _change_sets_date_by_date(
            incoming, previous, previous_sequences, dates, payload_columns, max_write_tasks, change_set_rules, annotations
        )
    full_states = None
    if load_type is not LoadType.full:
        held_keys = None
    if load_type is LoadType.full and len(dates) > 1 and held_keys is None:
        classification, changed, counts, cached = _full_loads_in_one_query(incoming, previous, dates, payload_columns, annotations)
    elif load_type is LoadType.delta and touched_keys_only:
        classification, changed, counts, cached, full_states = _deltas_by_touched_keys(
            incoming, previous, dates, payload_columns, max_write_tasks, annotations, previous_rows
        )
    else:
        classification, changed, counts, cached = _date_by_date(
            incoming, previous, dates, load_type, payload_columns, max_write_tasks, annotations, held_keys
        )
    tasks = write_tasks(sum(sum(by_op.values()) for by_op in counts.values()), max_write_tasks)
    changed = changed.coalesce(tasks)
    current = cdc.build_current(changed)
    return ChangePlan(
        classification=_without_untouched(classification).coalesce(tasks),
        inserts=cdc.with_operations(changed, [cdc.INSERT]),
        deletes=cdc.with_operations(changed, [cdc.DELETE]),
        updates=cdc.with_operations(changed, [cdc.UPDATE]),
        current=current,
        history=cdc.build_history(changed),
        counts=counts,
        state_changes=stored_changes(changed, load_type, previous, dates, untracked_columns),
        full_states=full_states or _dates_of(current),
        _cached=cached,
    )


def _without_untouched(classification: DataFrame) -> DataFrame:
    """The classified keys a date touched: X (not supplied) is counted, not written."""
    return classification.filter(F.col(cdc.OPERATION) != F.lit(cdc.NOT_SUPPLIED))


def _dates_of(current: DataFrame) -> Callable[[Sequence[date]], DataFrame]:
    def full_states(days: Sequence[date]) -> DataFrame:
        return current.filter(F.col(BUSINESS_DATE).isin(*days))

    return full_states


def _counts_by_date(classification: DataFrame, dates: Sequence[date]) -> dict[date, dict[str, int]]:
    found: dict[date, dict[str, int]] = {}
    for row in classification.groupBy(BUSINESS_DATE, cdc.OPERATION).count().collect():
        found.setdefault(row[BUSINESS_DATE], cdc.no_operations())[row[cdc.OPERATION]] = row["count"]
    return {day: found.get(day, cdc.no_operations()) for day in dates}  # a date may have no rows


def _full_loads_in_one_query(incoming: DataFrame, previous: DataFrame | None, dates: list[date], payload_columns, annotations):
    classification = persist(cdc.classify_full_loads(incoming, previous, dates, annotations["audit"]))
    counts = _counts_by_date(classification, dates)
    totals = {op: sum(by_op[op] for by_op in counts.values()) for op in cdc.OPERATIONS}
    changed = cdc.join_payload_by_date(
        classification, incoming, previous, dates, payload_columns, totals, non_key_columns=annotations["non_key_columns"]
    )
    changed = persist(changed)  # six outputs are filtered from it
    return classification.select(*cdc.CLASSIFICATION_COLUMNS, BUSINESS_DATE), changed, counts, [changed, classification]


def _date_by_date(
    incoming, previous, dates: list[date], load_type: LoadType, payload_columns, max_partitions: int, annotations,
    held_keys: DataFrame | None = None,
):
    classified, changed, counts, cached = [], [], {}, []
    for day in dates:
        # Filtering on the partition column prunes the scan to the date's folder.
        rows = incoming.filter(F.col(BUSINESS_DATE) == F.lit(day)).drop(BUSINESS_DATE)
        held = None if held_keys is None else held_keys.filter(F.col(BUSINESS_DATE) == F.lit(day))
        changes = cdc.classify_changes(rows, previous, day, load_type, payload_columns, **annotations, held=held)
        if len(dates) > 1:
            # A local checkpoint (not a cache) cuts the lineage: the next date's plan starts from this
            # date's rows instead of nesting every earlier date's plan (a 10-day range failed). The
            # cap keeps the partitions from growing date by date.
            changes = changes.coalesce(max_partitions).localCheckpoint()
        else:
            changes = persist(changes)  # six outputs are filtered from it
        cached.append(changes)
        counts[day] = cdc.count_operations(changes)
        dated = F.lit(day).alias(BUSINESS_DATE)
        classified.append(changes.select(*cdc.CLASSIFICATION_COLUMNS, dated))
        changed.append(changes.select("*", dated))
        previous = cdc.build_current(changes)  # the next date classifies against this date's state
    return reduce(DataFrame.unionByName, classified), reduce(DataFrame.unionByName, changed), counts, cached


def _deltas_by_touched_keys(incoming, previous, dates: list[date], payload_columns, max_partitions: int, annotations, previous_rows: int):
    """Deltas date by date against the previous state's rows of the keys each date supplies only.

    A key a delta does not supply is X: kept as it was, so nothing needs to be read of it. Each date's
    previous rows are the newest of the stored state's and the range's earlier dates' for its keys (a
    broadcast semi join: the state is scanned, not shuffled). X is counted: the previous state's rows
    less the keys the date touched.
    """
    day_before_range = F.lit(dates[0] - timedelta(days=1)).cast("date")
    before = None if previous is None else previous.withColumn(BUSINESS_DATE, day_before_range)
    classified: list[DataFrame] = []
    changed: list[DataFrame] = []
    counts: dict[date, dict[str, int]] = {}
    cached: list[DataFrame] = []
    earlier: list[DataFrame] = []
    rows_before = previous_rows
    for day in dates:
        rows = incoming.filter(F.col(BUSINESS_DATE) == F.lit(day)).drop(BUSINESS_DATE)
        keys = F.broadcast(rows.select(KEY_HASH))
        parts = [part.join(keys, on=KEY_HASH, how="left_semi") for part in ([before] if before is not None else []) + earlier]
        previous_rows_of_keys = latest_rows(parts, BUSINESS_DATE).drop(BUSINESS_DATE) if parts else None
        changes = cdc.classify_changes(rows, previous_rows_of_keys, day, LoadType.delta, payload_columns, **annotations)
        changes = changes.coalesce(max_partitions).localCheckpoint() if len(dates) > 1 else persist(changes)
        cached.append(changes)
        by_op = cdc.count_operations(changes)
        by_op[cdc.NOT_SUPPLIED] = rows_before - by_op[cdc.UPDATE] - by_op[cdc.UNCHANGED]
        counts[day] = by_op
        rows_before += by_op[cdc.INSERT]
        dated = F.lit(day).alias(BUSINESS_DATE)
        classified.append(changes.select(*cdc.CLASSIFICATION_COLUMNS, dated))
        changed.append(changes.select("*", dated))
        earlier.append(cdc.build_current(changes).select("*", dated))

    def full_states(days: Sequence[date]) -> DataFrame:
        states = []
        for day in days:
            parts = ([before] if before is not None else []) + [part for part, on in zip(earlier, dates) if on <= day]
            on_day = F.lit(day).cast("date")
            latest = latest_rows(parts, BUSINESS_DATE)
            # A key the date did not touch is X as of the date, whatever operation its row was stored with.
            operation = F.when(F.col(BUSINESS_DATE) == on_day, F.col(cdc.OPERATION)).otherwise(F.lit(cdc.NOT_SUPPLIED))
            states.append(latest.withColumns({cdc.OPERATION: operation, BUSINESS_DATE: on_day}))
        return reduce(DataFrame.unionByName, states)

    return reduce(DataFrame.unionByName, classified), reduce(DataFrame.unionByName, changed), counts, cached, full_states


def _has_truncate(incoming: DataFrame) -> bool:
    """Whether a change set's records hold a truncate, which changes every key of the state."""
    return incoming.filter(F.col(CHANGE_FLAG) == F.lit(TRUNCATE)).limit(1).count() > 0


def _change_set_by_touched_keys(
    incoming, previous, previous_sequences, day: date, payload_columns, max_partitions: int, rules, annotations, previous_rows: int
) -> ChangePlan:
    """One date of a change set without a truncate against the previous state's rows of the keys its
    records name only (an incremental state): a key the day does not touch is X, kept as it was.

    Both states, current's and applied_sequences', are semi joined with the day's keys (broadcast: the
    states are scanned, not shuffled); applied_sequences keeps its floor. The day's applied_sequences
    changes are its touched keys' entries that are new or differ, and the tombstones of untouched
    keys that expire on the day (D). X is counted: the previous state's rows less the held keys the
    day touched (U, N and D).
    """
    records = incoming.filter(F.col(BUSINESS_DATE) == F.lit(day)).drop(BUSINESS_DATE)
    keys = F.broadcast(records.filter(F.col(KEY_HASH).isNotNull()).select(KEY_HASH).distinct())
    held = previous.join(keys, on=KEY_HASH, how="left_semi")
    floor = previous_sequences.filter(F.col(KEY_HASH).isNull())
    entries = previous_sequences.join(keys, on=KEY_HASH, how="left_semi").unionByName(floor)
    result = apply_change_set(records, held, entries, day, payload_columns, rules, **annotations)
    changes = result.changes
    counts = dict(result.counts)
    counts[cdc.NOT_SUPPLIED] = previous_rows - counts[cdc.UPDATE] - counts[cdc.UNCHANGED] - counts[cdc.DELETE]
    dated = F.lit(day).alias(BUSINESS_DATE)
    on_day = F.lit(day).cast("date")
    expired = previous_sequences.filter(
        F.col(KEY_HASH).isNotNull() & F.col(DELETED) & (F.date_diff(on_day, F.col(APPLIED_ON)) >= F.lit(rules.tombstone_retention_days))
    ).join(keys, on=KEY_HASH, how="left_anti")
    sequence_changes = state_difference(entries, result.state).unionByName(expired.withColumn(cdc.OPERATION, F.lit(cdc.DELETE)))
    tasks = write_tasks(sum(counts.values()) - counts[cdc.NOT_SUPPLIED], max_partitions)
    changed = changes.select("*", dated).coalesce(tasks)
    sequence_changes = sequence_changes.select("*", dated).coalesce(tasks)
    day_before = F.lit(day - timedelta(days=1)).cast("date")

    def full_states(days: Sequence[date]) -> DataFrame:
        if list(days) != [day]:
            raise ValueError(f"the plan holds the state of {day} only, not of {list(days)}")
        # The day's rows over the previous state's; a key whose newest row is a D leaves.
        todays = changes.drop(CHANGED_COLUMNS).select(*previous.columns, dated)
        latest = latest_rows([previous.withColumn(BUSINESS_DATE, day_before), todays], BUSINESS_DATE)
        operation = F.when(F.col(BUSINESS_DATE) == on_day, F.col(cdc.OPERATION)).otherwise(F.lit(cdc.NOT_SUPPLIED))
        return latest.withColumns({cdc.OPERATION: operation, BUSINESS_DATE: on_day})

    # applied_sequences as of the day (read only when the day stores a full copy): the changes over the previous.
    marked = previous_sequences.withColumns({cdc.OPERATION: F.lit(cdc.UPDATE), BUSINESS_DATE: day_before})
    sequences = latest_rows([marked, sequence_changes], BUSINESS_DATE).drop(cdc.OPERATION).withColumn(BUSINESS_DATE, on_day)
    return ChangePlan(
        classification=_without_untouched(changes.select(*cdc.CLASSIFICATION_COLUMNS, dated)).coalesce(tasks),
        inserts=cdc.with_operations(changed, [cdc.INSERT]),
        deletes=cdc.with_operations(changed, [cdc.DELETE]),
        updates=cdc.with_operations(changed, [cdc.UPDATE]),
        current=cdc.build_current(changed),
        history=cdc.build_history(changed),
        counts={day: counts},
        late=result.late.select("*", dated).coalesce(1),
        sequences=sequences,
        figures={day: result.figures},
        state_changes=stored_changes(changed, LoadType.changeset),
        full_states=full_states,
        sequence_changes=sequence_changes,
        _cached=list(result.cached),
    )


def _change_sets_date_by_date(
    incoming, previous, previous_sequences, dates: list[date], payload_columns, max_partitions: int, rules, annotations
) -> ChangePlan:
    """Change sets go date by date, oldest first: a date's late records depend on every earlier date."""
    classified: list[DataFrame] = []
    changed: list[DataFrame] = []
    late: list[DataFrame] = []
    sequences: list[DataFrame] = []
    counts: dict[date, dict[str, int]] = {}
    figures: dict[date, dict[str, int]] = {}
    cached: list[DataFrame] = []
    sequence_changes: list[DataFrame] = []
    for day in dates:
        records = incoming.filter(F.col(BUSINESS_DATE) == F.lit(day)).drop(BUSINESS_DATE)
        try:
            result = apply_change_set(records, previous, previous_sequences, day, payload_columns, rules, **annotations)
        except Exception:
            for frame in cached:  # a tie fails the range: nothing of it is kept
                frame.unpersist()
            raise
        changes, state = result.changes, result.state
        if len(dates) > 1:
            # As for deltas: a local checkpoint keeps the next date's plan from nesting this one's.
            changes = changes.coalesce(max_partitions).localCheckpoint()
            state = state.coalesce(max_partitions).localCheckpoint()
            cached += [changes, state]
        cached += result.cached
        counts[day], figures[day] = result.counts, result.figures
        dated = F.lit(day).alias(BUSINESS_DATE)
        classified.append(changes.select(*cdc.CLASSIFICATION_COLUMNS, dated))
        changed.append(changes.select("*", dated))
        late.append(result.late.select("*", dated))
        sequences.append(state.select("*", dated))
        sequence_changes.append(state_difference(previous_sequences, state).select("*", dated))
        previous, previous_sequences = cdc.build_current(changes), state
    tasks = write_tasks(sum(sum(by_op.values()) for by_op in counts.values()), max_partitions)
    changed_all = reduce(DataFrame.unionByName, changed).coalesce(tasks)
    current = cdc.build_current(changed_all)
    return ChangePlan(
        classification=_without_untouched(reduce(DataFrame.unionByName, classified)).coalesce(tasks),
        inserts=cdc.with_operations(changed_all, [cdc.INSERT]),
        deletes=cdc.with_operations(changed_all, [cdc.DELETE]),
        updates=cdc.with_operations(changed_all, [cdc.UPDATE]),
        current=current,
        history=cdc.build_history(changed_all),
        state_changes=stored_changes(changed_all, LoadType.changeset),
        full_states=_dates_of(current),
        counts=counts,
        late=reduce(DataFrame.unionByName, late).coalesce(1),
        sequences=reduce(DataFrame.unionByName, sequences).coalesce(tasks),
        sequence_changes=reduce(DataFrame.unionByName, sequence_changes).coalesce(tasks),
        figures=figures,
        _cached=cached,
    )
