"""Reading one business date's extract and turning it into typed, validated rows.

Every row that is read comes out of :func:`validate_records` exactly once, either accepted (typed
values) or rejected (raw record, reason, source file), so rows read = accepted + rejected always holds.
"""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_assets.config import INTERNAL_PREFIX, SourceFormat, TableConfig
from cdc_assets.core.csv_header import can_read_header, read_csv_header

SOURCE_FILE = "_source_file"
RAW_RECORD = "_raw_record"
REJECT_REASON = "_reject_reason"
RECORD_ID = "_record_id"  # increases in file order within each file; ranks give record numbers
# The date a row belongs to when several dates' rows travel in one DataFrame (a range run). The same
# name as the warehouse's partition column, so such a frame is written partitioned by it as it is.
BUSINESS_DATE = "business_date"
_CORRUPT = "_corrupt_record"
# RFC 4180 doubles quotes inside quoted fields; Spark's CSV reader escapes with a backslash by default.
CSV_DEFAULTS = {"header": "true", "escape": '"', "mode": "PERMISSIVE"}


class SourceError(RuntimeError):
    """The day's input cannot be used as a whole: missing, or its columns do not match the config."""


def _options(config: TableConfig) -> dict[str, str]:
    options = {**CSV_DEFAULTS, **config.source.options} if config.source.format is SourceFormat.csv else config.source.options
    return {key: str(value) for key, value in options.items()}


def _reader(spark: SparkSession, config: TableConfig):
    return spark.read.format(config.source.format.value).options(**_options(config))


def _header_columns(spark: SparkSession, config: TableConfig, path: str) -> list[str]:
    no_input = SourceError(
        f"table {config.name}: no input at {path}. A missing extract is never treated as an empty one; "
        "land the file or fix source.path."
    )
    options = _options(config)
    try:
        if config.source.format is SourceFormat.csv and can_read_header(spark, options):
            # Spark lists the files (a schema spares its inference job); the driver reads the header.
            files = _reader(spark, config).schema("`_` string").load(path).inputFiles()
            found = read_csv_header(spark, files, options)
            if not found:
                raise no_input
            return found
        return _reader(spark, config).load(path).columns
    except AnalysisException as error:
        # An empty folder (or only empty files) cannot have its schema inferred: no input either.
        if any(marker in str(error) for marker in ("PATH_NOT_FOUND", "Path does not exist", "UNABLE_TO_INFER_SCHEMA")):
            raise no_input from None
        raise


def check_columns(config: TableConfig, found: list[str], path: str) -> None:
    """Configured columns must be present (matched by name); unexpected extra columns are an error."""
    found_lower = {name.lower() for name in found}
    configured = [column.name for column in config.columns]
    missing = [name for name in configured if name.lower() not in found_lower]
    configured_lower = {name.lower() for name in configured}
    extra = [name for name in found if name.lower() not in configured_lower]
    problems = []
    if missing:
        problems.append(f"missing configured column(s) {missing}")
    if extra and not config.allow_extra_columns:
        problems.append(f"unexpected column(s) {extra} (set allow_extra_columns: true to ignore them)")
    if problems:
        raise SourceError(f"table {config.name}: input {path}: " + "; ".join(problems) + f"; found columns {found}")


def read_source(spark: SparkSession, config: TableConfig, business_date: str) -> DataFrame:
    """The day's records as read, with the source file of each row in ``_source_file``.

    CSV columns are read as strings and matched to the config by header name, not position; records
    with the wrong number of fields keep their raw text in ``_corrupt_record``.
    """
    path = config.source.path_for(business_date)
    found = _header_columns(spark, config, path)
    # Columns come out named as configured (headers match case-insensitively), so several dates'
    # extracts line up by name even when their headers' case differs.
    as_configured = {column.name.lower(): column.name for column in config.columns}
    if config.source.format is SourceFormat.csv:
        if str(config.source.options.get("header", "true")).lower() == "true":
            check_columns(config, found, path)
            found = [as_configured.get(name.lower(), name) for name in found]
        else:
            # Without a header the fields are positional, in config order; a record with another
            # number of fields is malformed.
            found = [column.name for column in config.columns]
        schema = ", ".join(f"`{name}` string" for name in found) + f", `{_CORRUPT}` string"
        frame = _reader(spark, config).option("columnNameOfCorruptRecord", _CORRUPT).schema(schema).load(path)
    else:
        check_columns(config, found, path)
        frame = _reader(spark, config).load(path)
        frame = frame.withColumnsRenamed({name: as_configured[name.lower()] for name in found if name.lower() in as_configured})
    return frame.withColumns({SOURCE_FILE: F.col("_metadata.file_path"), RECORD_ID: F.monotonically_increasing_id()})


