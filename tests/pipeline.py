"""Helpers for tests that run the real asset graph: write table configs, run dates, read outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame

import yaml
from dagster import DagsterInstance, Definitions

from cdc_assets.model.config import TableConfig, load_table_config
from cdc_assets.defs.component import build_definitions
from cdc_assets.defs.factory import build_table_definitions

SYNTHETIC_COLUMNS = {
    "keys": [{"name": f"key_{i}", "type": "string"} for i in range(1, 6)],
    "non_keys": [{"name": f"nonkey_{i}", "type": "double"} for i in range(1, 11)],
}


def write_table_config(folder: Path, name: str, source_path: str, **fields) -> TableConfig:
    """Write ``folder/<name>.yaml`` (synthetic columns unless given) and load it back through validation."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "name": name,
        "start_date": "2019-06-18",
        "load_type": "full",
        "source": {"path": source_path, "format": "csv", "options": {"header": True}},
        **SYNTHETIC_COLUMNS,
        **fields,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_table_config(path)


def definitions_for(*configs: TableConfig) -> Definitions:
    return build_definitions([build_table_definitions(config) for config in configs])


def run_dates(
    defs: Definitions, dates: list[str], instance: DagsterInstance | None = None, raise_on_error: bool = True,
    backfill_id: str | None = None,
):
    """Materialize every asset for each date in turn, one run per date; returns the results. With
    ``backfill_id`` (see :func:`add_backfill`) each run is tagged as that backfill's, as Dagster tags them."""
    instance = instance or DagsterInstance.ephemeral()
    job = defs.resolve_implicit_global_asset_job_def()
    tags = {"dagster/backfill": backfill_id} if backfill_id else None
    return [job.execute_in_process(partition_key=day, instance=instance, raise_on_error=raise_on_error, tags=tags) for day in dates]


def failed_checks(result) -> list[str]:
    """The names of the checks that did not pass in ``result``, a run that failed on them. A run that
    failed otherwise (a step's error that names no failed check) raises here with each such step's error,
    so a test expecting a check to stop the run says what stopped it instead."""
    checks = sorted({evaluation.check_name for evaluation in result.get_asset_check_evaluations() if not evaluation.passed})
    errors = [
        f"{event.step_key}: {event.step_failure_data.error.message.strip() if event.step_failure_data.error else event.message}"
        for event in result.get_step_failure_events()
        if not any(name in (event.message or "") or (event.step_failure_data.error and name in event.step_failure_data.error.message) for name in checks)
    ]
    if errors or not checks:
        raise AssertionError("the run failed, and not (only) on a blocking check: " + ("; ".join(errors) or "no step failed"))
    return checks


def add_backfill(defs: Definitions, dates: list[str], instance: DagsterInstance) -> str:
    """Record in ``instance`` an asset backfill of every asset of ``defs`` for ``dates`` (what the UI's
    *Launch backfill* records); returns its id, for the runs of it (:func:`run_dates`)."""
    import time
    import uuid

    from dagster._core.execution.backfill import PartitionBackfill

    graph = defs.resolve_asset_graph()
    backfill_id = uuid.uuid4().hex[:8]
    instance.add_backfill(
        PartitionBackfill.from_asset_partitions(
            backfill_id=backfill_id, asset_graph=graph, partition_names=dates,
            asset_selection=sorted(graph.materializable_asset_keys), backfill_timestamp=time.time(), tags={},
            dynamic_partitions_store=instance, all_partitions=False, title=None, description=None, run_config=None,
        )
    )
    return backfill_id


def run_range(defs: Definitions, first: str, last: str, instance: DagsterInstance | None = None, raise_on_error: bool = True):
    """Materialize a date range in a single run, as a single-run backfill does."""
    instance = instance or DagsterInstance.ephemeral()
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=instance,
        tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
        raise_on_error=raise_on_error,
    )


