"""``checks:`` in a table config: the checks a table's owner declares on each date's outputs, validated with
pydantic. What they compute is ``cdc_assets/core/capture/declared_checks.py``'s; the Dagster checks are
``cdc_assets/defs/checks.py``'s. docs/running.md (Declared checks) says what each one does.

Each check is blocking unless ``severity: warn``: a failed blocking check stops the run's later steps and
dates, as the pipeline's own reconciliations do.

    checks:
      - {type: volume, max_delete_share: 0.02, min_rows: 1000}
      - {type: not_null, columns: [customer]}
      - {type: unique, columns: [invoice_number]}
      - {type: accepted_values, column: status, values: [A, B, C], on: changes}
      - {type: sql, name: no_negative_amounts, predicate: "amount < 0"}
      - {type: sql, name: no_orphan_lines, query: "SELECT key_hash FROM changes WHERE quantity > 1000", severity: warn}
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# A check's name is part of its Dagster check key, which allows letters, digits and underscores.
_CHECK_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


class Severity(str, Enum):
    """What a failed declared check does."""

    error = "error"  # blocking: the run's later steps and dates do not run
    warn = "warn"  # shown as a warning in the UI; the run goes on


class Rows(str, Enum):
    """Which of a date's outputs a row-level check reads."""

    current = "current"  # current_table as of the date: the table's state
    changes = "changes"  # history_partition of the date: the date's inserts, updates and deletes


class _DeclaredCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str  # each kind's Literal: the discriminator
    name: str | None = Field(default=None, description="The check's name in the UI (default: from its type and columns).")
    severity: Severity = Severity.error
    description: str | None = Field(default=None, description="What the check means, shown in the UI beside the built-in text.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and not _CHECK_NAME.fullmatch(value):
            raise ValueError(f"name {value!r} must match [a-z][a-z0-9_]* (at most 63 characters): it is part of a Dagster check key")
        return value

    @property
    def check_name(self) -> str:
        return self.name or self.default_name()

    def default_name(self) -> str:
        raise NotImplementedError

    def columns_named(self) -> list[str]:
        """The table columns the check names, for the config's own validation."""
        return []

    @property
    def reads(self) -> Rows:
        return Rows.current


class VolumeCheck(_DeclaredCheck):
    """Bounds on a date's inserts, updates and deletes, as counts or as a share of the state the date was
    classified against, and on the rows of the state after it."""

    type: Literal["volume"]
    max_insert_share: float | None = Field(default=None, ge=0.0)
    max_update_share: float | None = Field(default=None, ge=0.0)
    max_delete_share: float | None = Field(default=None, ge=0.0, le=1.0)
    max_inserts: int | None = Field(default=None, ge=0, strict=True)
    max_updates: int | None = Field(default=None, ge=0, strict=True)
    max_deletes: int | None = Field(default=None, ge=0, strict=True)
    min_rows: int | None = Field(default=None, ge=0, strict=True)
    max_rows: int | None = Field(default=None, ge=0, strict=True)

    @model_validator(mode="after")
    def _some_bound(self) -> "VolumeCheck":
        bounds = self.model_fields_set - {"type", "name", "severity", "description"}
        if not bounds:
            raise ValueError(
                "a volume check needs at least one bound: max_insert_share, max_update_share, max_delete_share, "
                "max_inserts, max_updates, max_deletes, min_rows or max_rows"
            )
        if self.min_rows is not None and self.max_rows is not None and self.min_rows > self.max_rows:
            raise ValueError(f"min_rows {self.min_rows} is above max_rows {self.max_rows}")
        return self

    def default_name(self) -> str:
        return "volume"


class _RowCheck(_DeclaredCheck):
    on: Rows = Field(default=Rows.current, description="current: the state as of the date; changes: the date's changes.")

    @property
    def reads(self) -> Rows:
        return self.on


class _ColumnsCheck(_RowCheck):
    columns: list[str] = Field(min_length=1)

    def default_name(self) -> str:
        return f"{self.type}_{'_'.join(self.columns)}".lower()

    def columns_named(self) -> list[str]:
        return list(self.columns)


class NotNullCheck(_ColumnsCheck):
    """No row with a NULL in any of ``columns``."""

    type: Literal["not_null"]


class UniqueCheck(_ColumnsCheck):
    """No two rows with the same values in ``columns`` (rows with a NULL among them are not compared)."""

    type: Literal["unique"]


class AcceptedValuesCheck(_RowCheck):
    """Every non-NULL value of ``column`` is one of ``values`` (each read as the column's type)."""

    type: Literal["accepted_values"]
    column: str
    values: list[str | int | float | bool] = Field(min_length=1)

    def default_name(self) -> str:
        return f"accepted_values_{self.column}".lower()

    def columns_named(self) -> list[str]:
        return [self.column]


class SqlCheck(_RowCheck):
    """A Spark SQL predicate that selects failing rows of ``on``, or a query over the date's outputs by name
    (``current``, ``changes``) that must return no rows."""

    type: Literal["sql"]
    name: str | None = Field(default=None, description="Required: the check's name in the UI.")
    predicate: str | None = Field(default=None, description="Selects the rows that fail, e.g. `amount < 0`.")
    query: str | None = Field(default=None, description="A SELECT over `current` and `changes` that must return no rows.")

    @model_validator(mode="after")
    def _one_form(self) -> "SqlCheck":
        if self.name is None:
            raise ValueError("a sql check needs a name (it is the check's name in the UI)")
        if (self.predicate is None) == (self.query is None):
            raise ValueError("a sql check takes exactly one of predicate (selects the failing rows) and query (must return no rows)")
        if self.query is not None and "on" in self.model_fields_set:
            raise ValueError("`on` applies to a predicate; a query names the outputs it reads (current, changes)")
        text = self.predicate if self.predicate is not None else self.query
        if not (text or "").strip():
            raise ValueError("the sql check's predicate or query is empty")
        if ";" in (text or ""):
            raise ValueError("a sql check is one expression or one SELECT, without ';'")
        return self

    def default_name(self) -> str:
        return self.name or "sql"


DeclaredCheck = Annotated[
    VolumeCheck | NotNullCheck | UniqueCheck | AcceptedValuesCheck | SqlCheck,
    Field(discriminator="type"),
]
