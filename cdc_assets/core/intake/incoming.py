"""Stage 1: the day's extract, read, validated, typed and hashed, with bad rows split off.

Policies from the table config decide what a bad record or a duplicated key does: fail the date
(nothing is written) or go to quarantine. Either way no row is lost:
rows read = rows accepted + rows rejected.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import date
from functools import reduce

from pyspark.sql import DataFrame, Row, Window
from pyspark.sql import functions as F

from cdc_assets.model.config import INTERNAL_PREFIX, BadRecordPolicy, DuplicateKeyPolicy, ErasedKeys, LoadType, TableConfig
from cdc_assets.model.masking import ValueMask
from cdc_assets.core.caching import persist
from cdc_assets.core.capture.erasure import RAW_KEY_HASH, with_raw_key_hash
from cdc_assets.core.errors import SummarizedError
from cdc_assets.core.hashing import KEY_HASH, add_hashes
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.intake.columns import RAW_RECORD, RECORD_ID, REJECT_REASON, SOURCE_FILE
from cdc_assets.core.intake.source import (
    accepted_records,
    header_mismatch,
    is_tombstone,
    rejected_records,
    validate_records,
)

SAMPLE_SIZE = 5


class BadRecordsError(SummarizedError, ValueError):
    """Bad records in a table whose policy is ``bad_records: fail``; the records only in the detail."""


class DuplicateKeysError(SummarizedError, ValueError):
    """Keys that occur more than once in one day's input, with ``duplicate_keys: fail`` (or a change
    set's ties); the summary gives their count and a ``key_hash``, the key values only the detail."""


def _erased_records(validated: DataFrame, erased: DataFrame, drop: bool) -> tuple[DataFrame, dict[str, int]]:
    """Records of erased keys per date (one small job over the cached rows), and ``validated`` without
    them when ``drop``. A record whose key does not parse has no erased key's hash: it stays."""
    flag = f"{INTERNAL_PREFIX}erased"
    marked = validated.join(F.broadcast(erased.distinct().withColumn(flag, F.lit(True))), on=KEY_HASH, how="left")
    marked = marked.select(*validated.columns, F.coalesce(F.col(flag), F.lit(False)).alias(flag))
    counts = {row[BUSINESS_DATE]: row["count"] for row in marked.filter(F.col(flag)).groupBy(BUSINESS_DATE).count().collect()}
    if not (drop and counts):
        return validated, counts
    return marked.filter(~F.col(flag)).drop(flag), counts


@contextmanager
def _header_mismatch_explained(config: TableConfig, cached: DataFrame):
    """Around the first read of the files, where Spark checks each file's header: a mismatch is raised
    as the error that names the file (the cache released)."""
    try:
        yield
    except Exception as error:
        mismatch = header_mismatch(config, error)
        cached.unpersist()
        if mismatch is None:
            raise
        raise mismatch from None


def _hash_specs(config: TableConfig):
    keys = [(column.name, column.type) for column in config.keys]
    non_keys = [(column.name, column.type) for column in config.non_keys]
    return keys, non_keys


