"""Schema changes between dates: what a stored state was hashed over, and how to compare a date with it.

Every current_table partition records the columns its hashes were computed over (:class:`HashSpec`, in
the Parquet schema's metadata of ``non_key_hash``). When a table's config changes its columns between
dates, :func:`schema_change` compares the stored spec with the config's and either refuses the change
(keys, or a type change that may not hold every stored value) or describes it; :func:`migrate_state`
then brings the previous state into the new schema, hashes recomputed, so that classification compares
like with like: a key whose columns the two dates share are equal stays N. Dates without a change never
call it. docs/schema-changes.md is the user's view of the same rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.capture.changes import AUDIT_COLUMNS, EFF_START_DATE, OPERATION
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.errors import SummarizedError
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH, add_hashes

# The hash encoding of core/hashing.py; a new encoding would get a new version and a migration.
HASH_VERSION = 1
# The key under which a state's spec is kept in the metadata of its non_key_hash column.
HASH_SPEC_METADATA = "cdc.hash_spec"
# What a stored state holds besides its payload and hashes; kept as they are by a migration.
_STATE_COLUMNS = (OPERATION, EFF_START_DATE, *AUDIT_COLUMNS, BUSINESS_DATE)

Typed = tuple[str, str]  # (column name, config type name)
GROUPS = ("keys", "non_keys", "untracked_columns")

# Type changes applied between dates, with the stored value's widening. Integers and decimals widen
# exactly and keep their canonical text, so their hashes do not change. A stored float widens through
# its shortest decimal text (0.1f -> "0.1" -> 0.1d), the value the source most likely sent: widened
# bit for bit it would be 0.10000000149011612, and every float key would read as changed.
_INTEGER_RANK = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def widens(old_type: str, new_type: str) -> bool:
    """Whether a stored ``old_type`` value always reads as an equal ``new_type`` value."""
    if old_type in _INTEGER_RANK and new_type in _INTEGER_RANK:
        return _INTEGER_RANK[new_type] > _INTEGER_RANK[old_type]
    if (old_type, new_type) == ("float", "double"):
        return True
    old, new = _DECIMAL.fullmatch(old_type), _DECIMAL.fullmatch(new_type)
    return bool(old and new and new.group(2) == old.group(2) and int(new.group(1)) > int(old.group(1)))


def widened(value: SparkColumn, old_type: str, new_type: str) -> SparkColumn:
    """A stored ``old_type`` value as ``new_type`` (only for a change :func:`widens` allows)."""
    if (old_type, new_type) == ("float", "double"):
        return value.cast("string").cast("double")
    return value.cast(new_type)


@dataclass(frozen=True)
class HashSpec:
    """The columns a state's hashes were computed over, in order, with their types."""

    keys: tuple[Typed, ...]
    non_keys: tuple[Typed, ...]  # tracked: in non_key_hash
    untracked: tuple[Typed, ...] = ()
    version: int = HASH_VERSION

    @property
    def payload(self) -> tuple[Typed, ...]:
        return (*self.keys, *self.non_keys, *self.untracked)

    def group(self, name: str) -> tuple[Typed, ...]:
        return {"keys": self.keys, "non_keys": self.non_keys, "untracked_columns": self.untracked}[name]

    def to_json(self) -> str:
        return json.dumps(
            {"version": self.version, "keys": self.keys, "non_keys": self.non_keys, "untracked": self.untracked},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> HashSpec:
        raw = json.loads(text)
        typed = lambda items: tuple((name, kind) for name, kind in items)  # noqa: E731
        return cls(typed(raw["keys"]), typed(raw["non_keys"]), typed(raw.get("untracked", ())), int(raw["version"]))


def with_hash_spec(frame: DataFrame, spec: HashSpec) -> DataFrame:
    """``frame`` with ``spec`` recorded in its ``non_key_hash`` column's metadata, which Parquet keeps."""
    return frame.withMetadata(NON_KEY_HASH, {HASH_SPEC_METADATA: spec.to_json()})


# Spark's JSON type names (a Parquet file's Spark schema) as config type names.
_SPARK_JSON_TYPES = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}


