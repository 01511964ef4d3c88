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
module is wiring only: what runs is in ``core/``, where it goes is in ``resources/``.
"""

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetSpec,
    AssetsDefinition,
    BackfillPolicy,
    Config,
    DailyPartitionsDefinition,
    MetadataValue,
    Output,
    ResourceParam,
    TimeWindowPartitionMapping,
    multi_asset,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import functions as F

from cdc_assets.defs.automation import build_daily_schedule, build_landing_sensor, build_table_job
from cdc_assets.defs.asset_descriptions import ASSET_DESCRIPTIONS
from cdc_assets.defs.checks import build_table_checks
from cdc_assets.model.config import DuplicateKeyPolicy, Retention, SourceFormat, TableConfig
from cdc_assets.defs.freshness import freshness_definitions
from cdc_assets.core.capture import changes as cdc
from cdc_assets.core.capture.changeset import ChangeSetRules
from cdc_assets.core.capture.guards import MassDeleteError, deletion_problem
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.intake.incoming import prepare_incoming_dates
from cdc_assets.core.capture.plan import plan_changes
from cdc_assets.core.capture.rerun import RerunDecision, rerun_decision
from cdc_assets.core.capture.schema import migrate_state, values_for_added_columns, with_hash_spec
from cdc_assets.core.intake.columns import CHANGE_SEQUENCE
from cdc_assets.core.intake.source import read_source
from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.model.names import (
    CLASSIFICATION,
    CURRENT,
    DELETES,
    HASHED_INCOMING,
    HISTORY,
    INSERTS,
    REJECTS,
    UPDATES,
    APPLIED_SEQUENCES,
    LATE_CHANGES,
    cdc_outputs,
    day_before,
    pool_name,
)
from cdc_assets.defs.runs_log import cdc_left_out, run_started_at, runs_logged
from cdc_assets.usecases.schema_changes import configured_spec, evolution_since
from cdc_assets.core.capture.state import StateSince, compaction_due, untouched_operation
from cdc_assets.usecases.erasure import erased_keys
from cdc_assets.defs.erasure_events import build_erase_job
from resources.parquet_io_manager import (
    CONFIGURED_COLUMNS,
    RENAMED_COLUMNS,
    STATE_LOAD_TYPE,
    DatedRows,
    LazyPartitions,
    PartitionedParquetIOManager,
    StateRows,
    server_loss_explained,
)
from resources.storage.state import (
    CHANGE_DATES_SINCE_FULL_COPY,
    CHANGE_ROWS_SINCE_FULL_COPY,
    FULL_COPY_ROWS,
    state_rows,
    state_since_full,
)
from resources.session.spark_session import SCHEDULER_POOL, for_each_date

IO_MANAGER_KEY = "parquet_io_manager"
BACKFILL_TAG = "dagster/backfill"  # Dagster's tag on every run a backfill launches: the backfill's id
KINDS = {"spark", "parquet"}



class ApplyChangesConfig(Config):
    """Run config of the CDC step (Launchpad: ops -> <table>__cdc -> config)."""

    allow_mass_delete: bool = False
    """Accept a full extract that is empty or would delete more than max_delete_fraction of the
    current rows. Only for a source that really did delete them; the run is tagged when used."""

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


@contextmanager
def _timed(context: AssetExecutionContext, table: str, stage: str, business_date: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    context.log.info(f"{table} {business_date}: {stage} finished in {time.perf_counter() - started:.2f}s")


def columns_metadata(config: TableConfig) -> dict[str, str]:
    """An asset's definition metadata naming the config's columns (with their former names) and its renamed
    ones: before it writes, the IO manager renames the renamed columns in the asset's Iceberg table and
    drops the columns the config no longer has."""
    renamed = {column.name: list(column.renamed_from) for column in config.columns if column.renamed_from}
    names = [name for column in config.columns for name in (column.name, *column.renamed_from)]
    if config.changes is not None:  # a change set's own source columns, which some outputs keep beside the table's
        names += [*([config.changes.operation_column] if config.changes.operation_column else []), *config.changes.sequence_columns]
    return {CONFIGURED_COLUMNS: json.dumps(names), **({RENAMED_COLUMNS: json.dumps(renamed)} if renamed else {})}


def build_incoming_asset(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> AssetsDefinition:
    common = dict(group_name=config.name, kinds=KINDS, owners=config.owners, partitions_def=partitions_def)
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
        # The CDC step logs the run's dates; this step does when the run ends here.
        with runs_logged(context, config, parquet_io_manager.storage, days, "intake", only_if_last=cdc_left_out(context, config)):
            if not cdc_left_out(context, config):
                # The CDC step would refuse the run: refused here, before the intake writes anything.
                later_dates_decision(context, config, parquet_io_manager.storage, days)
            # A change of columns that cannot be applied fails the date here, before anything is written.
            evolution_since(parquet_io_manager.storage, config, day_before(days[0]), rebaseline=_rebaseline_declared(context, config))
            with server_loss_explained(pyspark):
                yield from _read_incoming(context, config, pyspark, parquet_io_manager, days, hashed_key, rejects_key)

    return read_incoming


def _read_incoming(
    context: AssetExecutionContext, config: TableConfig, pyspark, parquet_io_manager, days: list[str], hashed_key, rejects_key
):
    """The intake step: read, validate and hash every date of the range, then write both outputs."""
    # The warehouse's session: it reaches the object store an extract may be in (s3://) as the tables do.
    spark = parquet_io_manager.storage.tables.session_for(pyspark.spark_session)
    spark.conf.set(SCHEDULER_POOL, pool_name(config))  # this table's fair share of a shared server
    # Each date's extract is located and its header checked on its own, side by side (the header
    # is read by Spark, a small job each); then every date is validated and hashed in
    # one query, and written in one write per output. Per-date jobs, not rows, are what a range
    # of small days would otherwise pay for.
    with _timed(context, config.name, "reading the extracts' headers", _span(days)):
        sources = dict(zip(days, for_each_date(lambda day: read_source(spark, config, day), days)))
    # Keys erased from the table (cdc-erase) never come back from an extract, a re-read one included,
    # unless the table says `erased_keys: keep`.
    # The lock first: an erase running now (it holds the lock) finishes, and its keys are in the ledger read.
    parquet_io_manager.storage.hold_writer_lock(config.name)
    erased = erased_keys(spark, parquet_io_manager.storage, config.name)
    with _timed(context, config.name, "validation and hashing", _span(days)):
        prepared = prepare_incoming_dates(config, sources, erased)
    try:
        summary = []  # one log line per date, logged as one message: each message is an event stored
        for day in days:
            figures = prepared.figures[day]
            counts = {
                "rows_read": figures.rows_read,
                "rows_accepted": figures.rows_accepted,
                "rows_rejected": figures.rows_rejected,
                "source_path": MetadataValue.path(config.source.path_for(day)),
            }
            if config.changes is None:  # a change set's ties are found by the CDC step, after lateness
                counts["duplicate_keys"] = figures.duplicate_keys
            if config.source.format is SourceFormat.debezium:
                counts["tombstone_lines"] = figures.tombstone_lines
            if erased is not None:
                counts["erased_keys_in_extract"] = figures.erased_records
                counts["erased_records_set_aside"] = figures.set_aside
            for key in (hashed_key, rejects_key):
                context.add_asset_metadata(counts, asset_key=key, partition_key=day)
            summary.append(
                f"{config.name} {day}: read {figures.rows_read} rows, accepted {figures.rows_accepted}, "
                f"rejected {figures.rows_rejected}"
                + (f", {figures.erased_records} of erased keys ({config.erased_keys.value})" if figures.erased_records else "")
            )
        context.log.info("\n".join(summary))
        kept = config.retention or Retention()
        for key, rows in ((hashed_key, prepared.accepted), (rejects_key, prepared.rejected)):
            with _timed(context, config.name, f"write {key.path[-1]}", _span(days)):
                output = DatedRows(rows, retention_staging_days=kept.staging_days, retention_snapshot_days=kept.snapshot_days)
                yield Output(output, output_name=context.assets_def.get_output_name_for_asset_key(key))
    finally:
        prepared.release()


def _rebaseline_declared(context: AssetExecutionContext, table: TableConfig) -> bool:
    """Whether the run's config declares a re-baseline for the table's CDC step (the intake reads it too)."""
    ops = (context.run_config or {}).get("ops", {})
    return bool(ops.get(f"{table.name}__cdc", {}).get("config", {}).get("rebaseline", False))


def later_dates_decision(context: AssetExecutionContext, table: TableConfig, storage, days: list[str]) -> RerunDecision:
    """Whether the run may write ``days`` while current_table stores later dates (cdc_assets/core/capture/rerun.py):
    the stored dates and the run's backfill are gathered here; the decision is the core's."""
    storage.hold_writer_lock(table.name)  # no run adds a date between this look and the run's writes
    return rerun_decision(table.name, days, storage.stored_dates(table.name, CURRENT), _backfill_dates(context, table))


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


def _span(days: list[str]) -> str:
    return days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"


def build_cdc_assets(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> AssetsDefinition:
    common = dict(group_name=config.name, kinds=KINDS, owners=config.owners, partitions_def=partitions_def)
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
        deps = [keys[CLASSIFICATION]]
        if name in (CURRENT, APPLIED_SEQUENCES):
            deps.append(AssetDep(keys[name], partition_mapping=previous_day))
        is_state = name in (CURRENT, APPLIED_SEQUENCES)
        metadata = {STATE_LOAD_TYPE: config.load_type.value, "cdc/state_storage": config.storage.current.value} if is_state else {}
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
                context, table, config, pyspark, parquet_io_manager.storage, keys, incoming, previous_current,
                change_set_state.get("previous_sequences"), logged,
            )

    return apply_changes


def _apply_changes(
    context, table: TableConfig, config: ApplyChangesConfig, pyspark, storage, keys, incoming, previous_current,
    previous_sequences, logged,
):
    """The CDC step: plan the range (core/capture/plan.py), guard it, then write every output."""
    days = list(context.partition_keys)  # oldest first
    dates = [date.fromisoformat(day) for day in days]
    first_previous = day_before(days[0])

    def as_of_day_before(stored: LazyPartitions | None):
        return stored[first_previous] if stored and first_previous in stored else None

    # A run that later stored dates were computed from: refused, or (inside a backfill that recomputes
    # them) each output drops them in the same commit as it writes the run's dates.
    decision = later_dates_decision(context, table, storage, days)
    drop_after = days[-1] if decision.dropped else None
    if decision.dropped:
        context.log.info(
            f"{table.name}: this run is part of a backfill that recomputes {', '.join(decision.dropped)}; each output "
            f"drops them in the commit that writes {_span(days)}, and the backfill's later runs write them again"
        )
    spark = pyspark.spark_session
    spark.conf.set(SCHEDULER_POOL, pool_name(table))
    previous_state = as_of_day_before(previous_current)
    incremental = table.storage.incremental
    incoming_rows = incoming.read_all()
    evolution = evolution_since(storage, table, first_previous, rebaseline=config.rebaseline) if previous_state is not None else None
    if evolution is not None and evolution.applies:
        previous_state = _in_new_schema(context, table, previous_state, incoming_rows, evolution, days[0])
    # An incremental state's rows are counted from what is stored, not by reading the state.
    previous_rows = state_rows(storage, table.name, CURRENT, first_previous) if incremental and previous_state is not None else 0
    with _timed(context, table.name, "classification", _span(days)):
        plan = plan_changes(
            incoming_rows,
            previous_state,
            dates,
            table.load_type,
            [column.name for column in table.columns],
            max_write_tasks=int(spark.conf.get("spark.sql.shuffle.partitions")),
            previous_sequences=as_of_day_before(previous_sequences),
            change_set_rules=_change_set_rules(table),
            audit=cdc.RunAudit(context.run_id, run_started_at(context)),
            non_key_columns=[column.name for column in table.non_keys],
            touched_keys_only=incremental,
            previous_rows=previous_rows,
            untracked_columns=[column.name for column in table.untracked_columns],
        )
    try:
        counts = {day.isoformat(): by_op for day, by_op in plan.counts.items()}
        logged.counts = counts
        figures = {day.isoformat(): found for day, found in plan.figures.items()}
        context.log.info(
            "\n".join(
                f"{table.name} {day}: " + ", ".join(f"{op}={n}" for op, n in {**counts[day], **figures.get(day, {})}.items())
                for day in days
            )
        )
        for day in days:
            _guard_deletions(context, table, day, counts[day], config.allow_mass_delete)
            _add_count_metadata(context, keys, day, counts[day], figures.get(day, {}))
        changed_schema = evolution is not None and evolution.applies
        if changed_schema:
            described = MetadataValue.json({**evolution.change.describe(), "rebaseline": evolution.rebaseline})
            for name in (CLASSIFICATION, CURRENT, HISTORY):
                context.add_asset_metadata({"schema_change": described}, asset_key=keys[name], partition_key=days[0])
            logged.schema_change = {days[0]: json.dumps(described.value, sort_keys=True)}
        spec = configured_spec(table)
        # Nothing is written until every date of the range has passed its guards.
        outputs = {
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
        current_days, staging_days, snapshot_days = kept.current_days, kept.staging_days, kept.snapshot_days
        for name in keys:
            dropped = current_days if name in (CURRENT, APPLIED_SEQUENCES) else None
            # current_table carries the columns its hashes cover, for the next date to compare with.
            frame = with_hash_spec(outputs[name], spec) if name == CURRENT else outputs[name]
            staging = staging_days if name in (CLASSIFICATION, LATE_CHANGES) else None
            rows = DatedRows(
                frame, retention_current_days=dropped, retention_staging_days=staging, retention_snapshot_days=snapshot_days,
                drop_stored_after=drop_after,
            )
            if name == CURRENT and incremental:
                rows = state = _incremental_state(
                    context, table, storage, plan, days, previous_state is not None, previous_rows, dropped, spec, changed_schema,
                    snapshot_days, drop_after,
                )
            elif name == APPLIED_SEQUENCES and incremental:
                # Compacted together with current_table: full copies on the same dates.
                full = plan.sequences.filter(F.col(BUSINESS_DATE).isin(*state.full_dates)) if state.full_dates else None
                rows = StateRows(
                    plan.sequence_changes, full, state.full_dates, untouched=state.untouched, retention_current_days=dropped,
                    retention_snapshot_days=snapshot_days, drop_stored_after=drop_after,
                )
            with _timed(context, table.name, f"write {name}", _span(days)):
                yield Output(rows, output_name=context.assets_def.get_output_name_for_asset_key(keys[name]))
    finally:
        plan.release()


def _in_new_schema(context, table: TableConfig, previous_state, incoming_rows, evolution, first_day: str):
    """The previous state brought into the config's columns (core/capture/schema.py), for a date whose columns changed."""
    what = "a declared re-baseline" if evolution.rebaseline else evolution.change.summary()
    context.log.info(
        f"{table.name} {first_day}: schema change since the state stored as of {evolution.stored_as_of} ({what}); "
        "the previous state is compared in the new schema, and this date stores a full copy"
    )
    if evolution.rebaseline:
        context.instance.add_run_tags(context.run_id, {REBASELINE_TAG: "true"})
    first_rows = incoming_rows.filter(F.col(BUSINESS_DATE) == F.lit(first_day).cast("date"))
    sequence = CHANGE_SEQUENCE if table.changes is not None else None
    values = values_for_added_columns(first_rows, evolution.change, evolution.configured, order_by=sequence)
    return migrate_state(previous_state, evolution.stored, evolution.configured, evolution.change, values, evolution.rebaseline)


