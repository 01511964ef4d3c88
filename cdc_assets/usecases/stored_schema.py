"""Which columns a table's stored dates hold, from the schema each date was written with (no Spark job).
 Readers
need this to read across a change of the table's config (:mod:`cdc_assets.core.views.as_configured`):
which former names of renamed columns some date still stores, and which columns DuckDB may name.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pyspark.sql.types import StructType

from cdc_assets.model.config import TableConfig
from cdc_assets.core.views.as_configured import former_names, stored_names
from resources.storage import WarehouseStorage


def date_schema(storage: WarehouseStorage, table: str, asset: str, business_date: str) -> StructType:
    """The Spark schema the date of ``[table, asset]`` was stored with."""
    return storage.stored_schema(table, asset, business_date)


def stored_among(storage: WarehouseStorage, table: str, asset: str, dates: Sequence[str], wanted: Collection[str]) -> set[str]:
    """The names of ``wanted`` (lower case) that some date of ``dates`` stores. Newest date first, and
    it stops once every one is found, so the usual case reads a footer or two."""
    missing = {name.lower() for name in wanted}
    found: set[str] = set()
    for day in reversed(sorted(dates)):
        if not missing:
            break
        names = {field.name.lower() for field in date_schema(storage, table, asset, day).fields}
        found |= missing & names
        missing -= names
    return found


def stored_former_names(storage: WarehouseStorage, config: TableConfig, asset: str, dates: Sequence[str]) -> list[str]:
    """The former names of the config's renamed columns that some date of ``dates`` stores, in config
    order (no footer is read for a config without ``renamed_from``)."""
    formers = former_names(config.columns)
    found = stored_among(storage, config.name, asset, dates, formers) if formers else set()
    return [name for name in formers if name.lower() in found]


def stored_configured_names(storage: WarehouseStorage, config: TableConfig, asset: str, dates: Sequence[str]) -> set[str]:
    """Which of the config's column names, former names included, some date of ``dates`` stores (lower case)."""
    wanted = [name for column in config.columns for name in stored_names(column)]
    return stored_among(storage, config.name, asset, dates, wanted)
