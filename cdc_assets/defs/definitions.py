"""The Dagster code location (``workspace.yaml``, ``[tool.dagster]``, ``dagster ... -m cdc_assets.defs.definitions``):
the project's defs folder as ``dg`` loads it, that is ``defs.yaml``'s one :class:`~cdc_assets.defs.component.CdcTables`
component over the table configs (``CDC_TABLE_CONFIGS``, else ``table_configs/``).
"""

from __future__ import annotations

from pathlib import Path

from dagster import load_from_defs_folder

defs = load_from_defs_folder(path_within_project=Path(__file__).parent)
