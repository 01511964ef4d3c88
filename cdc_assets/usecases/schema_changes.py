"""A table's schema change at a date: its config's columns against those the previous state was stored with.

Both steps of a date ask before they write: the intake, so that a change that cannot be applied fails the
date before anything is written, and the CDC step, which brings the previous state into the new schema
(``cdc_assets/core/capture/schema.py``). The rules are in docs/schema-changes.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_assets.model.config import TableConfig
from cdc_assets.core.capture.schema import HashSpec, SchemaChange, rebaseline_change, schema_change, spec_of, stored_spec
from cdc_assets.model.names import CURRENT
from resources.storage.state import stored_fields
from resources.storage import WarehouseStorage


@dataclass(frozen=True)
class SchemaEvolution:
    """The spec the previous state was stored with, the config's, and what changed between them."""

    stored: HashSpec
    configured: HashSpec
    change: SchemaChange
    stored_as_of: str
    rebaseline: bool = False

    @property
    def applies(self) -> bool:
        """Whether the previous state must be brought into the new schema before the date is classified."""
        return self.rebaseline or not self.change.is_empty


def configured_spec(config: TableConfig) -> HashSpec:
    """The columns the table's hashes are computed over now, as its config says."""
    typed = lambda columns: [(column.name, column.type) for column in columns]  # noqa: E731
    return spec_of(typed(config.keys), typed(config.non_keys), typed(config.untracked_columns))


def evolution_since(storage: WarehouseStorage, config: TableConfig, as_of: str, rebaseline: bool = False) -> SchemaEvolution | None:
    """The change from the state stored as of ``as_of`` to the config; None when no state is stored then.

    Raises :class:`cdc_assets.core.capture.schema.SchemaChangeError` for a change that cannot be applied,
    unless ``rebaseline`` (the run's declared re-baseline) accepts any change.
    """
    configured = configured_spec(config)
    fields = stored_fields(storage, config.name, CURRENT, as_of)
    if fields is None:
        return None
    stored = stored_spec(fields, configured)
    renamed_from = {column.name: column.renamed_from for column in config.columns if column.renamed_from}
    if rebaseline:
        change = rebaseline_change(stored, configured, renamed_from)
    else:
        change = schema_change(stored, configured, renamed_from, config.name, config.source_file, as_of)
    return SchemaEvolution(stored, configured, change, as_of, rebaseline)
