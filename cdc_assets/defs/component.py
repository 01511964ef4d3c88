"""The project's Dagster component: every table config in a folder as its assets, checks, jobs,
schedules and sensors (the table factory, :mod:`cdc_assets.defs.factory`), with the project's resources
bound once.

``cdc_assets/defs/defs.yaml`` instantiates it for the code location and names the folder::

    type: cdc_assets.defs.component.CdcTables
    attributes:
      table_configs: "{{ env('CDC_TABLE_CONFIGS', 'table_configs') }}"

so ``dg list defs``, ``dg check defs`` and ``dg dev`` load the same definitions as ``dagster dev``
(``cdc_assets.defs.definitions``). One component for all tables, not one per table: the tables share
their resources, the alert sensor and one executor, which a per-table component would each bind again;
and a table is added by adding its YAML to the folder, as before.

All steps of a run execute in one process (``in_process_executor``) so that the run starts one JVM
and shares one SparkSession, instead of one per step.

The resources' settings are fields fed by environment variables (``EnvVar``), so the UI's resource
page shows which variable each comes from; a variable unset when the code location loads leaves its
field at the default.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dagster import Component, ComponentLoadContext, Definitions, Model, Resolvable, in_process_executor

from cdc_assets.defs.alerts import ALERT_WEBHOOK_KEY, build_alert_sensor, watched_table
from cdc_assets.model import settings
from cdc_assets.model.config import load_table_configs
from cdc_assets.model.file_modes import apply_umask, tighten_files_in, tighten_root
from cdc_assets.model.masking import show_values
from cdc_assets.defs.factory import IO_MANAGER_KEY, TableDefinitions, build_table_definitions
from resources.parquet_io_manager import PartitionedParquetIOManager
from resources.spark import PipelineSparkResource
from resources.storage import warehouse_root
from resources.alerts import DEFAULT_UI_BASE_URL, UI_BASE_URL_ENV, WEBHOOK_URL_ENV, AlertWebhook
from resources.fields import env_or_default
from cdc_assets.engines.spark_conf import spark_conf_from_env
from resources.storage.lake import LakeCatalog


def build_definitions(tables: list[TableDefinitions]) -> Definitions:
    # First: the code location's process writes the warehouse and DAGSTER_HOME, and starts the runs' JVMs,
    # which inherit its umask (cdc_assets/model/file_modes.py). A root an older release made is tightened.
    apply_umask()
    tightened = [done for done in (tighten_root(warehouse_root()),) if done]
    home = settings.DAGSTER_HOME.value()
    if home:
        # Dagster opens the instance (its run and schedule databases) before it loads this code: those files
        # and their folders were made under the umask the command started with. Its run folders are made later.
        tightened += [done for folder in ("", "history", "history/runs", "schedules", "storage") for done in tighten_files_in(Path(home, folder))]
    for done in tightened:
        logging.getLogger(__name__).warning(f"tightened {done}: only its owner reaches it (docs/operations.md, File modes)")
    # What runs would fail on fails the code location at load instead, naming why: an unsupported
    # CDC_WAREHOUSE (gs://, ...), a bucket without a REST catalog, a CDC_SPARK_CONF that is not a JSON object,
    # a CDC_UMASK or CDC_SHOW_VALUES that is none of their values.
    LakeCatalog.from_environment(warehouse_root())
    spark_conf_from_env()
    show_values()  # a CDC_SHOW_VALUES that is none of its values, which the IO manager reads after a write
    spark = PipelineSparkResource.from_environment()
    warehouse = PartitionedParquetIOManager.from_environment(spark)
    alert_webhook = AlertWebhook(
        webhook_url=env_or_default(WEBHOOK_URL_ENV, ""), ui_base_url=env_or_default(UI_BASE_URL_ENV, DEFAULT_UI_BASE_URL)
    )
    alerts = build_alert_sensor([watched_table(table.config, table.asset_checks) for table in tables])
    return Definitions(
        assets=[asset for table in tables for asset in table.assets],
        asset_checks=[check for table in tables for check in table.asset_checks],
        schedules=[schedule for table in tables for schedule in table.schedules],
        sensors=[sensor for table in tables for sensor in table.sensors] + [alerts],
        jobs=[job for table in tables for job in table.jobs],
        resources={"pyspark": spark, IO_MANAGER_KEY: warehouse, ALERT_WEBHOOK_KEY: alert_webhook},
        executor=in_process_executor,
    )


class CdcTables(Component, Model, Resolvable):
    """Every table config in ``table_configs`` as a table's Dagster definitions, with the resources bound once."""

    table_configs: str = "table_configs"
    """The folder of table configs (one YAML per table), relative to the project's folder or absolute."""

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        folder = Path(self.table_configs)
        folder = folder if folder.is_absolute() else context.project_root / folder
        return build_definitions([build_table_definitions(config) for config in load_table_configs(folder.resolve())])
