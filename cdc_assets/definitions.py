"""The Dagster code location: every table in ``CDC_TABLE_CONFIGS`` plus the resources, bound once.

All steps of a run execute in one process (``in_process_executor``) so that the run starts one JVM
and shares one SparkSession, instead of one per step.
"""

from __future__ import annotations

from dagster import Definitions, in_process_executor

from cdc_assets.config import load_table_configs
from cdc_assets.factory import IO_MANAGER_KEY, TableDefinitions, build_table_definitions
from resources import PartitionedParquetIOManager, pipeline_spark_resource, warehouse_root


def build_definitions(tables: list[TableDefinitions]) -> Definitions:
    warehouse_root()  # an unsupported CDC_WAREHOUSE (an object store URI) fails the code location at load, naming why
    spark = pipeline_spark_resource()
    return Definitions(
        assets=[asset for table in tables for asset in table.assets],
        asset_checks=[check for table in tables for check in table.asset_checks],
        schedules=[schedule for table in tables for schedule in table.schedules],
        sensors=[sensor for table in tables for sensor in table.sensors],
        jobs=[job for table in tables for job in table.jobs],
        resources={"pyspark": spark, IO_MANAGER_KEY: PartitionedParquetIOManager(pyspark=spark)},
        executor=in_process_executor,
    )


defs = build_definitions([build_table_definitions(config) for config in load_table_configs()])