def stored_spec(stored_fields: Sequence[Mapping], config_spec: HashSpec) -> HashSpec:
    """The spec of a stored state from its Parquet schema's fields (Spark's JSON schema).

    A state written before specs were recorded is read as hashed the way ``config_spec`` groups its
    columns, with the types it stores (a stored column the config does not name: untracked). Such a
    state was written with the config of its time, which differed from today's only if the config
    changed since.
    """
    by_name = {item["name"]: item for item in stored_fields}
    recorded = (by_name.get(NON_KEY_HASH, {}).get("metadata") or {}).get(HASH_SPEC_METADATA)
    if recorded:
        return HashSpec.from_json(recorded)
    types = {
        name: _SPARK_JSON_TYPES.get(item["type"], item["type"])
        for name, item in by_name.items()
        if isinstance(item["type"], str) and name not in (KEY_HASH, NON_KEY_HASH, *_STATE_COLUMNS)
    }

    def present(columns: Sequence[Typed]) -> tuple[Typed, ...]:
        return tuple((name, types[name]) for name, _ in columns if name in types)

    named = {name for name, _ in config_spec.payload}
    leftovers = tuple((name, kind) for name, kind in types.items() if name not in named)
    return HashSpec(present(config_spec.keys), present(config_spec.non_keys), present(config_spec.untracked) + leftovers)


class SchemaChangeError(SummarizedError, ValueError):
    """A change of a table's columns that cannot be applied between dates; raised before anything is written."""


@dataclass(frozen=True)
class SchemaChange:
    """How a date's columns differ from the stored previous state's (new names; ``sources`` maps each to
    its stored name, None for an added column)."""

    sources: Mapping[str, str | None]
    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    renamed: Mapping[str, str] = field(default_factory=dict)  # new name -> stored name
    widened: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # new name -> (stored type, new type)
    now_tracked: tuple[str, ...] = ()
    now_untracked: tuple[str, ...] = ()
    reordered: bool = False

    @property
    def is_empty(self) -> bool:
        return not (self.added or self.dropped or self.renamed or self.widened or self.now_tracked or self.now_untracked or self.reordered)

    def describe(self) -> dict:
        """The change as metadata and the runs log show it."""
        described: dict = {}
        for name in ("added", "dropped", "now_tracked", "now_untracked"):
            if getattr(self, name):
                described[name] = list(getattr(self, name))
        if self.renamed:
            described["renamed"] = {new: old for new, old in self.renamed.items()}
        if self.widened:
            described["widened"] = {name: f"{old} -> {new}" for name, (old, new) in self.widened.items()}
        if self.reordered:
            described["reordered"] = True
        return described

    def summary(self) -> str:
        return "; ".join(f"{name}: {value}" for name, value in self.describe().items())


