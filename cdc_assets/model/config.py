"""Table configuration: one YAML file per table in ``table_configs/``, validated with pydantic.

A config is data, never code. Everything the factory builds for a table (assets, checks, schedule,
sensor) derives from one validated :class:`TableConfig`, and every validation error names the file
and the field that is wrong.
"""

from __future__ import annotations

import codecs
import fnmatch
import functools
import os
import re
from datetime import date
from enum import Enum
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from cdc_assets.model import settings
from cdc_assets.model.declared_checks import DeclaredCheck, SqlCheck

TABLE_CONFIGS_ENV = settings.TABLE_CONFIGS.name
DEFAULT_TABLE_CONFIGS = Path(__file__).resolve().parents[2] / "table_configs"

# Spark SQL type names a column may be cast to. Anything else is a config error, not a runtime one.
_SIMPLE_TYPES = {"string", "int", "bigint", "smallint", "tinyint", "double", "float", "date", "timestamp", "boolean"}
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Column names end up in Parquet schemas and SQL; keep them to plain identifiers.
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Columns the pipeline adds itself; a configured column of the same name would be overwritten.
RESERVED_COLUMNS = {
    "key_hash", "non_key_hash", "operation", "eff_start_date", "business_date", "change_flag", "change_sequence",
    # Operational metadata of current_table and history_partition.
    "process_id", "processed_at", "changed_columns",
    # Columns the consumer views add: the SCD type 2 view and the changes between two dates.
    "valid_from", "valid_to", "is_current", "is_deleted", "_change_type", "_from_date", "_to_date",
}
# The intake's own columns on the frame a source is read into (core/intake/source.py), and Spark's hidden file
# metadata column it reads the source file from: a source column of such a name, even one
# allow_extra_columns lets through, would be taken for the intake's own (core/intake/source.py check_columns).
INTAKE_COLUMNS = {"_source_file", "_raw_record", "_reject_reason", "_record_id", "_corrupt_record", "_metadata", "business_date"}
INTERNAL_PREFIX = "__cdc_"
# Every name the pipeline uses for itself besides RESERVED_COLUMNS, the one list of them: the intake's
# columns; the columns other outputs put beside a table's own (hashed_incoming's unavailable_columns); and the working columns of the later stages
# (core/intake/incoming.py, core/capture/changes.py, core/capture/changeset.py), some of them a prefix and a configured
# column's name or position (``_in_3``, ``_before_amount``).
INTERNAL_COLUMNS = INTAKE_COLUMNS | {
    "unavailable_columns",
    "_record_number", "_day_before", "_hash_before", "_day_after", "_sequence", "_filled", "_unfillable",
}
# The columns late_changes puts beside a change set's own (core/capture/changeset.py REASON, APPLIED_SEQUENCE):
# reserved in a changeset table only, since ``reason`` is a common column name and no other output has them.
CHANGESET_COLUMNS = {"reason", "applied_sequence"}
INTERNAL_PREFIXES = (INTERNAL_PREFIX, "_in_", "_held_", "_val_", "_earlier_", "_stored_", "_before_")


def reserved_name_problem(name: str) -> str | None:
    """Why ``name`` may not be a table's column (any case: Spark resolves names case-insensitively), or None."""
    lowered = name.lower()
    if lowered in RESERVED_COLUMNS:
        return f"{name!r} is reserved for a column the pipeline adds"
    if lowered in INTERNAL_COLUMNS or lowered.startswith(INTERNAL_PREFIXES):
        return f"{name!r} is reserved for the pipeline's own columns (docs/configuration.md, reserved names)"
    return None


class LoadType(str, Enum):
    """How a key that is missing from the day's input is interpreted."""

    full = "full"  # the extract is a full snapshot: a missing key was deleted (D)
    delta = "delta"  # the extract holds changed rows only: a missing key was not supplied (X)
    changeset = "changeset"  # change records (I/U/D flag + sequence): the latest per key is applied; untouched keys are X


class BadRecordPolicy(str, Enum):
    """What to do with a record that is malformed, does not cast, has a NULL/empty key, or has bytes that are
    not valid in ``source.encoding``.

    On a full load a quarantined record's key is *held* (kept as it was, neither updated nor deleted), so a
    record whose key cannot be parsed at all fails the date under ``quarantine``: the key it hides would be
    deleted. ``quarantine_unkeyed`` quarantines such records too, and their keys count as absent (D).
    """

    fail = "fail"
    quarantine = "quarantine"
    quarantine_unkeyed = "quarantine_unkeyed"


