"""Erasing keys (a right-to-be-forgotten request): which stored rows belong to erased keys. Plain PySpark.

An erased key is known by its ``key_hash``, computed from the request's key values exactly as the
intake computes it (``core/hashing.add_hashes`` over ``try_cast(text AS type)`` of the text as read,
nothing trimmed or case-folded: ``'C001  '``, ``'C001'`` and ``'c001'`` are three keys), so the ledger of
erased keys holds no key value and every stored dataset that carries ``key_hash`` is matched by one
broadcast join. The rejects hold a raw record instead: its key is parsed out of it where the record
says which value is which (the JSON the intake writes for a record that failed a cast or a duplicate
key, or a Debezium event). Given the request's key values (the keys file), a record whose key cannot
be parsed is matched by its values (:func:`reject_holds_key`): a CSV line (a malformed one: a field too
many or too few) is split into fields with the table's own CSV options, and holds a key when its fields
hold each of the key's values; any other record whose key cannot be told (a line of a JSON or Debezium
source that is not JSON, a CSV line whose values are not whole fields) *may hold* the key when its text
holds each key value's text: it cannot be checked, and is reported as such, never taken for clean.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.model.config import INTERNAL_PREFIX, SourceFormat, TableConfig
from cdc_assets.model.masking import MASKED, ValueMask
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH, add_hashes
from cdc_assets.core.intake.source import CSV_DEFAULTS

# A rejects row's key hash, parsed from its raw record: NULL when the record's key cannot be parsed.
RAW_KEY_HASH = f"{INTERNAL_PREFIX}raw_key_hash"
RAW_RECORD = "raw_record"  # the rejects' column holding the record as read
# Where a raw record may hold a key column's value: the intake's JSON of the record's fields, a
# Debezium event's row image (with or without the schema envelope), the after image first.
_JSON_PLACES = ("$.{name}", "$.after.{name}", "$.payload.after.{name}", "$.before.{name}", "$.payload.before.{name}")
# Lines of the keys file named in an error: enough to find them, few enough to read.
_SHOWN_BAD_LINES = 5


class KeysFileError(ValueError):
    """The file of keys to erase does not hold the table's key columns, or holds a value that is not a key."""


# How the keys file (a CSV of the request's key values) is read: every value as text, exactly as written.
# RFC 4180 quoting (a doubled quote inside quotes), so a value may hold the delimiter, quotes, spaces and
# line breaks; no whitespace is trimmed (Spark's reading default, said here so that no default can change it).
KEYS_FILE_OPTIONS = {
    "header": "true",
    "inferSchema": "false",
    "quote": '"',
    "escape": '"',
    "multiLine": "true",
    "ignoreLeadingWhiteSpace": "false",
    "ignoreTrailingWhiteSpace": "false",
}
# Options of a CSV source that change a key's text on its way to the intake's cast: the keys file,
# which lists keys as the extracts hold them, is read with the table's own setting of each.
_TEXT_CHANGING_CSV_OPTIONS = ("ignoreLeadingWhiteSpace", "ignoreTrailingWhiteSpace")


def keys_file_options(config: TableConfig) -> dict[str, str]:
    """The CSV options the keys file of ``config``'s table is read with: :data:`KEYS_FILE_OPTIONS`, and a
    CSV source's own whitespace trimming where it sets one (the intake never sees what it trims)."""
    options = dict(KEYS_FILE_OPTIONS)
    if config.source.format is SourceFormat.csv:
        given = {name.lower(): value for name, value in config.source.options.items()}
        for name in _TEXT_CHANGING_CSV_OPTIONS:
            if name.lower() in given:
                options[name] = str(given[name.lower()]).lower()
    return options


