"""What a correction changed: per business date, the keys whose class (I, U, D, N, X) differs between the
classification stored before a re-run and the one it computed (pure PySpark, no Dagster)."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc_assets.core.capture.changes import OPERATION
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.hashing import KEY_HASH
from cdc_assets.model.config import INTERNAL_PREFIX

CHANGED, SAMPLE = "changed_keys", "sample_key_hashes"
# Working columns, of frames holding only the key hash, the date and the class: the pipeline's reserved prefix all the same.
_BEFORE, _AFTER, _RANK = (f"{INTERNAL_PREFIX}class_{name}" for name in ("before", "after", "rank"))


def class_changes(before: DataFrame, after: DataFrame, sample: int = 5) -> DataFrame:
    """One row per date with a key whose class differs between ``before`` and ``after`` (classifications:
    ``key_hash``, ``operation``, ``business_date``); a key in one of them only counts. Columns:
    ``business_date``, ``changed_keys`` and ``sample_key_hashes`` (up to ``sample`` of them, smallest first:
    hashes, never values). A row per date: small enough to collect."""
    columns = [KEY_HASH, BUSINESS_DATE]
    joined = before.select(*columns, F.col(OPERATION).alias(_BEFORE)).join(
        after.select(*columns, F.col(OPERATION).alias(_AFTER)), columns, "full_outer"
    )
    changed = joined.where(~F.col(_BEFORE).eqNullSafe(F.col(_AFTER))).select(*columns)
    counts = changed.groupBy(BUSINESS_DATE).agg(F.count(F.lit(1)).alias(CHANGED))
    first = changed.withColumn(_RANK, F.row_number().over(Window.partitionBy(BUSINESS_DATE).orderBy(KEY_HASH)))
    samples = first.where(F.col(_RANK) <= sample).groupBy(BUSINESS_DATE).agg(F.array_sort(F.collect_list(KEY_HASH)).alias(SAMPLE))
    return counts.join(samples, BUSINESS_DATE, "left")