def _incremental_state(
    context, table: TableConfig, storage, plan, days: list[str], has_previous: bool, previous_rows: int, current_days,
    spec, changed_schema: bool, snapshot_days: int, drop_after: str | None = None,
) -> StateRows:
    """What an incremental (merged) current_table stores for each date: its changes, applied with one
    MERGE, or the whole state when ``storage.compact_after_share`` / ``compact_after_dates`` say so
    (compaction: a copy without position deletes), when there is no earlier state, or when the date's
    columns changed (a date's changes have the columns of the date before)."""
    since = state_since_full(storage, table.name, CURRENT, day_before(days[0])) if has_previous else None
    rows, full_dates, metadata, properties, notes = previous_rows, [], {}, {}, []
    for day in days:
        counts = plan.counts[date.fromisoformat(day)]
        change_rows = sum(n for op, n in counts.items() if op != untouched_operation(table.load_type))
        rows += counts[cdc.INSERT] - counts[cdc.DELETE]
        grown = None if since is None else StateSince(since.full_rows, since.change_dates + 1, since.change_rows + change_rows)
        # A truncate changes the whole state (and a change set's floor): stored as a full copy.
        truncated = plan.figures.get(date.fromisoformat(day), {}).get("truncates", 0) > 0
        new_schema = changed_schema and day == days[0]
        if compaction_due(grown, table.storage) or truncated or new_schema:
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
            "state_rows": MetadataValue.int(rows),
            "change_rows_since_full_copy": MetadataValue.int(since.change_rows),
            "change_dates_since_full_copy": MetadataValue.int(since.change_dates),
        }
        # Recorded in the date's snapshot, for the next run's compaction decision (resources/storage/state.py).
        properties[day] = {
            FULL_COPY_ROWS: str(since.full_rows),
            CHANGE_DATES_SINCE_FULL_COPY: str(since.change_dates),
            CHANGE_ROWS_SINCE_FULL_COPY: str(since.change_rows),
        }
    if notes:
        context.log.info("\n".join(notes))
    full = plan.full_states([date.fromisoformat(day) for day in full_dates]) if full_dates else None
    return StateRows(
        changes=with_hash_spec(plan.state_changes, spec),
        full=None if full is None else with_hash_spec(full, spec),
        full_dates=tuple(full_dates),
        untouched=untouched_operation(table.load_type),
        retention_current_days=current_days,
        retention_snapshot_days=snapshot_days,
        metadata=metadata,
        properties=properties,
        drop_stored_after=drop_after,
    )


