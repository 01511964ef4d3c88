"""The table's rollback job (the UI's way to run ``cdc-rollback``), and what Dagster and the runs log are told of a rollback.

Dagster cannot take a materialization back, so each partition a rollback removes (or an undo restores)
gets an observation saying so (``cdc/publication``: ``rolled back`` or ``restored``, with the rollback's
id and date): the asset's partition page shows it beside the materialization it undid. The next run of a
rolled-back date materializes it anew. The runs log gets a row per date (step ``rollback`` or
``rollback-undo``, status ``rolled_back`` or ``restored``).
"""


from collections.abc import Iterator
from datetime import datetime, timezone

from dagster import AssetObservation, Config, MetadataValue, OpExecutionContext, ResourceParam, job, op
from dagster_pyspark import LazyPySparkResource

from cdc_assets.defs.asset_keys import asset_key
from cdc_assets.defs.runs_log import runs_log_rows
from cdc_assets.model.config import TableConfig
from cdc_assets.model.names import pool_name
from cdc_assets.usecases.rollback import describe_rollback, roll_back_table, rolled_back_dates, undo_rollback
from resources.parquet_io_manager import PartitionedParquetIOManager
from resources.storage import WarehouseStorage
from resources.storage.rollback import Rollback

PUBLICATION = "cdc/publication"
ROLLED_BACK, RESTORED = "rolled back", "restored"


class RollbackConfig(Config):
    """Run config of the rollback job (Launchpad: ops -> <table>__rollback -> config)."""

    to: str = ""
    """Roll every output back to this business date (YYYY-MM-DD): the dates after it are removed (kept
    restorable for publish.keep_rolled_back_days) and the next run continues from it."""

    undo: bool = False
    """Undo the table's newest rollback instead (leave `to` empty)."""

    reason: str = ""
    """Why (a ticket id), recorded with the rollback; never a key value."""


def rollback_observations(config: TableConfig, record: Rollback, undone: bool) -> list[AssetObservation]:
    """An observation per partition the rollback removed (or its undo restored)."""
    what = RESTORED if undone else ROLLED_BACK
    return [
        AssetObservation(
            asset_key=asset_key(config, asset),
            partition=day,
            metadata={
                PUBLICATION: MetadataValue.text(what),
                "rollback_id": MetadataValue.text(record.id),
                "rolled_back_to": MetadataValue.text(record.to),
            },
            description=f"{what} by rollback {record.id} (to {record.to})",
        )
        for asset, days in sorted(record.removed().items())
        for day in days
    ]


def log_rollback(storage: WarehouseStorage, config: TableConfig, record: Rollback, undone: bool, started_at: datetime) -> None:
    """The runs log's rows of a rollback or an undo: one per date it removed or restored."""
    days = rolled_back_dates(record)
    if days:
        step, status = ("rollback-undo", "restored") if undone else ("rollback", "rolled_back")
        storage.append_to_runs_log(runs_log_rows(config, record.id, started_at, days, status, step), config.name)


def build_rollback_job(table: TableConfig):
    """The table's rollback job: ``cdc-rollback`` from the UI, with ``to`` (or ``undo``) as run config."""

    @op(name=f"{table.name}__rollback", out={}, pool=pool_name(table),
        description=f"Roll every output of {table.name} back to a business date, or undo the newest rollback.")
    def rollback(
        context: OpExecutionContext,
        config: RollbackConfig,
        pyspark: LazyPySparkResource,
        parquet_io_manager: ResourceParam[PartitionedParquetIOManager],
    ) -> Iterator[AssetObservation]:
        if config.undo == bool(config.to):
            raise ValueError(f"{table.name}_rollback: give either to (a business date) or undo: true, not {'both' if config.undo else 'neither'}")
        storage, started_at = parquet_io_manager.storage, datetime.now(timezone.utc)
        if config.undo:
            record: Rollback | None = undo_rollback(pyspark.spark_session, storage, table)
        else:
            record = roll_back_table(pyspark.spark_session, storage, table, config.to, config.reason, f"run {context.run_id}")
        if record is None:
            context.log.info(f"{table.name}: no output stores a date after {config.to}: nothing to roll back")
            return
        context.log.info(describe_rollback(record, undone=config.undo))
        log_rollback(storage, table, record, config.undo, started_at)
        yield from rollback_observations(table, record, config.undo)

    @job(name=f"{table.name}_rollback", description=f"Roll {table.name} back to a business date, or undo that (docs/publishing.md).")
    def rollback_job():
        rollback()

    return rollback_job
