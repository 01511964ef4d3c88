"""Asset checks that reconcile each date's stored outputs (rules in ``core/capture/reconcile.py``): blocking, but
the erased-keys warning (``WARNING_CHECKS``).

Two check steps per table. The intake checks run after ``hashed_incoming`` and, being blocking, stop
the CDC step of the same run when rows were lost or a key is duplicated. The CDC checks run after the
CDC step. Both read what the IO manager stored, not what the step held in memory, and report one
evaluation per date (a single-run backfill checks every date of its range), with both sides of each
equation in the metadata. What they compute is the use case ``cdc_assets/usecases/reconcile.py`` (no
Dagster); here, only the checks' specs and what Dagster's instance recorded.
"""

from collections.abc import Iterable, Iterator
from typing import cast

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetExecutionContext,
    DagsterEventType,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetObservation,
    AssetRecordsFilter,
    DagsterInstance,
    DailyPartitionsDefinition,
    MetadataValue,
    Output,
    ResourceParam,
    multi_asset_check,
)

from cdc_assets.model.config import LoadType, TableConfig
from cdc_assets.model.declared_checks import DeclaredCheck, Severity
from cdc_assets.core.capture.reconcile import (
    Reconciliation,
)
from cdc_assets.defs.asset_keys import asset_key, asset_keys
from cdc_assets.defs.runs_log import log_not_published
from cdc_assets.usecases import declared_checks, reconcile
from cdc_assets.model.names import (
    CLASSIFICATION,
    CURRENT,
    HASHED_INCOMING,
    HISTORY,
    PUBLISHED,
    UPDATES,
    pool_name,
)
from resources.parquet_io_manager import PartitionedParquetIOManager

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
        "current_table stores what the date's classification says: a whole state (a table stored per date, an "
        "incremental state's first date or compaction) of I + U + N + X rows, or an incremental date's changes, "
        "I + U + D rows (and N for delta and change-set loads)."
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
# A full load keeps a key with a rejected record as it was (X): it warns, naming their count. Not blocking:
# the state is as right as the extract allows (the key neither updated from nor deleted for a bad record),
# and the rejects say what to fix; a blocking check would stop nothing the warning does not show.
HELD_BY_REJECT_CHECK = (CLASSIFICATION, "no_key_held_by_reject")
CHECK_DESCRIPTIONS[HELD_BY_REJECT_CHECK] = (
    "Warns when a full load kept keys as they were because a record of theirs is in the date's rejects "
    "(held_by_reject, counted as X): neither updated nor deleted until an extract supplies them again."
)
WARNING_CHECKS.add(HELD_BY_REJECT_CHECK)
FULL_LOAD_CHECKS = [HELD_BY_REJECT_CHECK]
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
    cdc = checks in (CDC_CHECKS, CHANGESET_CDC_CHECKS)
    # Defined wherever the state may be merged (storage.current incremental or unset); a date stored
    # whole (per date, or a full copy) reconciles as a full copy.
    if config.storage.may_be_incremental and cdc:
        checks = checks + STATE_CHECKS
    if config.load_type is LoadType.full and cdc:
        checks = checks + FULL_LOAD_CHECKS
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


def evaluation(keys: dict[str, AssetKey], day: str, outcome: Reconciliation, warning: bool | None = None) -> AssetCheckEvaluation:
    """A check's result for one date, as the UI shows it: the equation and both of its sides; ``keys``: the
    table's asset keys by asset name; ``warning``: whether it warns rather than blocks (default: the
    pipeline's own rule, ``WARNING_CHECKS``)."""
    if warning is None:
        warning = (outcome.asset, outcome.name) in WARNING_CHECKS
    return AssetCheckEvaluation(
        asset_key=keys[outcome.asset],
        check_name=outcome.name,
        passed=outcome.passed,
        partition=day,
        severity=AssetCheckSeverity.WARN if warning else AssetCheckSeverity.ERROR,
        blocking=not warning,
        description=outcome.equation,
        metadata={"equation": MetadataValue.text(outcome.equation), **outcome.metadata},
    )


