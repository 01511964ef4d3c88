"""Blocking asset checks that reconcile each date's stored outputs (rules in ``core/reconcile.py``).

Two check steps per table. The intake checks run after ``hashed_incoming`` and, being blocking, stop
the CDC step of the same run when rows were lost or a key is duplicated. The CDC checks run after the
CDC step. Both read what the IO manager stored, not what the step held in memory, and report one
evaluation per date (a single-run backfill checks every date of its range), with both sides of each
equation in the metadata.
"""

from datetime import date

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetRecordsFilter,
    DailyPartitionsDefinition,
    MetadataValue,
    ResourceParam,
    multi_asset_check,
)

from cdc_assets.config import TableConfig
from cdc_assets.core.reconcile import Reconciliation, reconcile_changes, reconcile_incoming
from cdc_assets.names import (
    CLASSIFICATION,
    CURRENT,
    HASHED_INCOMING,
    HISTORY,
    REJECTS,
    asset_key,
    day_before,
    pool_name,
)
from resources.parquet_io_manager import PartitionedParquetIOManager
from resources.spark import map_dates

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
}
INCOMING_CHECKS = [(HASHED_INCOMING, "rows_read_reconcile"), (HASHED_INCOMING, "keys_unique")]
CDC_CHECKS = [key for key in CHECK_DESCRIPTIONS if key not in INCOMING_CHECKS]


def _specs(config: TableConfig, partitions_def: DailyPartitionsDefinition, checks) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(
            name,
            asset=asset_key(config, asset),
            description=CHECK_DESCRIPTIONS[(asset, name)],
            blocking=True,
            partitions_def=partitions_def,
        )
        for asset, name in checks
    ]


def _evaluation(config: TableConfig, day: str, outcome: Reconciliation) -> AssetCheckEvaluation:
    return AssetCheckEvaluation(
        asset_key=asset_key(config, outcome.asset),
        check_name=outcome.name,
        passed=outcome.passed,
        partition=day,
        severity=AssetCheckSeverity.ERROR,
        blocking=True,
        description=outcome.equation,
        metadata={"equation": MetadataValue.text(outcome.equation), **outcome.metadata},
    )


def _rows_read(context: AssetCheckExecutionContext, key: AssetKey, day: str) -> int:
    """Rows read at intake, as hashed_incoming's materialization for the date recorded them."""
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1
    ).records
    if not records:
        raise RuntimeError(f"{key.to_user_string()} has no materialization for {day} to reconcile against")
    return int(records[0].asset_materialization.metadata["rows_read"].value)


def build_table_checks(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> list:
    table = config.name

    @multi_asset_check(
        name=f"{table}__intake_checks",
        specs=_specs(config, partitions_def, INCOMING_CHECKS),
        can_subset=True,
        pool=pool_name(config),
    )
    def intake_checks(context: AssetCheckExecutionContext, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]):
        days = list(context.partition_keys)
        rows_read = {day: _rows_read(context, asset_key(config, HASHED_INCOMING), day) for day in days}

        def reconcile(day: str):
            accepted = parquet_io_manager.read_partition(table, HASHED_INCOMING, day)
            rejected = parquet_io_manager.read_partition(table, REJECTS, day).count()
            return reconcile_incoming(rows_read[day], accepted, rejected)

        for day, outcomes in zip(days, map_dates(reconcile, days)):
            for outcome in outcomes:
                yield _evaluation(config, day, outcome)

    @multi_asset_check(
        name=f"{table}__cdc_checks",
        specs=_specs(config, partitions_def, CDC_CHECKS),
        can_subset=True,
        pool=pool_name(config),
    )
    def cdc_checks(context: AssetCheckExecutionContext, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]):
        def reconcile(day: str):
            previous_day = day_before(day)
            previous = (
                parquet_io_manager.read_partition(table, CURRENT, previous_day)
                if date.fromisoformat(previous_day) >= config.start_date
                else None
            )
            return reconcile_changes(
                classification=parquet_io_manager.read_partition(table, CLASSIFICATION, day),
                incoming=parquet_io_manager.read_partition(table, HASHED_INCOMING, day),
                previous_current=previous,
                current=parquet_io_manager.read_partition(table, CURRENT, day),
                history=parquet_io_manager.read_partition(table, HISTORY, day),
                key_columns=config.key_names,
            )

        days = list(context.partition_keys)
        for day, outcomes in zip(days, map_dates(reconcile, days)):
            for outcome in outcomes:
                yield _evaluation(config, day, outcome)
            context.log.info(f"{table} {day}: " + "; ".join(o.equation for o in outcomes))

    return [intake_checks, cdc_checks]
