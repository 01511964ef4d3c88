"""The checks' bodies, without Dagster: each date's reconciliations (rules in ``core/capture/reconcile.py``)
from what the warehouse stores and what the date's materializations recorded.

``recorded(asset, date, names)`` gives those figures; the Dagster checks (``cdc_assets/defs/checks.py``) read
them from the instance's latest materialization of the date. Stored rows are counted from the footers
where that suffices, and a range is measured in one aggregation per dataset, grouped by date.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import date
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_assets.core.capture.changes import NOT_SUPPLIED, OPERATION, no_operations
from cdc_assets.core.capture.reconcile import (
    KeyedFigures,
    Reconciliation,
    keyed_figures_by_date,
    operations_by_date,
    reconcile_change_set,
    reconcile_change_set_intake,
    reconcile_changes,
    reconcile_erased_keys,
    reconcile_held_by_reject,
    reconcile_incoming,
    reconcile_stored_state,
    reconcile_updates,
)
from cdc_assets.core.capture.schema import SchemaChangeError, schema_change, shared_tracked_columns, stored_spec, updates_equal_on_shared_columns
from cdc_assets.core.capture.state import untouched_operation
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.compare import CHANGED_COLUMNS
from cdc_assets.model.config import LoadType, TableConfig
from cdc_assets.model.names import CLASSIFICATION, CURRENT, HASHED_INCOMING, HISTORY, LATE_CHANGES, REJECTS, UPDATES, day_before
from cdc_assets.usecases.schema_changes import configured_spec
from resources.session.spark_session import side_by_side
from resources.storage import WarehouseStorage
from resources.storage.state import read_state, state_rows, stored_fields

# (asset name, ISO date, figure names) -> each figure as the asset's latest materialization of the date
# recorded it, 0 for one it did not record.
Recorded = Callable[[str, str, tuple[str, ...]], dict[str, int]]


def cdc_outcomes(
    spark: SparkSession, storage: WarehouseStorage, config: TableConfig, days: list[str], recorded: Recorded
) -> Iterator[tuple[str, list[Reconciliation]]]:
    """(date, outcomes) of the CDC checks, from what is stored and what the latest materializations recorded."""
    table, change_set = config.name, config.changes is not None
    incoming = storage.row_counts(table, HASHED_INCOMING, days)
    history = storage.row_counts(table, HISTORY, days)
    late = storage.row_counts(table, LATE_CHANGES, days) if change_set else {}
    updates_naming_none = _updates_naming_no_column(spark, storage, table, days)
    operations, (current, parts) = side_by_side(
        lambda: operations_by_date(storage.read(spark, table, CLASSIFICATION, days), BUSINESS_DATE),
        lambda: _state_figures(spark, storage, config, days),
    )
    for day in days:
        on, before = date.fromisoformat(day), date.fromisoformat(day_before(day))
        by_operation = _with_not_supplied(recorded, day, operations.get(on, no_operations()))
        stored: dict[str, Any] = dict(
            operations=by_operation,
            incoming_rows=incoming[day],
            previous_rows=current[before].rows if before in current else previous_state_rows(storage, config, day),
            current=current.get(on, KeyedFigures()),
            history_rows=history[day],
        )
        if change_set:
            figures: dict[str, Any] = recorded(CLASSIFICATION, day, ("winners", "superseded", "duplicate_events"))
            outcomes = reconcile_change_set(**stored, **figures, late_rows=late[day])
        else:
            outcomes = reconcile_changes(**stored)
        if config.load_type is LoadType.full:
            held = recorded(CLASSIFICATION, day, ("held_by_reject",))["held_by_reject"]
            outcomes.append(reconcile_held_by_reject(held, by_operation[NOT_SUPPLIED]))
        outcomes += _stored_part_outcomes(config, day, by_operation, parts)
        outcomes.append(_updates_outcome(spark, storage, config, day, updates_naming_none.get(on, 0)))
        yield day, outcomes


def intake_outcomes(
    spark: SparkSession, storage: WarehouseStorage, config: TableConfig, days: list[str], recorded: Recorded
) -> Iterator[tuple[str, Reconciliation]]:
    """(date, outcome) of the intake checks; row counts from the committed files' footers."""
    table = config.name
    rejected = storage.row_counts(table, REJECTS, days)
    names = ("rows_read", "tombstone_lines", "erased_keys_in_extract", "erased_records_set_aside")
    if config.changes is not None:
        accepted = storage.row_counts(table, HASHED_INCOMING, days)
        for day in days:
            read = recorded(HASHED_INCOMING, day, names)
            yield day, reconcile_change_set_intake(
                read["rows_read"], accepted[day], rejected[day], read["tombstone_lines"], read["erased_records_set_aside"]
            )
            yield day, reconcile_erased_keys(read["erased_keys_in_extract"], config.erased_keys.value)
        return
    # Distinct keys from one aggregation over the range.
    keyed = keyed_figures_by_date(storage.read(spark, table, HASHED_INCOMING, days), BUSINESS_DATE)
    for day in days:
        read = recorded(HASHED_INCOMING, day, names)
        distinct = keyed.get(date.fromisoformat(day), KeyedFigures())
        for outcome in reconcile_incoming(read["rows_read"], distinct, rejected[day], read["erased_records_set_aside"]):
            yield day, outcome
        yield day, reconcile_erased_keys(read["erased_keys_in_extract"], config.erased_keys.value)


