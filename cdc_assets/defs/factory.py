"""The asset factory: everything Dagster needs for one table, built from its validated config.

Per table (asset keys ``[table, name]``, group ``table``, daily partitions from ``start_date`` to ``end_date``
if set, else to yesterday):

- ``hashed_incoming`` (+ ``rejects``): one multi-asset reading the day's extract;
- ``hash_join_classification``, ``inserts``, ``deletes``, ``updates``, ``current_table``,
  ``history_partition``: one multi-asset, because the classification of day d needs
  ``current_table`` of day d-1 and Dagster allows no cycle between assets, only an asset reading its
  own earlier partition. Each output is still its own asset with its own metadata. A change set
  (``load_type: changeset``) adds ``late_changes`` and ``applied_sequences`` (its state, which also
  reads its own previous partition) to the same multi-asset.

Both multi-assets take a whole date range in one run (``BackfillPolicy.single_run``), with outputs
identical to one run per date: the intake validates every date in one query, the CDC step runs
``core/capture/plan.py``'s plan for the range, and each output is one partitioned write (``DatedRows``). This
module is wiring: each step's body is a use case (``cdc_assets/usecases/intake.py`` and ``capture.py``, no
Dagster there); a step here gathers what only Dagster knows (the run, its config, its backfill), calls it,
and turns what it returns into metadata, tags and outputs.
"""

import json
from typing import Any
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

from dagster import (
    AssetCheckSeverity,
    AssetDep,
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetObservation,
    AssetSpec,
    AssetsDefinition,
    BackfillPolicy,
    Config,
    DailyPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    Output,
    ResourceParam,
    TimeWindowPartitionMapping,
    multi_asset,
)
from dagster_pyspark import LazyPySparkResource

from cdc_assets.defs.automation import build_daily_schedule, build_landing_sensor, build_table_job
from cdc_assets.defs.asset_descriptions import ASSET_DESCRIPTIONS
from cdc_assets.defs.checks import build_table_checks, cdc_outcomes, evaluation, say_not_published, unpassed_blocking_checks
from cdc_assets.model.config import NEW_TABLE_STATE_FORM, Retention, TableConfig
from cdc_assets.model.declared_checks import Severity
from cdc_assets.usecases import declared_checks
from cdc_assets.model.masking import shown_column_names
from cdc_assets.defs.freshness import freshness_definitions
from cdc_assets.defs.asset_keys import asset_key, asset_keys
from cdc_assets.model.names import (
    CLASSIFICATION,
    CURRENT,
    DELETES,
    HASHED_INCOMING,
    HISTORY,
    PUBLISHED,
    REJECTS,
    APPLIED_SEQUENCES,
    cdc_outputs,
    day_before,
    pool_name,
)
from cdc_assets.defs.runs_log import RunsLogEntry, cdc_left_out, log_not_published, run_started_at, runs_logged
from cdc_assets.usecases.capture import CaptureRun, capture_changes
from cdc_assets.usecases.intake import Intake, read_intake
from cdc_assets.usecases.publishing import publish_run
from cdc_assets.usecases.step_log import StageClock
from cdc_assets.defs.erasure_events import build_erase_job
from cdc_assets.defs.rollback_job import build_rollback_job
from resources.parquet_io_manager import (
    CONFIGURED_COLUMNS,
    RENAMED_COLUMNS,
    SHOWN_COLUMNS,
    STATE_LOAD_TYPE,
    LazyPartitions,
    PartitionedParquetIOManager,
    server_loss_explained,
)
from resources.storage.writes import DatedRows, StateRows

IO_MANAGER_KEY = "parquet_io_manager"
BACKFILL_TAG = "dagster/backfill"  # Dagster's tag on every run a backfill launches: the backfill's id
KINDS = {"spark", "parquet"}



class ApplyChangesConfig(Config):
    """Run config of the CDC step (Launchpad: ops -> <table>__cdc -> config)."""

    allow_mass_delete: bool = False
    """Accept a full extract that is empty or would delete more than max_delete_fraction of the
    current rows. Only for a source that really did delete them; the run is tagged when used."""

    carry_forward: bool = True
    """A re-run of a date that later stored dates were computed from (a corrected extract) recomputes those
    dates too, from their stored intake, and writes them in the same commits; each date's classification
    records how many keys changed class (correction_changed_keys). false: refuse such a run, naming the
    range to launch instead."""

    rebaseline: bool = False
    """Accept any change of the table's columns on the run's first date, keys and type changes included:
    the previous state is taken into the new definition column by column and every key compared under
    it (a key whose hash changes becomes a delete and an insert). docs/schema-changes.md, Re-baseline."""


