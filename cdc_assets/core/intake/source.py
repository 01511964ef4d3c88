"""Reading one business date's extract and turning it into typed, validated rows.

Every row that is read comes out of :func:`validate_records` exactly once, either accepted (typed
values) or rejected (raw record, reason, source file), so rows read = accepted + rejected always holds.
"""

from __future__ import annotations

import re
from typing import cast
from urllib.parse import unquote

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType, DataType, DateType, NumericType, StringType, StructField, StructType, TimestampNTZType, TimestampType,
)

from cdc_assets.model.config import DEBEZIUM_OPERATIONS, INTAKE_COLUMNS, INTERNAL_PREFIX, SourceFormat, TableConfig
from cdc_assets.model.masking import ValueMask
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.intake.encoding import LOSSLESS, SourceEncoding, reason
from cdc_assets.core.intake.debezium import read_debezium
from cdc_assets.core.intake.columns import (
    CHANGE_FLAG, CHANGE_SEQUENCE, FLAG, RAW_LINE, RAW_RECORD, READER_PROBLEM, RECORD_ID, REJECT_REASON, SEQUENCE_PREFIX, SOURCE_FILE,
    TOMBSTONE, TRUNCATE, UNAVAILABLE, UNAVAILABLE_COLUMNS, SourceError, no_input_error, sequence_text_column,
)  # fmt: skip

_CORRUPT = "_corrupt_record"
# RFC 4180 doubles quotes inside quoted fields; Spark's CSV reader escapes with a backslash by default.
CSV_DEFAULTS = {"header": "true", "escape": '"', "mode": "PERMISSIVE"}


def _options(config: TableConfig) -> dict[str, str]:
    if config.source.format is not SourceFormat.csv:
        return {key: str(value) for key, value in config.source.options.items()}
    # A CSV source is read as ISO-8859-1, every byte one character, and decoded from source.encoding
    # afterwards (core/intake/encoding.py); an option's text is matched against the text as read.
    encoding = SourceEncoding(config.source.encoding)
    options = {key: str(value) for key, value in {**CSV_DEFAULTS, **config.source.options}.items()}
    return {**{key: encoding.option_as_read(value) for key, value in options.items()}, "encoding": LOSSLESS}


def _reader(spark: SparkSession, config: TableConfig):
    return spark.read.format(config.source.format.value).options(**_options(config))


def _has_header(config: TableConfig) -> bool:
    return config.source.format is SourceFormat.csv and _options(config).get("header", "true").lower() == "true"


def _header_columns(spark: SparkSession, config: TableConfig, path: str) -> list[str]:
    """The extract's columns as Spark names them: for CSV, from one file's header (a small Spark job)."""
    reader = _reader(spark, config)
    if config.source.format is SourceFormat.csv:
        reader = reader.option("inferSchema", "false")  # the names only: one line, not a pass over the data
    try:
        found = reader.load(path).columns
    except AnalysisException as error:
        # An empty folder cannot have its schema inferred: no input either. (A Spark Connect error
        # subclasses pyspark.errors.AnalysisException too, with the same text.)
        if any(marker in str(error) for marker in ("PATH_NOT_FOUND", "Path does not exist", "UNABLE_TO_INFER_SCHEMA")):
            raise no_input_error(config, path) from None
        raise
    if not found:  # only empty files
        raise no_input_error(config, path)
    return found


def _made_up_names(found: list[str]) -> list[str]:
    """Names Spark may have made up for header fields that were empty (``_c<i>``) or duplicated
    (``<name><i>``), going by the names alone: a header that really says ``f0,f1`` looks the same."""
    suffixed: dict[str, list[str]] = {}
    made_up = []
    for index, name in enumerate(found):
        if name == f"_c{index}":
            made_up.append(name)
        elif name.endswith(str(index)) and len(name) > len(str(index)):
            suffixed.setdefault(name[: -len(str(index))].lower(), []).append(name)
    made_up += [name for names in suffixed.values() if len(names) > 1 for name in names]
    return made_up


