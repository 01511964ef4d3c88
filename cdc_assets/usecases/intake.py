"""The intake step's body, without Dagster: a range of dates' extracts read, validated and hashed, ready
to store as ``hashed_incoming`` and ``rejects``.

The Dagster step (``cdc_assets/defs/factory.py``) refuses a run that may not write these dates first,
then calls :func:`read_intake`, records :meth:`Intake.counts` on each date's materializations and hands
the two outputs to the IO manager.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession

from cdc_assets.core.intake.incoming import IncomingDates, prepare_incoming_dates
from cdc_assets.core.intake.source import read_source
from cdc_assets.model.config import Retention, SourceFormat, TableConfig
from cdc_assets.model.names import HASHED_INCOMING, REJECTS, day_before, pool_name
from cdc_assets.usecases.capture import decide_rerun
from cdc_assets.usecases.erasure import erased_keys
from cdc_assets.usecases.schema_changes import evolution_since
from cdc_assets.usecases.step_log import StageClock, StepLog
from resources.session.spark_session import SCHEDULER_POOL, for_each_date
from resources.storage import WarehouseStorage
from resources.storage.writes import DatedRows


@dataclass
class Intake:
    """A range's validated input: each date's figures, and the rows of both outputs (lazy until written).

    :meth:`release` frees what the validation cached, once both are written.
    """

    table: TableConfig
    days: list[str]
    prepared: IncomingDates
    erased_checked: bool  # the table keeps a ledger of erased keys: their records were looked for

    def counts(self, day: str) -> dict[str, int]:
        """What a date's ``hashed_incoming`` and ``rejects`` materializations record (rows read = accepted + rejected ...)."""
        figures = self.prepared.figures[day]
        counts = {"rows_read": figures.rows_read, "rows_accepted": figures.rows_accepted, "rows_rejected": figures.rows_rejected}
        if self.table.changes is None:  # a change set's ties are found by the CDC step, after lateness
            counts["duplicate_keys"] = figures.duplicate_keys
        if self.table.source.format is SourceFormat.debezium:
            counts["tombstone_lines"] = figures.tombstone_lines
        if self.erased_checked:
            counts["erased_keys_in_extract"] = figures.erased_records
            counts["erased_records_set_aside"] = figures.set_aside
        return counts

    def source_path(self, day: str) -> str:
        """Where the date's extract was read from."""
        return self.table.source.path_for(day)

    def summary(self) -> str:
        """One line per date, logged as one message (each message is an event the instance stores)."""
        lines = []
        for day in self.days:
            figures = self.prepared.figures[day]
            lines.append(
                f"{self.table.name} {day}: read {figures.rows_read} rows, accepted {figures.rows_accepted}, "
                f"rejected {figures.rows_rejected}"
                + (f", {figures.erased_records} of erased keys ({self.table.erased_keys.value})" if figures.erased_records else "")
            )
        return "\n".join(lines)

    def outputs(self) -> dict[str, DatedRows]:
        """Each output's rows for every date of the range, with the table's retention."""
        kept = self.table.retention or Retention()
        return {
            name: DatedRows(rows, retention_staging_days=kept.staging_days, retention_snapshot_days=kept.snapshot_days)
            for name, rows in ((HASHED_INCOMING, self.prepared.accepted), (REJECTS, self.prepared.rejected))
        }

    def release(self) -> None:
        self.prepared.release()


def read_intake(
    spark: SparkSession,
    storage: WarehouseStorage,
    table: TableConfig,
    days: list[str],
    log: StepLog,
    *,
    refuse_later_dates: bool = True,
    backfill_dates: set[str] | None = None,
    rebaseline: bool = False,
    carry_forward: bool = False,
) -> Intake:
    """Read, validate and hash every date of ``days`` (oldest first); raises, before anything is written,
    on what the CDC step would refuse (``refuse_later_dates``: a re-run that later stored dates were
    computed from, outside a backfill of ``backfill_dates`` that recomputes them, unless the CDC step
    recomputes them itself (``carry_forward``); a change of columns
    that cannot be applied, unless a declared ``rebaseline``) and on an extract the table's policies
    refuse (a bad record, a duplicate key)."""
    clock = StageClock(log, table.name, days)
    if refuse_later_dates:  # False when the run leaves the CDC step out
        decide_rerun(storage, table, days, backfill_dates, carry_forward)
    evolution_since(storage, table, day_before(days[0]), rebaseline=rebaseline)
    # The warehouse's session: it reaches the object store an extract may be in (s3://) as the tables do.
    spark = storage.tables.session_for(spark)
    spark.conf.set(SCHEDULER_POOL, pool_name(table))  # this table's fair share of a shared server
    # Keys erased from the table (cdc-erase) never come back from an extract, a re-read one included,
    # unless the table says `erased_keys: keep`.
    # The lock first: an erase running now (it holds the lock) finishes, and its keys are in the ledger read.
    storage.hold_writer_lock(table.name)
    erased = erased_keys(spark, storage, table.name)
    # Each date's extract is located and its header checked on its own, side by side (the header
    # is read by Spark, a small job each); then every date is validated and hashed in
    # one query, and written in one write per output. Per-date jobs, not rows, are what a range
    # of small days would otherwise pay for.
    with clock.timed("reading the extracts' headers"):
        sources = dict(zip(days, for_each_date(lambda day: read_source(spark, table, day), days)))
    with clock.timed("validation and hashing"):
        prepared = prepare_incoming_dates(table, sources, erased)
    return Intake(table, list(days), prepared, erased is not None)
