"""The hash encoding contract (cdc_assets/core/hashing.py), checked against an independent Python version.

Per value ``<char length>:<canonical text>``, NULL as ``~``, frames concatenated in config order,
MD5 (lowercase hex) of the UTF-8 bytes.
"""

from __future__ import annotations

import hashlib
import re
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pyarrow as pa
from pyspark.sql import functions as F

from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH, add_hashes

HEX32 = re.compile(r"^[0-9a-f]{32}$")
EPOCH_DATE = date(1970, 1, 1)
EPOCH_TS = datetime(1970, 1, 1, tzinfo=timezone.utc)


# --- independent reference implementation -------------------------------------------------------


def _text(value, spark_type: str) -> str:
    if spark_type == "string":
        return value
    if spark_type in ("int", "bigint", "smallint", "tinyint"):
        return str(int(value))
    if spark_type == "boolean":
        return "true" if value else "false"
    if spark_type == "date":
        return str((value - EPOCH_DATE).days)
    if spark_type == "timestamp":
        return str((value - EPOCH_TS) // timedelta(microseconds=1))
    if spark_type.startswith("decimal"):
        scale = int(spark_type.rstrip(")").split(",")[1])
        return str(Decimal(value).quantize(Decimal(1).scaleb(-scale)))
    if spark_type == "double":
        return java_double_to_string(0.0 if value == 0 else value)
    raise AssertionError(spark_type)


def java_double_to_string(value: float) -> str:
    """Java's Double.toString from Python's shortest repr: plain for 1e-3 <= |x| < 1e7, else d.dddE<n>."""
    if value == 0:
        return "0.0"
    sign, exact = ("-" if value < 0 else ""), Decimal(repr(abs(value)))
    if Decimal("1e-3") <= exact < Decimal("1e7"):
        text = format(exact, "f")
        return sign + (text if "." in text else text + ".0")
    significand, exponent = f"{exact:e}".split("e")
    digits = significand.replace(".", "").rstrip("0") or "0"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{int(exponent)}"


def encode(values, types) -> str:
    frames = []
    for value, spark_type in zip(values, types):
        if value is None:
            frames.append("~")
        else:
            text = _text(value, spark_type)
            frames.append(f"{len(text)}:{text}")
    return "".join(frames)


def reference_md5(values, types) -> str:
    return hashlib.md5(encode(values, types).encode("utf-8")).hexdigest()


# --- helpers ------------------------------------------------------------------------------------

_ARROW_TYPES = {
    "string": pa.string(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def _arrow_type(spark_type: str):
    if spark_type.startswith("decimal("):
        precision, scale = spark_type[len("decimal(") : -1].split(",")
        return pa.decimal128(int(precision), int(scale))
    return _ARROW_TYPES[spark_type]


def local_frame(spark, rows, columns: list[tuple[str, str]]):
    """A small typed DataFrame built through Arrow (no Python worker round trip, so it is quick)."""
    table = pa.table(
        {name: pa.array([row[i] for row in rows], type=_arrow_type(t)) for i, (name, t) in enumerate(columns)}
    )
    frame = spark.createDataFrame(table)
    assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
        (name, "int" if t == "int" else t) for name, t in columns
    ]
    return frame


def spark_hashes(spark, rows, columns: list[tuple[str, str]], non_keys: list[tuple[str, str]] | None = None):
    """key_hash over ``columns`` (and non_key_hash over ``non_keys``) per row, in input order."""
    frame = local_frame(spark, [(i, *row) for i, row in enumerate(rows)], [("_id", "int"), *columns])
    hashed = add_hashes(frame, columns, non_keys or [])
    collected = sorted(hashed.select("_id", KEY_HASH, NON_KEY_HASH).collect(), key=lambda r: r["_id"])
    return [(r[KEY_HASH], r[NON_KEY_HASH]) for r in collected]


def with_hash(frame, specs, name="h"):
    """``frame`` plus ``name``: the key_hash that add_hashes (the pipeline's path) gives over ``specs``."""
    return add_hashes(frame, specs, []).drop(NON_KEY_HASH).withColumnRenamed(KEY_HASH, name)


def key_hashes(spark, rows, columns):
    return [key for key, _ in spark_hashes(spark, rows, columns)]


# --- tests --------------------------------------------------------------------------------------


def test_hashes_are_32_char_lowercase_hex(spark):
    result = spark_hashes(
        spark,
        [("a", 1, "x"), (None, None, None), ("ÄÖ", -5, "")],
        [("k", "string"), ("n", "int"), ("s", "string")],
        non_keys=[("n", "int"), ("s", "string")],
    )
    for key_hash, non_key_hash in result:
        assert HEX32.match(key_hash), key_hash
        assert HEX32.match(non_key_hash), non_key_hash


def test_injective_framing_for_tricky_string_pairs(spark):
    rows = [
        ("ab", "c"),
        ("a", "bc"),
        (None, ""),
        ("", None),
        ("", ""),
        (None, None),
        (None, "x"),
        ("x", None),
        ("~", ""),
        ("", "~"),
        ("~", None),
        (None, "~"),
        ("~~", None),
        ("1:a", ""),
        ("", "1:a"),
        ("1:a", None),
        ("a", "1:b"),
        ("a1:", "b"),
        ("3:abc", "x"),
        ("abc", "1:x"),
    ]
    types = ["string", "string"]
    # Sanity of the reference: the documented encoding itself is injective on these rows.
    assert len({encode(row, types) for row in rows}) == len(rows)
    hashes = key_hashes(spark, rows, [("a", "string"), ("b", "string")])
    assert len(set(hashes)) == len(rows)
    named = dict(zip(rows, hashes))
    assert named[("ab", "c")] != named[("a", "bc")]
    assert named[(None, "")] != named[("", "")]
    assert named[(None, "x")] != named[("x", None)]
    assert named[("~", None)] != named[(None, None)]


def test_null_differs_from_empty_string_single_column(spark):
    null_hash, empty_hash, tilde_hash = key_hashes(spark, [(None,), ("",), ("~",)], [("s", "string")])
    assert null_hash == hashlib.md5(b"~").hexdigest()
    assert empty_hash == hashlib.md5(b"0:").hexdigest()
    assert tilde_hash == hashlib.md5(b"1:~").hexdigest()
    assert len({null_hash, empty_hash, tilde_hash}) == 3


def test_matches_independent_python_reimplementation_strings_and_ints(spark):
    columns = [("s", "string"), ("n", "bigint"), ("t", "string")]
    types = [spark_type for _, spark_type in columns]
    rows = [
        ("hello", 42, "world"),
        ("", 0, None),
        (None, -7, "x:y"),
        ("日本語", 1234567890123, "émoji 😀"),  # lengths count characters, not UTF-8 bytes
        ("a,b", None, "~"),
    ]
    assert key_hashes(spark, rows, columns) == [reference_md5(row, types) for row in rows]


def test_column_order_matters(spark):
    frame = local_frame(spark, [("x", "y")], [("a", "string"), ("b", "string")])
    forward = with_hash(frame, [("a", "string"), ("b", "string")], "forward")
    both = with_hash(forward, [("b", "string"), ("a", "string")], "backward")
    (row,) = both.select("forward", "backward").collect()
    forward, backward = row["forward"], row["backward"]
    assert forward == reference_md5(("x", "y"), ["string", "string"])
    assert backward == reference_md5(("y", "x"), ["string", "string"])
    assert forward != backward


def test_typed_values_match_reference(spark):
    columns = [
        ("b", "boolean"),
        ("d", "date"),
        ("ts", "timestamp"),
        ("amount", "decimal(10,2)"),
        ("x", "double"),
    ]
    types = [spark_type for _, spark_type in columns]
    rows = [
        (True, date(2024, 2, 29), datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc), Decimal("1.50"), 0.5),
        (False, date(1969, 12, 31), datetime(1960, 6, 1, tzinfo=timezone.utc), Decimal("-12.00"), -2.25),
        (None, date(1970, 1, 1), EPOCH_TS, Decimal("0.00"), 0.0),
    ]
    assert key_hashes(spark, rows, columns) == [reference_md5(row, types) for row in rows]
    # Spot-check the framing itself, byte for byte.
    assert encode(rows[0], types) == "4:true5:1978216:17041646451234564:1.503:0.5"


def test_double_canonicalisation_of_different_spellings(spark):
    frame = local_frame(
        spark,
        [(0, "3.1E-4"), (1, "0.00031"), (2, "3.10e-4"), (3, "-0.0"), (4, "0.0"), (5, "0"), (6, "0.00032")],
        [("_id", "int"), ("raw", "string")],
    ).select("_id", F.col("raw").cast("double").alias("x"))
    rows = sorted(with_hash(frame, [("x", "double")]).collect(), key=lambda r: r["_id"])
    hashes = [row["h"] for row in rows]
    assert hashes[0] == hashes[1] == hashes[2]
    assert hashes[3] == hashes[4] == hashes[5]
    assert hashes[3] == reference_md5((0.0,), ["double"])
    # Not exactly representable in binary: the documented text still lets any tool recompute the hash.
    assert hashes[0] == reference_md5((0.00031,), ["double"])
    assert hashes[6] != hashes[0]
    assert hashes[0] != hashes[3]


def test_negative_zero_as_double_value(spark):
    hashes = key_hashes(spark, [(-0.0,), (0.0,)], [("x", "double")])
    assert hashes[0] == hashes[1] == reference_md5((0.0,), ["double"])


def test_decimal_scale_canonicalisation(spark):
    frame = local_frame(spark, [(0, "1.5"), (1, "1.50"), (2, "1.51")], [("_id", "int"), ("raw", "string")]).select(
        "_id", F.col("raw").cast("decimal(10,2)").alias("amount")
    )
    rows = sorted(with_hash(frame, [("amount", "decimal(10,2)")]).collect(), key=lambda r: r["_id"])
    assert rows[0]["h"] == rows[1]["h"] == hashlib.md5(b"4:1.50").hexdigest()
    assert rows[2]["h"] != rows[0]["h"]


def test_small_decimal_uses_plain_notation(spark):
    frame = local_frame(spark, [("0.00000001",)], [("raw", "string")]).select(
        F.col("raw").cast("decimal(10,8)").alias("amount")
    )
    (row,) = with_hash(frame, [("amount", "decimal(10,8)")]).select("h").collect()
    assert row["h"] == hashlib.md5(b"10:0.00000001").hexdigest()


def test_date_and_timestamp_round_trip(spark):
    frame = local_frame(spark, [("2024-02-29", "2024-01-02 03:04:05.123456")], [("d", "string"), ("ts", "string")]).select(
        F.col("d").cast("date").alias("d"), F.col("ts").cast("timestamp").alias("ts")
    )
    hashed = with_hash(frame, [("d", "date")], "hd")
    hashed = with_hash(hashed, [("ts", "timestamp")], "ht")
    hashed = with_hash(hashed, [("d", "date"), ("ts", "timestamp")], "both")
    (row,) = hashed.select("hd", "ht", "both").collect()
    days = (date(2024, 2, 29) - EPOCH_DATE).days
    micros = (datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc) - EPOCH_TS) // timedelta(microseconds=1)
    assert row["hd"] == hashlib.md5(f"{len(str(days))}:{days}".encode()).hexdigest()
    assert row["ht"] == hashlib.md5(f"{len(str(micros))}:{micros}".encode()).hexdigest()
    assert row["both"] == hashlib.md5(f"{len(str(days))}:{days}{len(str(micros))}:{micros}".encode()).hexdigest()