MASS_DELETE_OVERRIDE_TAG = "cdc/mass_delete_override"
REBASELINE_TAG = "cdc/rebaseline"


@dataclass
class TableDefinitions:
    """What the factory builds for one table; definitions.py merges these across tables."""

    config: TableConfig
    partitions_def: DailyPartitionsDefinition
    assets: list[AssetsDefinition]
    asset_checks: list = field(default_factory=list)
    schedules: list = field(default_factory=list)
    sensors: list = field(default_factory=list)
    jobs: list = field(default_factory=list)


def columns_metadata(config: TableConfig) -> dict[str, str]:
    """An asset's definition metadata naming the config's columns (with their former names) and its renamed
    ones: before it writes, the IO manager renames the renamed columns in the asset's Iceberg table and
    drops the columns the config no longer has. And the columns whose values its previews may show
    (cdc_assets/model/masking.py: neither keys nor ``sensitive: true``)."""
    renamed = {column.name: list(column.renamed_from) for column in config.columns if column.renamed_from}
    names = [name for column in config.columns for name in (column.name, *column.renamed_from)]
    if config.changes is not None:  # a change set's own source columns, which some outputs keep beside the table's
        names += [*([config.changes.operation_column] if config.changes.operation_column else []), *config.changes.sequence_columns]
    return {
        CONFIGURED_COLUMNS: json.dumps(names),
        SHOWN_COLUMNS: json.dumps(shown_column_names(config)),
        **({RENAMED_COLUMNS: json.dumps(renamed)} if renamed else {}),
    }


def build_incoming_asset(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> AssetsDefinition:
    common: dict[str, Any] = dict(group_name=config.name, kinds=KINDS, owners=config.owners, partitions_def=partitions_def)
    hashed_key, rejects_key = asset_key(config, HASHED_INCOMING), asset_key(config, REJECTS)

    @multi_asset(
        name=f"{config.name}__{HASHED_INCOMING}",
        specs=[
            AssetSpec(hashed_key, description=ASSET_DESCRIPTIONS[HASHED_INCOMING], metadata=columns_metadata(config),
                      **common).with_io_manager_key(IO_MANAGER_KEY),
            AssetSpec(rejects_key, description=ASSET_DESCRIPTIONS[REJECTS], metadata=columns_metadata(config),
                      **common).with_io_manager_key(IO_MANAGER_KEY),
        ],
        backfill_policy=BackfillPolicy.single_run(),
        can_subset=False,
        pool=pool_name(config),
    )
    def read_incoming(
        context: AssetExecutionContext, pyspark: LazyPySparkResource, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]
    ):
        days = list(context.partition_keys)  # oldest first
        left_out = cdc_left_out(context, config)  # the run writes the intake alone
        # The CDC step logs the run's dates; this step does when the run ends here.
        with runs_logged(context, config, parquet_io_manager.storage, days, "intake", only_if_last=left_out):
            # What only Dagster knows, gathered first: the dates the run's backfill targets and its run config.
            backfill_dates = None if left_out else _backfill_dates(context, config)
            rebaseline = _rebaseline_declared(context, config)
            carry_forward = _cdc_config(context, config).get("carry_forward", True)
            clock = StageClock(context.log, config.name, days)
            _stage_if_published(context, config, parquet_io_manager)
            with server_loss_explained(pyspark):
                intake = read_intake(
                    pyspark.spark_session, parquet_io_manager.storage, config, days, context.log,
                    refuse_later_dates=not left_out, backfill_dates=backfill_dates, rebaseline=rebaseline,
                    carry_forward=carry_forward,
                )
                yield from _intake_outputs(context, intake, clock, {HASHED_INCOMING: hashed_key, REJECTS: rejects_key}, parquet_io_manager)

    return read_incoming


