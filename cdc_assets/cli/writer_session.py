"""Spark and the warehouse for a command that writes a table (``cdc-erase``, ``cdc-rollback``), as a run has them."""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from cdc_assets.engines.spark_conf import NO_UI
from resources.parquet_io_manager import PartitionedParquetIOManager
from resources.session.spark_target import ServerCannotServeRunError
from resources.spark import PipelineSparkResource


def writer_session(command: str) -> tuple[PartitionedParquetIOManager, SparkSession] | None:
    """The IO manager (its ``storage``, its ``pyspark``) configured from the environment as a run's is, and
    the Spark session: the warm server only if it can serve this (said on stderr when it cannot). None,
    said on stderr, when the server was asked for by name and cannot serve it."""
    spark_resource = PipelineSparkResource.from_environment(spark_config=NO_UI)
    io_manager = PartitionedParquetIOManager.from_environment(spark_resource)
    try:
        target = spark_resource.spark_target
    except ServerCannotServeRunError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return None
    if target.refusal:
        print(f"{command}: Spark: {target.description}", file=sys.stderr)
    return io_manager, io_manager.pyspark.spark_session