@dataclass(frozen=True)
class StoredPartition:
    """One business date of an asset in a warehouse: read through the project's storage (an Iceberg table)."""

    warehouse: Path
    table: str
    asset: str
    day: str

    def read(self, spark) -> DataFrame:
        from resources.storage import WarehouseStorage

        return WarehouseStorage(str(self.warehouse)).read_one(spark, self.table, self.asset, self.day)

    def exists(self) -> bool:
        from resources.storage import WarehouseStorage

        return WarehouseStorage(str(self.warehouse)).has_partition(self.table, self.asset, self.day)


@dataclass(frozen=True)
class StoredAsset:
    """Every stored business date of an asset (with its ``business_date`` column), read through the storage."""

    warehouse: Path
    table: str
    asset: str

    def read(self, spark) -> DataFrame:
        from resources.storage import WarehouseStorage

        storage = WarehouseStorage(str(self.warehouse))
        return storage.read(spark, self.table, self.asset, storage.stored_dates(self.table, self.asset))


def stored_asset(warehouse: Path, table: str, asset: str) -> StoredAsset:
    return StoredAsset(Path(warehouse), table, asset)


def read_stored(spark, where: "StoredPartition | StoredAsset | Path | str") -> DataFrame:
    """A stored date's or asset's rows (through the storage), or a Parquet folder's (never an Iceberg table's:
    its folder also holds the files of replaced snapshots)."""
    if isinstance(where, (StoredPartition, StoredAsset)):
        return where.read(spark)
    assert not (Path(where) / "metadata").is_dir(), f"{where} is an Iceberg table: read it through the storage"
    return spark.read.parquet(str(where))


def operation_counts(spark, where: "StoredPartition | Path | str") -> dict[str, int]:
    return {row["operation"]: row["count"] for row in read_stored(spark, where).groupBy("operation").count().collect()}


def partition_dir(warehouse: Path, table: str, asset: str, day: str) -> StoredPartition:
    return StoredPartition(Path(warehouse), table, asset, day)


# Who wrote a row differs between any two runs, by design (docs/operations.md, "Audit columns and the runs log"): comparisons of
# outputs written by different runs leave these out.
AUDIT_COLUMNS = ("process_id", "processed_at")


def sorted_rows(spark, where: "StoredPartition | Path | str", with_audit: bool = False) -> list[tuple]:
    """Every row of a stored date (or a Parquet folder) as sorted tuples: a content comparison independent of file layout.

    Without ``with_audit`` the audit columns are left out, so outputs of different runs compare.
    """
    frame = read_stored(spark, where)
    if not with_audit:
        frame = frame.drop(*AUDIT_COLUMNS)
    return sorted((tuple(row) for row in frame.collect()), key=repr)


def own_catalog_database(spark, monkeypatch, name: str):
    """A fixture body: a database of the test's own in the session's catalog, partitions from folders as
    in catalog_conf; dropped afterwards. Use with ``yield from``."""
    monkeypatch.delenv("CDC_CATALOG_DIR", raising=False)
    previous = spark.conf.get("spark.sql.hive.manageFilesourcePartitions")
    spark.conf.set("spark.sql.hive.manageFilesourcePartitions", "false")
    yield name
    spark.catalog.setCurrentDatabase("default")  # a fresh sync ends with USE
    spark.sql(f"DROP DATABASE IF EXISTS {name} CASCADE")
    spark.conf.set("spark.sql.hive.manageFilesourcePartitions", previous)


def stored_arrow(warehouse: Path, table: str, asset: str, day: str, columns: tuple[str, ...] | None = None):
    """A stored date's rows as an Arrow table, read by pyiceberg at the table's current snapshot (no Spark)."""
    from pyiceberg.catalog import load_catalog

    from resources.storage.lake import CATALOG_NAME, pyiceberg_properties

    iceberg = load_catalog(CATALOG_NAME, **pyiceberg_properties(str(warehouse))).load_table(f"{table}.{asset}")
    return iceberg.scan(row_filter=f"business_date = '{day}'", selected_fields=columns or ("*",)).to_arrow()
