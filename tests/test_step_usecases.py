"""The two steps' bodies without Dagster (cdc_assets/usecases/intake.py and capture.py): a script or a
test reads, classifies and gets each output's rows with a Spark session, the warehouse and a logger.

The `orders` sample (a delta load) on its first two dates: the counts are those its Dagster run stores
(tests/test_orders.py), here with no Dagster import on the way.
"""

from __future__ import annotations

import csv
import logging
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cdc_assets.core.capture.guards import MassDeleteError
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.model.config import load_table_config
from cdc_assets.model.names import CURRENT, HASHED_INCOMING, HISTORY, REJECTS, cdc_outputs
from cdc_assets.usecases.capture import CaptureRun, capture_changes, decide_rerun
from cdc_assets.usecases.intake import read_intake
from resources.storage import WarehouseStorage
from resources.storage.writes import DatedRows

REPO = Path(__file__).resolve().parent.parent
DAYS = ["2024-01-01", "2024-01-02"]


def _data_lines(day: str) -> int:
    with open(REPO / "samples" / "orders" / f"{day}.csv", newline="") as extract:
        return sum(1 for _ in csv.reader(extract)) - 1  # the header


def _by_operation(frame, day: str) -> dict[str, int]:
    rows = frame.filter(F.col(BUSINESS_DATE) == F.lit(day).cast("date")).groupBy("operation").count().collect()
    return {row["operation"]: row["count"] for row in rows}


@pytest.fixture
def orders(monkeypatch, tmp_path):
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    storage = WarehouseStorage(str(tmp_path / "warehouse"))
    yield load_table_config(REPO / "table_configs" / "orders.yaml"), storage
    storage.release()


def test_the_intake_and_the_cdc_step_run_without_dagster(spark, orders, caplog):
    table, storage = orders
    log = logging.getLogger("a script")
    caplog.set_level(logging.INFO, logger="a script")

    intake = read_intake(spark, storage, table, DAYS, log)
    try:
        for day in DAYS:
            lines = _data_lines(day)
            assert intake.counts(day) == {"rows_read": lines, "rows_accepted": lines, "rows_rejected": 0, "duplicate_keys": 0}
        outputs = intake.outputs()
        assert list(outputs) == [HASHED_INCOMING, REJECTS] and all(isinstance(rows, DatedRows) for rows in outputs.values())
        assert outputs[HASHED_INCOMING].frame.count() == sum(map(_data_lines, DAYS))

        assert not decide_rerun(storage, table, DAYS, None).dropped  # an empty warehouse: nothing later is stored
        run = CaptureRun("a-script-run", datetime(2024, 1, 4, tzinfo=timezone.utc))
        capture = capture_changes(spark, storage, table, DAYS, outputs[HASHED_INCOMING].frame, None, None, run, log)
        try:
            # What tests/test_orders.py finds stored after its Dagster runs.
            assert {op: n for op, n in capture.counts[DAYS[0]].items() if n} == {"I": 6}
            assert {op: n for op, n in capture.counts[DAYS[1]].items() if n} == {"I": 1, "U": 2, "N": 1, "X": 3}
            assert capture.operation_counts(DAYS[1])["updates"] == 2 and capture.schema_change() is None
            written = dict(capture.outputs())
            assert list(written) == list(cdc_outputs(table)) and capture.mass_deletes_accepted == {}
            assert _by_operation(written[CURRENT].frame, DAYS[1]) == {"I": 1, "U": 2, "N": 1, "X": 3}
            assert _by_operation(written[HISTORY].frame, DAYS[1]) == {"I": 1, "U": 2}
            assert set(written[CURRENT].frame.select("process_id").distinct().toPandas()["process_id"]) == {"a-script-run"}
        finally:
            capture.release()
    finally:
        intake.release()
    logged = caplog.text
    assert "validation and hashing finished in" in logged and "orders 2024-01-02: I=1, U=2" in logged  # the logger is the step log


def test_a_mass_delete_is_refused_before_any_output_unless_the_run_allows_it(spark, orders):
    table, storage = orders
    log = logging.getLogger("a script")
    # As a full load, the orders' second date without a row deletes every key of the first.
    full = table.model_copy(update={"load_type": type(table.load_type)("full")})
    intake = read_intake(spark, storage, table, DAYS[:1], log)
    try:
        first_day_only = intake.prepared.accepted
        refused = capture_changes(spark, storage, full, DAYS, first_day_only, None, None, CaptureRun("refused", datetime.now(timezone.utc)), log)
        try:
            assert {op: n for op, n in refused.counts[DAYS[1]].items() if n} == {"D": 6}
            with pytest.raises(MassDeleteError, match="allow_mass_delete"):
                next(refused.outputs())  # before the first output
        finally:
            refused.release()
        run = CaptureRun("allowed", datetime.now(timezone.utc), allow_mass_delete=True)
        allowed = capture_changes(spark, storage, full, DAYS, first_day_only, None, None, run, log)
        try:
            assert next(allowed.outputs())[0] == cdc_outputs(full)[0]
            assert list(allowed.mass_deletes_accepted) == [DAYS[1]] and "delete" in allowed.mass_deletes_accepted[DAYS[1]]
        finally:
            allowed.release()
    finally:
        intake.release()
