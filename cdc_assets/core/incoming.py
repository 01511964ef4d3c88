"""Stage 1: the day's extract, read, validated, typed and hashed, with bad rows split off.

Policies from the table config decide what a bad record or a duplicated key does: fail the date
(nothing is written) or go to quarantine. Either way no row is lost:
rows read = rows accepted + rows rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from cdc_assets.config import BadRecordPolicy, DuplicateKeyPolicy, TableConfig
from cdc_assets.core.hashing import KEY_HASH, add_hashes
from cdc_assets.core.source import (
    RAW_RECORD,
    RECORD_ID,
    REJECT_REASON,
    SOURCE_FILE,
    accepted_records,
    read_source,
    rejected_records,
    validate_records,
)

SAMPLE_SIZE = 5


class BadRecordsError(ValueError):
    """Bad records in a table whose policy is ``bad_records: fail``."""


class DuplicateKeysError(ValueError):
    """Keys that occur more than once in one day's input, with ``duplicate_keys: fail``."""


@dataclass
class IncomingBatch:
    """One date's input after validation. ``release()`` frees the cached rows once both are written."""

    accepted: DataFrame  # configured columns (typed) + key_hash + non_key_hash
    rejected: DataFrame  # raw_record, reason, source_file
    rows_read: int
    rows_rejected: int
    duplicate_keys: int
    _cached: DataFrame

    @property
    def rows_accepted(self) -> int:
        return self.rows_read - self.rows_rejected

    def release(self) -> None:
        self._cached.unpersist()


def _hash_specs(config: TableConfig):
    keys = [(column.name, column.type) for column in config.keys]
    non_keys = [(column.name, column.type) for column in config.non_keys]
    return keys, non_keys


def _describe_bad_records(validated: DataFrame, config: TableConfig, business_date: date, count: int) -> str:
    # Record numbers are only worked out on this failure path: a window over the whole input is too
    # dear for every run. Within one file the scan emits records in file order, so the rank of the
    # record id is the record's position (1-based, header not counted).
    numbered = validated.withColumn(
        "_record_number", F.row_number().over(Window.partitionBy(SOURCE_FILE).orderBy(RECORD_ID))
    )
    samples = (
        numbered.filter(F.col(REJECT_REASON).isNotNull())
        .orderBy(SOURCE_FILE, "_record_number")
        .select(SOURCE_FILE, "_record_number", REJECT_REASON, RAW_RECORD)
        .limit(SAMPLE_SIZE)
        .collect()
    )
    lines = [f"table {config.name}, {business_date}: {count} bad record(s); nothing was written for this date."]
    for row in samples:
        lines.append(
            f"  {row[SOURCE_FILE]} record {row['_record_number']}: {row[REJECT_REASON]} (raw: {row[RAW_RECORD]})"
        )
    lines.append("Fix the extract, or set bad_records: quarantine to set such rows aside.")
    return "\n".join(lines)


def _describe_duplicates(duplicates: DataFrame, accepted: DataFrame, config: TableConfig, business_date: date, count: int) -> str:
    sample_keys = duplicates.orderBy(F.desc("count"), KEY_HASH).limit(SAMPLE_SIZE)
    rows = (
        accepted.join(sample_keys, on=KEY_HASH, how="inner")
        .select(*config.key_names, "count")
        .dropDuplicates(config.key_names)
        .collect()
    )
    shown = "; ".join(
        "{" + ", ".join(f"{name}={row[name]!r}" for name in config.key_names) + f"}} x{row['count']}" for row in rows
    )
    return (
        f"table {config.name}, {business_date}: {count} key(s) occur more than once in the input "
        f"(identical rows count too), e.g. {shown}. Nothing was written for this date; deduplicate the "
        "extract, or set duplicate_keys: quarantine to set such rows aside."
    )


def prepare_incoming(spark: SparkSession, config: TableConfig, business_date: date) -> IncomingBatch:
    """Read the date's extract and split it into accepted (typed, hashed) and rejected rows.

    Raises :class:`BadRecordsError` / :class:`DuplicateKeysError` when the table's policy is ``fail``,
    and ``SourceError`` when the input is missing or its columns do not match the config.
    """
    keys, non_keys = _hash_specs(config)
    raw = read_source(spark, config, business_date.isoformat())
    # Hash while the typed values are at hand; the cache spares a second parse of the source.
    validated = add_hashes(validate_records(raw, config), keys, non_keys).persist(StorageLevel.MEMORY_AND_DISK)
    # One job fills the cache and yields every figure: rows read, rows rejected, and the keys that
    # occur more than once among the accepted rows (with their rows).
    accepted_flag = F.col(REJECT_REASON).isNull()
    per_key = validated.groupBy(accepted_flag.alias("accepted"), KEY_HASH).count()
    duplicated_group = F.col("accepted") & (F.col("count") > 1)
    totals = per_key.agg(
        F.sum("count").alias("read"),
        F.sum(F.when(~F.col("accepted"), F.col("count"))).alias("rejected"),
        F.count(F.when(duplicated_group, F.lit(1))).alias("duplicate_keys"),
        F.sum(F.when(duplicated_group, F.col("count"))).alias("duplicate_rows"),
    ).first()
    rows_read, rows_rejected = totals["read"] or 0, totals["rejected"] or 0
    duplicate_keys, duplicate_rows = totals["duplicate_keys"], totals["duplicate_rows"] or 0
    if rows_rejected and config.bad_records is BadRecordPolicy.fail:
        message = _describe_bad_records(validated, config, business_date, rows_rejected)
        validated.unpersist()
        raise BadRecordsError(message)

    accepted = accepted_records(validated)
    rejected = rejected_records(validated)
    if duplicate_keys:
        duplicates = accepted.groupBy(KEY_HASH).count().filter(F.col("count") > 1)
        if config.duplicate_keys is DuplicateKeyPolicy.fail:
            message = _describe_duplicates(duplicates, accepted, config, business_date, duplicate_keys)
            validated.unpersist()
            raise DuplicateKeysError(message)
        duplicated = validated.join(duplicates.select(KEY_HASH), on=KEY_HASH, how="left_semi")
        rejected = rejected.unionByName(
            duplicated.filter(F.col(REJECT_REASON).isNull()).select(
                F.to_json(
                    F.struct(*(F.col(column.name).cast("string").alias(column.name) for column in config.columns))
                ).alias("raw_record"),
                F.lit("duplicate key: the key occurs more than once in this date's input").alias("reason"),
                F.col(SOURCE_FILE).alias("source_file"),
            )
        )
        accepted = accepted.join(duplicates.select(KEY_HASH), on=KEY_HASH, how="left_anti")
        rows_rejected += duplicate_rows
    return IncomingBatch(
        accepted=accepted,
        rejected=rejected,
        rows_read=rows_read,
        rows_rejected=rows_rejected,
        duplicate_keys=duplicate_keys,
        _cached=validated,
    )
