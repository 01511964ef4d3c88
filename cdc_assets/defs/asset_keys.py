"""A table's Dagster asset keys, ``[table, asset name]`` (the names are ``names.py``'s, which has no Dagster)."""

from dagster import AssetKey

from cdc_assets.model.config import TableConfig
from cdc_assets.model.names import HASHED_INCOMING, REJECTS, cdc_outputs


def asset_key(config: TableConfig, name: str) -> AssetKey:
    """Every asset of a table is keyed ``[table, name]``; the IO manager maps that onto the warehouse."""
    return AssetKey([config.name, name])


def asset_keys(config: TableConfig) -> dict[str, AssetKey]:
    """The key of each of the table's assets, by asset name."""
    return {name: asset_key(config, name) for name in (HASHED_INCOMING, REJECTS, *cdc_outputs(config))}
