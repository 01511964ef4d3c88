"""``cdc-catalog describe TABLE --json``: what a script needs to read any asset's any date with pyiceberg alone.

One JSON object::

    {"table": "orders",
     "catalog": {"name": "lake", "properties": {...}},         # pyiceberg.catalog.load_catalog(name, **properties)
     "assets": {"current_table": {"identifier": "orders.current_table",
                                  "partition_column": "business_date",
                                  "stored_dates": ["2024-01-01", ...]}, ...}}

Each asset's one business date is the rows whose ``partition_column`` equals it. No Spark, no Dagster:
it reads the catalog and the tables' metadata only.
"""

from __future__ import annotations

from cdc_assets.config import TableConfig
from cdc_assets.core.columns import BUSINESS_DATE
from resources.storage import WarehouseStorage
from resources.storage.lake import CATALOG_NAME, pyiceberg_properties


def describe(storage: WarehouseStorage, config: TableConfig) -> dict:
    """The catalog and every stored asset of ``config``'s table, as ``cdc-catalog describe --json`` prints them."""
    assets = {}
    for asset in storage.stored_assets(config.name):
        assets[asset] = {
            "identifier": f"{config.name}.{asset}",
            "partition_column": BUSINESS_DATE,
            "stored_dates": storage.stored_dates(config.name, asset),
        }
    return {
        "table": config.name,
        "catalog": {"name": CATALOG_NAME, "properties": pyiceberg_properties(storage.root)},
        "assets": assets,
    }
