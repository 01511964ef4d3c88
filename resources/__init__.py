"""Dagster resources: the Spark session and the Parquet IO manager that owns every warehouse path."""

from resources.parquet_io_manager import PartitionedParquetIOManager, warehouse_root
from resources.spark import SparkResource, build_spark_session

__all__ = ["PartitionedParquetIOManager", "SparkResource", "build_spark_session", "warehouse_root"]
