"""The checks a table's owner declares (``checks:``, cdc_assets/model/declared_checks.py) applied to one date's
outputs. Plain PySpark, no Dagster.

A row-level check is a filter: :func:`failing_rows` keeps the rows that break it, and :func:`failure_figures`
counts them and takes a few of their ``key_hash`` values, never a row's values (the UI shows the metadata,
and a key or a sensitive column must not reach Dagster's event log). A volume check needs only the date's
counts (:func:`volume_outcome`). Each returns a :class:`~cdc_assets.core.capture.reconcile.Reconciliation`,
as the pipeline's own checks do, so the UI shows both the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.capture.changes import DELETE, INSERT, UPDATE
from cdc_assets.core.capture.reconcile import Reconciliation
from cdc_assets.core.hashing import KEY_HASH
from cdc_assets.model.declared_checks import AcceptedValuesCheck, NotNullCheck, SqlCheck, UniqueCheck, VolumeCheck

# How many failing rows' key hashes a check's metadata lists.
SAMPLE_SIZE = 5
# The names a sql check's query reads the date's outputs by.
CURRENT_VIEW, CHANGES_VIEW = "current", "changes"


@dataclass(frozen=True)
class Failures:
    rows: int
    sample_key_hashes: list[str]


def failing_rows(frame: DataFrame, check: NotNullCheck | UniqueCheck | AcceptedValuesCheck | SqlCheck, types: dict[str, str]) -> DataFrame:
    """The rows of ``frame`` that break ``check`` (a sql check's predicate form); ``types``: each configured
    column's Spark type by its lower-cased name, to read accepted values as the column's type."""
    if isinstance(check, NotNullCheck):
        return frame.filter(reduce(Column.__or__, [F.col(name).isNull() for name in check.columns]))
    if isinstance(check, AcceptedValuesCheck):
        column_type = types[check.column.lower()]
        accepted = [F.lit(_literal(value)).try_cast(column_type) for value in check.values]
        return frame.filter(F.col(check.column).isNotNull() & ~F.col(check.column).isin(*accepted))
    if isinstance(check, UniqueCheck):
        compared = frame.filter(reduce(Column.__and__, [F.col(name).isNotNull() for name in check.columns]))
        repeated = compared.groupBy(*check.columns).count().filter(F.col("count") > 1).drop("count")
        return compared.join(repeated, on=list(check.columns), how="left_semi")
    if isinstance(check, SqlCheck) and check.predicate is not None:
        # F.expr parses one expression: a statement in it is a parse error, never run.
        return frame.filter(F.coalesce(F.expr(check.predicate).cast("boolean"), F.lit(False)))
    raise TypeError(f"{type(check).__name__} is not a row-level check")


def query_rows(check: SqlCheck, current: DataFrame, changes: DataFrame) -> DataFrame:
    """The rows a sql check's query returns over the date's outputs, named ``current`` and ``changes``.

    The query is read as a subquery, so only a SELECT parses. The names are temporary views of the outputs'
    own session (a Connect session's own on a shared server), where the query runs: a view is its session's,
    and the pipeline's reads may come from a session other than the step's.
    """
    session = current.sparkSession
    current.createOrReplaceTempView(CURRENT_VIEW)
    changes.createOrReplaceTempView(CHANGES_VIEW)
    return session.sql(f"SELECT * FROM ({check.query}) AS declared_check")  # noqa: S608 - the table owner's own query, as a subquery


def failure_figures(failing: DataFrame) -> Failures:
    """How many rows fail, and up to :data:`SAMPLE_SIZE` of their key hashes (none where the rows have none)."""
    figures = failing.agg(F.count(F.lit(1)).alias("rows")).first()
    rows = int(figures["rows"]) if figures is not None else 0
    if rows == 0 or KEY_HASH not in failing.columns:
        return Failures(rows, [])
    sample = failing.select(KEY_HASH).where(F.col(KEY_HASH).isNotNull()).distinct().limit(SAMPLE_SIZE).collect()
    return Failures(rows, sorted(str(row[0]) for row in sample))


def row_outcome(asset: str, check: NotNullCheck | UniqueCheck | AcceptedValuesCheck | SqlCheck, failures: Failures) -> Reconciliation:
    """The check's result: passed when no row fails."""
    what = _what_fails(check)
    metadata: dict[str, int | str] = {"failing_rows": failures.rows, "reads": _reads(check)}
    if failures.sample_key_hashes:
        metadata["sample_key_hashes"] = ", ".join(failures.sample_key_hashes)
    return Reconciliation(asset, check.check_name, failures.rows == 0, f"{what}: {failures.rows} (allowed: 0)", metadata)


def volume_outcome(asset: str, check: VolumeCheck, operations: dict[str, int], previous_rows: int, current_rows: int) -> Reconciliation:
    """The date's inserts, updates and deletes (``operations``) and the state's rows after it against the
    check's bounds. A share is of the state the date was classified against; with no rows there (the
    table's first date) no share bound applies, as any insert would be an infinite share."""
    broken: list[str] = []
    counts = {"inserts": operations.get(INSERT, 0), "updates": operations.get(UPDATE, 0), "deletes": operations.get(DELETE, 0)}
    bounds = {
        "inserts": (check.max_inserts, check.max_insert_share, "max_insert_share"),
        "updates": (check.max_updates, check.max_update_share, "max_update_share"),
        "deletes": (check.max_deletes, check.max_delete_share, "max_delete_share"),
    }
    for kind, count in counts.items():
        count_bound, share_bound, share_name = bounds[kind]
        if count_bound is not None and count > count_bound:
            broken.append(f"{count} {kind} > max_{kind} {count_bound}")
        if share_bound is not None and previous_rows and count > share_bound * previous_rows:
            broken.append(f"{count} {kind} = {count / previous_rows:.2%} of {previous_rows} rows > {share_name} {share_bound:.2%}")
    if check.min_rows is not None and current_rows < check.min_rows:
        broken.append(f"{current_rows} rows < min_rows {check.min_rows}")
    if check.max_rows is not None and current_rows > check.max_rows:
        broken.append(f"{current_rows} rows > max_rows {check.max_rows}")
    figures = f"{counts['inserts']} inserts, {counts['updates']} updates, {counts['deletes']} deletes on {previous_rows} rows; {current_rows} rows after"
    metadata: dict[str, int | str] = {**counts, "previous_rows": previous_rows, "current_rows": current_rows}
    if broken:
        metadata["broken_bounds"] = "; ".join(broken)
    return Reconciliation(asset, check.check_name, not broken, figures + (": " + "; ".join(broken) if broken else ": within bounds"), metadata)


def _what_fails(check: NotNullCheck | UniqueCheck | AcceptedValuesCheck | SqlCheck) -> str:
    if isinstance(check, NotNullCheck):
        return "rows with a NULL in " + ", ".join(check.columns)
    if isinstance(check, UniqueCheck):
        return "rows sharing their " + ", ".join(check.columns) + " with another row"
    if isinstance(check, AcceptedValuesCheck):
        return f"rows whose {check.column} is not an accepted value"
    return "rows the query returns" if check.query is not None else "rows matching the predicate"


def _reads(check: NotNullCheck | UniqueCheck | AcceptedValuesCheck | SqlCheck) -> str:
    return f"{CURRENT_VIEW}, {CHANGES_VIEW}" if isinstance(check, SqlCheck) and check.query is not None else check.reads.value


def _literal(value: str | int | float | bool) -> str:
    """A YAML value as text for a cast to the column's type (YAML's true is Spark's 'true')."""
    return str(value).lower() if isinstance(value, bool) else str(value)
