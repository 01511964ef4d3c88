"""The asset factory: everything Dagster needs for one table, built from its validated config.

Per table (asset keys ``[table, name]``, group ``table``, daily partitions from ``start_date``):

- ``hashed_incoming`` (+ ``rejects``): one multi-asset reading the day's extract;
- ``hash_join_classification``, ``inserts``, ``deletes``, ``updates``, ``current_table``,
  ``history_partition``: one multi-asset, because the classification of day d needs
  ``current_table`` of day d-1 and Dagster allows no cycle between assets, only an asset reading its
  own earlier partition. Each output is still its own asset with its own metadata.

Both multi-assets take a whole date range in one run (``BackfillPolicy.single_run``) and process the
dates oldest first, feeding each date's new current state into the next date.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date

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
    TimeWindowPartitionMapping,
    multi_asset,
)
from pyspark import StorageLevel

from cdc_assets.automation import build_daily_schedule, build_landing_sensor, build_table_job
from cdc_assets.checks import build_table_checks
from cdc_assets.config import TableConfig
from cdc_assets.core import changes as cdc
from cdc_assets.core.guards import MassDeleteError, deletion_problem
from cdc_assets.core.incoming import IncomingBatch, prepare_incoming
from cdc_assets.names import (
    CDC_OUTPUTS,
    CLASSIFICATION,
    CURRENT,
    DELETES,
    HASHED_INCOMING,
    HISTORY,
    INSERTS,
    REJECTS,
    UPDATES,
    asset_key,
    day_before,
    pool_name,
)
from resources.parquet_io_manager import LazyPartitions
from resources.spark import SparkResource, map_dates

IO_MANAGER_KEY = "parquet_io_manager"
KINDS = {"spark", "parquet"}

DESCRIPTIONS = {
    HASHED_INCOMING: (
        "The day's extract as read from the source, cast to the configured types, with `key_hash` and "
        "`non_key_hash` (MD5 of the canonical encoding, see README) computed once and stored. Rows that "
        "fail validation are in `rejects`, never here."
    ),
    REJECTS: (
        "Quarantined input rows of the day: the raw record, why it was rejected (malformed, a value that "
        "does not cast, a NULL or empty key, a duplicated key) and the source file. "
        "Rows read = rows in hashed_incoming + rows here."
    ),
    CLASSIFICATION: (
        "One row per key: the day's incoming hashes FULL OUTER JOIN the previous day's current_table "
        "hashes ON key_hash, classified I (insert), U (update), N (no change), and D (deleted, full "
        "loads) or X (not supplied, delta loads). Only hash columns take part in the join."
    ),
    INSERTS: "Rows whose key is new today (I), with their full payload from the day's input.",
    DELETES: (
        "Keys missing from today's input, with their last payload from the previous current_table: "
        "D (deleted) for full loads, X (not supplied) for delta loads."
    ),
    UPDATES: "Rows whose non-key values changed today (U), with their full payload from the day's input.",
    CURRENT: (
        "The table's state as of the business date: I + U + N (payload from the day's input) + X "
        "(payload kept from the previous state). Deleted keys leave. `eff_start_date` is the date the "
        "row's current version started. Each partition is the full state as of its date."
    ),
    HISTORY: (
        "The date's net changes: I + U + D, each with eff_start_date = the business date (D rows carry "
        "their last payload). Read the asset folder as one dataset for the whole history."
    ),
}


class ApplyChangesConfig(Config):
    """Run config of the CDC step (Launchpad: ops -> <table>__cdc -> config)."""

    allow_mass_delete: bool = False
    """Accept a full extract that is empty or would delete more than max_delete_fraction of the
    current rows. Only for a source that really did delete them; the run is tagged when used."""


MASS_DELETE_OVERRIDE_TAG = "cdc/mass_delete_override"


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


def build_incoming_asset(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> AssetsDefinition:
    common = dict(group_name=config.name, kinds=KINDS, owners=config.owners, partitions_def=partitions_def)
    hashed_key, rejects_key = asset_key(config, HASHED_INCOMING), asset_key(config, REJECTS)

    @multi_asset(
        name=f"{config.name}__{HASHED_INCOMING}",
        specs=[
            AssetSpec(hashed_key, description=DESCRIPTIONS[HASHED_INCOMING], **common).with_io_manager_key(IO_MANAGER_KEY),
            AssetSpec(rejects_key, description=DESCRIPTIONS[REJECTS], **common).with_io_manager_key(IO_MANAGER_KEY),
        ],
        backfill_policy=BackfillPolicy.single_run(),
        can_subset=False,
        pool=pool_name(config),
    )
    def read_incoming(context: AssetExecutionContext, pyspark: SparkResource):
        spark = pyspark.spark_session
        days = list(context.partition_keys)  # oldest first
        batches = _prepare_dates(spark, config, days)
        accepted, rejected = {}, {}
        try:
            for day, (batch, seconds) in zip(days, batches):
                accepted[day], rejected[day] = batch.accepted, batch.rejected
                counts = {
                    "rows_read": batch.rows_read,
                    "rows_accepted": batch.rows_accepted,
                    "rows_rejected": batch.rows_rejected,
                    "duplicate_keys": batch.duplicate_keys,
                    "source_path": MetadataValue.path(config.source.path_for(day)),
                }
                for key in (hashed_key, rejects_key):
                    context.add_asset_metadata(counts, asset_key=key, partition_key=day)
                context.log.info(
                    f"{config.name} {day}: read {batch.rows_read} rows, accepted {batch.rows_accepted}, "
                    f"rejected {batch.rows_rejected} in {seconds:.2f}s"
                )
            yield Output(accepted, output_name=context.assets_def.get_output_name_for_asset_key(hashed_key))
            yield Output(rejected, output_name=context.assets_def.get_output_name_for_asset_key(rejects_key))
        finally:
            for batch, _ in batches:
                batch.release()

    return read_incoming


def _prepare_dates(spark, config: TableConfig, days: list[str]) -> list[tuple[IncomingBatch, float]]:
    """Each date's intake with its seconds, in date order; a range's dates are read side by side.

    The dates of a range do not depend on each other at intake, and for small days the time goes to
    Spark job latency rather than work (see ``map_dates``). If any date fails, the oldest failing
    date's error is raised and the other dates' cached rows are released.
    """

    def prepare(day: str) -> tuple[IncomingBatch | None, float, Exception | None]:
        started = time.perf_counter()
        try:
            return prepare_incoming(spark, config, date.fromisoformat(day)), time.perf_counter() - started, None
        except Exception as error:  # noqa: BLE001 - re-raised below, once the other dates are cleaned up
            return None, 0.0, error

    results = map_dates(prepare, days)
    failure = next((error for _, _, error in results if error is not None), None)
    if failure is not None:
        for batch, _, _ in results:
            if batch is not None:
                batch.release()
        raise failure
    return [(batch, seconds) for batch, seconds, _ in results]


def build_cdc_assets(config: TableConfig, partitions_def: DailyPartitionsDefinition) -> AssetsDefinition:
    common = dict(group_name=config.name, kinds=KINDS, owners=config.owners, partitions_def=partitions_def)
    keys = {name: asset_key(config, name) for name in CDC_OUTPUTS}
    hashed_key = asset_key(config, HASHED_INCOMING)
    previous_day = TimeWindowPartitionMapping(start_offset=-1, end_offset=-1, allow_nonexistent_upstream_partitions=True)
    # Each output has a single parent inside the graph; current_table also depends on its own
    # previous partition. README.md, "Graph shape", says why this shape and no other backfills.
    specs = [
        AssetSpec(keys[CLASSIFICATION], deps=[hashed_key], description=DESCRIPTIONS[CLASSIFICATION], **common),
        *(
            AssetSpec(keys[name], deps=[keys[CLASSIFICATION]], description=DESCRIPTIONS[name], **common)
            for name in (INSERTS, DELETES, UPDATES, HISTORY)
        ),
        AssetSpec(
            keys[CURRENT],
            deps=[keys[CLASSIFICATION], AssetDep(keys[CURRENT], partition_mapping=previous_day)],
            description=DESCRIPTIONS[CURRENT],
            **common,
        ),
    ]
    specs = [spec.with_io_manager_key(IO_MANAGER_KEY) for spec in specs]
    payload_columns = [column.name for column in config.columns]
    table = config  # inside the step, `config` is the run config (Dagster's naming)

    @multi_asset(
        name=f"{config.name}__cdc",
        specs=specs,
        ins={"incoming": AssetIn(hashed_key), "previous_current": AssetIn(keys[CURRENT])},
        backfill_policy=BackfillPolicy.single_run(),
        can_subset=False,
        pool=pool_name(config),
    )
    def apply_changes(
        context: AssetExecutionContext,
        config: ApplyChangesConfig,
        pyspark: SparkResource,
        incoming: LazyPartitions,
        previous_current: LazyPartitions | None,
    ):
        days = list(context.partition_keys)  # oldest first
        max_partitions = int(pyspark.spark_session.conf.get("spark.sql.shuffle.partitions"))
        first_previous = day_before(days[0])
        previous = previous_current[first_previous] if previous_current and first_previous in previous_current else None
        outputs: dict[str, dict] = {name: {} for name in CDC_OUTPUTS}
        cached = []
        try:
            for day in days:
                with _timed(context, table.name, "classification", day):
                    classification = cdc.classify_changes(
                        incoming[day], previous, date.fromisoformat(day), table.load_type
                    ).persist(StorageLevel.MEMORY_AND_DISK)
                    counts = cdc.count_operations(classification)
                cached.append(classification)
                context.log.info(f"{table.name} {day}: " + ", ".join(f"{op}={n}" for op, n in counts.items()))
                _guard_deletions(context, table, day, counts, config.allow_mass_delete)
                # A local checkpoint (not a cache) cuts the lineage: the next date's plan starts from
                # this date's rows instead of nesting every earlier date's plan (a 10-day range failed).
                # A broadcast re-join keeps both inputs' partitions, and the next date reads this
                # date's state, so without the cap a range would add partitions (and files) every date.
                changed = (
                    cdc.join_payload(classification, incoming[day], previous, payload_columns, counts)
                    .coalesce(max_partitions)
                    .localCheckpoint()
                )
                current = cdc.build_current(changed)
                outputs[CLASSIFICATION][day] = classification
                outputs[INSERTS][day] = cdc.with_operations(changed, [cdc.INSERT])
                outputs[UPDATES][day] = cdc.with_operations(changed, [cdc.UPDATE])
                outputs[DELETES][day] = cdc.with_operations(changed, cdc.REMOVED_OPERATIONS)
                outputs[CURRENT][day] = current
                outputs[HISTORY][day] = cdc.build_history(changed)
                _add_count_metadata(context, keys, day, counts)
                previous = current  # the next date classifies against this date's state
            # Nothing is written until every date of the range has passed its guards.
            for name in CDC_OUTPUTS:
                with _timed(context, table.name, f"write {name}", f"{days[0]}..{days[-1]}"):
                    yield Output(outputs[name], output_name=context.assets_def.get_output_name_for_asset_key(keys[name]))
        finally:
            for frame in cached:
                frame.unpersist()

    return apply_changes


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


def _add_count_metadata(context: AssetExecutionContext, keys: dict[str, AssetKey], day: str, counts: dict[str, int]) -> None:
    by_operation = {
        "inserts": counts[cdc.INSERT],
        "updates": counts[cdc.UPDATE],
        "deletes": counts[cdc.DELETE],
        "not_supplied": counts[cdc.NOT_SUPPLIED],
        "unchanged": counts[cdc.UNCHANGED],
    }
    for name in (CLASSIFICATION, CURRENT, HISTORY):
        context.add_asset_metadata(by_operation, asset_key=keys[name], partition_key=day)


def build_table_definitions(config: TableConfig) -> TableDefinitions:
    """Assets (and, as they are added, checks, schedule and sensor) for one table."""
    partitions_def = DailyPartitionsDefinition(start_date=config.start_date.isoformat(), timezone="UTC")
    assets = [build_incoming_asset(config, partitions_def), build_cdc_assets(config, partitions_def)]
    job = build_table_job(config, partitions_def)
    return TableDefinitions(
        config=config,
        partitions_def=partitions_def,
        assets=assets,
        asset_checks=build_table_checks(config, partitions_def),
        jobs=[job],
        schedules=[build_daily_schedule(config, job)],
        sensors=[build_landing_sensor(config, job, partitions_def)],
    )