def _bad_records_error(
    validated: DataFrame, config: TableConfig, business_date: date, count: int, unkeyed: bool = False
) -> BadRecordsError:
    """The error for a date's bad records (``unkeyed``: those whose key cannot be parsed, on a full load
    with ``bad_records: quarantine``), naming the first ones' file, record number and reason."""
    # Record numbers are only worked out on this failure path: a window over the whole input is too
    # dear for every run. Within one file the scan emits records in file order, so the rank of the
    # record id is the record's position (1-based, header not counted).
    numbered = validated.withColumn(
        "_record_number", F.row_number().over(Window.partitionBy(SOURCE_FILE).orderBy(RECORD_ID))
    )
    shown = (SOURCE_FILE, "_record_number", REJECT_REASON, RAW_RECORD)
    bad = numbered.filter(F.col(REJECT_REASON).isNotNull()).select(*shown)
    if unkeyed:
        keys = [(column.name, column.type) for column in config.keys]
        parsed = with_raw_key_hash(bad.withColumn("raw_record", F.col(RAW_RECORD)), keys)
        bad = parsed.filter(F.col(RAW_KEY_HASH).isNull()).select(*shown)
    samples = (
        bad.orderBy(SOURCE_FILE, "_record_number")
        .limit(SAMPLE_SIZE)
        .collect()
    )
    # The message stays in Dagster's event log, beyond an erase: the raw record (every field of it) and a
    # masked column's value in the reason are shown only as CDC_SHOW_VALUES allows (model/masking.py).
    mask = ValueMask.for_table(config)
    lines = [
        f"  {row[SOURCE_FILE]} record {row['_record_number']}: {mask.reason(row[REJECT_REASON])} (raw: {mask.raw(row[RAW_RECORD])})"
        for row in samples
    ]
    if unkeyed:
        summary = (
            f"table {config.name}, {business_date}: {count} bad record(s) whose key cannot be parsed, in a full load"
            + (f" (the first: {samples[0][SOURCE_FILE]} record {samples[0]['_record_number']})" if samples else "")
            + "; nothing was written for this date. Their keys would be taken as deleted from the snapshot."
        )
        lines.append(
            "Fix the extract, or set bad_records: quarantine_unkeyed to set such rows aside and let their keys "
            "count as deleted (docs/load-types.md)."
        )
    else:
        summary = f"table {config.name}, {business_date}: {count} bad record(s); nothing was written for this date."
        lines.append("Fix the extract, or set bad_records: quarantine to set such rows aside.")
    return BadRecordsError(summary, "\n".join(lines))


def _duplicate_keys_error(
    duplicates: DataFrame, accepted: DataFrame, config: TableConfig, business_date: date, count: int
) -> DuplicateKeysError:
    sample_keys = duplicates.orderBy(F.desc("count"), KEY_HASH).limit(SAMPLE_SIZE)
    rows = (
        accepted.join(sample_keys, on=KEY_HASH, how="inner")
        .select(KEY_HASH, *config.key_names, "count")
        .dropDuplicates([KEY_HASH])
        .orderBy(F.desc("count"), KEY_HASH)
        .collect()
    )
    mask = ValueMask.for_table(config)  # keys are masked unless a key is `sensitive: false` (model/masking.py)
    shown = "; ".join(mask.key(config.key_names, [row[name] for name in config.key_names]) + f" x{row['count']}" for row in rows)
    first = rows[0] if rows else None
    example = f", e.g. key_hash {first[KEY_HASH]} x{first['count']}" if first else ""
    return DuplicateKeysError(
        f"table {config.name}, {business_date}: {count} key(s) occur more than once in the input "
        f"(identical rows count too){example}. Nothing was written for this date; deduplicate the "
        "extract, or set duplicate_keys: quarantine to set such rows aside.",
        f"The keys, e.g. {shown}.",
    )


@dataclass(frozen=True)
class DateFigures:
    """One date's intake figures: rows read = rows accepted + rows rejected + tombstone lines + records set aside.

    ``duplicate_keys``: keys found more than once (0 for a change set). ``tombstone_lines``: Debezium's
    null-valued lines, counted, not kept. ``erased_records``: records of keys the table's ledger has
    erased (``cdc-erase``); ``set_aside``: those of them not kept (``erased_keys: drop``), counted only.
    """

    rows_read: int = 0
    rows_rejected: int = 0
    duplicate_keys: int = 0
    tombstone_lines: int = 0
    erased_records: int = 0
    set_aside: int = 0
    # A full load's rejects whose key cannot be parsed (``bad_records: quarantine_unkeyed`` keeps them),
    # and its good records set aside because another record of their key was rejected (in rows_rejected).
    unkeyed_rejects: int = 0
    held_records: int = 0

    @property
    def rows_accepted(self) -> int:
        return self.rows_read - self.rows_rejected - self.tombstone_lines - self.set_aside


@dataclass
class IncomingDates:
    """Several dates' input after validation, in one DataFrame each, dated by a ``business_date`` column."""

    accepted: DataFrame  # configured columns (typed) + key_hash + non_key_hash + business_date
    rejected: DataFrame  # raw_record, reason, source_file, business_date
    figures: dict[str, DateFigures]  # by ISO date; every date given, with or without rows
    _cached: DataFrame

    def release(self) -> None:
        self._cached.unpersist()