def _intake_outputs(
    context: AssetExecutionContext, intake: Intake, clock: StageClock, keys: dict[str, AssetKey], io_manager: PartitionedParquetIOManager
) -> Iterator[Output]:
    """The intake's figures on each date's materializations, then both outputs."""
    try:
        for day in intake.days:
            counts = {**intake.counts(day), "source_path": MetadataValue.path(intake.source_path(day))}
            for key in keys.values():
                context.add_asset_metadata(counts, asset_key=key, partition_key=day)
        _staged_metadata(context, io_manager, keys.values(), intake.days)
        context.log.info(intake.summary())
        yield from _stored_outputs(context, io_manager, clock, keys, intake.outputs().items())
    finally:
        intake.release()


def _stored_outputs(
    context: AssetExecutionContext, io_manager: PartitionedParquetIOManager, clock: StageClock, keys: dict[str, AssetKey],
    outputs: Iterable[tuple[str, DatedRows | StateRows]],
) -> Iterator[Output]:
    """Each of a step's outputs, stored first: its dated rows side by side (each output its own table and
    commit; a small date's writes are mostly fixed cost, which overlaps), then each merged state in turn
    (an incremental current_table's MERGE, a change set's sequences after it), as the IO manager stores them."""
    outputs = list(outputs)
    dated = [(name, rows) for name, rows in outputs if not isinstance(rows, StateRows)]
    days = sorted(context.partition_keys)
    with clock.timed(f"write {', '.join(name for name, _ in dated)}"):
        stored = io_manager.store_side_by_side(
            [(keys[name], days, context.assets_def.specs_by_key[keys[name]].metadata, rows) for name, rows in dated]
        )
    stored_by_name = dict(zip((name for name, _ in dated), stored))
    for name, rows in outputs:
        output_name = context.assets_def.get_output_name_for_asset_key(keys[name])
        if name in stored_by_name:
            yield Output(stored_by_name[name], output_name=output_name)
        else:
            with clock.timed(f"write {name}"):
                yield Output(rows, output_name=output_name)


def _stage_if_published(context: AssetExecutionContext, table: TableConfig, io_manager: PartitionedParquetIOManager) -> None:
    """Write the step's outputs to the run's staging branch when the run also publishes them (its
    ``published`` step is in it: the table's job, a schedule's or sensor's run, a backfill). A run without
    that step (assets picked by hand) writes to main as it goes."""
    key = asset_key(table, PUBLISHED)
    selection = context.dagster_run.asset_selection
    publishes = key in selection if selection else key in context.job_def.asset_layer.asset_graph.get_all_asset_keys()
    if publishes:
        io_manager.storage.stage()
        context.log.info(f"{table.name}: writing to the staging branch {io_manager.storage.branch}; published once every blocking check passed")


def _staged_metadata(context: AssetExecutionContext, io_manager: PartitionedParquetIOManager, keys, days: list[str]) -> None:
    """Name the staging branch on each output's materialization of each date: where the date is until published."""
    if not io_manager.storage.staging:
        return
    staged = {"cdc/publication": MetadataValue.text(f"staged on branch {io_manager.storage.branch}")}
    for key in keys:
        for day in days:
            context.add_asset_metadata(staged, asset_key=key, partition_key=day)


def _cdc_config(context: AssetExecutionContext, table: TableConfig) -> dict[str, Any]:
    """The run config of the table's CDC step, as given (the intake reads it too)."""
    ops = (context.run_config or {}).get("ops", {})
    return dict(ops.get(f"{table.name}__cdc", {}).get("config", {}) or {})


def _rebaseline_declared(context: AssetExecutionContext, table: TableConfig) -> bool:
    """Whether the run's config declares a re-baseline for the table's CDC step."""
    return bool(_cdc_config(context, table).get("rebaseline", False))


def _backfill_dates(context: AssetExecutionContext, table: TableConfig) -> set[str] | None:
    """The dates of the table's current_table that the run's backfill targets; None outside a backfill."""
    backfill_id = context.dagster_run.tags.get(BACKFILL_TAG)
    backfill = context.instance.get_backfill(backfill_id) if backfill_id else None
    if backfill is None:
        return None
    if not backfill.is_asset_backfill:  # a job's backfill: every partition it names, for all of the job's assets
        return set(backfill.partition_names or ())
    # The run's job knows every asset a backfill of this code location can target (a run in process has no repository).
    target = backfill.get_asset_backfill_data(context.job_def.asset_layer.asset_graph).target_subset
    subset = target.partitions_subsets_by_asset_key.get(asset_key(table, CURRENT))
    return set() if subset is None else set(subset.get_partition_keys())