def _change_set_rules(table: TableConfig) -> ChangeSetRules | None:
    if table.changes is None:
        return None
    return ChangeSetRules(
        table=table.name,
        key_columns=tuple(table.key_names),
        tombstone_retention_days=table.changes.tombstone_retention_days,
        quarantine_ties=table.duplicate_keys is DuplicateKeyPolicy.quarantine,
        hashed_non_keys=tuple((column.name, column.type) for column in table.non_keys),
    )


def _guard_deletions(
    context: AssetExecutionContext, table: TableConfig, day: str, counts: dict[str, int], allowed: bool
) -> None:
    problem = deletion_problem(table, day, counts)
    if problem is None:
        return
    if not allowed:
        raise MassDeleteError(
            f"{problem}. No CDC output was written for this date (hashed_incoming holds the extract as "
            "read). If the source really deleted these rows, re-run with run config "
            f"ops: {{{table.name}__cdc: {{config: {{allow_mass_delete: true}}}}}}."
        )
    context.log.warning(f"{problem}; accepted because the run sets allow_mass_delete")
    context.instance.add_run_tags(context.run_id, {MASS_DELETE_OVERRIDE_TAG: "true"})
    for name in (CURRENT, HISTORY, DELETES):
        context.add_asset_metadata(
            {"mass_delete_override": MetadataValue.text(problem)}, asset_key=asset_key(table, name), partition_key=day
        )