def _dates_in_one(sources: Mapping[str, DataFrame], days: list[str]) -> DataFrame:
    """Every date's source rows in one DataFrame, each with its date as text in ``business_date``.

    Text up to the cache: Spark writes a date literal into the generated code, so each date's branch
    of the union would compile a class of its own (a cold compile is about 0.1 s); a text literal is
    passed by reference, and with spark.sql.codegen.useIdInClassName off (PIPELINE_DEFAULTS) every
    branch shares one class.
    """
    return reduce(
        lambda left, right: left.unionByName(right, allowMissingColumns=True),  # extra columns may differ by date
        (sources[day].withColumn(BUSINESS_DATE, F.lit(day)) for day in days),
    )


def _figures_by_date(validated: DataFrame, changeset: bool) -> DataFrame:
    """One row per date: rows read, rows rejected, and the keys that occur more than once among the
    date's accepted rows (with their rows); for a change set, its tombstone lines instead (several
    records per key are its point)."""
    if changeset:
        return validated.groupBy(BUSINESS_DATE).agg(
            F.count(F.lit(1)).alias("read"),
            F.count(F.when(F.col(REJECT_REASON).isNotNull(), F.lit(1))).alias("rejected"),
            F.count(F.when(is_tombstone(validated), F.lit(1))).alias("tombstones"),
            F.lit(0).alias("duplicate_keys"),
            F.lit(0).alias("duplicate_rows"),
        )
    accepted_flag = F.col(REJECT_REASON).isNull()
    per_key = validated.groupBy(BUSINESS_DATE, accepted_flag.alias("accepted"), KEY_HASH).count()
    duplicated_group = F.col("accepted") & (F.col("count") > 1)
    return per_key.groupBy(BUSINESS_DATE).agg(
        F.sum("count").alias("read"),
        F.sum(F.when(~F.col("accepted"), F.col("count"))).alias("rejected"),
        F.lit(0).alias("tombstones"),
        F.count(F.when(duplicated_group, F.lit(1))).alias("duplicate_keys"),
        F.sum(F.when(duplicated_group, F.col("count"))).alias("duplicate_rows"),
    )


def _date_figures(
    totals: list[Row], days: list[str], erased_by_date: Mapping[str, int], erased_keys: ErasedKeys
) -> tuple[dict[str, DateFigures], dict[str, int]]:
    """Each date's :class:`DateFigures` (every date of ``days``, with rows or not) from
    :func:`_figures_by_date`'s rows and the erased keys' records found; and each date's rows of
    duplicated keys."""
    figures = {day: DateFigures() for day in days}
    duplicate_rows: dict[str, int] = {}
    for row in totals:
        day = row[BUSINESS_DATE]
        figures[day] = DateFigures(row["read"] or 0, row["rejected"] or 0, row["duplicate_keys"], row["tombstones"] or 0)
        duplicate_rows[day] = row["duplicate_rows"] or 0
    for day, found in erased_by_date.items():
        set_aside = found if erased_keys is ErasedKeys.drop else 0
        figures[day] = replace(figures[day], rows_read=figures[day].rows_read + set_aside, erased_records=found, set_aside=set_aside)
    return figures, duplicate_rows


def _quarantine_duplicates(
    config: TableConfig, dated: DataFrame, accepted: DataFrame, rejected: DataFrame, duplicate_ids: DataFrame
) -> tuple[DataFrame, DataFrame]:
    """The accepted rows without the keys ``duplicate_ids`` names (``business_date``, ``key_hash``), and
    the rejects with those keys' rows, each as its configured columns in JSON, given the reason."""
    duplicated = dated.join(duplicate_ids, on=[BUSINESS_DATE, KEY_HASH], how="left_semi")
    rejected = rejected.unionByName(
        duplicated.filter(F.col(REJECT_REASON).isNull()).select(
            F.to_json(
                F.struct(*(F.col(column.name).cast("string").alias(column.name) for column in config.columns))
            ).alias("raw_record"),
            F.lit("duplicate key: the key occurs more than once in this date's input").alias("reason"),
            F.col(SOURCE_FILE).alias("source_file"),
            F.col(BUSINESS_DATE),
        )
    )
    # A USING join puts its columns first; keep the accepted rows' column order.
    accepted = accepted.join(duplicate_ids, on=[BUSINESS_DATE, KEY_HASH], how="left_anti").select(*accepted.columns)
    return accepted, rejected


