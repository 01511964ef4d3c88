"""Dagster resources: the Spark session, the warehouse storage, and the Parquet IO manager over it."""

from resources.parquet_io_manager import PartitionedParquetIOManager
from resources.spark import PipelineSparkResource, build_spark_session
from resources.storage import WarehouseStorage, warehouse_root

__all__ = [
    "PartitionedParquetIOManager",
    "PipelineSparkResource",
    "WarehouseStorage",
    "build_spark_session",
    "warehouse_root",
]