def _with_not_supplied(recorded: Recorded, day: str, operations: dict[str, int]) -> dict[str, int]:
    """The date's operations as hash_join_classification stores them, and X as its materialization
    recorded it: a key a delta or change set did not supply is counted, not stored."""
    if operations.get(NOT_SUPPLIED):  # written by a release that stored X rows: they are all there
        return operations
    return {**operations, NOT_SUPPLIED: recorded(CLASSIFICATION, day, ("not_supplied",))["not_supplied"]}


def _state_figures(spark: SparkSession, storage: WarehouseStorage, config: TableConfig, days: list[str]):
    """current_table's figures per date as a state, and what each date stored (full copy or changes, rows).

    A date stored whole is measured as it is; a merged state's other dates count their rows from what
    is stored (the tag's summary, ``resources/storage/state.py``) and their keys from the rows the date's MERGE
    wrote (the rows of the tag whose ``operation_date`` is the date).
    """
    table = config.name
    stored_as = {day: storage.stored_as(table, CURRENT, day) for day in days}
    fulls = [day for day in days if stored_as[day] == "full"]
    changes = [day for day in days if stored_as[day] == "changes"]
    figures = {}
    if fulls:
        figures.update(keyed_figures_by_date(storage.read(spark, table, CURRENT, fulls), BUSINESS_DATE, config.key_names))
    parts = {date.fromisoformat(day): (True, figures.get(date.fromisoformat(day), KeyedFigures()).rows, 0) for day in fulls}
    if changes:
        written = reduce(DataFrame.unionByName, [storage.merged.touched(spark, table, CURRENT, day) for day in changes])
        stored = keyed_figures_by_date(written, BUSINESS_DATE, config.key_names)
        untouched = untouched_operation(config.load_type)
        untouched_written = {
            row[BUSINESS_DATE]: row["count"]
            for row in written.filter(F.col(OPERATION) == F.lit(untouched)).groupBy(BUSINESS_DATE).count().collect()
        }
        for day in changes:
            on = date.fromisoformat(day)
            part = stored.get(on, KeyedFigures())
            rows = state_rows(storage, table, CURRENT, day)
            # Keys the date's MERGE wrote twice are keys the state holds twice.
            figures[on] = KeyedFigures(rows, rows - (part.rows - part.distinct_keys), part.null_key_rows)
            parts[on] = (False, part.rows, untouched_written.get(on, 0))
    return figures, parts


def previous_state_rows(storage: WarehouseStorage, config: TableConfig, day: str) -> int:
    """Rows of the state the first date of a run was classified against (0 before the table's start).

    Only its rows enter the equations, so they are counted from what is stored (footers, and a change
    date's ``operation`` column), not by a scan of the state: its keys were checked on its own date, and
    on a big table with a small change that scan was most of the checks' time.
    """
    previous = day_before(day)
    if date.fromisoformat(previous) < config.start_date:
        return 0
    return state_rows(storage, config.name, CURRENT, previous)


def _updates_naming_no_column(spark: SparkSession, storage: WarehouseStorage, table: str, days: list[str]) -> dict[date, int]:
    """Updates whose changed_columns is empty, per date, in one aggregation over the range."""
    updates = storage.read(spark, table, UPDATES, days)
    if CHANGED_COLUMNS not in updates.columns:  # written by a release before changed_columns
        return {}
    unnamed = updates.filter(F.size(F.col(CHANGED_COLUMNS)) == 0).groupBy(BUSINESS_DATE).count()
    return {row[BUSINESS_DATE]: row["count"] for row in unnamed.collect()}


def _updates_outcome(spark: SparkSession, storage: WarehouseStorage, config: TableConfig, day: str, unnamed: int) -> Reconciliation:
    """Updates without a change: none on any date; on a date whose stored columns differ from the day
    before's, also none equal to the previous version in every shared tracked column (a scan of the
    previous state, on such dates only)."""
    table, configured = config.name, configured_spec(config)
    before, now = stored_fields(storage, table, CURRENT, day_before(day)), stored_fields(storage, table, CURRENT, day)
    if before is None or now is None:
        return reconcile_updates(unnamed)
    stored, written = stored_spec(before, configured), stored_spec(now, configured)
    if stored == written:
        return reconcile_updates(unnamed)
    renamed_from = {column.name: column.renamed_from for column in config.columns if column.renamed_from}
    try:
        change = schema_change(stored, written, renamed_from, table, config.source_file, day_before(day))
    except SchemaChangeError:  # only a declared re-baseline writes such a date: every key was compared anew
        return reconcile_updates(unnamed)
    updates = storage.read(spark, table, UPDATES, [day])
    previous = read_state(storage, spark, table, CURRENT, day_before(day))
    equal = updates_equal_on_shared_columns(updates, previous, shared_tracked_columns(stored, written, change)).count()
    return reconcile_updates(unnamed, equal, change.summary())


def _stored_part_outcomes(config: TableConfig, day: str, operations: dict[str, int], parts) -> list:
    if not config.storage.may_be_incremental:  # the check is not defined (cdc_assets/defs/checks.py)
        return []
    full_copy, rows, untouched_rows_stored = parts.get(date.fromisoformat(day), (False, 0, 0))
    return [reconcile_stored_state(operations, full_copy, rows, untouched_operation(config.load_type), untouched_rows_stored)]
