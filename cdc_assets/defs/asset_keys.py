"""A table's Dagster asset keys, ``[table, asset name]`` (the names are ``names.py``'s, which has no Dagster)."""

from dagster import AssetKey

from cdc_assets.model.config import TableConfig


def asset_key(config: TableConfig, name: str) -> AssetKey:
    """Every asset of a table is keyed ``[table, name]``; the IO manager maps that onto the warehouse."""
    return AssetKey([config.name, name])