def _header_fields(spark: SparkSession, config: TableConfig, path: str, count: int) -> list[str | None]:
    """The first line of the extract as raw fields (a Spark job): what Spark's per-file check compares."""
    schema = StructType([StructField(f"{INTERNAL_PREFIX}field_{index}", StringType()) for index in range(count)])
    rows = _reader(spark, config).option("header", "false").schema(schema).load(path).limit(1).collect()
    return list(rows[0]) if rows else []


def _check_each_header(spark: SparkSession, config: TableConfig, path: str, found: list[str]) -> bool:
    """Whether Spark can check every file's header against ``found`` as it reads them (``enforceSchema:
    false``); if not, whether reading by position is still exact (one file). Otherwise a SourceError.

    Spark's check compares each file's raw header fields with the schema's names. Where Spark made a
    name up (an empty or a duplicated field) the two can never agree, so such a header cannot be
    checked. With a single file there is nothing to check it against; with several, a file with
    another header would be read by position, wrongly and silently.
    """
    made_up = _made_up_names(found)
    if not made_up:
        return True
    files = _reader(spark, config).schema(StructType([StructField("_", StringType())])).load(path).inputFiles()
    if len(files) <= 1:
        return False
    if _header_fields(spark, config, path, len(found)) == found:
        return True  # the header really says these names
    raise SourceError(
        f"table {config.name}: input {path}: the header has empty or duplicate column names, so Spark cannot "
        f"check that the {len(files)} files share one header, and a file whose columns are in another order "
        "would be read wrongly. Give every column a distinct, non-empty name, or land the date as one file.",
        f"Spark names them {made_up} ({len(files)} files).",
    )


# Spark's per-file header check (CSVHeaderChecker, enforceSchema=false) fails a scan with one of these.
_HEADER_MISMATCH = re.compile(
    r"CSV header does not conform to the schema\.\s*Header: (?P<header>[^\n]*)\n\s*Schema: (?P<schema>[^\n]*)"
    r"\n\s*Expected: (?P<expected>.*?) but found: (?P<found>[^\n]*)\n\s*CSV file: (?P<file>\S+)"
    r"|Number of column in CSV header is not equal to number of fields in the schema:\s*"
    r"Header length: (?P<length>\d+), schema size: (?P<size>\d+)\s*CSV file: (?P<file2>\S+)"
)


def header_mismatch(config: TableConfig, error: BaseException) -> SourceError | None:
    """The :class:`SourceError` for ``error`` if it is Spark failing a scan of ``config``'s input because
    a file's header differs from the one the date was read with; else None (re-raise ``error``).

    The check runs as the data is read, so this error comes from the first action on the rows, not
    from :func:`read_source`. Spark's text is found in the error as classic PySpark raises it (the
    Java stack trace, causes included) and through Spark Connect (its server stack trace).
    """
    text = "\n".join(str(part) for part in (error, getattr(error, "getStackTrace", lambda: None)()) if part)
    match = _HEADER_MISMATCH.search(text)
    if match is None:
        return None
    if match["file"]:
        # A file landed without its header shows its first record here, which stays in Dagster's event log: a
        # header that is not all column names is shown as CDC_SHOW_VALUES allows a raw record (model/masking.py).
        mask, names = ValueMask.for_table(config), {name.lower() for name in _source_columns(config)}
        header, found = match["header"], repr(match["found"])
        if not all(field.strip().lower() in names for field in header.split(",")):
            header, found = mask.raw(header), mask.raw(found)
        file, detail = match["file"], (
            f"it lists {header} where {match['schema']} was expected "
            f"(first difference: {found} where {match['expected']!r} was expected)"
        )
    else:
        file, detail = match["file2"], (
            f"it has {match['length']} column(s) where the header the date was read with has {match['size']}"
        )
    return SourceError(
        f"table {config.name}: input file {unquote(file)} does not have the header its date was read with. "
        "The files of one date must list the same columns in the same order.",
        f"The file: {detail}.",
    )