def _state_storage(config: TableConfig) -> str:
    """How current_table is stored, as its definition's metadata says: the config's ``storage.current``, or
    what unset means (the layout is then decided at the table's first run, cdc_assets/usecases/capture.py)."""
    current = config.storage.current
    return current.value if current is not None else f"{NEW_TABLE_STATE_FORM.value} for a new table, else as stored (storage.current unset)"


def build_cdc_assets(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> AssetsDefinition:
    common: dict[str, Any] = dict(group_name=config.name, kinds=KINDS, owners=config.owners, partitions_def=partitions_def)
    outputs = cdc_outputs(config)
    keys = {name: asset_key(config, name) for name in outputs}
    hashed_key = asset_key(config, HASHED_INCOMING)
    previous_day = TimeWindowPartitionMapping(start_offset=-1, end_offset=-1, allow_nonexistent_upstream_partitions=True)
    # Each output has a single parent inside the graph; current_table (and a changeset's
    # applied_sequences) also depends on its own previous partition. docs/design.md, "Graph shape", says
    # why this shape and no other backfills.
    columns = columns_metadata(config)
    specs = [AssetSpec(keys[CLASSIFICATION], deps=[hashed_key], description=ASSET_DESCRIPTIONS[CLASSIFICATION], metadata=columns, **common)]
    for name in outputs[1:]:
        deps: list[AssetKey | AssetDep] = [keys[CLASSIFICATION]]
        if name in (CURRENT, APPLIED_SEQUENCES):
            deps.append(AssetDep(keys[name], partition_mapping=previous_day))
        is_state = name in (CURRENT, APPLIED_SEQUENCES)
        metadata = {STATE_LOAD_TYPE: config.load_type.value, "cdc/state_storage": _state_storage(config)} if is_state else {}
        metadata.update(columns)
        specs.append(AssetSpec(keys[name], deps=deps, description=ASSET_DESCRIPTIONS[name], metadata=metadata, **common))
    specs = [spec.with_io_manager_key(IO_MANAGER_KEY) for spec in specs]
    ins = {"incoming": AssetIn(hashed_key), "previous_current": AssetIn(keys[CURRENT])}
    decorator = multi_asset(
        name=f"{config.name}__cdc",
        specs=specs,
        ins=ins if config.changes is None else {**ins, "previous_sequences": AssetIn(keys[APPLIED_SEQUENCES])},
        backfill_policy=BackfillPolicy.single_run(),
        can_subset=False,
        pool=pool_name(config),
    )
    table = config  # inside the step, `config` is the run config (Dagster's naming)

    @decorator
    def apply_changes(
        context: AssetExecutionContext,
        config: ApplyChangesConfig,
        pyspark: LazyPySparkResource,
        parquet_io_manager: ResourceParam[PartitionedParquetIOManager],
        incoming: LazyPartitions,
        previous_current: LazyPartitions | None,
        **change_set_state: LazyPartitions | None,  # a change set's previous_sequences (its `ins` above)
    ):
        days = list(context.partition_keys)
        with runs_logged(context, table, parquet_io_manager.storage, days, "cdc") as logged, server_loss_explained(pyspark):
            yield from _apply_changes(
                context, table, config, pyspark, parquet_io_manager, keys, incoming, previous_current,
                change_set_state.get("previous_sequences"), logged,
            )

    return apply_changes


def _apply_changes(
    context: AssetExecutionContext, table: TableConfig, config: ApplyChangesConfig, pyspark: LazyPySparkResource,
    io_manager: PartitionedParquetIOManager, keys: dict[str, AssetKey], incoming: LazyPartitions,
    previous_current: LazyPartitions | None, previous_sequences: LazyPartitions | None,
    logged: RunsLogEntry,
) -> Iterator[Output]:
    """The CDC step: :func:`capture_changes` for the range (cdc_assets/usecases/capture.py), its figures
    on each date's materializations, then every output."""
    days = list(context.partition_keys)  # oldest first
    first_previous, clock = day_before(days[0]), StageClock(context.log, table.name, days)

    def as_of_day_before(stored: LazyPartitions | None):
        return stored[first_previous] if stored and first_previous in stored else None

    # What only Dagster knows, gathered first: the run, its config, the dates its backfill targets.
    _stage_if_published(context, table, io_manager)
    run = CaptureRun(
        context.run_id, run_started_at(context), rebaseline=config.rebaseline, allow_mass_delete=config.allow_mass_delete,
        backfill_dates=_backfill_dates(context, table), carry_forward=config.carry_forward,
    )
    capture = capture_changes(
        pyspark.spark_session, io_manager.storage, table, days, incoming.read_all(), as_of_day_before(previous_current),
        as_of_day_before(previous_sequences), run, context.log,
    )
    try:
        logged.counts, logged.carried = capture.counts, list(capture.carried)
        if capture.rebaselined:
            context.instance.add_run_tags(context.run_id, {REBASELINE_TAG: "true"})
        capture.guard()  # nothing is written until every date of the range has passed its guards
        if capture.mass_deletes_accepted:
            context.instance.add_run_tags(context.run_id, {MASS_DELETE_OVERRIDE_TAG: "true"})
        for day in days:
            for name in (CURRENT, HISTORY, DELETES) if day in capture.mass_deletes_accepted else ():
                override = {"mass_delete_override": MetadataValue.text(capture.mass_deletes_accepted[day])}
                context.add_asset_metadata(override, asset_key=keys[name], partition_key=day)
            for name in (CLASSIFICATION, CURRENT, HISTORY):
                context.add_asset_metadata(capture.operation_counts(day), asset_key=keys[name], partition_key=day)
            if capture.correction_figures(day):
                context.add_asset_metadata(capture.correction_figures(day), asset_key=keys[CLASSIFICATION], partition_key=day)
        schema_change = capture.schema_change()
        if schema_change is not None:
            for name in (CLASSIFICATION, CURRENT, HISTORY):
                context.add_asset_metadata({"schema_change": MetadataValue.json(schema_change)}, asset_key=keys[name], partition_key=days[0])
            logged.schema_change = {days[0]: json.dumps(schema_change, sort_keys=True)}
        _staged_metadata(context, io_manager, keys.values(), days)
        yield from _stored_outputs(context, io_manager, clock, keys, capture.outputs())
        if capture.carried:
            _check_carried_dates(context, table, io_manager, capture.carried)
    finally:
        capture.release()


def _check_carried_dates(context: AssetExecutionContext, table: TableConfig, io_manager: PartitionedParquetIOManager, carried: list[str]) -> None:
    """The CDC checks of the dates a correction carried forward, which the run's check steps do not target:
    evaluated on what is stored now and reported for each date; a failed blocking one fails the step."""
    failed, keys = [], asset_keys(table)
    evaluations = [evaluation(keys, day, outcome) for day, outcomes in cdc_outcomes(context.instance, io_manager, table, carried) for outcome in outcomes]
    if table.checks:  # the table's declared checks too
        spark, storage = io_manager.pyspark.spark_session, io_manager.storage
        evaluations += [
            evaluation(keys, day, outcome, warning=check.severity is Severity.warn)
            for day, outcomes in declared_checks.declared_outcomes(spark, storage, table, carried)
            for check, outcome in outcomes
        ]
    for check in evaluations:
        context.instance.report_runless_asset_event(check)
        if not check.passed and check.severity == AssetCheckSeverity.ERROR:
            failed.append(f"{check.asset_key.to_user_string()}:{check.check_name} {check.partition}")
    said = f"; failing: {', '.join(failed)}" if failed else ", all passed"
    context.log.info(f"{table.name}: the checks of {', '.join(carried)} (carried forward) evaluated again{said}")
    if failed:
        raise Failure(description=f"{table.name}: a blocking check failed on a date this correction carried forward: {', '.join(failed)}")


def build_published_asset(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> AssetsDefinition:
    """The table's ``published`` step: downstream of every output, so Dagster runs it only once every blocking
    check on them passed; it publishes what the run staged (cdc_assets/usecases/publishing.py)."""
    key = asset_key(config, PUBLISHED)
    outputs = [asset_key(config, name) for name in (HASHED_INCOMING, REJECTS, *cdc_outputs(config))]

    @multi_asset(
        name=f"{config.name}__publish",
        specs=[AssetSpec(key, deps=outputs, description=ASSET_DESCRIPTIONS[PUBLISHED], group_name=config.name,
                         kinds={"iceberg"}, owners=config.owners, partitions_def=partitions_def)],
        backfill_policy=BackfillPolicy.single_run(),
        can_subset=False,
        pool=pool_name(config),
    )
    def publish(context: AssetExecutionContext, parquet_io_manager: ResourceParam[PartitionedParquetIOManager]):
        days = list(context.partition_keys)
        storage = parquet_io_manager.storage
        unpassed = unpassed_blocking_checks(context, config, days)
        if unpassed:  # nothing is published: a reader of main keeps the dates before the run's
            by_day = {day: [name for name in unpassed if f" {day} (" in name] for day in days}
            say_not_published(context, config, days, by_day, storage.branch, [PUBLISHED, *storage.staged_assets(config.name)])
            log_not_published(context, config, storage, days, unpassed)
            raise Failure(
                description=f"{config.name}: nothing published: blocking check(s) did not pass: {', '.join(unpassed)}. What the "
                f"run wrote stays on branch {storage.branch} (readable for publish.keep_failed_days, docs/publishing.md); "
                "fix the extract and run the date(s) again.",
                metadata={"cdc/publication": MetadataValue.text("staged, not published: a blocking check failed"),
                          "cdc/branch": MetadataValue.text(storage.branch)},
            )
        publication = publish_run(storage, config, days)
        context.log.info(publication.summary())
        missing = [day for day in days if day not in publication.dates]
        if missing:
            raise Failure(
                description=f"{config.name}: {', '.join(missing)} not published: current_table's main does not hold "
                f"{'it' if len(missing) == 1 else 'them'} (nothing of the run was staged: its CDC step was left out or "
                "wrote to main directly). Run the table's job for the date(s)."
            )
        snapshots = MetadataValue.json({name: str(snapshot) for name, snapshot in publication.snapshots.items()})
        for name in publication.snapshots:  # each output's own events say it is published now, not only staged
            for day in days:
                context.log_event(AssetObservation(
                    asset_key=asset_key(config, name), partition=day,
                    metadata={"cdc/publication": MetadataValue.text(f"published from branch {publication.branch}")},
                ))
        for day in days:
            context.add_asset_metadata(
                {"cdc/publication": MetadataValue.text("published"), "cdc/branch": MetadataValue.text(publication.branch),
                 "published_snapshots": snapshots,
                 "retention_snapshot_days": MetadataValue.int((config.retention or Retention()).snapshot_days),
                 "expired_snapshots": MetadataValue.json(publication.expired),
                 "removed_unreferenced_files": MetadataValue.json(publication.removed_files)},
                asset_key=key, partition_key=day,
            )
        return MaterializeResult(asset_key=key)

    return publish


def build_table_definitions(config: TableConfig) -> TableDefinitions:
    """Assets (and, as they are added, checks, schedule and sensor) for one table."""
    # Dagster's end_date is exclusive; the config's is the last business date.
    end = (config.end_date + timedelta(days=1)).isoformat() if config.end_date else None
    partitions_def = DailyPartitionsDefinition(start_date=config.start_date.isoformat(), end_date=end, timezone="UTC")
    assets = [build_incoming_asset(config, partitions_def), build_cdc_assets(config, partitions_def), build_published_asset(config, partitions_def)]
    job = build_table_job(config, partitions_def)
    table = TableDefinitions(
        config=config,
        partitions_def=partitions_def,
        assets=assets,
        asset_checks=build_table_checks(config, partitions_def),
        jobs=[job, build_erase_job(config), build_rollback_job(config)],
        schedules=[build_daily_schedule(config, job)],
        sensors=[build_landing_sensor(config, job, partitions_def)],
    )
    freshness_checks, freshness_sensors = freshness_definitions(config)  # none without `freshness:`
    table.asset_checks += freshness_checks
    table.sensors += freshness_sensors
    return table