def test_timestamp_hash_independent_of_session_time_zone(spark):
    instant = datetime(2024, 3, 31, 1, 30, 0, 250000, tzinfo=timezone.utc)
    frame = local_frame(spark, [(instant, date(2024, 3, 31))], [("ts", "timestamp"), ("d", "date")])
    specs = [("ts", "timestamp"), ("d", "date")]
    expected = reference_md5((instant, date(2024, 3, 31)), ["timestamp", "date"])
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    try:
        results = {}
        for zone in ("UTC", "America/Los_Angeles", "Asia/Kolkata", "Pacific/Kiritimati"):
            spark.conf.set("spark.sql.session.timeZone", zone)
            (row,) = with_hash(frame, specs).select("h").collect()
            results[zone] = row["h"]
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert set(results.values()) == {expected}, results


def test_empty_non_key_list_hashes_to_md5_of_empty_string(spark):
    (row,) = add_hashes(local_frame(spark, [("k",)], [("k", "string")]), [("k", "string")], []).collect()
    assert row[NON_KEY_HASH] == hashlib.md5(b"").hexdigest() == "d41d8cd98f00b204e9800998ecf8427e"
    assert row[KEY_HASH] == hashlib.md5(b"1:k").hexdigest()


def test_key_and_non_key_hashes_cover_their_own_columns(spark):
    columns = [("k", "string"), ("v", "int")]
    schema = [("k", "string"), ("v", "int"), ("untracked", "string")]
    frame = local_frame(spark, [("a", 1, "x"), ("a", 1, "y"), ("a", 2, "x")], schema)
    rows = add_hashes(frame, [columns[0]], [columns[1]]).collect()
    assert {row[KEY_HASH] for row in rows} == {hashlib.md5(b"1:a").hexdigest()}
    by_value = {(row["v"], row["untracked"]): row[NON_KEY_HASH] for row in rows}
    # The untracked column takes no part in either hash.
    assert by_value[(1, "x")] == by_value[(1, "y")] == hashlib.md5(b"1:1").hexdigest()
    assert by_value[(2, "x")] == hashlib.md5(b"1:2").hexdigest()