def schema_change(
    stored: HashSpec,
    configured: HashSpec,
    renamed_from: Mapping[str, Sequence[str]],
    table: str,
    config_file: str,
    stored_as_of: str,
) -> SchemaChange:
    """What changed from the state stored as of ``stored_as_of`` to the config; raises :class:`SchemaChangeError`
    (naming ``config_file``, the field, both definitions and what to do) for a change that cannot be applied."""
    where = f"{config_file}: table {table}"
    redo = (
        "Either define a new table (a new name) with the new definition, or re-baseline this one: run this date with "
        f"run config ops: {{{table}__cdc: {{config: {{rebaseline: true}}}}}}, which compares every key under the new "
        "definition (docs/schema-changes.md, Re-baseline)."
    )
    if stored.version != configured.version:
        raise SchemaChangeError(
            f"{where}: the state as of {stored_as_of} was hashed with encoding version {stored.version}, this release uses "
            f"{configured.version}. {redo}"
        )
    if stored.keys != configured.keys:
        raise SchemaChangeError(
            f"{where}: field 'keys' changed: the state as of {stored_as_of} was written with keys {_shown(stored.keys)}, "
            f"the config now says {_shown(configured.keys)}. A change to the keys changes every key's hash, so it is "
            f"not applied between dates; nothing was written. {redo}"
        )
    stored_types = dict(stored.payload)
    tracked_before = {name for name, _ in stored.non_keys}
    sources: dict[str, str | None] = {}
    renamed, widened_columns = {}, {}
    for group in GROUPS[1:]:
        for index, (name, new_type) in enumerate(configured.group(group)):
            source = name if name in stored_types else next((old for old in renamed_from.get(name, ()) if old in stored_types), None)
            sources[name] = source
            if source is None:
                continue
            if source != name:
                renamed[name] = source
            old_type = stored_types[source]
            if old_type != new_type:
                if not widens(old_type, new_type):
                    stored_name = source if source == name else f"{source} (now {name})"
                    raise SchemaChangeError(
                        f"{where}: field '{group}.{index}.type' ({name}) changed from {old_type} to {new_type}: the state "
                        f"as of {stored_as_of} holds {stored_name} as {old_type}, and {old_type} -> {new_type} is not a "
                        "widening that reads every stored value as an equal one (allowed: tinyint -> smallint -> int -> "
                        "bigint, float -> double, decimal(p,s) -> decimal(p',s) with p' > p); nothing was written. Keep "
                        f"{old_type}, or add the column under a new name. {redo}"
                    )
                widened_columns[name] = (old_type, new_type)
    used = set(sources.values())
    configured_tracked = [name for name, _ in configured.non_keys]
    kept = [sources[name] for name, _ in (*configured.non_keys, *configured.untracked) if sources[name] is not None]
    stored_order = [name for name, _ in (*stored.non_keys, *stored.untracked) if name in used]
    return SchemaChange(
        sources=sources,
        added=tuple(name for name, source in sources.items() if source is None),
        dropped=tuple(name for name, _ in (*stored.non_keys, *stored.untracked) if name not in used),
        renamed=renamed,
        widened=widened_columns,
        now_tracked=tuple(name for name in configured_tracked if sources[name] is not None and sources[name] not in tracked_before),
        now_untracked=tuple(
            name for name, _ in configured.untracked if sources[name] is not None and sources[name] in tracked_before
        ),
        reordered=kept != stored_order,
    )


def _shown(columns: Sequence[Typed]) -> str:
    return "[" + ", ".join(f"{name} {kind}" for name, kind in columns) + "]"


def rebaseline_change(stored: HashSpec, configured: HashSpec, renamed_from: Mapping[str, Sequence[str]]) -> SchemaChange:
    """A declared re-baseline: every configured column taken from the stored column of its name (or a former
    one) where there is one, whatever its type; keys included. Nothing is refused."""
    stored_types = dict(stored.payload)
    sources = {
        name: name if name in stored_types else next((old for old in renamed_from.get(name, ()) if old in stored_types), None)
        for name, _ in configured.payload
    }
    return SchemaChange(sources=sources, added=tuple(name for name, source in sources.items() if source is None))