def _add_count_metadata(
    context: AssetExecutionContext, keys: dict[str, AssetKey], day: str, counts: dict[str, int], figures: dict[str, int]
) -> None:
    by_operation = {
        "inserts": counts[cdc.INSERT],
        "updates": counts[cdc.UPDATE],
        "deletes": counts[cdc.DELETE],
        "not_supplied": counts[cdc.NOT_SUPPLIED],
        "unchanged": counts[cdc.UNCHANGED],
        **figures,  # a changeset's winners, superseded, late, duplicate events, deletes of unknown keys
    }
    for name in (CLASSIFICATION, CURRENT, HISTORY):
        context.add_asset_metadata(by_operation, asset_key=keys[name], partition_key=day)


def build_table_definitions(config: TableConfig) -> TableDefinitions:
    """Assets (and, as they are added, checks, schedule and sensor) for one table."""
    # Dagster's end_date is exclusive; the config's is the last business date.
    end = (config.end_date + timedelta(days=1)).isoformat() if config.end_date else None
    partitions_def = DailyPartitionsDefinition(start_date=config.start_date.isoformat(), end_date=end, timezone="UTC")
    assets = [build_incoming_asset(config, partitions_def), build_cdc_assets(config, partitions_def)]
    job = build_table_job(config, partitions_def)
    table = TableDefinitions(
        config=config,
        partitions_def=partitions_def,
        assets=assets,
        asset_checks=build_table_checks(config, partitions_def),
        jobs=[job, build_erase_job(config)],
        schedules=[build_daily_schedule(config, job)],
        sensors=[build_landing_sensor(config, job, partitions_def)],
    )
    freshness_checks, freshness_sensors = freshness_definitions(config)  # none without `freshness:`
    table.asset_checks += freshness_checks
    table.sensors += freshness_sensors
    return table