def blocking_check_keys(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> set[AssetCheckKey]:
    """Every blocking check of the table: the pipeline's own and the declared ones but those that warn."""
    return {spec.key for check in build_table_checks(config, partitions_def) for spec in check.check_specs if spec.blocking}


def unpassed_blocking_checks(context: AssetExecutionContext, config: TableConfig, days: list[str]) -> list[str]:
    """The table's blocking checks that did not pass in this run on each of ``days``, as ``asset:check date
    (failed)`` or ``(not evaluated)``: a run that left a check out (the UI's *without checks*) publishes
    nothing unchecked. Dagster skips a downstream step when a blocking check fails, not when a blocking
    check reports nothing (left out of the run, or its step never ran), so publication reads them here."""
    wanted = blocking_check_keys(config, cast(DailyPartitionsDefinition, context.assets_def.partitions_def))
    passed: dict[tuple[AssetCheckKey, str | None], bool] = {}
    for record in context.instance.get_records_for_run(context.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records:
        event = record.event_log_entry.dagster_event
        outcome = cast(AssetCheckEvaluation, event.event_specific_data) if event is not None else None
        if outcome is not None:
            slot = (outcome.asset_check_key, outcome.partition)
            passed[slot] = passed.get(slot, True) and outcome.passed
    return sorted(
        f"{key.asset_key.to_user_string()}:{key.name} {day} ({'failed' if (key, day) in passed else 'not evaluated'})"
        for key in wanted for day in days
        if not passed.get((key, day), False)
    )


def say_not_published(context, config: TableConfig, days: list[str], unpassed: dict[str, list[str]], branch: str, assets: list[str]) -> None:
    """Each date's events in the UI say why it is staged and not published (docs/publishing.md): an
    observation per date on each of ``assets`` (``published`` and the outputs the run staged), naming the
    blocking checks that did not pass on it (``unpassed``: date -> checks), or, for a date whose own
    checks passed, that the run's dates publish together. ``context``: a step's, to log the events."""
    for day in days:
        own = unpassed.get(day, [])
        why = f"blocking check(s) did not pass: {', '.join(own)}" if own else (
            "its checks passed, but a range run publishes all of its dates or none, and another date's did not"
        )
        metadata = {"cdc/publication": MetadataValue.text(f"staged on branch {branch}, not published: {why}"),
                    "cdc/branch": MetadataValue.text(branch)}
        for name in assets:
            context.log_event(AssetObservation(asset_key=asset_key(config, name), partition=day, metadata=metadata))


def _told_if_blocking(
    context: AssetCheckExecutionContext, config: TableConfig, io_manager: PartitionedParquetIOManager,
    evaluations: Iterable[AssetCheckEvaluation],
) -> Iterator[AssetCheckEvaluation | Output]:
    """Yield each evaluation; then, if a blocking one failed in a run that staged the table's dates,
    :func:`say_not_published` for each date of the step: Dagster then skips the ``published`` step, which
    would have said it."""
    failed: dict[str, list[str]] = {}
    # A check's evaluations are yielded per date (a range run has several), which Dagster logs but does not
    # count as the check's output: it then warns, at every run, that the blocking check "emitted no result"
    # and the next step "will proceed without gating on it". The output, once per check, says it did. The
    # gating itself is the step's: it fails when a blocking evaluation failed, and the steps after it skip.
    assets_def = context.op_execution_context.assets_def
    told: set[AssetCheckKey] = set()
    for result in evaluations:
        if result.blocking and not result.passed and result.partition is not None:
            failed.setdefault(result.partition, []).append(
                f"{result.asset_key.to_user_string()}:{result.check_name} {result.partition} (failed)"
            )
        yield result
        if result.asset_check_key not in told and result.asset_check_key in assets_def.check_keys:
            told.add(result.asset_check_key)
            yield Output(None, output_name=assets_def.get_output_name_for_asset_check_key(result.asset_check_key))
    storage = io_manager.storage
    staged = storage.staged_assets(config.name) if failed else []
    if staged:
        days = list(context.partition_keys)
        say_not_published(context.op_execution_context, config, days, failed, storage.branch, [PUBLISHED, *staged])
        log_not_published(context.op_execution_context, config, storage, days, [name for names in failed.values() for name in names])


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
    keys = asset_keys(config)

    @multi_asset_check(
        name=f"{table}__intake_checks",
        specs=_specs(config, partitions_def, CHANGESET_INCOMING_CHECKS if change_set else INCOMING_CHECKS),
        can_subset=True,
        pool=pool_name(config),
    )
    def intake_checks(context: AssetCheckExecutionContext, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]):
        outcomes = intake_outcomes(context.instance, parquet_io_manager, config, list(context.partition_keys))
        yield from _told_if_blocking(context, config, parquet_io_manager, (evaluation(keys, day, outcome) for day, outcome in outcomes))

    @multi_asset_check(
        name=f"{table}__cdc_checks",
        specs=_specs(config, partitions_def, CHANGESET_CDC_CHECKS if change_set else CDC_CHECKS),
        can_subset=True,
        pool=pool_name(config),
    )
    def cdc_checks(context: AssetCheckExecutionContext, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]):
        def evaluations() -> Iterator[AssetCheckEvaluation]:
            for day, outcomes in cdc_outcomes(context.instance, parquet_io_manager, config, list(context.partition_keys)):
                yield from (evaluation(keys, day, outcome) for outcome in outcomes)
                context.log.info(f"{table} {day}: " + "; ".join(o.equation for o in outcomes))

        yield from _told_if_blocking(context, config, parquet_io_manager, evaluations())

    return [intake_checks, cdc_checks, *build_declared_checks(config, partitions_def)]


