"""The declared checks' bodies, without Dagster: each date's ``checks:`` (cdc_assets/model/declared_checks.py)
applied to what the warehouse stores for it (rules in ``core/capture/declared_checks.py``).

A row-level check reads the state as of the date (``on: current``) or the date's history rows (``on:
changes``); a volume check reads only figures: the date's inserts, updates and deletes from one aggregation
of the range's history, and the state's rows before and after it from the tables' metadata.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date

from pyspark.sql import DataFrame, SparkSession

from cdc_assets.core.capture.declared_checks import failing_rows, failure_figures, query_rows, row_outcome, volume_outcome
from cdc_assets.core.capture.reconcile import Reconciliation, operations_by_date
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.model.config import TableConfig
from cdc_assets.model.declared_checks import DeclaredCheck, Rows, SqlCheck, VolumeCheck
from cdc_assets.model.names import CLASSIFICATION, CURRENT, HISTORY
from cdc_assets.usecases.reconcile import previous_state_rows
from resources.storage import WarehouseStorage
from resources.storage.state import read_state, state_rows

# The asset each kind of check is shown on: a volume check on the classification (its counts), a row-level
# check on the output it reads.
ASSET_OF_ROWS = {Rows.current: CURRENT, Rows.changes: HISTORY}


def check_asset(check: DeclaredCheck) -> str:
    """The asset the check belongs to in the UI."""
    return CLASSIFICATION if isinstance(check, VolumeCheck) else ASSET_OF_ROWS[check.reads]


def declared_outcomes(
    spark: SparkSession, storage: WarehouseStorage, config: TableConfig, days: list[str]
) -> Iterator[tuple[str, list[tuple[DeclaredCheck, Reconciliation]]]]:
    """(date, [(check, outcome)]) of the table's declared checks, for each of ``days``."""
    table, checks = config.name, list(config.checks)
    if not checks:
        return
    types = {column.name.lower(): column.type for column in config.columns}
    operations = {}
    if any(isinstance(check, VolumeCheck) for check in checks):
        operations = operations_by_date(storage.read(spark, table, HISTORY, days), BUSINESS_DATE)
    for day in days:
        current = read_state(storage, spark, table, CURRENT, day)
        changes = storage.read(spark, table, HISTORY, [day])
        outcomes = []
        for check in checks:
            asset = check_asset(check)
            if isinstance(check, VolumeCheck):
                counts = operations.get(date.fromisoformat(day), {})
                outcome = volume_outcome(asset, check, counts, previous_state_rows(storage, config, day), state_rows(storage, table, CURRENT, day))
            elif isinstance(check, SqlCheck) and check.query is not None:
                outcome = row_outcome(asset, check, failure_figures(query_rows(check, current, changes)))
            else:
                rows: DataFrame = current if check.reads is Rows.current else changes
                outcome = row_outcome(asset, check, failure_figures(failing_rows(rows, check, types)))
            outcomes.append((check, outcome))
        yield day, outcomes

