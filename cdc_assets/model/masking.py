"""Which row values the project may show: in materialization previews, errors, logs and alerts.

What the project shows outlives the rows: Dagster keeps every materialization's metadata and every failed
step's message in its event log, where ``cdc-erase`` does not reach (docs/erasure.md, "What Dagster keeps").
So by default (``CDC_SHOW_VALUES=masked``) a value is shown only where it is known to be no one's:

- a configured non-key column that is not ``sensitive: true``;
- the pipeline's own columns, which hold operations, dates, counts, run ids, column names and hashes
  (a ``key_hash`` is pseudonymous, as in the erase's ledger, which keeps it anyway);

and masked (:data:`MASKED`) elsewhere: key columns (unless ``sensitive: false``), ``sensitive: true``
columns, a reject's raw record (it holds every field), a reject reason's quoted value of a masked column,
and any column the config does not name. ``none`` shows no row value at all; ``all`` shows every value
(for data that is no one's, e.g. the synthetic demo). No Spark, no Dagster here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from cdc_assets.model import settings
from cdc_assets.model.config import RESERVED_COLUMNS, TableConfig

MASKED = "(masked)"


class ShowValues(str, Enum):
    """``CDC_SHOW_VALUES``: which row values the project shows."""

    masked = "masked"  # non-sensitive non-key values only
    none = "none"  # no row value
    all = "all"  # every value, keys and sensitive columns included


# The pipeline's own columns whose values are no one's: operations, dates, sequences, run ids, column
# names, hashes, reasons (redacted, below) and paths. The rejects' raw record is not among them.
PIPELINE_COLUMNS = frozenset(
    {
        *(name.lower() for name in RESERVED_COLUMNS),
        "unavailable_columns", "reason", "applied_sequence", "sequence", "deleted", "applied_on",
        "source_file", "_source_file", "_reject_reason",
    }
)  # fmt: skip
# Columns that hold a whole record as it came, every field of it: shown under ``all`` only.
RAW_COLUMNS = frozenset({"raw_record", "_raw_record"})
# A reject reason that quotes a column's value (core/intake/source.py, core/intake/debezium.py):
# ``column amount: value 'oops' is not a valid double``.
_QUOTED_VALUE = re.compile(r"(?P<what>column (?P<name>[A-Za-z_][A-Za-z0-9_]*)): value '(?P<value>.*)'(?P<tail>(?: is | has ).*)?", re.S)
_REASON_COLUMNS = frozenset({"reason", "_reject_reason"})


def show_values() -> ShowValues:
    """``CDC_SHOW_VALUES``, checked: an unknown value is an error that names the variable."""
    value = settings.SHOW_VALUES.value().lower()
    try:
        return ShowValues(value)
    except ValueError:
        allowed = ", ".join(mode.value for mode in ShowValues)
        raise ValueError(f"{settings.SHOW_VALUES.name}={value!r}: use one of {allowed}") from None


def is_sensitive(config: TableConfig, name: str) -> bool:
    """Whether a configured column's values are masked: its ``sensitive``, else whether it is a key."""
    keys = {column.name.lower() for column in config.keys}
    for column in config.columns:
        if name.lower() in {column.name.lower(), *(former.lower() for former in column.renamed_from)}:
            return column.sensitive if column.sensitive is not None else column.name.lower() in keys
    raise KeyError(f"{config.source_file}: no configured column {name!r}")


def shown_column_names(config: TableConfig) -> list[str]:
    """The config's columns (and their former names) whose values may be shown, and a change set's
    flag column: what the factory hands the IO manager (``cdc/shown_columns``)."""
    names = [
        name
        for column in config.columns
        if not is_sensitive(config, column.name)
        for name in (column.name, *column.renamed_from)
    ]
    if config.changes is not None and config.changes.operation_column:
        names.append(config.changes.operation_column)
    return names


@dataclass(frozen=True)
class ValueMask:
    """Which columns' values may be shown (any case), and how: build it with :meth:`for_table` or
    :meth:`for_columns`; ``mode`` defaults to ``CDC_SHOW_VALUES``."""

    shown: frozenset[str]
    mode: ShowValues = ShowValues.masked

    @classmethod
    def for_columns(cls, shown: Iterable[str], mode: ShowValues | None = None) -> "ValueMask":
        """The configured columns ``shown`` besides the pipeline's own (a table unknown here: none)."""
        return cls(frozenset(name.lower() for name in shown) | PIPELINE_COLUMNS, mode or show_values())

    @classmethod
    def for_table(cls, config: TableConfig, mode: ShowValues | None = None) -> "ValueMask":
        return cls.for_columns(shown_column_names(config), mode)

    @property
    def shows_rows(self) -> bool:
        """Whether any row value is shown (``none``: a preview is its header only)."""
        return self.mode is not ShowValues.none

    def shows(self, name: str) -> bool:
        """Whether the values of column ``name`` may be shown as they are."""
        if self.mode is ShowValues.all:
            return True
        if self.mode is ShowValues.none:
            return False
        return name.lower() in self.shown and name.lower() not in RAW_COLUMNS

    def value(self, name: str, value: object) -> str:
        """``value`` of column ``name`` as it may be shown: its text (``""`` for NULL), or :data:`MASKED`."""
        if value is None:
            return ""
        if self.mode is not ShowValues.all and name.lower() in _REASON_COLUMNS:
            return self.reason(str(value))
        return str(value) if self.shows(name) else MASKED

    def row(self, names: Sequence[str], values: Sequence[object]) -> list[str]:
        """A row's values, each as :meth:`value` shows it."""
        return [self.value(name, value) for name, value in zip(names, values, strict=True)]

    def reason(self, text: str) -> str:
        """A reject reason with the value it quotes masked, unless that value's column is shown."""
        match = _QUOTED_VALUE.fullmatch(text)
        if match is None or self.shows(match["name"]):
            return text
        return f"{match['what']}: value {MASKED}{match['tail'] or ''}"

    def key(self, names: Sequence[str], values: Sequence[object]) -> str:
        """A key as an error names it, ``{store_code='LON', order_id=(masked)}``: each shown value quoted."""
        return "{" + ", ".join(
            f"{name}={value!r}" if self.shows(name) else f"{name}={MASKED}" for name, value in zip(names, values, strict=True)
        ) + "}"

    def raw(self, text: object) -> str:
        """A record as it came (every field of it): shown under ``all`` only."""
        return str(text) if self.mode is ShowValues.all else MASKED


def what_dagster_keeps(mode: ShowValues | None = None) -> str:
    """What an erase leaves in Dagster's instance (``DAGSTER_HOME``), which it does not rewrite: what
    ``cdc-erase`` says after each erase (docs/erasure.md, "What Dagster keeps")."""
    mode = mode or show_values()
    kept = {
        ShowValues.masked: "previews hold the values of non-key columns that are not sensitive: true, no key or sensitive value",
        ShowValues.none: "previews hold no row value",
        ShowValues.all: "previews and failed steps' messages hold every value, keys included (CDC_SHOW_VALUES=all)",
    }[mode]
    return (
        "Dagster's event log keeps what runs recorded, which an erase does not rewrite: counts, column names, key "
        f"hashes and paths; {kept}. Previews from before CDC_SHOW_VALUES (or under =all) may hold the keys: wipe those "
        "with `dagster asset wipe` or by deleting their runs (docs/erasure.md, what Dagster keeps)"
    )
