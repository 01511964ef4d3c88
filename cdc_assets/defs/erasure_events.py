"""What Dagster is told of an erase, and the table's erase job (the UI's way to run ``cdc-erase``).

An erase changes stored partitions and the figures their materializations recorded (rows read, the
operations counted, X, a change set's winners), which the reconciliation checks use. So each partition
it rewrote gets a new materialization: the figures of the latest one, less what the erase removed,
with ``erased_rows`` (the rows it removed) and ``erasure_request``. Then the checks of the dates it
touched are evaluated again on what is stored now. The metadata copied never includes the partition's
preview: it showed the rows as they were.
"""


import os
from collections import defaultdict
from datetime import date, timedelta
from collections.abc import Iterator

from dagster import (
    AssetMaterialization,
    AssetRecordsFilter,
    Config,
    DagsterInstance,
    Failure,
    MetadataValue,
    OpExecutionContext,
    ResourceParam,
    job,
    op,
)
from dagster_pyspark import LazyPySparkResource

from cdc_assets.defs.checks import cdc_outcomes, evaluation, intake_outcomes
from cdc_assets.model.config import TableConfig
from cdc_assets.core.capture.changes import DELETE, INSERT, UNCHANGED, UPDATE
from cdc_assets.usecases.erasure import ErasureResult, erase_keys
from cdc_assets.defs.asset_keys import asset_key, asset_keys
from cdc_assets.model.names import (
    CDC_OUTPUTS, CHANGESET_OUTPUTS, CLASSIFICATION, CURRENT, HASHED_INCOMING, HISTORY, LATE_CHANGES, REJECTS, pool_name,
)
from resources.parquet_io_manager import PartitionedParquetIOManager

# The metadata of an operation's count, as the CDC step records it on classification, current_table and history.
_OPERATION_FIGURES = {INSERT: "inserts", UPDATE: "updates", DELETE: "deletes", UNCHANGED: "unchanged"}
_INTAKE = (HASHED_INCOMING, REJECTS)
_NOT_COPIED = ("preview", "erased_rows", "erasure_request")


def erasure_materializations(instance: DagsterInstance, config: TableConfig, storage, result: ErasureResult) -> list[AssetMaterialization]:
    """A materialization per partition the erase changed, with its adjusted figures (see the module docstring).

    A partition this Dagster instance never saw materialized gets none: it has no figures to adjust.
    """
    removed: dict[tuple[str, str], int] = defaultdict(int)
    for (asset, day), rows in result.removed.items():
        removed[(asset, day)] += rows
    events = []
    for day in touched_days(result):
        intake_changed = any(removed.get((asset, day)) for asset in _INTAKE)
        cdc_changed = any(removed.get((asset, day)) for asset in (*CDC_OUTPUTS, *CHANGESET_OUTPUTS)) or _not_supplied_removed(result).get(day)
        for asset in (*_INTAKE, *CDC_OUTPUTS, *CHANGESET_OUTPUTS):
            figures_change = (asset in _INTAKE and intake_changed) or (asset in (CLASSIFICATION, CURRENT, HISTORY) and cdc_changed)
            if not removed.get((asset, day)) and not figures_change:
                continue
            latest = _latest_metadata(instance, asset_key(config, asset), day)
            if latest is None:
                continue
            metadata = {name: value for name, value in latest.items() if name not in _NOT_COPIED}
            metadata.update(_adjusted_figures(config, asset, day, latest, removed, result))
            if storage.has_partition(config.name, asset, day):  # what the date stores now
                metadata["dagster/row_count"] = MetadataValue.int(storage.row_counts(config.name, asset, [day])[day])
            metadata["erased_rows"] = MetadataValue.int(removed.get((asset, day), 0))
            metadata["erasure_request"] = MetadataValue.text(result.request_id)
            events.append(AssetMaterialization(asset_key=asset_key(config, asset), partition=day, metadata=metadata,
                                               description=f"cdc-erase request {result.request_id}: {removed.get((asset, day), 0)} row(s) removed"))
    return events


def erasure_check_evaluations(instance: DagsterInstance, io_manager: PartitionedParquetIOManager, config: TableConfig, days: list[str]):
    """The table's checks of ``days``, evaluated again on what is stored and recorded now: the intake
    checks of the dates whose staging outputs are stored, the CDC checks of those whose states are too
    (:func:`rechecked`); the others' earlier evaluations stand."""
    intake_days, cdc_days, _ = rechecked(instance, io_manager.storage, config, days)
    keys = asset_keys(config)
    evaluations = []
    if intake_days:
        evaluations += [evaluation(keys, day, outcome) for day, outcome in intake_outcomes(instance, io_manager, config, intake_days)]
    if cdc_days:
        for day, outcomes in cdc_outcomes(instance, io_manager, config, cdc_days):
            evaluations += [evaluation(keys, day, outcome) for outcome in outcomes]
    return evaluations