def prepare_incoming_dates(
    config: TableConfig, sources: Mapping[str, DataFrame], erased: DataFrame | None = None
) -> IncomingDates:
    """Validate, type and hash several dates' extracts (``{ISO date: read_source(...)}``) in one query.

    Duplicate keys are looked for within each date. Raises :class:`BadRecordsError` /
    :class:`DuplicateKeysError` for the oldest date that breaks a ``fail`` policy; nothing is
    returned for any date then. ``erased`` (``key_hash`` values of erased keys) makes the records of
    those keys, good or bad, counted; with ``erased_keys: drop`` they are also set aside first, kept
    nowhere, so no policy fails a date on an erased key's record.
    """
    days = sorted(sources)
    keys, non_keys = _hash_specs(config)
    raw = _dates_in_one(sources, days)
    # The cache spares a second parse of the source. The hashes are computed on top of it, not
    # cached with it: validation and hashing compiled into one whole-stage method of about 11 KB of
    # bytecode (15 columns), over HotSpot's 8,000-byte limit for JIT compilation
    # (-XX:HugeMethodLimit), so the intake ran interpreted, on a warm JVM too. Apart, each stays
    # under it (about 6.6 KB and 4.9 KB). Each job prunes what it does not use: the duplicate
    # count hashes the keys only, the rejects hash nothing.
    cached = persist(validate_records(raw, config))
    validated = add_hashes(cached, keys, non_keys)
    erased_by_date: dict[str, int] = {}
    if erased is not None:
        with _header_mismatch_explained(config, cached):  # this job reads the files first
            validated, erased_by_date = _erased_records(validated, erased, drop=config.erased_keys is ErasedKeys.drop)
    # One job fills the cache and yields every date's figures: rows read, rows rejected, and the keys
    # that occur more than once among the date's accepted rows (with their rows); for a change set,
    # its tombstone lines instead (several records per key are its point).
    changeset = config.load_type is LoadType.changeset
    with _header_mismatch_explained(config, cached):
        totals = _figures_by_date(validated, changeset).collect()  # a row per date
    figures, duplicate_rows = _date_figures(totals, days, erased_by_date, config.erased_keys)

    def on(day: str):  # for the cached rows (date as text) and the ones derived from them alike
        return F.col(BUSINESS_DATE).cast("date") == F.lit(day).cast("date")

    failing = next((day for day in days if figures[day].rows_rejected), None)
    if failing and config.bad_records is BadRecordPolicy.fail:
        error = _bad_records_error(
            validated.filter(on(failing)), config, date.fromisoformat(failing), figures[failing].rows_rejected
        )
        cached.unpersist()
        raise error

    full = config.load_type is LoadType.full
    if full and failing:
        # A full load holds a rejected record's key as it was (the CDC step); one whose key cannot be
        # parsed would hide a key that the snapshot then seems to have deleted.
        unkeyed = _unkeyed_rejects_by_date(validated, config)
        figures = {day: replace(found, unkeyed_rejects=unkeyed.get(day, 0)) for day, found in figures.items()}
        first_unkeyed = next((day for day in days if unkeyed.get(day)), None)
        if first_unkeyed and config.bad_records is BadRecordPolicy.quarantine:
            error = _bad_records_error(
                validated.filter(on(first_unkeyed)), config, date.fromisoformat(first_unkeyed), unkeyed[first_unkeyed], unkeyed=True
            )
            cached.unpersist()
            raise error

    dated = validated.withColumn(BUSINESS_DATE, F.col(BUSINESS_DATE).cast("date"))
    accepted = accepted_records(dated)
    rejected = rejected_records(dated)
    if changeset:  # its ties are decided by the CDC step, once late records are set aside
        return IncomingDates(accepted=accepted, rejected=rejected, figures=figures, _cached=cached)
    bad_keys = rejected_keys(rejected, config) if full and failing else None
    duplicated_day = next((day for day in days if figures[day].duplicate_keys), None)
    duplicate_ids = None
    if duplicated_day:
        duplicates = accepted.groupBy(BUSINESS_DATE, KEY_HASH).count().filter(F.col("count") > 1)
        if config.duplicate_keys is DuplicateKeyPolicy.fail:
            duplicate_error = _duplicate_keys_error(
                duplicates.filter(on(duplicated_day)).drop(BUSINESS_DATE),
                accepted.filter(on(duplicated_day)),
                config,
                date.fromisoformat(duplicated_day),
                figures[duplicated_day].duplicate_keys,
            )
            cached.unpersist()
            raise duplicate_error
        duplicate_ids = duplicates.select(BUSINESS_DATE, KEY_HASH)
        accepted, rejected = _quarantine_duplicates(config, dated, accepted, rejected, duplicate_ids)
        figures = {
            day: replace(found, rows_rejected=found.rows_rejected + duplicate_rows.get(day, 0)) for day, found in figures.items()
        }
    if bad_keys is not None:
        accepted, rejected, figures = _holdrejected_keys(config, dated, accepted, rejected, figures, bad_keys, duplicate_ids)
    return IncomingDates(accepted=accepted, rejected=rejected, figures=figures, _cached=cached)


