"""``changed_columns`` and the audit columns in the core, on each classification path: a single date
(``classify_changes``, full and delta loads) and a range of full loads in one query
(``classify_full_loads`` + ``join_payload_by_date``)."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

from pyspark.sql import functions as F

from cdc_assets.model.config import LoadType
from cdc_assets.core.capture import changes as cdc
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.hashing import add_hashes

SCHEMA = "id int, score double, amount decimal(10,2), since date, note string, seen string"
KEYS, NON_KEYS, PAYLOAD = ["id"], ["score", "amount", "since", "note"], ["id", "score", "amount", "since", "note", "seen"]
DAY1, DAY2 = date(2024, 5, 1), date(2024, 5, 2)
RUN1 = cdc.RunAudit("run-1", datetime(2024, 5, 1, 6, 0, tzinfo=timezone.utc))
RUN2 = cdc.RunAudit("run-2", datetime(2024, 5, 2, 6, 0, tzinfo=timezone.utc))
# id: what day 2 changes against day 1 ("seen" is untracked: hashed with neither keys nor non-keys).
FIRST = [
    (1, 1.5, Decimal("1.00"), date(2024, 1, 1), "a", "x"),  # score changes
    (2, 2.0, Decimal("2.00"), date(2024, 1, 2), "b", "x"),  # amount changes
    (3, 3.0, Decimal("3.00"), date(2024, 1, 3), None, "x"),  # note NULL -> value, since changes
    (4, 4.0, Decimal("4.00"), date(2024, 1, 4), "d", "x"),  # only the untracked column changes: N
    (5, 5.0, Decimal("5.00"), None, "e", "x"),  # deleted (full) / not supplied (delta)
]
SECOND = [
    (1, 1.25, Decimal("1.00"), date(2024, 1, 1), "a", "x"),
    (2, 2.0, Decimal("2.50"), date(2024, 1, 2), "b", "x"),
    (3, 3.0, Decimal("3.00"), date(2024, 2, 3), "c", "x"),
    (4, 4.0, Decimal("4.00"), date(2024, 1, 4), "d", "y"),
    (6, 6.0, Decimal("6.00"), date(2024, 1, 6), None, "x"),  # inserted
]
EXPECTED = {1: ("U", ["score"]), 2: ("U", ["amount"]), 3: ("U", ["note", "since"]), 4: ("N", []), 6: ("I", [])}


TYPES = dict(part.split() for part in SCHEMA.split(", "))


def _hashed(spark, rows):
    typed = [(name, TYPES[name]) for name in KEYS], [(name, TYPES[name]) for name in NON_KEYS]
    return add_hashes(spark.createDataFrame(rows, SCHEMA), *typed)


def _by_id(frame):
    return {row["id"]: (row["operation"], row["changed_columns"], row["process_id"]) for row in frame.collect()}


def test_single_date_full_and_delta(spark):
    day1 = cdc.classify_changes(_hashed(spark, FIRST), None, DAY1, LoadType.full, PAYLOAD, RUN1, NON_KEYS)
    assert {op for op, changed, _ in _by_id(day1).values()} == {"I"}
    previous = cdc.build_current(day1)
    assert "changed_columns" not in previous.columns
    for load_type, missing in ((LoadType.full, "D"), (LoadType.delta, "X")):
        day2 = cdc.classify_changes(_hashed(spark, SECOND), previous, DAY2, load_type, PAYLOAD, RUN2, NON_KEYS)
        found = _by_id(day2)
        assert {key: value[:2] for key, value in found.items()} == {**EXPECTED, 5: (missing, [])}, load_type
        # I/U/D rows are this run's; N and X keep the run that started their version.
        writers = {key: value[2] for key, value in found.items()}
        assert writers == {1: "run-2", 2: "run-2", 3: "run-2", 4: "run-1", 5: "run-1" if missing == "X" else "run-2", 6: "run-2"}
        stamps = {row["id"]: row["processed_at"] for row in day2.collect()}
        assert stamps[4] == datetime(2024, 5, 1, 6, 0) and stamps[1] == datetime(2024, 5, 2, 6, 0)  # UTC session


def test_range_of_full_loads_gives_the_same_columns(spark):
    incoming = _hashed(spark, FIRST).withColumn(BUSINESS_DATE, F.lit(DAY1)).unionByName(
        _hashed(spark, SECOND).withColumn(BUSINESS_DATE, F.lit(DAY2))
    )
    classification = cdc.classify_full_loads(incoming, None, [DAY1, DAY2], RUN2)
    changed = cdc.join_payload_by_date(classification, incoming, None, [DAY1, DAY2], PAYLOAD, non_key_columns=NON_KEYS)
    day2 = changed.filter(F.col(BUSINESS_DATE) == F.lit(DAY2))
    found = _by_id(day2)
    assert {key: value[:2] for key, value in found.items()} == {**EXPECTED, 5: ("D", [])}
    # One run wrote both dates: every row is that run's, the unchanged key's too.
    assert {value[2] for value in found.values()} == {"run-2"}

    # A range after a stored state: the unchanged key keeps the stored writer.
    stored = cdc.build_current(cdc.classify_changes(_hashed(spark, FIRST), None, DAY1, LoadType.full, PAYLOAD, RUN1, NON_KEYS))
    second_only = incoming.filter(F.col(BUSINESS_DATE) == F.lit(DAY2))
    classification = cdc.classify_full_loads(second_only, stored, [DAY2], RUN2)
    changed = cdc.join_payload_by_date(classification, second_only, stored, [DAY2], PAYLOAD, non_key_columns=NON_KEYS)
    found = _by_id(changed)
    assert {key: value[:2] for key, value in found.items()} == {**EXPECTED, 5: ("D", [])}
    assert found[4][2] == "run-1" and found[1][2] == "run-2" and found[5][2] == "run-2"