def _source_columns(config: TableConfig) -> list[str]:
    """The columns the extract must have: the configured ones, and a flagged changeset's flag column."""
    names = [column.name for column in config.columns]
    if config.changes is not None and config.change_set.operation_column:
        names.append(config.change_set.operation_column)
    return names


def _taken_for_the_intakes_own(name: str) -> bool:
    """Whether a source column of this name would be taken for one of the intake's own columns.

    Only these are refused in a source's columns: an extra column (``allow_extra_columns``) is dropped
    once the records are validated, so one named like an output column (``key_hash``, ``operation``...)
    changes nothing, while one named like a column the intake reads or writes on the same frame does
    (``__cdc_tombstone`` would make rows vanish uncounted, ``business_date`` would be carried along,
    ``_metadata`` would hide the file name, ``_source_file`` would be overwritten).
    """
    lowered = name.lower()
    return lowered in INTAKE_COLUMNS or lowered.startswith(INTERNAL_PREFIX)


def check_columns(config: TableConfig, found: list[str], path: str) -> None:
    """Configured columns must be present (matched by name); unexpected extra columns are an error, and
    so is any column named like one of the intake's own (:func:`_taken_for_the_intakes_own`)."""
    found_lower = {name.lower() for name in found}
    configured = _source_columns(config)
    missing = [name for name in configured if name.lower() not in found_lower]
    configured_lower = {name.lower() for name in configured}
    # A JSON reader's _corrupt_record is Spark's own: the text of a line it could not parse.
    sparks_own = {_CORRUPT} if config.source.format is SourceFormat.json else set()
    reserved = [
        name for name in found
        if name.lower() not in configured_lower and name not in sparks_own and _taken_for_the_intakes_own(name)
    ]
    extra = [name for name in found if name.lower() not in configured_lower and name not in reserved]
    problems, details = [], []
    if reserved:
        problems.append(
            f"{len(reserved)} column(s) have names the pipeline uses for its own columns (not even allow_extra_columns "
            "admits them): rename them in the extract"
        )
        details.append(f"column(s) named like the pipeline's own {reserved}")
    if missing:
        problems.append(f"missing configured column(s) {missing}")
    if extra and not config.allow_extra_columns:
        problems.append(f"{len(extra)} unexpected column(s) (set allow_extra_columns: true to ignore them)")
        details.append(f"unexpected column(s) {extra}")
    if problems:
        raise SourceError(
            f"table {config.name}: input {path}: " + "; ".join(problems),
            "The header: " + "; ".join([*details, f"found columns {found}"]) + ".",
        )