class DuplicateKeyPolicy(str, Enum):
    """What to do when a key appears more than once in one day's input."""

    fail = "fail"
    quarantine = "quarantine"


class Column(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    type: str
    # Strict: a YAML string ("false") is a typo here, not a choice.
    sensitive: bool | None = Field(
        default=None,
        strict=True,
        description="Whether the column's values are kept out of everything the project shows (materialization "
        "previews, errors, logs, alerts): true masks them. Unset: a key column is sensitive, any other is not "
        "(docs/erasure.md, what Dagster keeps).",
    )
    renamed_from: tuple[str, ...] = Field(
        default=(),
        description="The column's former name(s), newest first (one name, or a list): a rename between dates. "
        "Stored values under a former name carry across, and nothing is re-versioned (docs/schema-changes.md).",
    )

    @field_validator("renamed_from", mode="before")
    @classmethod
    def _one_or_more_names(cls, value):
        names = (value,) if isinstance(value, str) else tuple(value or ())
        for name in names:
            if not isinstance(name, str) or not _COLUMN.fullmatch(name):
                raise ValueError(f"renamed_from: {name!r} must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*)")
            problem = reserved_name_problem(name)
            if problem:  # a former name is a stored column's name
                raise ValueError(f"renamed_from: {problem}")
        return names

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _COLUMN.fullmatch(value):
            raise ValueError(f"column name {value!r} must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*)")
        problem = reserved_name_problem(value)
        if problem:
            raise ValueError(f"column name {problem}")
        return value

    @field_validator("type")
    @classmethod
    def _valid_type(cls, value: str) -> str:
        normalized = value.strip().lower()
        match = _DECIMAL.fullmatch(normalized)
        if match:
            precision, scale = int(match.group(1)), int(match.group(2))
            if not (1 <= precision <= 38 and 0 <= scale <= precision):
                raise ValueError(f"decimal({precision},{scale}) needs 1 <= precision <= 38 and 0 <= scale <= precision")
            return f"decimal({precision},{scale})"
        if normalized not in _SIMPLE_TYPES:
            allowed = ", ".join(sorted(_SIMPLE_TYPES)) + ", decimal(p,s)"
            raise ValueError(f"unknown type {value!r}; use one of: {allowed}")
        return normalized


class SourceFormat(str, Enum):
    csv = "csv"
    parquet = "parquet"
    json = "json"
    debezium = "debezium"  # JSON lines, one Debezium change event per line (bare or {"schema", "payload"})


class TimestampUnit(str, Enum):
    """How a Debezium timestamp without an embedded schema is encoded: epoch milli- or microseconds."""

    millis = "millis"
    micros = "micros"


# Envelope fields of a Debezium event a sequence may be made of, e.g. source.lsn or ts_ms.
_ENVELOPE_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
DEBEZIUM_OPERATIONS = {"c": "I", "r": "I", "u": "U", "d": "D", "t": "T"}
# What Debezium's PostgreSQL connector sends for an unchanged TOASTed column (unavailable.value.placeholder).
DEBEZIUM_UNAVAILABLE_VALUE = "__debezium_unavailable_value"


class Changes(BaseModel):
    """How a changeset's records say what they are (``load_type: changeset``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operation_column: str | None = Field(
        default=None, description="The source column holding each record's flag (not for source.format: debezium)."
    )
    insert_values: list[str] = Field(default_factory=lambda: ["I"], min_length=1)
    update_values: list[str] = Field(default_factory=lambda: ["U"], min_length=1)
    delete_values: list[str] = Field(default_factory=lambda: ["D"], min_length=1)
    sequence_columns: list[str] = Field(
        min_length=1,
        description="Columns (Debezium: envelope fields such as source.lsn) that order a key's changes, as a tuple.",
    )
    tombstone_retention_days: int = Field(default=30, ge=1)
    unavailable_value_placeholder: str = Field(
        default=DEBEZIUM_UNAVAILABLE_VALUE,
        min_length=1,
        description="source.format debezium: the connector's unavailable.value.placeholder, the text it sends "
        "for an unchanged large (TOASTed) column. Such a column keeps its previous value.",
    )

    @field_validator("operation_column")
    @classmethod
    def _plain_column(cls, value: str | None) -> str | None:
        if value is not None and not _COLUMN.fullmatch(value):
            raise ValueError(f"column name {value!r} must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*)")
        problem = reserved_name_problem(value) if value is not None else None
        if problem:  # the flag is a source column, read beside the table's own
            raise ValueError(f"column name {problem}")
        return value

    @model_validator(mode="after")
    def _values_distinct(self) -> "Changes":
        seen: dict[str, str] = {}
        for group in ("insert_values", "update_values", "delete_values"):
            for value in getattr(self, group):
                if value in seen:
                    raise ValueError(f"flag value {value!r} is listed in both {seen[value]} and {group}")
                seen[value] = group
        if len(set(self.sequence_columns)) != len(self.sequence_columns):
            raise ValueError(f"sequence_columns lists a column twice: {self.sequence_columns}")
        return self



class HardDeletes(str, Enum):
    """How the SCD type 2 view shows a deleted key (dbt snapshots' ``hard_deletes``)."""

    invalidate = "invalidate"  # the delete only closes the key's open version
    new_record = "new_record"  # it also starts a deletion row (is_deleted true) that the key's return closes


class Scd2(BaseModel):
    """How the SCD type 2 view (``cdc_assets.usecases.readers.scd2_view``) represents open versions and deletes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    open_end: date | None = Field(
        default=None,
        description="valid_to of an open version: null (dbt's convention), or a high date such as 9999-12-31.",
    )
    hard_deletes: HardDeletes = HardDeletes.invalidate


class Retention(BaseModel):
    """How many dates of stored states and of staging outputs the table keeps
    (``resources.storage.WarehouseStorage.drop_outside_retention``), and for how long replaced table
    versions stay (``WarehouseStorage.expire_snapshots``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Strict: YAML's `true` or `"2"` is a typo here, not a number of dates. At least 2: a date's run
    # reads the day before's state and never drops what it read, so 1 would keep 2 anyway.
    current_days: int | None = Field(
        default=None,
        ge=2,
        strict=True,
        description="Keep current_table (and a change set's applied_sequences) for the newest N business dates "
        "(the newest stored date and the N-1 calendar days before it); older partitions are dropped. null keeps "
        "every date. History is never dropped.",
    )
    # Strict and at least 1: no later date reads a date's staging outputs, so keeping the newest date's only is sound.
    staging_days: int | None = Field(
        default=None,
        ge=1,
        strict=True,
        description="Keep the staging outputs (hashed_incoming, rejects, hash_join_classification and a change "
        "set's late_changes) for the newest N business dates (the newest stored date and the N-1 calendar days "
        "before it); older partitions are dropped. null keeps every date. A run of a dropped date writes them "
        "again from its extract.",
    )
    # 0 is allowed (Iceberg allows it): the docs say what a reader still on an older version then meets.
    snapshot_days: int = Field(
        default=7,
        ge=0,
        strict=True,
        description="Keep each output's replaced table versions (Iceberg snapshots: what a re-run, a drop or an "
        "erase replaced) readable by time travel for N days; at the table's next run older ones are expired "
        "and the files only they read are deleted (a dropped date's files with them). The current version "
        "is always kept.",
    )


class Publish(BaseModel):
    """``publish:`` in a table config: how long what a table did not publish, or no longer publishes, stays readable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keep_rolled_back_days: int = Field(
        default=7,
        ge=1,
        strict=True,
        description="Keep the dates a rollback removed (cdc-rollback TABLE --to D) restorable by cdc-rollback TABLE "
        "--undo for N days: an Iceberg tag keeps the snapshot each output had before, and the files it reads, "
        "until then. An erase ends it at once (the tags' snapshots hold the erased keys).",
    )
    keep_failed_days: int = Field(
        default=7,
        ge=1,
        strict=True,
        description="Keep what a run staged and did not publish (a blocking check failed, the run was killed) "
        "readable on its branch cdc_run_<run id> for N days; the table's next publication after that drops the "
        "branch. An erase drops every such branch at once (staged rows hold the erased keys).",
    )


class ErasedKeys(str, Enum):
    """What a date's extract does with a key that ``cdc-erase`` erased (it is in the table's ``_erasures`` ledger)."""

    drop = "drop"  # set its records aside (counted, never stored): the key stays erased
    keep = "keep"  # take them as any other record: the key comes back, as the source still holds it


_CLOCK = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


class Freshness(BaseModel):
    """``freshness:`` in a table config: by when a business date's partitions should be materialized.

    Business date D is expected by ``expected_by`` (HH:MM, 24-hour) on the day after D, in ``timezone``
    (an IANA name such as Europe/Amsterdam; daylight saving is applied). Later than that, D is late.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    expected_by: str = Field(description="HH:MM on the day after the business date, in `timezone`.")
    timezone: str = Field(default="UTC", description="IANA time zone of expected_by, e.g. Europe/Amsterdam.")

    @field_validator("expected_by")
    @classmethod
    def _clock_time(cls, value: str) -> str:
        if not _CLOCK.fullmatch(value):
            raise ValueError(f"expected_by {value!r} must be a 24-hour time HH:MM, e.g. \"06:00\"")
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {value!r} is not an IANA time zone name such as Europe/Amsterdam or UTC") from None
        return value


class StateForm(str, Enum):
    """How current_table stores each date's state."""

    snapshot = "snapshot"  # every date a full copy of the state
    incremental = "incremental"  # every date its changes; a full copy (a base) now and then


# How a table whose config does not say (``storage.current`` unset) stores its state when it has none
# stored yet. A table with a stored state keeps its layout whatever this says (a table cannot switch:
# docs/incremental-state.md, Switching modes), so changing it leaves every existing warehouse as it is.
# Issue 50 wants incremental here (O(change) by default); the tests that assume a per-date layout are
# being pinned to it first (docs/incremental-state.md, "The default layout").
NEW_TABLE_STATE_FORM = StateForm.snapshot


class StateStorage(BaseModel):
    """``storage:`` in a table config: how the table's state (current_table) is stored.

    ``incremental`` writes a date's changes only (its I, U, N and D rows) and, when the changes since the
    last full copy pass ``compact_after_share`` of its rows or ``compact_after_dates`` dates, a full copy
    (compaction). ``snapshot`` writes the whole state every date. Unset, a table with no stored state is
    stored as :data:`NEW_TABLE_STATE_FORM` says and one with a stored state keeps the layout it has
    (:meth:`resolved`).
    Readers see the same state either way (docs/incremental-state.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    current: StateForm | None = Field(
        default=None,
        description="snapshot | incremental; unset: NEW_TABLE_STATE_FORM for a table with no stored state, else the layout it has.",
    )
    compact_after_share: float = Field(
        default=0.25,
        gt=0.0,
        description="Write a full copy once the change rows stored since the last one reach this share of its rows.",
    )
    compact_after_dates: int = Field(
        default=30, ge=1, strict=True, description="Write a full copy at the latest after this many dates of changes."
    )

    def resolved(self, stored: StateForm | None) -> "StateStorage":
        """This storage with ``current`` set: as configured, else ``stored`` (the layout the table's
        current_table has; None: nothing stored yet), else :data:`NEW_TABLE_STATE_FORM`."""
        if self.current is not None:
            return self
        return self.model_copy(update={"current": stored or NEW_TABLE_STATE_FORM})

    @property
    def incremental(self) -> bool:
        """Whether the state is stored incrementally; only for a resolved storage (:meth:`resolved`)."""
        if self.current is None:
            raise ValueError("storage.current is unset: resolve it against what the table stores first (StateStorage.resolved)")
        return self.current is StateForm.incremental

    @property
    def may_be_incremental(self) -> bool:
        """Whether the state is or may be stored incrementally (configured so, or unset): the table's
        definitions then carry the stored state's check."""
        return self.current is not StateForm.snapshot


@functools.lru_cache(maxsize=None)
def encoding_bytes(name: str) -> tuple[str, ...] | None:
    """What each byte 0x80..0xFF is in encoding ``name``: its character, or '' where the encoding leaves
    the byte undefined; None for UTF-8. A ValueError for a name Python's codecs do not know, and for an
    encoding that is not UTF-8 nor single-byte with ASCII as is (the readers split records and fields
    on ASCII bytes before decoding, core/intake/encoding.py)."""
    try:
        codec = codecs.lookup(name)
    except LookupError:
        raise ValueError(f"unknown encoding {name!r}; use UTF-8 or a single-byte encoding such as ISO-8859-1 or windows-1252") from None
    if codec.name == "utf-8":
        return None
    unsupported = ValueError(
        f"encoding {name!r} is not supported: use UTF-8 or a single-byte encoding that keeps ASCII as is "
        "(ISO-8859-1 to -16, windows-1250 to -1258, ...)"
    )
    characters = []
    for byte in range(0x100):
        decoder = codecs.getincrementaldecoder(codec.name)()
        try:
            character = decoder.decode(bytes([byte]), final=False)
        except UnicodeDecodeError:
            character = ""  # undefined in this encoding
        else:
            if len(character) != 1:  # waiting for more bytes (multi-byte), or several characters
                raise unsupported
        if byte < 0x80 and character != chr(byte):
            raise unsupported
        characters.append(character)
    return tuple(characters[0x80:])


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Annotated[str, Field(description="File, folder or glob with a {date} placeholder (YYYY-MM-DD).")]
    format: SourceFormat = SourceFormat.csv
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    # When a date's extract counts as complete, for the landing sensor (cdc_assets/defs/automation.py).
    ready_marker: str | None = Field(
        default=None,
        description="A file name, in the date's folder, that the producer writes once the date's files are complete "
        "(e.g. _SUCCESS, or {date}.done when one folder holds every date's files): the landing sensor requests a date "
        "only once its marker exists. Never read as data.",
    )
    settle_seconds: int = Field(
        default=60,
        ge=0,
        strict=True,
        description="Without a ready_marker: the landing sensor requests a date once the size and modification time "
        "of each of its files have stayed the same across sensor ticks at least this many seconds apart (0: at first "
        "sight, for producers that move complete files into place).",
    )
    encoding: str = Field(
        default="UTF-8",
        description="The text encoding of a csv or debezium source: UTF-8, or a single-byte encoding such as "
        "ISO-8859-1 or windows-1252. A record with bytes that are not valid in it is a bad record (invalid_encoding).",
    )

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        encoding_bytes(value)
        return value

    @model_validator(mode="after")
    def _encoding_fits_the_format(self) -> "Source":
        given = sorted(key for key in self.options if key.lower() in ("encoding", "charset"))
        if given and self.format in (SourceFormat.csv, SourceFormat.json):
            raise ValueError(f"source.options.{given[0]}: set source.encoding instead (it is checked record by record)")
        if encoding_bytes(self.encoding) is not None and self.format not in (SourceFormat.csv, SourceFormat.debezium):
            raise ValueError(f"source.encoding {self.encoding!r} applies to csv and debezium sources; a {self.format.value} source is read as UTF-8")
        for key, value in self.options.items():
            try:  # a CSV option's text is matched against the source's bytes (core/intake/encoding.py)
                str(value).encode(self.encoding)
            except UnicodeEncodeError:
                raise ValueError(f"source.options.{key}: {value!r} has a character that {self.encoding} cannot encode") from None
        return self

    @field_validator("path")
    @classmethod
    def _has_date_placeholder(cls, value: str) -> str:
        if "{date}" not in value:
            raise ValueError("path must contain the {date} placeholder, e.g. data/orders/{date}/")
        try:
            value.format(date="2000-01-01")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"path may contain only the {{date}} placeholder: {error}") from None
        return value

    @model_validator(mode="after")
    def _marker_is_not_data(self) -> "Source":
        if self.ready_marker is None:
            return self
        if "settle_seconds" in self.model_fields_set:
            raise ValueError(
                "settle_seconds applies without a ready_marker only: with one, the marker says when a date is complete"
            )
        marker = self.ready_marker
        try:
            sample = marker.format(date="2000-01-01")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"ready_marker may contain only the {{date}} placeholder: {error}") from None
        if not sample or "/" in marker or "\\" in marker or sample in (".", ".."):
            raise ValueError(f"ready_marker {marker!r} must be a file name (no folder): it is looked for in the date's folder")
        folder = self.marker_folder
        if any(character in folder.format(date="2000-01-01") for character in "*?["):
            raise ValueError(
                f"ready_marker needs a source.path whose folder has no wildcards, so the marker has one place "
                f"(the folder is {folder!r})"
            )
        if "{date}" not in folder and "{date}" not in marker:
            raise ValueError(
                f"ready_marker {marker!r} would be one file for every date: the folder {folder!r} holds every date's "
                "files, so put {date} in the marker's name, e.g. '{date}.done' (a source.path that names a folder per "
                "date ends with /)"
            )
        # Spark (and so the intake) skips files whose names start with _ or .; any other marker must not
        # match the files the intake reads.
        hidden = sample.startswith(("_", "."))
        if not hidden and self.path.endswith("/"):
            raise ValueError(
                f"ready_marker {marker!r} would be read as data from the date's folder: start its name with _ or . "
                "(files the readers skip), e.g. _SUCCESS"
            )
        if not hidden and fnmatch.fnmatchcase(sample, self.path.rsplit("/", 1)[-1].format(date="2000-01-01")):
            raise ValueError(
                f"ready_marker {marker!r} matches source.path {self.path!r}, so it would be read as data: start its "
                "name with _ or ., or give it a name the path does not match"
            )
        return self

    @property
    def marker_folder(self) -> str:
        """The folder of a date's files, as a template: source.path itself when it ends with /, else the
        folder that holds the file or glob it names."""
        if self.path.endswith("/"):
            return self.path
        return self.path.rsplit("/", 1)[0] + "/" if "/" in self.path else ""

    def ready_marker_for(self, business_date: str) -> str | None:
        """Where the date's ready marker is, or None when the table has none."""
        if self.ready_marker is None:
            return None
        return self._resolve(self.marker_folder.format(date=business_date) + self.ready_marker.format(date=business_date))

    def path_for(self, business_date: str) -> str:
        """The source location for one business date; relative paths resolve against ``CDC_DATA_ROOT``."""
        return self._resolve(self.path.format(date=business_date))

    @staticmethod
    def _resolve(resolved: str) -> str:
        if "://" in resolved or os.path.isabs(resolved):
            return resolved
        root = settings.DATA_ROOT.value()
        if "://" in root:  # a bucket (s3://landing/extracts): joined as a key prefix
            return f"{root.rstrip('/')}/{resolved}"
        return str(Path(root).resolve() / resolved)


