"""A column added to a table's config later reads as NULL on older dates, in every consumer reader.

History written with the config's first two columns on D1, and with a third one (``note``) from D2 on,
as the pipeline writes it after ``note`` was added to the config.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import duckdb
import pytest
from pyspark.sql import functions as F

from cdc_assets.model.config import TableConfig
from cdc_assets.usecases.readers import changes_between, scd2_duckdb_sql, scd2_view
from cdc_assets.core.hashing import add_hashes
from resources.storage import WarehouseStorage

TABLE = "added_column"
D1, D2 = date(2024, 1, 1), date(2024, 1, 2)
BEFORE = {
    "name": TABLE,
    "start_date": "2024-01-01",
    "load_type": "full",
    "source": {"path": "data/added_column/{date}.csv"},
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}],
}
AFTER = {**BEFORE, "untracked_columns": [{"name": "note", "type": "string"}]}

# (id, name, note, operation, business_date); D1 has no note column at all.
HISTORY_D1 = [(1, "ann", "I", D1), (2, "bob", "I", D1)]
HISTORY_D2 = [(1, "anna", "n1", "U", D2), (3, "cy", "n3", "I", D2)]


@pytest.fixture(scope="module")
def history_warehouse(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("added_column_warehouse")
    storage = WarehouseStorage(str(root))
    try:
        for config, rows, schema in (
            (BEFORE, HISTORY_D1, "id int, name string, operation string, business_date date"),
            (AFTER, HISTORY_D2, "id int, name string, note string, operation string, business_date date"),
        ):
            config = TableConfig.model_validate(config)
            hashed = add_hashes(spark.createDataFrame(rows, schema), [("id", "int")], [("name", "string")])
            day = rows[0][-1].isoformat()
            storage.write(
                hashed.select(
                    *(c.name for c in config.columns), "key_hash", "non_key_hash", "operation",
                    F.col("business_date").alias("eff_start_date"),
                ),
                TABLE,
                "history_partition",
                [day],
            )
    finally:
        storage.release()
    return root


def test_scd2_in_spark_and_duckdb_and_changes_read_the_added_column_as_null_on_older_dates(spark, history_warehouse):
    config, warehouse = TableConfig.model_validate(AFTER), str(history_warehouse)
    # (id, name, note, valid_from, valid_to, is_current)
    versions = sorted([
        (1, "ann", None, D1, D2, False), (1, "anna", "n1", D2, None, True),
        (2, "bob", None, D1, None, True), (3, "cy", "n3", D2, None, True),
    ], key=repr)
    assert sorted((tuple(row) for row in scd2_view(spark, config, warehouse=warehouse).collect()), key=repr) == versions
    assert sorted(duckdb.sql(scd2_duckdb_sql(config, warehouse)).fetchall(), key=repr) == versions

    changes = changes_between(spark, config, D1, D2, warehouse=warehouse)
    assert sorted((tuple(row)[:4] for row in changes.collect()), key=repr) == sorted([
        (1, "ann", None, "update_preimage"), (1, "anna", "n1", "update_postimage"), (3, "cy", "n3", "insert"),
    ], key=repr)

