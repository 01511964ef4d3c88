"""``cdc-catalog describe TABLE --json``: what a script needs to read any asset's any date with pyiceberg alone.

One JSON object::

    {"table": "orders",
     "catalog": {"name": "lake", "properties": {...}},         # pyiceberg.catalog.load_catalog(name, **properties)
     "assets": {"current_table": {"identifier": "orders.current_table",
                                  "partition_column": "business_date",
                                  "stored_dates": ["2024-01-01", ...]}, ...}}

Each asset's one business date is the rows whose ``partition_column`` equals it. An incremental state
(``storage: {current: incremental}``) is one table with a tag per date instead: ``"tag": "{date}"``
names the snapshot of date D (``table.snapshot_by_name(D)``), and a row's ``operation`` as of D is its
stored ``operation_column`` (``last_operation``: the key's last change) where ``operation_date_column``
equals D, else ``untouched_operation`` (N or X). No Spark, no Dagster: it reads the catalog and the
tables' metadata only.
"""

from __future__ import annotations

from cdc_assets.model.config import TableConfig
from cdc_assets.core.columns import BUSINESS_DATE
from resources.storage import OPERATION_DATE, WarehouseStorage
from resources.storage.lake import CATALOG_NAME


def describe(storage: WarehouseStorage, config: TableConfig) -> dict:
    """The catalog and every stored asset of ``config``'s table, as ``cdc-catalog describe --json`` prints them."""
    assets = {}
    for asset in storage.stored_assets(config.name):
        described = {"identifier": f"{config.name}.{asset}", "stored_dates": storage.stored_dates(config.name, asset)}
        if storage.merged.holds(config.name, asset):
            # One table, a tag per date: read the tag's snapshot, then label each row as of the date.
            described.update(
                tag="{date}", operation_column=storage.merged.operation_column(config.name, asset),
                operation_date_column=OPERATION_DATE, untouched_operation=storage.merged.untouched(config.name, asset),
            )  # fmt: skip
        else:
            described["partition_column"] = BUSINESS_DATE
        assets[asset] = described
    return {
        "table": config.name,
        # No credential among them: pyiceberg takes the keys from its environment, as the project does.
        "catalog": {"name": CATALOG_NAME, "properties": storage.lake.pyiceberg_properties()},
        "assets": assets,
    }