class TableConfig(BaseModel):
    """One operational table: where its daily extract lands and which columns mean what."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    start_date: date
    # The last business date, for a table whose extracts have stopped (a retired system, the demo's two
    # days); without it the partitions run up to yesterday and grow by one each day.
    end_date: date | None = None
    load_type: LoadType
    source: Source
    keys: list[Column] = Field(min_length=1)
    non_keys: list[Column] = Field(default_factory=list)
    untracked_columns: list[Column] = Field(default_factory=list)
    bad_records: BadRecordPolicy = BadRecordPolicy.quarantine
    duplicate_keys: DuplicateKeyPolicy = DuplicateKeyPolicy.fail
    max_delete_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    allow_extra_columns: bool = False
    changes: Changes | None = None
    scd2: Scd2 = Scd2()
    retention: Retention | None = None
    publish: Publish = Publish()
    storage: StateStorage = StateStorage()
    erased_keys: ErasedKeys = ErasedKeys.drop
    freshness: Freshness | None = None
    # Checks the table's owner declares on each date's outputs (cdc_assets/model/declared_checks.py, docs/running.md (Declared checks)).
    checks: list[DeclaredCheck] = Field(default_factory=list)
    owners: list[str] = Field(default_factory=list)
    description: str | None = None
    # The file the config was read from, for errors that must name it (None: built in code).
    _source_file: Path | None = PrivateAttr(default=None)

    @property
    def change_set(self) -> Changes:
        """The ``changes:`` section of a table whose extracts are change sets (``load_type: changeset``, and
        every Debezium table); raises for a table without one, which no change set code path reaches."""
        if self.changes is None:
            raise ValueError(f"{self.source_file}: table {self.name} has no `changes:` section")
        return self.changes

    def with_state_stored(self, stored: StateForm | None) -> "TableConfig":
        """This config with ``storage.current`` resolved against ``stored``, the layout the table's
        current_table has (None: none stored yet): :meth:`StateStorage.resolved`."""
        storage = self.storage.resolved(stored)
        return self if storage is self.storage else self.model_copy(update={"storage": storage})

    @property
    def source_file(self) -> str:
        """The config's file, or a description of where it came from, for error messages."""
        return str(self._source_file) if self._source_file is not None else f"the table config of {self.name}"

    @field_validator("name")
    @classmethod
    def _valid_table_name(cls, value: str) -> str:
        # The name becomes a folder under the warehouse root and an asset key prefix:
        # this pattern also rules out "..", "/" and absolute paths.
        if not _NAME.fullmatch(value):
            raise ValueError(f"name {value!r} must match [a-z][a-z0-9_]* (it is a folder name and asset key prefix)")
        return value

    @model_validator(mode="after")
    def _end_after_start(self) -> "TableConfig":
        if self.end_date is not None and self.end_date < self.start_date:
            raise ValueError(f"end_date {self.end_date} is before start_date {self.start_date}")
        return self

    @model_validator(mode="after")
    def _columns_distinct(self) -> "TableConfig":
        seen: dict[str, str] = {}
        for group in ("keys", "non_keys", "untracked_columns"):
            for column in getattr(self, group):
                lowered = column.name.lower()  # Spark resolves column names case-insensitively
                if lowered in seen:
                    where = "twice in " + group if seen[lowered] == group else f"in both {seen[lowered]} and {group}"
                    raise ValueError(f"column {column.name!r} is listed {where}")
                seen[lowered] = group
        for group in ("keys", "non_keys", "untracked_columns"):
            for column in getattr(self, group):
                for former in column.renamed_from:
                    if group == "keys":
                        raise ValueError(
                            f"{group}: column {column.name!r} has renamed_from, but a key cannot be renamed: a key "
                            "change is a new table (docs/schema-changes.md)"
                        )
                    if former.lower() in seen:
                        raise ValueError(
                            f"{group}: column {column.name!r} is renamed_from {former!r}, which is also a configured column"
                        )
        return self

    @model_validator(mode="after")
    def _changes_fit_the_load(self) -> "TableConfig":
        changeset = self.load_type is LoadType.changeset
        debezium = self.source.format is SourceFormat.debezium
        if debezium and not changeset:
            raise ValueError("source.format debezium holds change events: it needs load_type: changeset")
        if changeset:
            for group in ("keys", "non_keys", "untracked_columns"):
                for index, column in enumerate(getattr(self, group)):
                    for name in (column.name, *column.renamed_from):
                        if name.lower() in CHANGESET_COLUMNS:
                            field = "name" if name == column.name else "renamed_from"
                            raise ValueError(
                                f"{group}.{index}.{field}: {name!r} is reserved in a changeset table: late_changes "
                                "puts a column of that name beside the table's own"
                            )
        if not changeset:
            if self.changes is not None:
                raise ValueError("field 'changes' applies to load_type: changeset only")
            return self
        if self.changes is None:
            raise ValueError("load_type changeset needs a 'changes' section (at least sequence_columns)")
        changes, by_lower = self.changes, {column.name.lower(): column for column in self.columns}
        if debezium:
            given = changes.model_fields_set & {"operation_column", "insert_values", "update_values", "delete_values"}
            if given:
                raise ValueError(
                    f"changes.{sorted(given)[0]} does not apply to source.format debezium: the event's op is the flag"
                )
            for field in changes.sequence_columns:
                if not _ENVELOPE_FIELD.fullmatch(field):
                    raise ValueError(f"changes.sequence_columns: {field!r} is not an envelope field path such as source.lsn")
            unit = self.source.options.get("timestamp_unit")
            if unit is not None and str(unit) not in {unit.value for unit in TimestampUnit}:
                raise ValueError(f"source.options.timestamp_unit must be millis or micros, not {unit!r}")
            return self
        if "unavailable_value_placeholder" in changes.model_fields_set:
            raise ValueError("changes.unavailable_value_placeholder applies to source.format debezium only")
        if changes.operation_column is None:
            raise ValueError("changes.operation_column is required: the source column holding each record's I/U/D flag")
        if changes.operation_column.lower() in by_lower:
            raise ValueError(
                f"changes.operation_column {changes.operation_column!r} is also a configured column; "
                "the flag is not part of the table's payload"
            )
        for name in changes.sequence_columns:
            column = by_lower.get(name.lower())
            if column is None:
                raise ValueError(
                    f"changes.sequence_columns: {name!r} is not a configured column (declare it, usually under untracked_columns)"
                )
        return self

    @model_validator(mode="after")
    def _checks_name_columns(self) -> "TableConfig":
        by_lower = {column.name.lower() for column in self.columns}
        seen: dict[str, int] = {}
        for index, check in enumerate(self.checks):
            for name in check.columns_named():
                if name.lower() not in by_lower:
                    raise ValueError(f"checks.{index}: {name!r} is not a configured column of table {self.name}")
            name = check.check_name
            if name in RESERVED_CHECK_NAMES:
                raise ValueError(f"checks.{index}.name: {name!r} is the name of one of the pipeline's own checks; choose another")
            if name in seen:
                raise ValueError(f"checks.{index}.name: {name!r} is also the name of checks.{seen[name]} (give one a `name`)")
            seen[name] = index
            if isinstance(check, SqlCheck) and check.query is not None and not _NAMES_AN_OUTPUT.search(check.query):
                raise ValueError(f"checks.{index}.query: the query reads neither `current` nor `changes`, the date's outputs")
        return self

    @property
    def sequence_column_names(self) -> list[str]:
        """A flagged changeset's sequence columns as configured (empty for other loads and for Debezium)."""
        if self.changes is None or self.source.format is SourceFormat.debezium:
            return []
        by_lower = {column.name.lower(): column.name for column in self.columns}
        return [by_lower[name.lower()] for name in self.changes.sequence_columns]

    @property
    def columns(self) -> list[Column]:
        """All configured columns in output order: keys, non-keys, untracked."""
        return [*self.keys, *self.non_keys, *self.untracked_columns]

    @property
    def key_names(self) -> list[str]:
        return [column.name for column in self.keys]


