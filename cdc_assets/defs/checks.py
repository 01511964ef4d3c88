"""Asset checks that reconcile each date's stored outputs (rules in ``core/capture/reconcile.py``): blocking, but
the erased-keys warning (``WARNING_CHECKS``).

Two check steps per table. The intake checks run after ``hashed_incoming`` and, being blocking, stop
the CDC step of the same run when rows were lost or a key is duplicated. The CDC checks run after the
CDC step. Both read what the IO manager stored, not what the step held in memory, and report one
evaluation per date (a single-run backfill checks every date of its range), with both sides of each
equation in the metadata. A range is measured in one aggregation per dataset, grouped by date.
"""

from collections.abc import Iterator
from datetime import date
from functools import reduce
from typing import Any, cast

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DailyPartitionsDefinition,
    MetadataValue,
    ResourceParam,
    multi_asset_check,
)

from cdc_assets.model.config import TableConfig
from cdc_assets.core.capture.changes import no_operations
from cdc_assets.core.compare import CHANGED_COLUMNS
from cdc_assets.core.capture.reconcile import (
    KeyedFigures,
    Reconciliation,
    keyed_figures_by_date,
    operations_by_date,
    reconcile_change_set,
    reconcile_change_set_intake,
    reconcile_changes,
    reconcile_erased_keys,
    reconcile_incoming,
    reconcile_stored_state,
    reconcile_updates,
)
from cdc_assets.core.capture.changes import NOT_SUPPLIED, OPERATION
from cdc_assets.core.capture.state import untouched_operation
from cdc_assets.core.capture.schema import SchemaChangeError, schema_change, shared_tracked_columns, stored_spec, updates_equal_on_shared_columns
from cdc_assets.usecases.schema_changes import configured_spec
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from resources.storage.state import state_rows, stored_fields
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import (
    CLASSIFICATION,
    CURRENT,
    HASHED_INCOMING,
    HISTORY,
    LATE_CHANGES,
    REJECTS,
    UPDATES,
    day_before,
    pool_name,
)
from cdc_assets.core.columns import BUSINESS_DATE
from resources.parquet_io_manager import PartitionedParquetIOManager
from resources.session.spark_session import side_by_side

CHECK_DESCRIPTIONS = {
    (HASHED_INCOMING, "rows_read_reconcile"): "Nothing lost at intake: rows read = rows in hashed_incoming + rows in rejects.",
    (HASHED_INCOMING, "keys_unique"): "Every key occurs once in hashed_incoming: rows = distinct key_hash.",
    (CLASSIFICATION, "incoming_reconciles"): "Every incoming key is classified: I + U + N = rows of hashed_incoming.",
    (CLASSIFICATION, "previous_state_reconciles"): (
        "Every key of the previous state is accounted for: D + U + N + X = rows of current_table the day before "
        "(0 on the first date)."
    ),
    (CURRENT, "row_count_reconciles"): "current_table rows = I + U + N + X.",
    (CURRENT, "key_hash_unique"): "No key twice in current_table: rows = distinct key_hash.",
    (CURRENT, "keys_not_null"): "No NULL key column in current_table.",
    (HISTORY, "row_count_reconciles"): "history_partition rows = I + U + D.",
    (UPDATES, "no_update_without_change"): (
        "No key is re-versioned without a change: every update names a changed column, and on a date whose "
        "columns changed (docs/schema-changes.md) no update's key holds equal values in every column both "
        "dates track, compared value by value with the stored previous state (renames and widenings applied)."
    ),
    (CURRENT, "stored_state_reconciles"): (
        "An incremental state stores what the date's classification says: a full copy (the first date, a "
        "compaction) of I + U + N + X rows, or the date's changes, I + U + D rows (and N for delta and change-set "
        "loads)."
    ),
}
ERASED_KEYS_CHECK = (HASHED_INCOMING, "no_erased_keys_in_extract")
CHECK_DESCRIPTIONS[ERASED_KEYS_CHECK] = (
    "Warns when the extract holds records of keys erased from this table (cdc-erase): the source still holds them. "
    "They were set aside (erased_keys: drop) or kept (erased_keys: keep), as the table config says."
)
# The checks that warn and never stop a run; every other check is blocking.
WARNING_CHECKS = {ERASED_KEYS_CHECK}
STATE_CHECKS = [(CURRENT, "stored_state_reconciles")]
INCOMING_CHECKS = [(HASHED_INCOMING, "rows_read_reconcile"), (HASHED_INCOMING, "keys_unique"), ERASED_KEYS_CHECK]
CDC_CHECKS = [key for key in CHECK_DESCRIPTIONS if key not in INCOMING_CHECKS and key != (CURRENT, "stored_state_reconciles")]
# A change set holds several records per key, and its incoming records are not one per classified key.
CHANGESET_DESCRIPTIONS = {
    (HASHED_INCOMING, "rows_read_reconcile"): (
        "Nothing lost at intake: records read = records in hashed_incoming + records in rejects + tombstone lines."
    ),
    (CLASSIFICATION, "records_reconcile"): (
        "Every accepted record is accounted for: hashed_incoming rows = winners + superseded + late_changes rows "
        "+ duplicate events."
    ),
    (CURRENT, "previous_plus_changes"): "current_table rows = current_table rows the day before + I - D.",
}
CHANGESET_INCOMING_CHECKS = [(HASHED_INCOMING, "rows_read_reconcile"), ERASED_KEYS_CHECK]
CHANGESET_CDC_CHECKS = [(CLASSIFICATION, "records_reconcile"), (CURRENT, "previous_plus_changes")] + [
    key for key in CDC_CHECKS if key != (CLASSIFICATION, "incoming_reconciles")
]