def read_source(spark: SparkSession, config: TableConfig, business_date: str) -> DataFrame:
    """The day's records as read, with the source file of each row in ``_source_file``.

    CSV columns are read as strings and matched to the config by header name, not position; records
    with the wrong number of fields keep their raw text in ``_corrupt_record``. The header is taken
    from one file (Spark's own header handling, a small job), and Spark checks every file's header
    against it as it reads the rows (``enforceSchema: false``): a file whose columns differ, or are in
    another order, fails the read (see :func:`header_mismatch`) instead of being read by position.
    """
    if config.source.format is SourceFormat.debezium:
        return read_debezium(spark, config, business_date)
    path = config.source.path_for(business_date)
    found = _header_columns(spark, config, path)  # a CSV header as read: ISO-8859-1, see _options
    csv = config.source.format is SourceFormat.csv
    encoding = SourceEncoding(config.source.encoding)
    shown = [encoding.name_as_read(name) for name in found] if csv else found
    # Columns come out named as configured (headers match case-insensitively), so several dates'
    # extracts line up by name even when their headers' case differs. A changeset's flag column
    # comes out as the working column FLAG.
    as_configured = {column.name.lower(): column.name for column in config.columns}
    if config.changes is not None and config.change_set.operation_column:
        as_configured[config.change_set.operation_column.lower()] = FLAG
    if config.source.format is SourceFormat.csv:
        reader = _reader(spark, config).option("columnNameOfCorruptRecord", _CORRUPT)
        if _has_header(config):
            check_columns(config, shown, path)
            # The schema carries the header's own names, which is what Spark's check compares (case
            # as spark.sql.caseSensitive says); the corrupt-record column is left out of the check.
            reader = reader.option("enforceSchema", str(not _check_each_header(spark, config, path, found)).lower())
        else:
            # Without a header the fields are positional, in config order; a record with another
            # number of fields is malformed.
            found = shown = _source_columns(config)
        schema = StructType([StructField(name, StringType()) for name in (*found, _CORRUPT)])
        frame = reader.schema(schema).load(path)
    else:
        check_columns(config, found, path)
        frame = _reader(spark, config).load(path)
    names = [as_configured.get(name.lower(), name) for name in shown]
    renamed = {name: new for name, new in zip(found, names) if new != name}
    if renamed:
        frame = frame.withColumnsRenamed(renamed)
    frame = frame.withColumns({SOURCE_FILE: F.col("_metadata.file_path"), RECORD_ID: F.monotonically_increasing_id()})
    if csv:
        frame = _decoded(frame, config, names, encoding, headerless=not _has_header(config))
    elif config.source.format is SourceFormat.json and _CORRUPT in frame.columns:
        # Spark's JSON reader takes a line with bytes that are not UTF-8 as malformed and keeps its bytes
        # as they are: said so, and kept as ISO-8859-1 like the other formats' (core/intake/encoding.py).
        undecodable = F.col(_CORRUPT).isNotNull() & ~F.is_valid_utf8(F.col(_CORRUPT))
        frame = frame.withColumns(
            {
                READER_PROBLEM: F.when(undecodable, F.lit(reason("the record", encoding))),
                RAW_LINE: F.when(undecodable, F.decode(F.col(_CORRUPT).cast("binary"), LOSSLESS)).otherwise(F.col(_CORRUPT)),
            }
        )
    return frame