# The pipeline's own check names (cdc_assets/defs/checks.py, freshness.py): a declared check may not take one.
RESERVED_CHECK_NAMES = {
    "rows_read_reconcile", "keys_unique", "no_erased_keys_in_extract", "incoming_reconciles", "previous_state_reconciles",
    "row_count_reconciles", "key_hash_unique", "keys_not_null", "no_update_without_change", "stored_state_reconciles",
    "no_key_held_by_reject", "records_reconcile", "previous_plus_changes", "freshness",
}
_NAMES_AN_OUTPUT = re.compile(r"\b(current|changes)\b", re.IGNORECASE)


class TableConfigError(ValueError):
    """A table config file that cannot be used; the message names the file and the field."""


def _format_validation_error(path: Path, error: ValidationError) -> str:
    lines = [f"{path}: invalid table config"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  field '{field}': {message}")
    return "\n".join(lines)


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that leaves YAML timestamps as strings: pydantic parses dates, so an unquoted invalid
    date (``start_date: 2024-13-45``) is reported against its field instead of escaping as a bare ValueError."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_table_config(path: str | Path) -> TableConfig:
    """Read and validate one table config file."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        raise TableConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise TableConfigError(f"{path}: expected a mapping of fields at the top level, got {type(raw).__name__}")
    try:
        config = TableConfig.model_validate(raw)
    except ValidationError as error:
        raise TableConfigError(_format_validation_error(path, error)) from None
    config._source_file = path
    return config


def table_configs_dir() -> Path:
    configured = settings.TABLE_CONFIGS.value()
    return Path(configured).resolve() if configured else DEFAULT_TABLE_CONFIGS


def load_table_configs(folder: str | Path | None = None) -> list[TableConfig]:
    """Every ``*.yaml``/``*.yml`` table config in ``folder`` (default: ``CDC_TABLE_CONFIGS``), sorted by name."""
    folder = Path(folder) if folder is not None else table_configs_dir()
    if not folder.is_dir():
        raise TableConfigError(f"{folder}: table config folder does not exist (set {TABLE_CONFIGS_ENV})")
    files = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    configs = [load_table_config(path) for path in files]
    by_name: dict[str, Path] = {}
    for path, config in zip(files, configs):
        if config.name in by_name:
            raise TableConfigError(f"{path}: field 'name': table {config.name!r} is also defined in {by_name[config.name]}")
        by_name[config.name] = path
    return sorted(configs, key=lambda config: config.name)