def rechecked(instance: DagsterInstance, storage, config: TableConfig, days: list[str]) -> tuple[list[str], list[str], dict[str, str]]:
    """Which of ``days`` get their checks evaluated again: (intake check dates, CDC check dates, and per
    date what is not evaluated again and why). Only what is stored is checked again.

    The intake checks read the date's staging outputs (hashed_incoming, rejects, the classification, a
    change set's late_changes); the CDC checks also its state and the state of the day before (its rows).
    A date retention dropped one of (``retention.staging_days``, ``retention.current_days``) keeps the
    earlier evaluations of the checks that read it. So does a date whose figures this instance never
    recorded: the checks reconcile against the figures the date's runs recorded, and a date another
    instance ran (hosts sharing a lake) has none here (the ledger records the erase, and
    ``cdc-erase --verify`` checks it from any host)."""
    table = config.name
    staging = (HASHED_INCOMING, REJECTS, CLASSIFICATION, *((LATE_CHANGES,) if config.changes is not None else ()))
    recorded = (asset_key(config, HASHED_INCOMING), asset_key(config, CLASSIFICATION))

    def missing(parts: list[tuple[str, str]]) -> str:
        absent = [(asset, on) for asset, on in parts if not storage.has_partition(table, asset, on)]
        if not absent:
            return ""
        dropped = any(storage.dropped_partition(table, asset, on) for asset, on in absent)
        return f"{', '.join(f'{asset} {on}' for asset, on in absent)} {'dropped by retention' if dropped else 'not stored'}"

    intake_days, cdc_days, skipped = [], [], {}
    for day in days:
        if not all(_latest_metadata(instance, key, day) is not None for key in recorded):
            skipped[day] = "no check evaluated again: no run of it recorded its figures in this Dagster instance"
            continue
        absent = missing([(asset, day) for asset in staging])
        if absent:
            skipped[day] = f"no check evaluated again: {absent}"
            continue
        intake_days.append(day)
        states = [(CURRENT, day)]
        before = (date.fromisoformat(day) - timedelta(days=1)).isoformat()
        if date.fromisoformat(before) >= config.start_date:
            states.append((CURRENT, before))
        absent = missing(states)
        if absent:
            skipped[day] = f"the CDC checks not evaluated again: {absent}"
        else:
            cdc_days.append(day)
    return intake_days, cdc_days, skipped


def not_rechecked(instance: DagsterInstance, storage, config: TableConfig, days: list[str]) -> dict[str, str]:
    """Per date of ``days``, the checks not evaluated again and why (:func:`rechecked`)."""
    return rechecked(instance, storage, config, days)[2]


def touched_days(result: ErasureResult) -> list[str]:
    """The dates whose partitions or recorded figures the erase changed."""
    return sorted({day for _, day in result.removed} | set(_not_supplied_removed(result)))


def _not_supplied_removed(result: ErasureResult) -> dict[str, int]:
    """X keys the erase removed per date: keys of the date's state (before - after) the classification did
    not store as I, U or N (a delta or change set counts X, it does not store it)."""
    removed = {}
    for day, before in result.state_rows_before.items():
        in_state = before - result.state_rows_after.get(day, before)
        operations = result.removed_operations.get(day, {})
        x = in_state - sum(operations.get(op, 0) for op in (INSERT, UPDATE, UNCHANGED))
        if x > 0:
            removed[day] = x
    return removed


def _adjusted_figures(config: TableConfig, asset: str, day: str, latest: dict, removed: dict, result: ErasureResult) -> dict:
    def less(name: str, by: int) -> dict:
        if name not in latest or not by:
            return {}
        return {name: MetadataValue.int(max(0, int(latest[name].value) - by))}

    figures: dict = {}
    if asset in _INTAKE:
        accepted, rejected = removed.get((HASHED_INCOMING, day), 0), removed.get((REJECTS, day), 0)
        figures.update(less("rows_read", accepted + rejected), **less("rows_accepted", accepted), **less("rows_rejected", rejected))
    elif asset in (CLASSIFICATION, CURRENT, HISTORY):
        operations = result.removed_operations.get(day, {})
        for operation, name in _OPERATION_FIGURES.items():
            figures.update(less(name, operations.get(operation, 0)))
        figures.update(less("not_supplied", _not_supplied_removed(result).get(day, 0)))
        if config.changes is not None:
            # The equation hashed_incoming = winners + superseded + late + duplicate events lost the erased
            # keys' records: their winners (a classified row each), then the rest as superseded, then duplicates.
            records = removed.get((HASHED_INCOMING, day), 0) - removed.get(("late_changes", day), 0)
            winners = min(sum(operations.values()), int(latest["winners"].value) if "winners" in latest else 0)
            superseded = min(records - winners, int(latest["superseded"].value) if "superseded" in latest else 0)
            figures.update(less("winners", winners), **less("superseded", max(0, superseded)),
                           **less("duplicate_events", max(0, records - winners - max(0, superseded))))
    return figures