def _decoded(frame: DataFrame, config: TableConfig, names: list[str], encoding: SourceEncoding, headerless: bool) -> DataFrame:
    """A CSV source's columns (``names`` and the corrupt record's), read as ISO-8859-1, decoded from
    ``source.encoding`` (core/intake/encoding.py). A record with a value that does not decode gets its reason
    in ``READER_PROBLEM`` (and its values NULL); ``RAW_LINE`` holds its fields as read, or a malformed
    record's text as read, so that the raw record shows the source's bytes, never a replacement."""
    if encoding.is_lossless:
        return frame
    if headerless and encoding.is_utf8:  # each file's first record starts with the file's byte order mark, if any
        frame = frame.withColumn(names[0], encoding.without_byte_order_mark(F.col(names[0])))
    texts = [*names, _CORRUPT]
    prepared = {name: f"{INTERNAL_PREFIX}prepared_{index}" for index, name in enumerate(texts)}
    undecodable = {name: f"{INTERNAL_PREFIX}undecodable_{index}" for index, name in enumerate(texts)}
    if encoding.is_utf8:
        # UTF-8: prepared() gives a column (None is for other encodings).
        frame = frame.withColumns({prepared[name]: cast(F.Column, encoding.prepared(F.col(name))) for name in texts})

    def prepared_of(name: str) -> F.Column | None:
        return F.col(prepared[name]) if encoding.is_utf8 else None

    frame = frame.withColumns({undecodable[name]: encoding.undecodable(F.col(name), prepared_of(name)) for name in texts})
    shown = {FLAG: config.change_set.operation_column} if config.changes is not None and config.change_set.operation_column else {}
    as_read = F.coalesce(F.col(_CORRUPT), F.to_json(F.struct(*(F.col(name).alias(shown.get(name, name)) for name in names))))
    what = {name: f"column {shown.get(name, name)}" for name in names}
    problem = F.lit(None).cast("string")
    for name in reversed([_CORRUPT, *names]):  # the malformed record's text first, then the columns in order
        problem = F.when(F.col(undecodable[name]), F.lit(reason(what.get(name, "the record"), encoding))).otherwise(problem)
    any_undecodable = F.lit(False)
    for name in texts:
        any_undecodable = any_undecodable | F.col(undecodable[name])

    def decoded(name: str) -> F.Column:
        return F.when(~F.col(undecodable[name]), encoding.decoded(F.col(name), prepared_of(name)))

    frame = frame.withColumns(
        {
            **{name: decoded(name) for name in texts},
            READER_PROBLEM: problem,
            RAW_LINE: F.when(any_undecodable, as_read).otherwise(decoded(_CORRUPT)),
        }
    )
    return frame.drop(*prepared.values(), *undecodable.values())  # (dropping a column a frame lacks does nothing)


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
    key column. A changeset's record also carries ``change_flag`` (I, U, D, or T for a truncate, which
    has no key) and ``change_sequence`` (a struct of the sequence values); an unknown flag or a NULL
    sequence value makes it bad, and so does anything the reader found wrong (Debezium).

    Built in projections that refer to each other's columns: every value is cast once, a cheap boolean
    decides whether a row is bad, and only bad rows pay for the wording of their reason and their raw
    text. Spark keeps projections apart rather than repeat a non-trivial expression, so nothing below
    is evaluated twice per row.
    """
    working = {FLAG, TOMBSTONE, READER_PROBLEM, RAW_LINE, UNAVAILABLE, _CORRUPT}
    carried = [name for name in (SOURCE_FILE, RECORD_ID, BUSINESS_DATE, TOMBSTONE) if name in raw.columns]
    raw_columns = [
        name for name in raw.columns
        if name not in (*carried, *working) and not name.startswith(SEQUENCE_PREFIX)
    ]
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
    changes = change_columns(config, raw, typed_alias) if config.changes is not None else {}
    if changes:
        typed = typed.withColumns({f"{INTERNAL_PREFIX}{name}": value for name, value in changes.items()})
    candidates: list[tuple[F.Column, F.Column]] = []
    if READER_PROBLEM in raw.columns:
        candidates.append((F.col(READER_PROBLEM).isNotNull(), F.col(READER_PROBLEM)))
    if has_corrupt:
        candidates.append((F.col(_CORRUPT).isNotNull(), F.lit(f"malformed record: expected {len(raw_columns)} fields")))
    if changes:
        candidates += change_problems(config, raw, F.col(f"{INTERNAL_PREFIX}{CHANGE_FLAG}"))
    source_types = {field.name.lower(): field.dataType for field in raw.schema.fields}
    for column in config.columns:
        value = F.col(typed_alias[column.name])
        candidates.append(_cast_problem(column.name, column.type, source[column.name], value, source_types[column.name.lower()]))
    # A truncate (Debezium op t) names no key: it applies to every key.
    keyed = F.col(f"{INTERNAL_PREFIX}{CHANGE_FLAG}").isNull() | (F.col(f"{INTERNAL_PREFIX}{CHANGE_FLAG}") != TRUNCATE) if changes else F.lit(True)
    for key in config.keys:
        text = source[key.name].cast("string")
        candidates.append((keyed & (text.isNull() | (F.trim(text) == "")), F.lit(f"key column {key.name} is NULL or empty")))
    if changes:
        candidates += sequence_problems(config, raw, typed_alias)
    is_bad = F.lit(False)
    for condition, _ in candidates:
        is_bad = is_bad | condition
    if TOMBSTONE in raw.columns:  # a tombstone line is neither a record nor bad: it is counted apart
        is_bad = F.coalesce(~F.col(TOMBSTONE), F.lit(True)) & is_bad
    bad_alias = f"{INTERNAL_PREFIX}is_bad"
    flagged = typed.withColumn(bad_alias, is_bad)
    raw_record = F.col(RAW_LINE) if RAW_LINE in raw.columns else F.col(_CORRUPT) if has_corrupt else F.lit(None).cast("string")
    raw_fields = [F.col(f"`{name}`") for name in raw_columns]
    if FLAG in raw.columns and config.change_set.operation_column:
        raw_fields.insert(0, F.col(FLAG).alias(config.change_set.operation_column))
    raw_json = F.to_json(F.struct(*raw_fields))
    return flagged.select(
        *(F.col(typed_alias[name]).alias(name) for name in typed_alias),
        *(F.col(f"{INTERNAL_PREFIX}{name}").alias(name) for name in changes),
        *([F.col(UNAVAILABLE).alias(UNAVAILABLE_COLUMNS)] if UNAVAILABLE in raw.columns else []),
        F.when(F.col(bad_alias), _first_reason(candidates)).alias(REJECT_REASON),
        # Only rejected rows keep their raw text; good rows would just carry it around.
        F.when(F.col(bad_alias), F.coalesce(raw_record, raw_json)).alias(RAW_RECORD),
        *carried,
    )


# Source types whose values a cast can be checked on by casting back (a typed source: Parquet, JSON numbers).
_ATOMIC = (NumericType, BooleanType, DateType, TimestampType, TimestampNTZType)


def _cast_problem(name: str, target: str, source: F.Column, typed: F.Column, source_type: DataType) -> tuple[F.Column, F.Column]:
    """The condition and reason of a value that does not cast to its column's type, or casts with a loss.

    A text value (CSV, Debezium, a JSON string) is bad when ``try_cast`` gives NULL, as Spark's ANSI cast
    refuses '3.7' for an int; a decimal's extra digits, which the cast rounds away, make it bad too. A typed
    value (Parquet, a JSON number or boolean) is bad when the cast overflows (NULL) or loses anything:
    cast back to the source's type, it differs from the value read (``lossy_cast``). A widening cast
    (int to bigint, float to double, int to a decimal that holds it, a decimal to one with more digits)
    casts back to the same value, and so does any value into a string column (its exact text).
    """
    shown = source.cast("string")
    if isinstance(source_type, _ATOMIC):
        kind = source_type.simpleString()
        lost = typed.isNull() | ~typed.try_cast(kind).eqNullSafe(source)
        reason = F.concat(F.lit(f"lossy_cast: column {name}, from {kind} to {target}: value '"), shown, F.lit("'"))
        return source.isNotNull() & lost, reason
    invalid = source.isNotNull() & typed.isNull()
    reason = F.concat(F.lit(f"column {name}: value '"), shown, F.lit(f"' is not a valid {target}"))
    wide = _wider_decimal(target) if isinstance(source_type, StringType) else None
    if wide is None:
        return invalid, reason
    # The text read with more decimal places than the column has: a rounded value differs from it.
    rounded = typed.isNotNull() & ~typed.try_cast(wide).eqNullSafe(source.try_cast(wide))
    rounded_reason = F.concat(F.lit(f"lossy_cast: column {name}, from string to {target}: value '"), shown, F.lit("' has more decimal places"))
    return invalid | rounded, F.when(invalid, reason).otherwise(rounded_reason)


def _wider_decimal(target: str) -> str | None:
    """``decimal(38, s')`` with the target's integer digits and every spare digit as a decimal place, for a
    decimal target that has a spare digit; else None."""
    match = re.fullmatch(r"\s*decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*", target.lower())
    if match is None:
        return None
    precision, scale = int(match[1]), int(match[2])
    return f"decimal(38,{scale + 38 - precision})" if precision < 38 else None


def change_columns(config: TableConfig, raw: DataFrame, typed_alias: dict[str, str]) -> dict[str, F.Column]:
    """``change_flag`` (I/U/D/T, NULL for a value the config does not list) and ``change_sequence``."""
    flag = F.col(FLAG).cast("string")
    if config.source.format is SourceFormat.debezium:
        pairs: list[tuple[str, str]] = list(DEBEZIUM_OPERATIONS.items())
    else:
        changes = config.change_set
        pairs = [
            *((value, "I") for value in changes.insert_values),
            *((value, "U") for value in changes.update_values),
            *((value, "D") for value in changes.delete_values),
        ]
    normalized = F.lit(None).cast("string")
    for value, meaning in reversed(list(pairs)):
        normalized = F.when(flag == F.lit(value), F.lit(meaning)).otherwise(normalized)
    if config.source.format is SourceFormat.debezium:
        # Envelope fields are integers (LSN, ts_ms, pos, SCN) or text (a binlog file name): each is
        # kept as a number when it is one, else as text, so integers compare as numbers.
        fields = []
        for index, path in enumerate(config.change_set.sequence_columns):
            text = F.col(sequence_text_column(index)).cast("string")
            number = F.expr(f"try_cast({sequence_text_column(index)} AS decimal(38,0))")
            fields.append(
                F.struct(number.alias("number"), F.when(number.isNull(), text).alias("text")).alias(_field_name(path))
            )
        sequence = F.struct(*fields)
    else:
        sequence = F.struct(*(F.col(typed_alias[name]).alias(name) for name in config.sequence_column_names))
    return {CHANGE_FLAG: normalized, CHANGE_SEQUENCE: sequence}


def _field_name(path: str) -> str:
    return path.replace(".", "_")


def change_problems(config: TableConfig, raw: DataFrame, normalized_flag: F.Column) -> list[tuple[F.Column, F.Column]]:
    if config.source.format is SourceFormat.debezium:
        allowed = ", ".join(DEBEZIUM_OPERATIONS)
        what = "op"
    else:
        changes = config.change_set
        allowed = ", ".join([*changes.insert_values, *changes.update_values, *changes.delete_values])
        what = f"flag column {changes.operation_column}"
    found = F.coalesce(F.col(FLAG).cast("string"), F.lit("NULL"))
    return [(normalized_flag.isNull(), F.concat(F.lit(f"{what}: value '"), found, F.lit(f"' is not one of {allowed}")))]


def sequence_problems(config: TableConfig, raw: DataFrame, typed_alias: dict[str, str]) -> list[tuple[F.Column, F.Column]]:
    if config.source.format is SourceFormat.debezium:
        return [
            (F.col(sequence_text_column(index)).isNull(), F.lit(f"sequence field {path} is missing or NULL"))
            for index, path in enumerate(config.change_set.sequence_columns)
        ]
    return [
        (F.col(typed_alias[name]).isNull(), F.lit(f"sequence column {name} is NULL"))
        for name in config.sequence_column_names
    ]


def is_tombstone(frame: DataFrame) -> F.Column:
    return F.coalesce(F.col(TOMBSTONE), F.lit(False)) if TOMBSTONE in frame.columns else F.lit(False)


def _not_tombstone(validated: DataFrame) -> F.Column:
    return ~is_tombstone(validated)


def accepted_records(validated: DataFrame) -> DataFrame:
    accepted = validated.filter(F.col(REJECT_REASON).isNull() & _not_tombstone(validated))
    return accepted.drop(REJECT_REASON, RAW_RECORD, SOURCE_FILE, RECORD_ID, TOMBSTONE)


def rejected_records(validated: DataFrame) -> DataFrame:
    dated = [BUSINESS_DATE] if BUSINESS_DATE in validated.columns else []
    return validated.filter(F.col(REJECT_REASON).isNotNull()).select(
        F.col(RAW_RECORD).alias("raw_record"),
        F.col(REJECT_REASON).alias("reason"),
        F.col(SOURCE_FILE).alias("source_file"),
        *dated,
    )
