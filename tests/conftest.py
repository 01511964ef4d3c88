"""Shared fixtures: one real local SparkSession for the whole test session, and real temp folders."""

from __future__ import annotations

import os

import pytest

# Dagster and Spark must not write into the repository or the user's home while tests run.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    from resources.spark import build_spark_session

    # The pipeline's resource reuses this session through getOrCreate, so tests and runs share one JVM.
    session = build_spark_session(
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "spark.driver.memory": "2g"},
        app_name="cdc_assets_tests",
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture()
def warehouse(tmp_path, monkeypatch):
    """An empty warehouse root, set as CDC_WAREHOUSE for the test."""
    root = tmp_path / "warehouse"
    root.mkdir()
    monkeypatch.setenv("CDC_WAREHOUSE", str(root))
    return root
