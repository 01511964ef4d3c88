"""Deterministic, injective MD5 hashes of typed key and non-key values.

The encoding is a contract: hashes are computed once when a row arrives, stored with it forever and
compared with hashes computed on later days, possibly by another Spark version or another tool.
docs/design.md ("Hash encoding") documents it byte for byte; change it only with a migration.

Each value is rendered to a canonical text by its *type* (so "3.1E-4" and "0.00031" in a CSV, once
cast to double, give the same text), then framed as ``<length>:<text>``, where length counts
characters; NULL is framed as ``~``. The frames of the columns, in config order, are concatenated and
the MD5 of the UTF-8 bytes is the hash. Length framing makes the encoding injective: ("ab", "c") and
("a", "bc") give ``2:ab1:c`` and ``1:a2:bc``; NULL (``~``) differs from "" (``0:``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.model.config import INTERNAL_PREFIX

KEY_HASH = "key_hash"
NON_KEY_HASH = "non_key_hash"
NULL_FRAME = "~"


def canonical_text(column: SparkColumn, spark_type: str) -> SparkColumn:
    """The canonical text of a typed value, independent of how it was written in the source."""
    if spark_type in ("double", "float"):
        # Java's Double.toString (shortest round-trip digits). Exact hex (%a) would not depend on the
        # JDK, but a Java Formatter call per value made hashing 15x slower; see docs/design.md, "Hash encoding".
        as_double = column.cast("double")
        return F.when(as_double == 0, F.lit("0.0")).otherwise(as_double.cast("string"))
    if spark_type == "date":
        return F.unix_date(column).cast("string")  # days since 1970-01-01: no calendar or time zone formatting
    if spark_type == "timestamp":
        return F.unix_micros(column).cast("string")  # microseconds since the epoch, UTC by definition
    # string as is; integers, booleans ("true"/"false") and decimals (plain notation, fixed scale) by cast.
    return column.cast("string")


def framed(text: SparkColumn) -> SparkColumn:
    """``<length>:<text>`` for a canonical text, ``~`` for NULL (a value's text is NULL exactly when it is)."""
    return F.when(text.isNull(), F.lit(NULL_FRAME)).otherwise(F.concat(F.length(text).cast("string"), F.lit(":"), text))


def add_hashes(
    typed: DataFrame, keys: Sequence[tuple[str, str]], non_keys: Sequence[tuple[str, str]]
) -> DataFrame:
    """``typed`` plus ``key_hash`` over the keys and ``non_key_hash`` over the tracked non-keys.

    Computed in two projections: the canonical texts first, then the frames over them. A frame
    refers to its text three times; Spark keeps the projections apart rather than repeat a
    non-trivial expression (CollapseProject), so each text (a double's ``Double.toString`` above
    all) is computed once per row instead of twice.
    """
    texts = {f"{INTERNAL_PREFIX}text_{index}": (name, spark_type) for index, (name, spark_type) in enumerate([*keys, *non_keys])}
    with_texts = typed.withColumns({alias: canonical_text(F.col(name), spark_type) for alias, (name, spark_type) in texts.items()})
    aliases = list(texts)

    def digest(names: list[str]) -> SparkColumn:
        return F.md5(F.concat(*(framed(F.col(alias)) for alias in names))) if names else F.md5(F.lit(""))

    return with_texts.withColumns(
        {KEY_HASH: digest(aliases[: len(keys)]), NON_KEY_HASH: digest(aliases[len(keys) :])}
    ).drop(*aliases)