def erased_key_values(keys: DataFrame, key_columns: Sequence[tuple[str, str]], table: str, path: str) -> DataFrame:
    """Each distinct key in ``keys`` (the keys file read as text, with a header), its columns typed as the
    intake types them: ``try_cast(text AS type)`` of the text as read (``core/source.validate_records``).

    The header must name the table's key columns (any order, any case, nothing else). Every value
    must cast to its column's configured type and not be blank (the intake rejects a NULL or blank key,
    so no stored row has one): a key that is either raises :class:`KeysFileError` naming the file and
    the first bad lines, since erasing "nearly" the requested keys is not an erase. Nothing is trimmed
    or case-folded: a string key's spaces and case are part of it, as in the intake's hash.
    """
    by_lower = {name.lower(): name for name in keys.columns}
    wanted = [name.lower() for name, _ in key_columns]
    missing = [name for name, _ in key_columns if name.lower() not in by_lower]
    extra = [name for name in keys.columns if name.lower() not in wanted]
    if missing or extra:
        raise KeysFileError(
            f"{path}: the keys file of table {table} must have a header naming its key columns "
            f"({', '.join(name for name, _ in key_columns)}) and nothing else; "
            + (f"missing {', '.join(missing)}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"not a key column: {', '.join(extra)}" if extra else "")
        )
    texts = [f"{INTERNAL_PREFIX}text_{index}" for index in range(len(key_columns))]
    typed = keys.select(
        *(F.expr(f"try_cast(`{by_lower[name.lower()]}` AS {spark_type})").alias(name) for name, spark_type in key_columns),
        *(F.col(f"`{by_lower[name.lower()]}`").alias(text) for text, (name, _) in zip(texts, key_columns)),
    )
    # The intake's rule for a key it rejects: NULL, or blank once trimmed (core/source.validate_records).
    bad = typed.filter(
        F.expr(" OR ".join(f"`{name}` IS NULL OR trim(`{text}`) = ''" for text, (name, _) in zip(texts, key_columns)))
    )
    shown = bad.limit(_SHOWN_BAD_LINES).collect()
    if shown:
        # Under the erase job this message stays in Dagster's event log, past the erase: a key's value (or a
        # near miss of one) is shown only as CDC_SHOW_VALUES allows, with what is wrong with it.
        mask = ValueMask.for_columns([])
        described = "; ".join(
            ", ".join(_bad_key_field(mask, name, spark_type, row[name], row[text]) for text, (name, spark_type) in zip(texts, key_columns))
            for row in shown
        )
        types = ", ".join(f"{name} {spark_type}" for name, spark_type in key_columns)
        raise KeysFileError(
            f"{path}: {bad.count()} line(s) hold a key of table {table} that is empty or does not cast to its type "
            f"({types}): {described}. Nothing was erased; correct the file and run the erase again."
        )
    return typed.select(*(name for name, _ in key_columns)).distinct()


def _bad_key_field(mask: ValueMask, name: str, spark_type: str, typed: object, text: str | None) -> str:
    if text is None or not text.strip():
        return f"{name}={text!r} (empty)" if mask.shows(name) else f"{name}=(empty)"
    shown = repr(text) if mask.shows(name) else MASKED
    return f"{name}={shown}" if typed is not None else f"{name}={shown} (not a {spark_type})"


def erased_key_hashes(keys: DataFrame, key_columns: Sequence[tuple[str, str]], table: str, path: str) -> DataFrame:
    """``key_hash`` of each distinct key in ``keys`` (see :func:`erased_key_values`, which checks them)."""
    return key_hashes_of(erased_key_values(keys, key_columns, table, path), key_columns)


def key_hashes_of(values: DataFrame, key_columns: Sequence[tuple[str, str]]) -> DataFrame:
    """``key_hash`` of each distinct key of ``values`` (typed key columns, as :func:`erased_key_values` gives)."""
    return add_hashes(values.select(*(name for name, _ in key_columns)), list(key_columns), []).select(KEY_HASH).distinct()


def with_raw_key_hash(rejects: DataFrame, key_columns: Sequence[tuple[str, str]]) -> DataFrame:
    """``rejects`` plus :data:`RAW_KEY_HASH`: the key hash of each raw record's key (the intake's encoding),
    or NULL when the record does not say which value is which key column, or a key value does not cast."""
    parsed = {f"{INTERNAL_PREFIX}key_{index}": _raw_key_value(name, spark_type) for index, (name, spark_type) in enumerate(key_columns)}
    aliases = list(parsed)
    with_keys = rejects.withColumns(parsed)
    hashed = add_hashes(with_keys, [(alias, spark_type) for alias, (_, spark_type) in zip(aliases, key_columns)], [])
    any_missing = F.expr(" OR ".join(f"`{alias}` IS NULL" for alias in aliases))
    parsed_hash = F.when(any_missing, F.lit(None).cast("string")).otherwise(F.col(KEY_HASH))
    return hashed.withColumn(RAW_KEY_HASH, parsed_hash).drop(KEY_HASH, NON_KEY_HASH, *aliases)


def with_raw_key_values(rejects: DataFrame, key_columns: Sequence[tuple[str, str]]) -> DataFrame:
    """``rejects`` plus each key column, named as configured: its value parsed from the raw record and
    cast as by :func:`with_raw_key_hash` (NULL where the record does not say, or it does not cast)."""
    return rejects.withColumns({name: _raw_key_value(name, spark_type) for name, spark_type in key_columns})


def _raw_key_value(name: str, spark_type: str):
    return F.expr(f"try_cast(coalesce({', '.join(_json_value(name, place) for place in _JSON_PLACES)}) AS {spark_type})")


def _json_value(name: str, place: str) -> str:
    # get_json_object yields NULL for text that is not JSON (a malformed CSV line) and for a missing field.
    return f"get_json_object(`{RAW_RECORD}`, '{place.format(name=name)}')"


def without(frame: DataFrame, erased: DataFrame, key_hash: str = KEY_HASH) -> DataFrame:
    """``frame`` without the rows of erased keys, its columns in their order (NULL hashes are kept)."""
    kept = frame.join(F.broadcast(erased.withColumnRenamed(KEY_HASH, key_hash)), on=key_hash, how="left_anti")
    return kept.select(*frame.columns)


# A rejected CSV line as fields: split with at most this many more fields than the table's columns
# (more are dropped: a line that long holds a key's value among its first fields, or is text, not a record).
_SPARE_FIELDS = 16
# The CSV options that say how a line splits into fields and what a field's text is (the rest, such as
# header or mode, are about files, not one line).
_LINE_OPTIONS = ("sep", "delimiter", "quote", "escape", "ignoreLeadingWhiteSpace", "ignoreTrailingWhiteSpace", "nullValue", "emptyValue")
# The rejects' column holding a record's fields (a CSV source's line that is not JSON), or NULL.
RAW_FIELDS = f"{INTERNAL_PREFIX}raw_fields"
# An erased key's columns as text, beside its typed columns, for a text search of unparsed records.
_KEY_TEXT = f"{INTERNAL_PREFIX}key_text_"


def reject_line_options(config: TableConfig) -> dict[str, str]:
    """How one rejected CSV line of ``config``'s table splits into fields: its own CSV options (delimiter,
    quote, escape, trimming), as the intake reads its extracts."""
    given = {key.lower(): str(value) for key, value in {**CSV_DEFAULTS, **config.source.options}.items()}
    return {name: given[name.lower()] for name in _LINE_OPTIONS if name.lower() in given}


def with_raw_fields(rejects: DataFrame, config: TableConfig) -> DataFrame:
    """``rejects`` plus :data:`RAW_FIELDS`: for a CSV source, the fields of each raw record that is not a JSON
    object (a malformed line), split with the table's CSV options (:func:`reject_line_options`); else NULL."""
    if config.source.format is not SourceFormat.csv:
        return rejects.withColumn(RAW_FIELDS, F.lit(None).cast("array<string>"))
    width = len(config.columns) + (1 if config.changes is not None and config.change_set.operation_column else 0) + _SPARE_FIELDS
    schema = ", ".join(f"f{index} string" for index in range(width))
    parsed = F.from_csv(F.col(RAW_RECORD), schema, reject_line_options(config))
    fields = F.filter(F.array(*(parsed[f"f{index}"] for index in range(width))), lambda field: field.isNotNull())
    is_json = F.get_json_object(F.col(RAW_RECORD), "$").isNotNull() & F.startswith(F.ltrim(F.col(RAW_RECORD)), F.lit("{"))
    return rejects.withColumn(RAW_FIELDS, F.when(~is_json, fields))


def erased_keys_for_rejects(values: DataFrame, key_columns: Sequence[tuple[str, str]]) -> DataFrame:
    """The erased keys (typed key columns, as :func:`erased_key_values` gives) with their ``key_hash`` and
    each key column as text: what :func:`reject_holds_key` and :func:`reject_may_hold_key` compare with."""
    hashed = add_hashes(values.select(*(name for name, _ in key_columns)), list(key_columns), []).drop(NON_KEY_HASH)
    return hashed.withColumns({f"{_KEY_TEXT}{index}": F.col(f"`{name}`").cast("string") for index, (name, _) in enumerate(key_columns)})


def reject_holds_key(key_columns: Sequence[tuple[str, str]], key_prefix: str = "") -> F.Column:
    """A join condition of rejects (with :data:`RAW_KEY_HASH` and :data:`RAW_FIELDS`) and erased keys
    (:func:`erased_keys_for_rejects`, its columns prefixed by ``key_prefix``): the reject holds the key.

    Its parsed key is the key; or its key cannot be parsed and its fields (a CSV line) hold each of the
    key's values, each field cast as the intake casts that key column: a line with a field too many
    (an unquoted delimiter) still holds the key it was written for, wherever the extra field is. A line
    of another key that holds this key's values in other fields is taken too: an erase removes what
    may be the person's record rather than keep it (the extract still holds the line)."""
    by_hash = F.col(RAW_KEY_HASH) == F.col(f"{key_prefix}{KEY_HASH}")
    by_fields = F.col(RAW_KEY_HASH).isNull() & F.col(RAW_FIELDS).isNotNull()
    for name, spark_type in key_columns:
        wanted = F.col(f"{key_prefix}{name}")
        by_fields = by_fields & F.exists(F.col(RAW_FIELDS), _field_is(wanted, spark_type))
    return by_hash | by_fields


def _field_is(wanted: F.Column, spark_type: str):
    """A field's test (one argument: Spark's higher-order functions count the lambda's parameters)."""
    return lambda field: field.try_cast(spark_type) == wanted


def reject_may_hold_key(key_columns: Sequence[tuple[str, str]], key_prefix: str = "", separator: str = ",") -> F.Column:
    """A join condition as :func:`reject_holds_key`'s: the reject does not hold the key by that rule, its key
    cannot be parsed, and it holds each key value's text where its structure is lost: in a CSV line's field
    that holds the ``separator`` too (an unclosed quote made one field of the rest of the line), or anywhere
    in a record that is neither JSON nor a CSV line (a JSON or Debezium source's malformed line). It
    cannot be checked: it may be the key's record. A value inside an ordinary longer field (``9876540``)
    is not the key."""
    unparsed = F.col(RAW_KEY_HASH).isNull() & ~F.coalesce(reject_holds_key(key_columns, key_prefix), F.lit(False))
    for index in range(len(key_columns)):
        text = F.col(f"{key_prefix}{_KEY_TEXT}{index}")
        in_merged_field = F.exists(F.col(RAW_FIELDS), _field_holds(text, separator))
        unparsed = unparsed & F.when(F.col(RAW_FIELDS).isNotNull(), in_merged_field).otherwise(F.contains(F.col(RAW_RECORD), text))
    return unparsed


def _field_holds(text: F.Column, separator: str):
    return lambda field: F.contains(field, F.lit(separator)) & F.contains(field, text)


def reject_separator(config: TableConfig) -> str:
    """The delimiter a rejected CSV line of ``config``'s table is split at."""
    options = reject_line_options(config)
    return options.get("sep", options.get("delimiter", ","))