def _latest_metadata(instance: DagsterInstance, key, day: str) -> dict | None:
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1).records
    materialization = records[0].asset_materialization if records else None
    return None if materialization is None else dict(materialization.metadata)


class EraseConfig(Config):
    """Run config of a table's erase job (Launchpad: ops -> <table>__erase -> config)."""

    keys_file: str
    """A CSV file on the run's machine with a header naming the table's key columns, a key per line."""

    reason: str = ""
    """Why (a ticket or request id): recorded in the ledger, never a key value."""


def build_erase_job(table: TableConfig):
    """The table's erase job: ``cdc-erase`` from the UI, with the keys file and reason as run config."""

    @op(name=f"{table.name}__erase", out={}, pool=pool_name(table), description=f"Erase keys from every stored partition of {table.name}.")
    def erase(
        context: OpExecutionContext,
        config: EraseConfig,
        pyspark: LazyPySparkResource,
        parquet_io_manager: ResourceParam[PartitionedParquetIOManager],
    ) -> Iterator[AssetMaterialization]:
        storage = parquet_io_manager.storage
        result = erase_keys(pyspark.spark_session, storage, table, config.keys_file, config.reason, f"run {context.run_id}")
        context.log.info(describe(table, result))
        # Yielded one by one, each is stored before the checks below read the latest figures.
        yield from erasure_materializations(context.instance, table, storage, result)
        for check in erasure_check_evaluations(context.instance, parquet_io_manager, table, touched_days(result)):
            context.instance.report_runless_asset_event(check)
        for day, why in sorted(not_rechecked(context.instance, storage, table, touched_days(result)).items()):
            context.log.info(f"{table.name} {day}: {why}; their earlier results stand")
        if result.left:
            # The request is recorded incomplete (ledger): the run fails, naming what is left.
            raise Failure(description=f"{table.name}: the erase is incomplete; left: " + "; ".join(result.left))

    @job(name=f"{table.name}_erase", description=f"Erase keys from every stored partition of {table.name} (docs/erasure.md).")
    def erase_job():
        erase()

    return erase_job


def describe(config: TableConfig, result: ErasureResult) -> str:
    """One paragraph for the log and the command line."""
    assets: defaultdict[str, int] = defaultdict(int)
    for (asset, _), rows in result.removed.items():
        assets[asset] += rows
    unverifiable = sum(result.unverifiable_rejects.values())
    copies = sum(result.stored_copies.values())
    return (
        f"{config.name}: erase request {result.request_id}{' (resumed)' if result.resumed else ''}: {result.keys} key(s), "
        f"{result.rows_removed} row(s) removed from {len(result.removed)} partition(s)"
        + (" (" + ", ".join(f"{asset} {rows}" for asset, rows in sorted(assets.items())) + ")" if assets else "")
        + (f"; {copies} stored row(s) of the keys in data files of an incremental state rewritten" if copies else "")
        + f"; {result.bytes_rewritten} of {result.bytes_stored} stored bytes rewritten"
        + (f"; {unverifiable} reject(s) may hold a key and could not be checked (kept)" if unverifiable else "")
        + (f"; the undo point of rollback(s) {', '.join(result.undo_points_dropped)} dropped (it held the keys): "
           "cdc-rollback --undo can no longer restore them" if result.undo_points_dropped else "")
        + (f"; the unpublished staging branch(es) {', '.join(result.staging_branches_dropped)} dropped (their rows "
           "held the keys)" if result.staging_branches_dropped else "")
        + (f"; {len(result.date_tags_dropped)} date tag(s) dropped (their table versions held the keys): time travel "
           "by date starts again at the next published date" if result.date_tags_dropped else "")
        + f". Replaced snapshots expired and their files deleted; ledger {os.path.join('_erasures', result.request_id)}"
        + (f", incomplete: {len(result.left)} thing(s) left, listed in its request.json (left)." if result.left else ", complete (verified).")
    )