def _specs(config: TableConfig, partitions_def: DailyPartitionsDefinition, checks) -> list[AssetCheckSpec]:
    if config.storage.incremental and checks in (CDC_CHECKS, CHANGESET_CDC_CHECKS):
        checks = checks + STATE_CHECKS
    return [
        AssetCheckSpec(
            name,
            asset=asset_key(config, asset),
            description={**CHECK_DESCRIPTIONS, **(CHANGESET_DESCRIPTIONS if config.changes else {})}[(asset, name)],
            blocking=(asset, name) not in WARNING_CHECKS,
            partitions_def=partitions_def,
        )
        for asset, name in checks
    ]


def evaluation(config: TableConfig, day: str, outcome: Reconciliation) -> AssetCheckEvaluation:
    """A check's result for one date, as the UI shows it: the equation and both of its sides."""
    warning = (outcome.asset, outcome.name) in WARNING_CHECKS
    return AssetCheckEvaluation(
        asset_key=asset_key(config, outcome.asset),
        check_name=outcome.name,
        passed=outcome.passed,
        partition=day,
        severity=AssetCheckSeverity.WARN if warning else AssetCheckSeverity.ERROR,
        blocking=not warning,
        description=outcome.equation,
        metadata={"equation": MetadataValue.text(outcome.equation), **outcome.metadata},
    )


