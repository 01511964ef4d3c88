"""A range of full loads classified in one query equals classify_changes applied date by date."""

from __future__ import annotations

from datetime import date, timedelta

import pytest
from pyspark.sql import functions as F

from cdc_assets.model.config import LoadType
from cdc_assets.core.capture.changes import (
    CLASSIFICATION_COLUMNS,
    build_current,
    classify_changes,
    classify_full_loads,
    join_payload_by_date,
)
from cdc_assets.core.columns import BUSINESS_DATE
from tests.test_changes import PAYLOAD, incoming_frame, previous_frame

FIRST = date(2024, 2, 1)
DATES = [FIRST + timedelta(days=offset) for offset in range(4)]
STORED = [  # the state as of the day before the range
    (1, "a", "n1", "I", date(2024, 1, 10)),  # unchanged throughout: keeps 2024-01-10
    (2, "b", "n2", "U", date(2024, 1, 20)),  # updated on day 2
    (3, "c", "n3", "N", date(2024, 1, 5)),  # deleted on day 1
    (4, "d", "n4", "I", date(2024, 1, 7)),  # deleted on day 2, back on day 4 with the same value
]
DAYS = [
    [(1, "a", "n1"), (2, "b", "n2"), (4, "d", "n4"), (5, "e", "n5")],  # 3 deleted, 5 inserted
    [(1, "a", "x"), (2, "b2", "n2"), (5, "e", "n5")],  # note of 1 changes (untracked), 2 updated, 4 deleted
    [(1, "a", "x"), (2, "b2", "n2"), (5, "e2", "n5"), (6, None, "n6")],  # 5 updated, 6 inserted with a NULL
    [(1, "a", "x"), (2, "b3", "n2"), (4, "d", "n4"), (6, None, "n6")],  # 4 inserted again, 5 deleted
]


def _day_by_day(spark, stored):
    """The reference: classify_changes, each date against the state the date before left."""
    previous, classified, changed = stored, [], []
    for day, rows in zip(DATES, DAYS):
        incoming = incoming_frame(spark, rows)
        classification = classify_changes(incoming, previous, day, LoadType.full)
        changes = classify_changes(incoming, previous, day, LoadType.full, PAYLOAD).cache()
        dated = F.lit(day).alias(BUSINESS_DATE)
        classified += [tuple(row) for row in classification.select(dated, *CLASSIFICATION_COLUMNS).collect()]
        changed += [tuple(row) for row in changes.select("*", dated).collect()]
        previous = build_current(changes)
    return sorted(classified), sorted(changed, key=repr)


def _in_one_query(spark, stored):
    frames = [incoming_frame(spark, rows).withColumn(BUSINESS_DATE, F.lit(day)) for day, rows in zip(DATES, DAYS)]
    incoming = frames[0]
    for frame in frames[1:]:
        incoming = incoming.unionByName(frame)
    classification = classify_full_loads(incoming, stored, DATES).cache()
    changes = join_payload_by_date(classification, incoming, stored, DATES, PAYLOAD)
    classified = sorted(tuple(row) for row in classification.select(BUSINESS_DATE, *CLASSIFICATION_COLUMNS).collect())
    changed = sorted((tuple(row) for row in changes.collect()), key=repr)
    return classified, changed, changes.columns


@pytest.mark.parametrize("with_stored_state", [True, False], ids=["after_stored_state", "first_dates"])
def test_full_loads_in_one_query_equal_date_by_date(spark, with_stored_state):
    stored = previous_frame(spark, STORED) if with_stored_state else None
    expected_classified, expected_changed = _day_by_day(spark, stored)
    classified, changed, columns = _in_one_query(spark, stored)

    assert classified == expected_classified
    assert changed == expected_changed
    assert columns == [*PAYLOAD, *CLASSIFICATION_COLUMNS, BUSINESS_DATE]
    operations = {(row[0], row[3]) for row in classified}
    # The cases this range is built to cover actually occur (the comparison alone would pass on none).
    if with_stored_state:
        assert {(DATES[0], "D"), (DATES[1], "U"), (DATES[1], "D"), (DATES[3], "I"), (DATES[3], "N")} <= operations
    else:
        assert {(DATES[0], "I"), (DATES[1], "D"), (DATES[2], "U"), (DATES[3], "I")} <= operations


def test_a_key_back_after_a_deletion_starts_a_new_version(spark):
    stored = previous_frame(spark, STORED)
    classified, _, _ = _in_one_query(spark, stored)
    key_4 = [row for row in classified if row[1] == incoming_frame(spark, [DAYS[0][2]]).first()["key_hash"]]
    assert [(row[0], row[3], row[4]) for row in key_4] == [
        (DATES[0], "N", date(2024, 1, 7)),
        (DATES[1], "D", DATES[1]),
        (DATES[3], "I", DATES[3]),
    ]
    assert all(row[3] is not None for row in classified)
