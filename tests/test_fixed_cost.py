"""A date's fixed cost does not creep back: the Spark jobs and catalog table loads one date of a small table
runs stay at or below stated counts (issue 50, point 6). Counts, not seconds: they do not depend on how busy
the machine is, and a change that adds a job or a load per output shows here at once.

The counts are what the pipeline ran when they were set (2026-12-07, after previews were read by pyiceberg,
a table's layout read once per run, and the writes' shuffle dropped); lower them when a change cuts one. A
real run of each layout's first and second date (20% deleted, 40% updated, 20% new), in this process on the
session's Spark; a 1,000-row table of the demo's shape.
"""

from __future__ import annotations

import pytest
from dagster import DagsterInstance
from pyiceberg.catalog.sql import SqlCatalog

from cdc_assets.cli.generate import generate
from tests.pipeline import definitions_for, run_dates, write_table_config

DAYS = ["2019-06-18", "2019-06-19"]

# Per layout: (Spark jobs, catalog table loads) of the first date and of a later one, at most.
CEILINGS = {
    "snapshot": {"first": (24, 176), "later": (27, 177)},
    "incremental": {"first": (25, 196), "later": (31, 237)},
}


@pytest.mark.parametrize("layout", sorted(CEILINGS))
def test_a_dates_spark_jobs_and_catalog_loads_stay_at_or_below_their_counts(spark, warehouse, tmp_path, monkeypatch, layout):
    extracts = tmp_path / "extracts"
    generate(1000, 1000, 5, 10, 0.2, 0.4, 0.4, extracts / DAYS[0], extracts / DAYS[1], seed=42)
    storage = {"storage": {"current": "incremental", "compact_after_share": 2.0}} if layout == "incremental" else {}
    defs = definitions_for(write_table_config(tmp_path / "configs", "synthetic", f"{extracts}/{{date}}/", **storage))

    loads = []
    load_table = SqlCatalog.load_table
    monkeypatch.setattr(SqlCatalog, "load_table", lambda catalog, identifier: loads.append(identifier) or load_table(catalog, identifier))
    tracker = spark.sparkContext.statusTracker()
    instance = DagsterInstance.ephemeral()
    measured = {}
    for day in DAYS:
        jobs_before, loads_before = set(tracker.getJobIdsForGroup(None)), len(loads)
        assert run_dates(defs, [day], instance)[0].success
        measured[day] = (len(set(tracker.getJobIdsForGroup(None)) - jobs_before), len(loads) - loads_before)

    print(f"{layout}: (Spark jobs, catalog loads) per date: {measured}")  # shown with -s, and on a failure
    assert all(jobs > 0 and table_loads > 0 for jobs, table_loads in measured.values()), measured  # counted at all
    first, later = CEILINGS[layout]["first"], CEILINGS[layout]["later"]
    over = {
        day: (jobs, table_loads)
        for day, (jobs, table_loads) in measured.items()
        if jobs > (first if day == DAYS[0] else later)[0] or table_loads > (first if day == DAYS[0] else later)[1]
    }
    assert not over, f"{layout}: more Spark jobs or catalog loads than {CEILINGS[layout]} (jobs, loads): {measured}"