def _recorded(instance: DagsterInstance, key: AssetKey, day: str, names: tuple[str, ...]) -> dict[str, int]:
    """Figures the asset's latest materialization of the date recorded (0 for one it did not record)."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1
    ).records
    if not records:
        raise RuntimeError(f"{key.to_user_string()} has no materialization for {day} to reconcile against")
    materialization = records[0].asset_materialization
    metadata = {} if materialization is None else materialization.metadata
    return {name: int(cast(int, metadata[name].value)) if name in metadata else 0 for name in names}


def build_table_checks(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> list:
    """The table's two check steps: the intake checks after ``hashed_incoming``, the CDC checks after the
    CDC step. A change set reconciles its records (several per key, late ones, tombstones) by its own rules."""
    table, change_set = config.name, config.changes is not None

    @multi_asset_check(
        name=f"{table}__intake_checks",
        specs=_specs(config, partitions_def, CHANGESET_INCOMING_CHECKS if change_set else INCOMING_CHECKS),
        can_subset=True,
        pool=pool_name(config),
    )
    def intake_checks(context: AssetCheckExecutionContext, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]):
        for day, outcome in intake_outcomes(context.instance, parquet_io_manager, config, list(context.partition_keys)):
            yield evaluation(config, day, outcome)

    @multi_asset_check(
        name=f"{table}__cdc_checks",
        specs=_specs(config, partitions_def, CHANGESET_CDC_CHECKS if change_set else CDC_CHECKS),
        can_subset=True,
        pool=pool_name(config),
    )
    def cdc_checks(context: AssetCheckExecutionContext, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]):
        for day, outcomes in cdc_outcomes(context.instance, parquet_io_manager, config, list(context.partition_keys)):
            for outcome in outcomes:
                yield evaluation(config, day, outcome)
            context.log.info(f"{table} {day}: " + "; ".join(o.equation for o in outcomes))

    return [intake_checks, cdc_checks]


def cdc_outcomes(
    instance: DagsterInstance, parquet_io_manager: PartitionedParquetIOManager, config: TableConfig, days: list[str]
) -> Iterator[tuple[str, list[Reconciliation]]]:
    """(date, outcomes) of the CDC checks, from what is stored and what the latest materializations recorded."""
    table, change_set = config.name, config.changes is not None
    incoming = parquet_io_manager.row_counts(table, HASHED_INCOMING, days)
    history = parquet_io_manager.row_counts(table, HISTORY, days)
    late = parquet_io_manager.row_counts(table, LATE_CHANGES, days) if change_set else {}
    updates_naming_none = _updates_naming_no_column(parquet_io_manager, table, days)
    operations, (current, parts) = side_by_side(
        lambda: operations_by_date(parquet_io_manager.read_partitions(table, CLASSIFICATION, days), BUSINESS_DATE),
        lambda: _state_figures(parquet_io_manager, config, days),
    )
    for day in days:
        on, before = date.fromisoformat(day), date.fromisoformat(day_before(day))
        by_operation = _with_not_supplied(instance, config, day, operations.get(on, no_operations()))
        stored: dict[str, Any] = dict(
            operations=by_operation,
            incoming_rows=incoming[day],
            previous_rows=current[before].rows if before in current else _previous_rows(parquet_io_manager, config, day),
            current=current.get(on, KeyedFigures()),
            history_rows=history[day],
        )
        if change_set:
            recorded: dict[str, Any] = _recorded(instance, asset_key(config, CLASSIFICATION), day, ("winners", "superseded", "duplicate_events"))
            outcomes = reconcile_change_set(**stored, **recorded, late_rows=late[day])
        else:
            outcomes = reconcile_changes(**stored)
        outcomes += _stored_part_outcomes(config, day, by_operation, parts)
        outcomes.append(_updates_outcome(parquet_io_manager, config, day, updates_naming_none.get(on, 0)))
        yield day, outcomes


def intake_outcomes(
    instance: DagsterInstance, io_manager: PartitionedParquetIOManager, config: TableConfig, days: list[str]
) -> Iterator[tuple[str, Reconciliation]]:
    """(date, outcome) of the intake checks; row counts from the committed files' footers."""
    table, key = config.name, asset_key(config, HASHED_INCOMING)
    rejected = io_manager.row_counts(table, REJECTS, days)
    names = ("rows_read", "tombstone_lines", "erased_keys_in_extract", "erased_records_set_aside")
    if config.changes is not None:
        accepted = io_manager.row_counts(table, HASHED_INCOMING, days)
        for day in days:
            read = _recorded(instance, key, day, names)
            yield day, reconcile_change_set_intake(
                read["rows_read"], accepted[day], rejected[day], read["tombstone_lines"], read["erased_records_set_aside"]
            )
            yield day, reconcile_erased_keys(read["erased_keys_in_extract"], config.erased_keys.value)
        return
    # Distinct keys from one aggregation over the range.
    keyed = keyed_figures_by_date(io_manager.read_partitions(table, HASHED_INCOMING, days), BUSINESS_DATE)
    for day in days:
        read = _recorded(instance, key, day, names)
        distinct = keyed.get(date.fromisoformat(day), KeyedFigures())
        for outcome in reconcile_incoming(read["rows_read"], distinct, rejected[day], read["erased_records_set_aside"]):
            yield day, outcome
        yield day, reconcile_erased_keys(read["erased_keys_in_extract"], config.erased_keys.value)


def _with_not_supplied(instance: DagsterInstance, config: TableConfig, day: str, operations: dict[str, int]) -> dict[str, int]:
    """The date's operations as hash_join_classification stores them, and X as its materialization
    recorded it: a key a delta or change set did not supply is counted, not stored."""
    if operations.get(NOT_SUPPLIED):  # written by a release that stored X rows: they are all there
        return operations
    recorded = _recorded(instance, asset_key(config, CLASSIFICATION), day, ("not_supplied",))["not_supplied"]
    return {**operations, NOT_SUPPLIED: recorded}