def migrate_state(
    previous: DataFrame,
    stored: HashSpec,
    configured: HashSpec,
    change: SchemaChange,
    incoming_values: DataFrame | None = None,
    rebaseline: bool = False,
) -> DataFrame:
    """The previous state in the configured schema, hashed as a row of today would be.

    Each configured column takes its stored column (renamed, widened) or, added, NULL; the stored
    columns the config no longer has go. ``non_key_hash`` is recomputed over the configured tracked
    columns, so a key whose shared columns are equal to today's row hashes equal to it. An added
    tracked column has no stored value to compare: for a key that today's rows supply (``incoming_values``:
    ``key_hash`` and the added tracked columns, one row per key) it takes today's value, so it cannot
    make the key differ; for the other keys (X, D) it is NULL, as current_table then holds it. With
    ``rebaseline`` the keys are taken the same way (any type, cast where it fits) and ``key_hash`` is
    recomputed too. The other columns (eff_start_date, audit) are kept.
    """
    stored_types = dict(stored.payload)
    added_tracked = [name for name, _ in configured.non_keys if change.sources.get(name) is None and name in change.sources]
    frame = previous
    if incoming_values is not None and added_tracked:
        today = incoming_values.select(KEY_HASH, *(F.col(name).alias(f"__cdc_today_{name}") for name in added_tracked))
        frame = frame.join(today, on=KEY_HASH, how="left")

    def value(name: str, new_type: str) -> SparkColumn:
        source = change.sources.get(name, name if not rebaseline else None)
        if source is None:
            if incoming_values is not None and name in added_tracked:
                return F.col(f"__cdc_today_{name}").cast(new_type)
            return F.lit(None).cast(new_type)
        old_type = stored_types[source]
        if old_type == new_type:
            return F.col(source)
        if rebaseline and not widens(old_type, new_type):
            return F.col(source).try_cast(new_type)
        return widened(F.col(source), old_type, new_type)

    kept = [name for name in previous.columns if name in _STATE_COLUMNS]
    columns = {name: value(name, kind) for name, kind in configured.payload}
    migrated = frame.select(*(column.alias(name) for name, column in columns.items()), *kept)
    # Both hashes as the intake computes them (the key hash comes out as stored unless re-baselined).
    rehashed = add_hashes(migrated, configured.keys, configured.non_keys)
    return rehashed.select(*columns, KEY_HASH, NON_KEY_HASH, *kept)


def values_for_added_columns(incoming: DataFrame, change: SchemaChange, configured: HashSpec, order_by: str | None = None) -> DataFrame | None:
    """One row per key of a date's incoming rows with the added tracked columns (None: none was added).

    ``order_by`` (a change set's sequence) picks the key's newest record, the one that decides it.
    """
    added = [name for name, _ in configured.non_keys if name in change.added]
    if not added:
        return None
    keyed = incoming.filter(F.col(KEY_HASH).isNotNull())
    if order_by is None:
        return keyed.select(KEY_HASH, *added).dropDuplicates([KEY_HASH])
    newest = F.max_by(F.struct(*added), F.col(order_by))
    return keyed.groupBy(KEY_HASH).agg(newest.alias("__cdc_newest")).select(KEY_HASH, *(F.col(f"__cdc_newest.{name}").alias(name) for name in added))


def equal_across(before: SparkColumn, after: SparkColumn, old_type: str, new_type: str) -> SparkColumn:
    """Whether a stored ``old_type`` value and today's ``new_type`` value are equal (NULL equals NULL)."""
    return widened(before, old_type, new_type).eqNullSafe(after) if old_type != new_type else before.eqNullSafe(after)


def spec_of(keys: Sequence[Typed], non_keys: Sequence[Typed], untracked: Sequence[Typed]) -> HashSpec:
    def pairs(columns: Sequence[Typed]) -> tuple[tuple[str, str], ...]:
        return tuple((name, kind) for name, kind in columns)

    return HashSpec(pairs(keys), pairs(non_keys), pairs(untracked))


def shared_tracked_columns(stored: HashSpec, configured: HashSpec, change: SchemaChange) -> list[tuple[str, str, str, str]]:
    """(name now, stored name, stored type, type now) of each tracked column whose stored value exists."""
    stored_types = dict(stored.payload)
    return [
        (name, source, stored_types[source], kind)
        for name, kind in configured.non_keys
        if (source := change.sources.get(name)) is not None
    ]


def updates_equal_on_shared_columns(
    updates: DataFrame, previous: DataFrame, shared: Sequence[tuple[str, str, str, str]]
) -> DataFrame:
    """The updates whose key's previous version holds equal values in every shared tracked column: keys
    re-versioned by a schema change alone. Compared value by value (widened), not by hash."""
    before = previous.select(KEY_HASH, *(F.col(old).alias(f"__cdc_before_{index}") for index, (_, old, _, _) in enumerate(shared)))
    joined = updates.join(before, on=KEY_HASH, how="inner")
    equal = F.lit(True)
    for index, (name, _, old_type, new_type) in enumerate(shared):
        equal = equal & equal_across(F.col(f"__cdc_before_{index}"), F.col(name), old_type, new_type)
    return joined.filter(equal)
