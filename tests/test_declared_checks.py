"""Checks a table's owner declares (``checks:`` in the table config, docs/checks.md): the config's validation
names the file and the field; each rule on tiny frames; and real runs of the shipped orders table where a
blocking declared check fails its date's run, a warning does not, and the UI's metadata holds counts and key
hashes, never a row's values."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance
from pyspark.sql import functions as F

from cdc_assets.core.capture.declared_checks import failing_rows, failure_figures, query_rows, row_outcome, volume_outcome
from cdc_assets.defs.component import build_definitions
from cdc_assets.defs.factory import build_table_definitions
from cdc_assets.model.config import TableConfigError, load_table_config
from cdc_assets.model.declared_checks import AcceptedValuesCheck, NotNullCheck, SqlCheck, UniqueCheck, VolumeCheck
from resources.storage import WarehouseStorage
from tests.pipeline import run_range

REPO = Path(__file__).resolve().parent.parent
ORDERS = yaml.safe_load((REPO / "table_configs" / "orders.yaml").read_text())
DAY1, DAY2 = "2024-01-01", "2024-01-02"


def _config_with(tmp_path: Path, checks: list[dict]):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump({**ORDERS, "checks": checks}, sort_keys=False))
    return path


@pytest.mark.parametrize(
    "checks, message",
    [
        ([{"type": "not_null", "columns": ["custmer"]}], "field '(top level)': checks.0: 'custmer' is not a configured column of table orders"),
        ([{"type": "volume"}], "field 'checks.0.volume': a volume check needs at least one bound"),
        ([{"type": "volume", "max_delete_share": 1.5}], "field 'checks.0.volume.max_delete_share'"),
        ([{"type": "sql", "predicate": "amount < 0"}], "field 'checks.0.sql': a sql check needs a name"),
        ([{"type": "sql", "name": "both", "predicate": "amount < 0", "query": "SELECT 1 FROM current"}], "exactly one of predicate"),
        ([{"type": "sql", "name": "two", "query": "SELECT 1 FROM current; DROP TABLE x"}], "without ';'"),
        ([{"type": "sql", "name": "elsewhere", "query": "SELECT 1"}], "checks.0.query: the query reads neither `current` nor `changes`"),
        ([{"type": "unique", "columns": ["customer"]}, {"type": "unique", "columns": ["customer"], "on": "changes"}],
         "checks.1.name: 'unique_customer' is also the name of checks.0"),
        ([{"type": "not_null", "columns": ["customer"], "name": "keys_not_null"}], "'keys_not_null' is the name of one of the pipeline's own checks"),
        ([{"type": "not_null", "columns": ["customer"], "name": "Not Null"}], "field 'checks.0.not_null.name'"),
        ([{"type": "row_count", "min": 1}], "field 'checks.0'"),
        ([{"type": "accepted_values", "column": "store_code", "values": []}], "field 'checks.0.accepted_values.values'"),
    ],
)
def test_a_wrong_check_names_the_file_and_the_field(tmp_path, checks, message):
    path = _config_with(tmp_path, checks)
    with pytest.raises(TableConfigError) as error:
        load_table_config(path)
    assert str(path) in str(error.value)
    assert message in str(error.value), str(error.value)


def test_each_row_rule_keeps_exactly_the_rows_that_break_it(spark):
    frame = spark.createDataFrame(
        [("k1", "A", 1, "x"), ("k2", "B", 2, None), ("k3", "Z", 2, "y"), ("k4", None, 3, "y"), ("k5", "C", -1, "y")],
        "key_hash string, status string, quantity int, email string",
    )
    types = {"status": "string", "quantity": "int", "email": "string"}

    def failing(check) -> list[str]:
        return sorted(row["key_hash"] for row in failing_rows(frame, check, types).collect())

    assert failing(NotNullCheck(type="not_null", columns=["email"])) == ["k2"]
    assert failing(NotNullCheck(type="not_null", columns=["email", "status"])) == ["k2", "k4"]
    # A NULL is not judged by accepted_values (not_null is its check); numbers are read as the column's type.
    assert failing(AcceptedValuesCheck(type="accepted_values", column="status", values=["A", "B", "C"])) == ["k3"]
    assert failing(AcceptedValuesCheck(type="accepted_values", column="quantity", values=[1, "2"])) == ["k4", "k5"]
    # Every row of a repeated value fails; NULLs are not compared.
    assert failing(UniqueCheck(type="unique", columns=["quantity"])) == ["k2", "k3"]
    assert failing(UniqueCheck(type="unique", columns=["email"])) == ["k3", "k4", "k5"]
    assert failing(UniqueCheck(type="unique", columns=["email", "quantity"])) == []
    # A predicate selects the failing rows; one that is NULL for a row does not fail it.
    assert failing(SqlCheck(type="sql", name="negative", predicate="quantity < 0 OR email = 'x'")) == ["k1", "k5"]

    check = SqlCheck(type="sql", name="z_status", query="SELECT key_hash FROM current WHERE status = 'Z' AND key_hash NOT IN (SELECT key_hash FROM changes)")
    returned = query_rows(check, frame, frame.filter(F.col("key_hash") != "k3"))
    outcome = row_outcome("current_table", check, failure_figures(returned))
    assert not outcome.passed and outcome.metadata["failing_rows"] == 1 and outcome.metadata["sample_key_hashes"] == "k3"
    passed = row_outcome("current_table", check, failure_figures(query_rows(check, frame, frame)))
    assert passed.passed and "sample_key_hashes" not in passed.metadata


def test_a_volume_check_bounds_counts_shares_and_rows():
    check = VolumeCheck(type="volume", max_delete_share=0.02, max_inserts=100, min_rows=900)
    within = volume_outcome("hash_join_classification", check, {"I": 100, "U": 50, "D": 20}, 1000, 1080)
    assert within.passed, within.equation
    too_many = volume_outcome("hash_join_classification", check, {"I": 101, "U": 0, "D": 21}, 1000, 950)
    assert not too_many.passed
    assert "101 inserts > max_inserts 100" in too_many.equation and "21 deletes = 2.10% of 1000 rows > max_delete_share 2.00%" in too_many.equation
    shrunk = volume_outcome("hash_join_classification", check, {"D": 0}, 1000, 899)
    assert not shrunk.passed and shrunk.metadata["broken_bounds"] == "899 rows < min_rows 900"
    # The first date has no state before it: no share applies, the counts and rows still do.
    first = volume_outcome("hash_join_classification", VolumeCheck(type="volume", max_insert_share=0.1, max_rows=10), {"I": 11}, 0, 11)
    assert not first.passed and first.metadata["broken_bounds"] == "11 rows > max_rows 10"


def test_declared_checks_run_on_each_dates_outputs_and_only_errors_stop_the_run(spark, tmp_path, monkeypatch):
    checks = [
        {"type": "volume", "max_updates": 0, "description": "Orders are never changed after they are placed."},
        {"type": "not_null", "columns": ["customer"]},
        {"type": "accepted_values", "column": "store_code", "values": ["LON", "PAR"]},
        {"type": "sql", "name": "big_orders", "predicate": "quantity > 3", "on": "changes", "severity": "warn"},
        {"type": "sql", "name": "no_negative_amounts", "query": "SELECT key_hash FROM current WHERE amount < 0"},
    ]
    config = load_table_config(_config_with(tmp_path / "configs", checks))
    warehouse = tmp_path / "warehouse"
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse))
    defs = build_definitions([build_table_definitions(config)])
    instance = DagsterInstance.ephemeral()
    # Both dates in one run: a failed blocking check publishes neither (docs/publishing.md), and every date's
    # checks are evaluated all the same.
    result = run_range(defs, DAY1, DAY2, instance, raise_on_error=False)

    evaluations = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    by_day = {}
    for day in (DAY1, DAY2):
        by_day[day] = {e.check_name: e for e in evaluations if e.asset_key.path[0] == "orders" and e.partition == day}
        assert {"volume", "not_null_customer", "accepted_values_store_code", "big_orders", "no_negative_amounts"} <= set(by_day[day])

    # What the run staged says, read apart from the checks (on its branch: nothing was published).
    storage = WarehouseStorage(str(warehouse), run_id=result.run_id)
    history = storage.read(spark, "orders", "history_partition", [DAY1, DAY2])
    updates = {row["business_date"]: row["count"] for row in history.filter("operation = 'U'").groupBy("business_date").count().collect()}
    big = {row["business_date"]: row["count"] for row in history.filter("quantity > 3").groupBy("business_date").count().collect()}
    outside = {day: storage.read(spark, "orders", "current_table", [day]).filter(~F.col("store_code").isin("LON", "PAR")) for day in by_day}
    assert updates.get(date(2024, 1, 2), 0) > 0 and big.get(date(2024, 1, 2), 0) > 0 and outside[DAY1].count() > 0

    blocking_failed = []
    for day in (DAY1, DAY2):
        evaluations = by_day[day]
        on = date.fromisoformat(day)
        volume = evaluations["volume"]
        assert volume.passed == (updates.get(on, 0) == 0), volume.description
        assert volume.metadata["updates"].value == updates.get(on, 0)
        assert volume.blocking and volume.severity.value == "ERROR"
        warned = evaluations["big_orders"]
        assert warned.passed == (big.get(on, 0) == 0) and warned.severity.value == "WARN" and not warned.blocking
        assert evaluations["not_null_customer"].passed and evaluations["no_negative_amounts"].passed
        values = evaluations["accepted_values_store_code"]
        assert values.metadata["failing_rows"].value == outside[day].count() and values.passed == (outside[day].count() == 0)
        blocking_failed += [(day, name) for name, e in evaluations.items() if e.blocking and not e.passed]
    # Only the blocking checks decide the run: the warning alone does not fail it. A failed one publishes nothing.
    assert (DAY2, "volume") in blocking_failed  # 2 updates
    assert not result.success
    assert WarehouseStorage(str(warehouse)).stored_dates("orders", "current_table") == []

    failed_values = by_day[DAY1]["accepted_values_store_code"]
    assert not failed_values.passed
    sample = failed_values.metadata["sample_key_hashes"].value.split(", ")
    assert set(sample) <= {row["key_hash"] for row in outside[DAY1].select("key_hash").collect()}
    # Counts and key hashes only: no value of a failing row reaches the UI's metadata.
    shown = " ".join(str(value.value) for e in by_day[DAY1].values() for value in e.metadata.values())
    assert "NYC" not in shown and "frank" not in shown