def build_declared_checks(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> list:
    """The table's declared checks (``checks:`` in its config, docs/running.md (Declared checks)) as one check step after the
    CDC step: each its own Dagster check on the output it reads, blocking unless ``severity: warn``. None
    without a ``checks:`` section."""
    if not config.checks:
        return []
    table, keys = config.name, asset_keys(config)
    specs = [
        AssetCheckSpec(
            check.check_name,
            asset=keys[declared_checks.check_asset(check)],
            description=_declared_description(check),
            blocking=check.severity is Severity.error,
            partitions_def=partitions_def,
        )
        for check in config.checks
    ]

    @multi_asset_check(name=f"{table}__declared_checks", specs=specs, can_subset=True, pool=pool_name(config))
    def declared(context: AssetCheckExecutionContext, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]):
        spark, storage = parquet_io_manager.pyspark.spark_session, parquet_io_manager.storage

        def evaluations() -> Iterator[AssetCheckEvaluation]:
            for day, outcomes in declared_checks.declared_outcomes(spark, storage, config, list(context.partition_keys)):
                yield from (evaluation(keys, day, outcome, warning=check.severity is Severity.warn) for check, outcome in outcomes)
                failed = [outcome.name for _, outcome in outcomes if not outcome.passed]
                context.log.info(f"{table} {day}: declared checks " + (f"failed: {', '.join(failed)}" if failed else "passed"))

        yield from _told_if_blocking(context, config, parquet_io_manager, evaluations())

    return [declared]


def _declared_description(check: DeclaredCheck) -> str:
    """The UI's text for a declared check: what it demands, then the owner's own words."""
    text = {
        "volume": "Declared volume bounds on the date's inserts, updates and deletes and the state's rows after it.",
        "not_null": "Declared: no NULL in the columns named.",
        "unique": "Declared: no two rows share the values of the columns named.",
        "accepted_values": "Declared: every non-NULL value of the column is an accepted value.",
        "sql": "Declared SQL: no row may match it.",
    }[check.type]
    shown = check.model_dump(exclude={"type", "name", "severity", "description"}, exclude_none=True, mode="json")
    text += " " + ", ".join(f"{name}: {value}" for name, value in shown.items())
    return text + (f" {check.description}" if check.description else "")


def cdc_outcomes(
    instance: DagsterInstance, io_manager: PartitionedParquetIOManager, config: TableConfig, days: list[str]
) -> Iterator[tuple[str, list[Reconciliation]]]:
    """(date, outcomes) of the CDC checks (:func:`cdc_assets.usecases.reconcile.cdc_outcomes`)."""
    recorded = _recorded_by(instance, asset_keys(config))
    return reconcile.cdc_outcomes(io_manager.pyspark.spark_session, io_manager.storage, config, days, recorded)


def intake_outcomes(
    instance: DagsterInstance, io_manager: PartitionedParquetIOManager, config: TableConfig, days: list[str]
) -> Iterator[tuple[str, Reconciliation]]:
    """(date, outcome) of the intake checks (:func:`cdc_assets.usecases.reconcile.intake_outcomes`)."""
    recorded = _recorded_by(instance, asset_keys(config))
    return reconcile.intake_outcomes(io_manager.pyspark.spark_session, io_manager.storage, config, days, recorded)


def _recorded_by(instance: DagsterInstance, keys: dict[str, AssetKey]) -> reconcile.Recorded:
    """What the table's assets' latest materializations recorded, as the use case asks for it."""
    return lambda asset, day, names: _recorded(instance, keys[asset], day, names)