HELD_REASON = "key held: another record of this key in this date's input was rejected"


def rejected_keys(rejected: DataFrame, config: TableConfig) -> DataFrame:
    """(``business_date``, ``key_hash``) of each rejected record whose key parses from its raw record
    (``rejects`` as stored; core/capture/erasure.py): the keys a full load holds as they were."""
    parsed = with_raw_key_hash(rejected, [(column.name, column.type) for column in config.keys])
    return parsed.filter(F.col(RAW_KEY_HASH).isNotNull()).select(BUSINESS_DATE, F.col(RAW_KEY_HASH).alias(KEY_HASH)).distinct()


def _unkeyed_rejects_by_date(validated: DataFrame, config: TableConfig) -> dict[str, int]:
    """Rejected records per date (dates as text) whose key cannot be parsed from the raw record the rejects
    keep, as the CDC step parses it: a small job over the cached rejected rows."""
    rejected = validated.filter(F.col(REJECT_REASON).isNotNull()).select(BUSINESS_DATE, F.col(RAW_RECORD).alias("raw_record"))
    parsed = with_raw_key_hash(rejected, [(column.name, column.type) for column in config.keys])
    unkeyed = parsed.filter(F.col(RAW_KEY_HASH).isNull()).groupBy(BUSINESS_DATE).count().collect()
    return {row[BUSINESS_DATE]: row["count"] for row in unkeyed}


def _holdrejected_keys(
    config: TableConfig,
    dated: DataFrame,
    accepted: DataFrame,
    rejected: DataFrame,
    figures: dict[str, DateFigures],
    bad_keys: DataFrame,
    duplicate_ids: DataFrame | None,
) -> tuple[DataFrame, DataFrame, dict[str, DateFigures]]:
    """A full load's good records of a key that also has a rejected record that date go to the rejects too:
    the key is held as it was (neither updated from one record nor deleted for the other). A small job
    counts them; rows read = accepted + rejected still holds."""
    good = dated.filter(F.col(REJECT_REASON).isNull()).join(bad_keys, on=[BUSINESS_DATE, KEY_HASH], how="left_semi")
    if duplicate_ids is not None:  # already set aside as duplicates
        good = good.join(duplicate_ids, on=[BUSINESS_DATE, KEY_HASH], how="left_anti")
    held = {row[BUSINESS_DATE].isoformat(): row["count"] for row in good.groupBy(BUSINESS_DATE).count().collect()}
    if not held:
        return accepted, rejected, figures
    rejected = rejected.unionByName(
        good.select(
            F.to_json(F.struct(*(F.col(column.name).cast("string").alias(column.name) for column in config.columns))).alias("raw_record"),
            F.lit(HELD_REASON).alias("reason"),
            F.col(SOURCE_FILE).alias("source_file"),
            F.col(BUSINESS_DATE),
        )
    )
    accepted = accepted.join(bad_keys, on=[BUSINESS_DATE, KEY_HASH], how="left_anti").select(*accepted.columns)
    figures = {
        day: replace(found, rows_rejected=found.rows_rejected + held.get(day, 0), held_records=held.get(day, 0))
        for day, found in figures.items()
    }
    return accepted, rejected, figures
