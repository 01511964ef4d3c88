"""Erasing keys (a right-to-be-forgotten request): which stored rows belong to erased keys. Plain PySpark.

An erased key is known by its ``key_hash``, computed from the request's key values exactly as the
intake computes it (``core/hashing.add_hashes`` over ``try_cast(text AS type)`` of the text as read,
nothing trimmed or case-folded: ``'C001  '``, ``'C001'`` and ``'c001'`` are three keys), so the ledger of
erased keys holds no key value and every stored dataset that carries ``key_hash`` is matched by one
broadcast join. The rejects hold a raw record instead: its key is parsed out of it where the record
says which value is which (the JSON the intake writes for a record that failed a cast or a duplicate
key, or a Debezium event); a record whose key cannot be parsed (a malformed CSV line, a key that does
not cast) is *unverifiable*, counted and reported, never silently taken for clean.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.model.config import INTERNAL_PREFIX, SourceFormat, TableConfig
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH, add_hashes

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
        described = "; ".join(
            ", ".join(f"{name}={row[text]!r}" for text, (name, _) in zip(texts, key_columns)) for row in shown
        )
        types = ", ".join(f"{name} {spark_type}" for name, spark_type in key_columns)
        raise KeysFileError(
            f"{path}: {bad.count()} line(s) hold a key of table {table} that is empty or does not cast to its type "
            f"({types}): {described}. Nothing was erased; correct the file and run the erase again."
        )
    return typed.select(*(name for name, _ in key_columns)).distinct()


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