def _first_reason(candidates: list[tuple[F.Column, F.Column]]) -> F.Column:
    """The reason of the first failing condition, or NULL when none fails."""
    reason = F.lit(None).cast("string")
    for condition, text in reversed(candidates):
        reason = F.when(condition, text).otherwise(reason)
    return reason


def validate_records(raw: DataFrame, config: TableConfig) -> DataFrame:
    """Typed configured columns plus ``_reject_reason`` (NULL for a good row), ``_raw_record``, ``_source_file``.

    A record is bad when it has the wrong number of fields, a value that does not cast to its configured
    type (``try_cast``, so ANSI mode does not abort the whole job on the first one), or a NULL or empty
    key column.

    Built in projections that refer to each other's columns: every value is cast once, a cheap boolean
    decides whether a row is bad, and only bad rows pay for the wording of their reason and their raw
    text. Spark keeps projections apart rather than repeat a non-trivial expression, so nothing below
    is evaluated twice per row.
    """
    carried = [name for name in (SOURCE_FILE, RECORD_ID, BUSINESS_DATE) if name in raw.columns]
    raw_columns = [name for name in raw.columns if name not in (*carried, _CORRUPT)]
    by_lower = {name.lower(): name for name in raw_columns}
    has_corrupt = _CORRUPT in raw.columns
    source = {column.name: F.col(f"`{by_lower[column.name.lower()]}`") for column in config.columns}
    typed_alias = {column.name: f"{INTERNAL_PREFIX}typed_{index}" for index, column in enumerate(config.columns)}
    typed = raw.withColumns(
        {
            typed_alias[column.name]: F.expr(f"try_cast(`{by_lower[column.name.lower()]}` AS {column.type})")
            for column in config.columns
        }
    )
    candidates: list[tuple[F.Column, F.Column]] = []
    if has_corrupt:
        candidates.append((F.col(_CORRUPT).isNotNull(), F.lit(f"malformed record: expected {len(raw_columns)} fields")))
    for column in config.columns:
        value = F.col(typed_alias[column.name])
        candidates.append(
            (
                source[column.name].isNotNull() & value.isNull(),
                F.concat(
                    F.lit(f"column {column.name}: value '"),
                    source[column.name].cast("string"),
                    F.lit(f"' is not a valid {column.type}"),
                ),
            )
        )
    for key in config.keys:
        text = source[key.name].cast("string")
        candidates.append((text.isNull() | (F.trim(text) == ""), F.lit(f"key column {key.name} is NULL or empty")))
    is_bad = F.lit(False)
    for condition, _ in candidates:
        is_bad = is_bad | condition
    bad_alias = f"{INTERNAL_PREFIX}is_bad"
    flagged = typed.withColumn(bad_alias, is_bad)
    raw_record = F.col(_CORRUPT) if has_corrupt else F.lit(None).cast("string")
    raw_json = F.to_json(F.struct(*(F.col(f"`{name}`") for name in raw_columns)))
    return flagged.select(
        *(F.col(typed_alias[name]).alias(name) for name in typed_alias),
        F.when(F.col(bad_alias), _first_reason(candidates)).alias(REJECT_REASON),
        # Only rejected rows keep their raw text; good rows would just carry it around.
        F.when(F.col(bad_alias), F.coalesce(raw_record, raw_json)).alias(RAW_RECORD),
        *carried,
    )


def accepted_records(validated: DataFrame) -> DataFrame:
    return validated.filter(F.col(REJECT_REASON).isNull()).drop(REJECT_REASON, RAW_RECORD, SOURCE_FILE, RECORD_ID)


def rejected_records(validated: DataFrame) -> DataFrame:
    dated = [BUSINESS_DATE] if BUSINESS_DATE in validated.columns else []
    return validated.filter(F.col(REJECT_REASON).isNotNull()).select(
        F.col(RAW_RECORD).alias("raw_record"),
        F.col(REJECT_REASON).alias("reason"),
        F.col(SOURCE_FILE).alias("source_file"),
        *dated,
    )