def _state_figures(io_manager: PartitionedParquetIOManager, config: TableConfig, days: list[str]):
    """current_table's figures per date as a state, and what each date stored (full copy or changes, rows).

    A date stored whole is measured as it is; a merged state's other dates count their rows from what
    is stored (the tag's summary, ``resources/storage/state.py``) and their keys from the rows the date's MERGE
    wrote (the rows of the tag whose ``operation_date`` is the date).
    """
    storage, table = io_manager.storage, config.name
    stored_as = {day: storage.stored_as(table, CURRENT, day) for day in days}
    fulls = [day for day in days if stored_as[day] == "full"]
    changes = [day for day in days if stored_as[day] == "changes"]
    figures = {}
    if fulls:
        figures.update(keyed_figures_by_date(io_manager.read_partitions(table, CURRENT, fulls), BUSINESS_DATE, config.key_names))
    parts = {date.fromisoformat(day): (True, figures.get(date.fromisoformat(day), KeyedFigures()).rows, 0) for day in fulls}
    if changes:
        spark = io_manager.pyspark.spark_session
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


def _previous_rows(io_manager: PartitionedParquetIOManager, config: TableConfig, day: str) -> int:
    """Rows of the state the first date of a run was classified against (0 before the table's start).

    Only its rows enter the equations, so they are counted from what is stored (footers, and a change
    date's ``operation`` column), not by a scan of the state: its keys were checked on its own date, and
    on a big table with a small change that scan was most of the checks' time.
    """
    previous = day_before(day)
    if date.fromisoformat(previous) < config.start_date:
        return 0
    return state_rows(io_manager.storage, config.name, CURRENT, previous)


def _updates_naming_no_column(io_manager: PartitionedParquetIOManager, table: str, days: list[str]) -> dict[date, int]:
    """Updates whose changed_columns is empty, per date, in one aggregation over the range."""
    updates = io_manager.read_partitions(table, UPDATES, days)
    if CHANGED_COLUMNS not in updates.columns:  # written by a release before changed_columns
        return {}
    unnamed = updates.filter(F.size(F.col(CHANGED_COLUMNS)) == 0).groupBy(BUSINESS_DATE).count()
    return {row[BUSINESS_DATE]: row["count"] for row in unnamed.collect()}


def _updates_outcome(io_manager: PartitionedParquetIOManager, config: TableConfig, day: str, unnamed: int) -> Reconciliation:
    """Updates without a change: none on any date; on a date whose stored columns differ from the day
    before's, also none equal to the previous version in every shared tracked column (a scan of the
    previous state, on such dates only)."""
    table, storage = config.name, io_manager.storage
    before, now = stored_fields(storage, table, CURRENT, day_before(day)), stored_fields(storage, table, CURRENT, day)
    if before is None or now is None:
        return reconcile_updates(unnamed)
    configured = configured_spec(config)
    stored, written = stored_spec(before, configured), stored_spec(now, configured)
    if stored == written:
        return reconcile_updates(unnamed)
    renamed_from = {column.name: column.renamed_from for column in config.columns if column.renamed_from}
    try:
        change = schema_change(stored, written, renamed_from, table, config.source_file, day_before(day))
    except SchemaChangeError:  # only a declared re-baseline writes such a date: every key was compared anew
        return reconcile_updates(unnamed)
    updates = io_manager.read_partitions(table, UPDATES, [day])
    previous = io_manager.read_state(table, CURRENT, day_before(day))
    equal = updates_equal_on_shared_columns(updates, previous, shared_tracked_columns(stored, written, change)).count()
    return reconcile_updates(unnamed, equal, change.summary())


def _stored_part_outcomes(config: TableConfig, day: str, operations: dict[str, int], parts) -> list:
    if not config.storage.incremental:
        return []
    full_copy, rows, untouched_rows_stored = parts.get(date.fromisoformat(day), (False, 0, 0))
    return [reconcile_stored_state(operations, full_copy, rows, untouched_operation(config.load_type), untouched_rows_stored)]
