"""Reading a day's Debezium change events (``source.format: debezium``) as text columns for validation.

Accepted input: JSON lines, one Debezium change event per line, either bare (``{"before", "after",
"source", "op", "ts_ms", ...}``) or wrapped by Kafka Connect's JsonConverter with schemas enabled
(``{"schema": {...}, "payload": {...}}``); the form is decided per line. A line that is JSON ``null``
(the Kafka tombstone that follows a delete) or blank is a tombstone.

:func:`read_debezium` turns every line into one row of text, decoded from Debezium's default
encodings so that ``try_cast(text AS <configured type>)`` gives the value:

* The row's values come from ``after`` for op c, u and r, from ``before`` for op d (the columns a
  key-only ``before`` lacks are NULL), and are all NULL for op t (truncate). Column names match the
  configured ones case-insensitively.
* ``date``/``timestamp``: days since the epoch (``io.debezium.time.Date``, Connect ``Date``) become
  'YYYY-MM-DD'; epoch milli-, micro- and nanoseconds (``Timestamp``, ``MicroTimestamp``,
  ``NanoTimestamp``, Connect ``Timestamp``) become 'YYYY-MM-DD HH:MM:SS.ffffff' (the session time
  zone, UTC; nanoseconds rounded down to the microsecond), within 0001-01-01..9999-12-31. A number
  without a logical type is days for a ``date`` column and, for a ``timestamp`` column, in
  ``source.options.timestamp_unit`` (millis|micros). Strings (ISO, ``ZonedTimestamp``) pass through
  unchanged: Spark's cast reads them, offsets and up to nine fraction digits included.
* ``decimal``: string and double handling modes pass through; precise mode (base64 of the unscaled
  two's-complement integer, Connect ``Decimal`` with its scale in the embedded schema, or Debezium's
  self-describing ``VariableScaleDecimal``) is decoded with SQL functions, up to decimal(38).
* Anything else: the JSON value's text (a number's text, an object's compact JSON).
* A non-key value that is ``changes.unavailable_value_placeholder`` (PostgreSQL's unchanged TOASTed
  column, ``__debezium_unavailable_value`` by default) in a c, u or r event is no value: NULL, and
  the column is named in ``__cdc_unavailable`` (validation carries it as ``unavailable_columns``;
  the CDC step keeps the column's previous value, see core/capture/changeset.py).

Working columns: ``__cdc_flag`` (the op as found), ``__cdc_sequence_<i>`` (text of each
``changes.sequence_columns`` envelope field), ``__cdc_unavailable`` (array, NULL if none),
``__cdc_tombstone``, ``__cdc_bad`` (why the line cannot be used, else NULL), ``__cdc_raw_line``, plus
``_source_file`` and ``_record_id`` as for other formats.

Left to validation: unknown or missing flags, missing sequences, values that do not cast to their
configured type, NULL keys, and what to do with tombstones and bad lines. This module only says
why a line is unusable when the reason is lost once decoded: not a JSON object (or a field of an
unexpected JSON type), no op, no row for the op or a row without a configured column, a precise
decimal that is not base64 or is beyond decimal(38), a temporal number out of range or of unknown
unit, and a logical type (from an embedded schema) the column's type does not take: a date or
timestamp column takes Date, Timestamp, MicroTimestamp, NanoTimestamp and ZonedTimestamp (not
MicroTime, NanoTime, Time, ZonedTime, Year, ...), a decimal column Decimal and VariableScaleDecimal,
and no other column either of those two.
"""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StringType, StructField, StructType

from cdc_assets.model.config import INTERNAL_PREFIX, Column, TableConfig
from cdc_assets.core.intake.encoding import LOSSLESS, SourceEncoding, reason
from cdc_assets.core.intake.columns import (
    FLAG,
    RAW_LINE,
    RECORD_ID,
    SEQUENCE_PREFIX,
    SOURCE_FILE,
    TOMBSTONE,
    UNAVAILABLE,
    SourceError,
    no_input_error,
)
from cdc_assets.core.intake.columns import READER_PROBLEM as BAD


# Logical type names (the embedded schema's "name") and the unit of their numbers.
_DATE_NAMES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_TIME_UNITS = {
    **{name: "days" for name in _DATE_NAMES},
    "io.debezium.time.Timestamp": "millis",
    "org.apache.kafka.connect.data.Timestamp": "millis",
    "io.debezium.time.MicroTimestamp": "micros",
    "io.debezium.time.NanoTimestamp": "nanos",
}
_CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"  # {"scale": s, "value": base64}
# A date or timestamp column takes the logical types above and ISO strings; any other (MicroTime,
# NanoTime, Time, ZonedTime, Year, ...) would be read in a unit it is not in: a bad record instead.
_TEMPORAL_LOGICAL = (*_TIME_UNITS, "io.debezium.time.ZonedTimestamp")
# What Spark's date and timestamp types hold: 0001-01-01 to 9999-12-31 (days / microseconds since the epoch).
_DAYS_RANGE = (-719_162, 2_932_896)
_MICROS_RANGE = (-62_135_596_800_000_000, 253_402_300_799_999_999)
_TIMESTAMP_TEXT = "yyyy-MM-dd HH:mm:ss.SSSSSS"
# A precise decimal's magnitude is summed in chunks of 14 hex digits (56 bits): conv() handles 64-bit
# numbers only, and every chunk times its place value stays within decimal(38,0) until the total does not.
_CHUNK_HEX_DIGITS = 14
_CHUNK_PLACE = 1 << (4 * _CHUNK_HEX_DIGITS)
_ENVELOPE_ROWS = ("before", "after")
_WRAPPED_NULL = r'^\s*\{\s*(?:"schema"\s*:\s*null\s*,\s*)?"payload"\s*:\s*null\s*(?:,\s*"schema"\s*:\s*null\s*)?\}\s*$'
_CORRUPT = f"{INTERNAL_PREFIX}corrupt"
_WORK = f"{INTERNAL_PREFIX}dbz_"  # prefix of this module's intermediate columns
_WRAPPED = f"{_WORK}wrapped"  # TRUE for a {"schema", "payload"} line, else NULL

# The part of the embedded schema that is read: each envelope field's sub-fields with logical name
# and parameters (a Decimal's scale). The rest of the schema (types, defaults, ...) is skipped.
_COLUMN_SCHEMA = StructType(
    [
        StructField("field", StringType()),
        StructField("name", StringType()),
        StructField("parameters", MapType(StringType(), StringType())),
    ]
)
_SCHEMA_SECTION = StructType(
    [
        StructField(
            "fields",
            ArrayType(
                StructType([StructField("field", StringType()), StructField("fields", ArrayType(_COLUMN_SCHEMA))])
            ),
        )
    ]
)


def sequence_columns(config: TableConfig) -> list[str]:
    """The working columns holding ``config.changes.sequence_columns``' texts, in order."""
    count = len(config.changes.sequence_columns) if config.changes else 0
    return [f"{SEQUENCE_PREFIX}{index}" for index in range(count)]


def _envelope_tree(config: TableConfig) -> dict:
    """The payload fields to parse as a tree: a dict per JSON object, None for a value read as text.

    ``before``/``after`` are parsed as maps (column names are matched case-insensitively, which a
    struct field of from_json does not do); a sequence field inside them is a column of the row.
    """
    tree: dict = {"op": None}
    for path in config.changes.sequence_columns if config.changes else []:
        parts = path.split(".")
        if parts[0] in _ENVELOPE_ROWS:
            if len(parts) != 2:
                raise SourceError(
                    f"table {config.name}: changes.sequence_columns {path!r}: a field of {parts[0]} must be a "
                    f"column of the row ({parts[0]}.<column>)"
                )
            continue
        if parts[0] in ("schema", "payload"):
            raise SourceError(
                f"table {config.name}: changes.sequence_columns {path!r}: paths are relative to the event's "
                "payload; schema and payload are the wrapper's fields"
            )
        node = tree
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if part in node and (node[part] is None) != last:
                raise SourceError(
                    f"table {config.name}: changes.sequence_columns {path!r} conflicts with another sequence "
                    "field: one is inside the other"
                )
            if last:
                node[part] = None
            else:
                node = node.setdefault(part, {})
    return tree


def _struct_type(tree: dict) -> StructType:
    return StructType(
        [StructField(name, StringType() if sub is None else _struct_type(sub)) for name, sub in tree.items()]
    )


def _line_schema(config: TableConfig) -> StructType:
    """One schema for both forms: a bare event's fields at the top, a wrapped one's under payload."""
    row = MapType(StringType(), StringType())
    payload: list[StructField] = [
        StructField("before", row),
        StructField("after", row),
        *_struct_type(_envelope_tree(config)).fields,
    ]
    return StructType(
        [
            *payload,
            StructField("schema", _SCHEMA_SECTION),
            StructField("payload", StructType(payload)),
            StructField(_CORRUPT, StringType()),
        ]
    )


def _read_lines(spark: SparkSession, config: TableConfig, path: str) -> DataFrame:
    try:
        lines = spark.read.text(path)
        files = lines.inputFiles()  # through Spark Connect a missing path surfaces here, not above
    except AnalysisException as error:
        if any(marker in str(error) for marker in ("PATH_NOT_FOUND", "Path does not exist")):
            raise no_input_error(config, path) from None
        raise
    if not files:
        raise no_input_error(config, path)
    return lines


_LINE, _UNDECODABLE, _AS_READ = f"{_WORK}line", f"{_WORK}undecodable", f"{_WORK}as_read"


def _decoded_lines(lines: DataFrame, encoding: SourceEncoding) -> DataFrame:
    """Each line decoded from ``source.encoding`` (core/intake/encoding.py) in ``_LINE``, whether it has bytes
    that are not valid in it in ``_UNDECODABLE``, and for such a line its bytes as ISO-8859-1 in
    ``_AS_READ`` (its raw record); with ``_source_file`` and ``_record_id``.

    The text reader does not decode: a line's string holds the file's bytes as they are, so UTF-8 is
    checked on it directly (a U+FFFD is one only where the source sent one)."""
    value = F.col("value")
    read = {SOURCE_FILE: F.col("_metadata.file_path"), RECORD_ID: F.monotonically_increasing_id()}
    if encoding.is_utf8:
        valid = F.is_valid_utf8(value)
        return lines.select(
            value.alias(_LINE),
            (~valid).alias(_UNDECODABLE),
            F.when(~valid, F.decode(value.cast("binary"), LOSSLESS)).alias(_AS_READ),
            *(column.alias(name) for name, column in read.items()),
        )
    as_read = lines.select(
        F.decode(value.cast("binary"), LOSSLESS).alias(_AS_READ), *(column.alias(name) for name, column in read.items())
    )
    text = F.col(_AS_READ)
    return as_read.select(
        encoding.decoded(text, None).alias(_LINE), encoding.undecodable(text, None).alias(_UNDECODABLE), text, *read
    )


def _first_reason(candidates: list[tuple[SparkColumn, SparkColumn]]) -> SparkColumn:
    """The reason of the first condition that holds, or NULL."""
    reason = F.lit(None).cast("string")
    for condition, text in reversed(candidates):
        reason = F.when(condition, text).otherwise(reason)
    return reason


def _quoted(value: SparkColumn) -> SparkColumn:
    return F.concat(F.lit("'"), value, F.lit("'"))


class _Decoder:
    """How one configured column's text is found and decoded, in stages that each read the previous
    stage's columns: Spark keeps projections apart rather than evaluate a non-trivial expression twice,
    so every intermediate value is computed once per row."""

    def __init__(self, index: int, column: Column, config: TableConfig):
        self.column, self.config = column, config
        self.prefix = f"{_WORK}{index}_"
        self.text = F.col(self.name("text"))  # the value as found in the event
        self.logical = F.col(self.name("logical"))  # its logical type name, from an embedded schema
        self.scale = F.col(self.name("scale"))  # its Decimal scale parameter, from an embedded schema

    def name(self, what: str) -> str:
        return f"{self.prefix}{what}"

    def col(self, what: str) -> SparkColumn:
        return F.col(self.name(what))

    needs_logical_type = False  # whether the embedded schema's logical type name and scale are looked up

    def stages(self) -> list[dict[str, SparkColumn]]:
        """Intermediate columns, stage by stage."""
        return []

    def decoded(self) -> SparkColumn:
        return self.text

    def problem(self) -> SparkColumn | None:
        """Why the row is unusable because of this column (NULL if it is not), or None if it never is."""
        return None

    def reason(self, text: SparkColumn) -> SparkColumn:
        return F.concat(F.lit(f"column {self.column.name}: value "), _quoted(self.text), text)

    def unsupported_logical(self, supported: tuple[str, ...]) -> SparkColumn:
        """Whether the embedded schema gives the value a logical type this column cannot read."""
        return self.logical.isNotNull() & ~self.logical.isin(*supported)

    def unsupported_reason(self) -> SparkColumn:
        return self.reason(
            F.concat(
                F.lit(" has logical type "), _quoted(self.logical), F.lit(f", which a {self.column.type} column does not take")
            )
        )


class _PlainDecoder(_Decoder):
    """Any other column: the value's text; a decimal's encoding (its scale is in the schema) is refused."""

    needs_logical_type = True

    def problem(self) -> SparkColumn:
        decimal = self.logical.isin(_CONNECT_DECIMAL, _VARIABLE_SCALE_DECIMAL)
        return F.when(decimal, self.unsupported_reason())


class _TemporalDecoder(_Decoder):
    """date and timestamp columns: numbers are days or epoch units, strings pass through."""

    needs_logical_type = True

    def stages(self) -> list[dict[str, SparkColumn]]:
        unit = F.lit(None).cast("string")
        for logical, logical_unit in _TIME_UNITS.items():
            unit = F.when(self.logical == logical, logical_unit).otherwise(unit)
        default = "days" if self.column.type == "date" else self.config.source.options.get("timestamp_unit")
        unit = F.coalesce(unit, F.lit(str(default) if default is not None else "unknown"))
        is_number = self.text.rlike("^-?[0-9]+$")
        number, kind = self.col("number"), self.col("kind")
        micros = (
            F.when(kind == "millis", F.try_multiply(number, F.lit(1000)))
            .when(kind == "micros", number)
            # floor division, so that a time before 1970 keeps its microsecond and drops the rest
            .when(kind == "nanos", F.floor(number.cast("decimal(20,0)") / 1000).cast("bigint"))
        )
        return [
            {
                self.name("kind"): F.when(self.unsupported_logical(_TEMPORAL_LOGICAL), F.lit("unsupported"))
                .when(is_number, unit)
                .when(self.text.isNotNull(), F.lit("text")),
                self.name("number"): F.when(is_number, self.text.try_cast("bigint")),
            },
            {self.name("micros"): micros},
        ]

    def decoded(self) -> SparkColumn:
        kind, number, micros = self.col("kind"), self.col("number"), self.col("micros")
        days = F.when(number.between(*_DAYS_RANGE), F.date_add(F.lit("1970-01-01").cast("date"), number.cast("int")))
        instant = F.when(micros.between(*_MICROS_RANGE), F.date_format(F.timestamp_micros(micros), _TIMESTAMP_TEXT))
        # A value that cannot be decoded keeps its text: it is never silently NULL (and it is bad, see problem()).
        return F.coalesce(
            F.when(kind == "days", days.cast("string")).when(~kind.isin("text", "unsupported"), instant), self.text
        )

    def problem(self) -> SparkColumn:
        kind, number, micros = self.col("kind"), self.col("number"), self.col("micros")
        in_range = F.when(kind == "days", number.between(*_DAYS_RANGE)).otherwise(micros.between(*_MICROS_RANGE))
        return _first_reason(
            [
                (kind == "unsupported", self.unsupported_reason()),
                (
                    kind == "unknown",
                    self.reason(
                        F.lit(
                            " is a number of unknown unit (no logical type in an embedded schema): set "
                            "source.options.timestamp_unit (millis or micros)"
                        )
                    ),
                ),
                (
                    kind.isin("days", "millis", "micros", "nanos") & F.coalesce(~in_range, F.lit(True)),
                    self.reason(F.concat(F.lit(" ("), kind, F.lit(") is outside 0001-01-01..9999-12-31"))),
                ),
            ]
        )


class _DecimalDecoder(_Decoder):
    """decimal columns: precise-mode base64 is decoded, string and double modes pass through."""

    needs_logical_type = True

    def stages(self) -> list[dict[str, SparkColumn]]:
        variable = (self.logical == _VARIABLE_SCALE_DECIMAL) | (
            self.logical.isNull() & self.text.rlike(r'^\{.*"value"')
        )
        encoded = F.when(self.logical == _CONNECT_DECIMAL, self.text).when(
            variable, F.regexp_extract(self.text, r'"value"\s*:\s*"([^"]*)"', 1)
        )
        scale = F.when(self.logical == _CONNECT_DECIMAL, self.scale).when(
            variable, F.regexp_extract(self.text, r'"scale"\s*:\s*(-?[0-9]+)', 1)
        )
        hex_digits = self.col("hex")
        negative = F.substring(hex_digits, 1, 1) > F.lit("7")
        # A negative two's-complement number is -(~x + 1): sum the complement's digits instead, so the
        # sum never exceeds the magnitude (2^(8n) itself may be beyond decimal(38)).
        magnitude_hex = F.when(negative, F.translate(hex_digits, "0123456789ABCDEF", "FEDCBA9876543210")).otherwise(
            hex_digits
        )
        padded = F.lpad(
            magnitude_hex,
            (F.ceil(F.length(magnitude_hex) / _CHUNK_HEX_DIGITS) * _CHUNK_HEX_DIGITS).cast("int"),
            "0",
        )
        chunks = F.regexp_extract_all(padded, F.lit(f".{{{_CHUNK_HEX_DIGITS}}}"), 0)
        zero = F.lit(0).cast("decimal(38,0)")
        magnitude = F.aggregate(
            chunks,
            zero,
            lambda total, chunk: F.try_add(
                F.try_multiply(total, F.lit(_CHUNK_PLACE).cast("decimal(38,0)")),
                F.conv(chunk, 16, 10).cast("decimal(38,0)"),
            ).cast("decimal(38,0)"),
        )
        return [
            {self.name("encoded"): encoded, self.name("scale_int"): scale.try_cast("int")},
            {self.name("hex"): F.hex(F.try_to_binary(self.col("encoded"), F.lit("base64")))},
            {
                # The magnitude only, the sign kept apart: Spark 4 rounds a 38-digit decimal to 34 digits
                # when it negates it (unary minus, abs) and then fails the job on the result.
                self.name("absolute"): F.when(
                    F.length(hex_digits) > 0,
                    F.when(negative, F.try_add(magnitude, F.lit(1).cast("decimal(38,0)"))).otherwise(magnitude),
                ),
                self.name("sign"): F.when(negative, F.lit("-")).otherwise(F.lit("")),
            },
            {self.name("digits"): self.col("absolute").cast("string")},
        ]

    def decoded(self) -> SparkColumn:
        digits, sign, scale = self.col("digits"), self.col("sign"), self.col("scale_int")
        padded = F.lpad(digits, F.greatest(F.length(digits), scale + 1), "0")
        whole = F.length(padded) - scale
        text = (
            F.when(
                scale > 0,
                F.concat(sign, F.substring(padded, F.lit(1), whole), F.lit("."), F.substring(padded, whole + 1, scale)),
            )
            .when(scale == 0, F.concat(sign, digits))
            .otherwise(F.concat(sign, digits, F.lit("E"), (-scale).cast("string")))
        )
        return F.coalesce(F.when(self.col("encoded").isNotNull() & scale.isNotNull(), text), self.text)

    def problem(self) -> SparkColumn:
        encoded, hex_digits = self.col("encoded"), self.col("hex")
        looks_base64 = self.text.rlike("^[A-Za-z0-9+/]+={0,2}$") & self.text.try_cast("double").isNull()
        return _first_reason(
            [
                (self.unsupported_logical((_CONNECT_DECIMAL, _VARIABLE_SCALE_DECIMAL)), self.unsupported_reason()),
                (
                    encoded.isNotNull() & F.coalesce(F.length(hex_digits) == 0, F.lit(True)),
                    self.reason(F.lit(" is not a base64-encoded decimal (decimal.handling.mode=precise)")),
                ),
                (
                    encoded.isNotNull() & self.col("scale_int").isNull(),
                    self.reason(F.lit(" is a precise decimal without a valid scale in its schema")),
                ),
                (
                    encoded.isNotNull() & self.col("absolute").isNull(),
                    self.reason(F.lit(" is beyond decimal(38)")),
                ),
                (
                    encoded.isNull() & self.logical.isNull() & F.col(_WRAPPED).isNull() & looks_base64,
                    self.reason(
                        F.lit(
                            " looks like a precise-mode (base64) decimal, whose scale is only in an embedded "
                            "schema: enable value schemas or set decimal.handling.mode=string"
                        )
                    ),
                ),
            ]
        )


def _decoder(index: int, column: Column, config: TableConfig) -> _Decoder:
    if column.type in ("date", "timestamp"):
        return _TemporalDecoder(index, column, config)
    if column.type.startswith("decimal("):
        return _DecimalDecoder(index, column, config)
    return _PlainDecoder(index, column, config)


# The intermediate columns of read_debezium's steps.
_PARSED, _ROW, _ROW_SCHEMA = f"{_WORK}parsed", f"{_WORK}row", f"{_WORK}row_schema"
_NAMES, _TEXTS, _SCHEMA_NAMES, _MISSING = f"{_WORK}names", f"{_WORK}texts", f"{_WORK}schema_names", f"{_WORK}missing"


def _op() -> SparkColumn:
    return F.col(FLAG)


def _side() -> SparkColumn:
    """The row the values come from: ``before`` for a delete, ``after`` otherwise (none for a truncate)."""
    return F.when(_op() == "d", F.lit("before")).when(_op() != "t", F.lit("after"))


def read_debezium(spark: SparkSession, config: TableConfig, business_date: str) -> DataFrame:
    """One row per line of the date's Debezium events: every configured column as text (see the module
    docstring), ``__cdc_flag``, ``__cdc_sequence_<i>``, ``__cdc_unavailable``, ``__cdc_tombstone``, ``__cdc_bad``,
    ``__cdc_raw_line``, ``_source_file`` and ``_record_id``. Raises :class:`SourceError` when there is
    no input at the date's path.
    """
    path = config.source.path_for(business_date)
    lines = _decoded_lines(_read_lines(spark, config, path), SourceEncoding(config.source.encoding))
    decoders = [_decoder(index, column, config) for index, column in enumerate(config.columns)]
    events = _with_envelope(_parsed_events(lines, config), config)
    frame = _decoded_columns(_located_columns(events, config, decoders), decoders)
    return frame.select(
        *(decoder.decoded().alias(decoder.column.name) for decoder in decoders),
        _op(),
        *sequence_columns(config),
        F.col(UNAVAILABLE),
        F.col(TOMBSTONE),
        _bad_event(config, decoders).alias(BAD),
        F.col(RAW_LINE),
        F.col(SOURCE_FILE),
        F.col(RECORD_ID),
    )


def _parsed_events(lines: DataFrame, config: TableConfig) -> DataFrame:
    """Each decoded line parsed once, into only the fields used (``_PARSED``), beside the line as read
    and whether it is a tombstone: Kafka's null value, which JsonConverter with schemas writes as
    ``{"schema":null,"payload":null}``."""
    line, undecodable = F.col(_LINE), F.col(_UNDECODABLE)
    tombstone = ~undecodable & (line.rlike(r"^\s*(null)?\s*$") | line.rlike(_WRAPPED_NULL))
    return lines.select(
        F.when(undecodable, F.col(_AS_READ)).otherwise(line).alias(RAW_LINE),
        tombstone.alias(TOMBSTONE),
        F.when(
            ~tombstone & ~undecodable, F.from_json(line, _line_schema(config), {"columnNameOfCorruptRecord": _CORRUPT})
        ).alias(_PARSED),
        undecodable,
        F.col(SOURCE_FILE),
        F.col(RECORD_ID),
    )


def _envelope(*parts: str) -> SparkColumn:
    """An envelope field of the parsed event, bare or wrapped in ``{"schema", "payload"}``."""
    parsed = F.col(_PARSED)
    bare, inside = parsed, parsed.getField("payload")
    for part in parts:
        bare, inside = bare.getField(part), inside.getField(part)
    return F.when(F.col(_WRAPPED), inside).otherwise(bare)


def _sequence_field(path: str) -> SparkColumn:
    """A sequence column's value: an envelope field, or a column of the row (e.g. after.version: any case, as columns)."""
    parts = path.split(".")
    if parts[0] in _ENVELOPE_ROWS:
        row = _envelope(parts[0])
        names = F.transform(F.map_keys(row), F.lower)
        return F.get(F.map_values(row), (F.array_position(names, F.lit(parts[1].lower())) - 1).cast("int"))
    return _envelope(*parts)


def _with_envelope(frame: DataFrame, config: TableConfig) -> DataFrame:
    """The event's op (``FLAG``), whether it is wrapped, its row (before for a delete, after otherwise),
    the embedded schema's entry for that row (its fields' logical types) and its sequence fields."""
    parsed = F.col(_PARSED)
    # A wrapped event has a payload; the wrapper's NULL for a bare one (and for a non-event) reads as bare.
    wrapped = F.when(parsed.getField("payload").isNotNull(), F.lit(True))
    frame = frame.withColumns({_WRAPPED: wrapped}).withColumns({FLAG: _envelope("op")})
    sequence_paths = config.changes.sequence_columns if config.changes else []
    return frame.withColumns(
        {
            _ROW: F.when(_op() == "d", _envelope("before")).when(_op() != "t", _envelope("after")),
            _ROW_SCHEMA: F.when(
                F.col(_WRAPPED),
                F.get(
                    F.filter(parsed.getField("schema").getField("fields"), lambda entry: entry.getField("field") == _side()),
                    0,
                ).getField("fields"),
            ),
            **{name: _sequence_field(path) for name, path in zip(sequence_columns(config), sequence_paths)},
        }
    )


def _located_columns(frame: DataFrame, config: TableConfig, decoders: list[_Decoder]) -> DataFrame:
    """Each configured column's text in the row (and, where its decoder needs them, its logical type and
    scale from the embedded schema); the columns sent as the unavailable-value placeholder
    (``UNAVAILABLE``); and those a c, u or r row lacks (``_MISSING``)."""
    row, row_schema = F.col(_ROW), F.col(_ROW_SCHEMA)
    # Lower-cased once per row; each column is then one lookup in them.
    frame = frame.withColumns(
        {
            _NAMES: F.transform(F.map_keys(row), F.lower),
            _TEXTS: F.map_values(row),
            _SCHEMA_NAMES: F.transform(row_schema, lambda field: F.lower(field.getField("field"))),
        }
    )

    def position(names: str, column: Column) -> SparkColumn:
        return (F.array_position(F.col(names), column.name.lower()) - 1).cast("int")

    located: dict[str, SparkColumn] = {}
    # An unchanged large column (PostgreSQL TOAST) comes as the placeholder: no value, but a name in
    # UNAVAILABLE, for the CDC step to keep the column's previous value.
    placeholder = config.change_set.unavailable_value_placeholder
    fillable = {column.name for column in (*config.non_keys, *config.untracked_columns)}
    unavailable: list[SparkColumn] = []
    missing: list[SparkColumn] = []
    for decoder in decoders:
        found = F.get(F.col(_TEXTS), position(_NAMES, decoder.column))
        # A c, u or r row lists every column (NULL or not): one it lacks was renamed or dropped at the source.
        absent = F.array_position(F.col(_NAMES), decoder.column.name.lower()) == 0
        missing.append(F.when(_op().isin("c", "u", "r") & absent, F.lit(decoder.column.name)))
        if decoder.column.name in fillable:
            left_out = _op().isin("c", "u", "r") & (found == F.lit(placeholder))
            unavailable.append(F.when(left_out, F.lit(decoder.column.name)))
            found = F.when(~F.coalesce(left_out, F.lit(False)), found)
        located[decoder.name("text")] = found
        if decoder.needs_logical_type:
            entry = F.get(row_schema, position(_SCHEMA_NAMES, decoder.column))
            located[decoder.name("logical")] = entry.getField("name")
            located[decoder.name("scale")] = F.try_element_at(entry.getField("parameters"), F.lit("scale"))
    names = F.array_compact(F.array(*unavailable)) if unavailable else F.array().cast("array<string>")
    located[UNAVAILABLE] = F.when(F.size(names) > 0, names)
    located[_MISSING] = F.array_join(F.array_compact(F.array(*missing)), ", ")
    return frame.withColumns(located)


def _decoded_columns(frame: DataFrame, decoders: list[_Decoder]) -> DataFrame:
    """Each decoder's stages, one ``withColumns`` per depth: each column's typed value from its text."""
    staged = [decoder.stages() for decoder in decoders]
    for depth in range(max(map(len, staged), default=0)):
        frame = frame.withColumns(
            {name: value for stages in staged if depth < len(stages) for name, value in stages[depth].items()}
        )
    return frame


def _bad_event(config: TableConfig, decoders: list[_Decoder]) -> SparkColumn:
    """Why a line is rejected (NULL for a good one, and for a tombstone): the first of the line's own
    problems, else the first column's."""
    row_reasons: list[tuple[SparkColumn, SparkColumn]] = [
        (F.col(_UNDECODABLE), F.lit(reason("the line", SourceEncoding(config.source.encoding)))),
        (
            F.col(_PARSED).getField(_CORRUPT).isNotNull(),
            F.lit("not a Debezium event: not a JSON object, or an envelope field of an unexpected JSON type"),
        ),
        (_op().isNull(), F.lit("not a Debezium event: no op")),
        (
            _op().isin("c", "u", "r", "d") & F.col(_ROW).isNull(),
            F.concat(F.lit("op "), _quoted(_op()), F.lit(" event has no "), _side(), F.lit(" row")),
        ),
        (
            F.length(F.col(_MISSING)) > 0,
            F.concat(
                F.lit("op "), _quoted(_op()), F.lit(" event's "), _side(), F.lit(" row has no configured column(s) "),
                F.col(_MISSING), F.lit(" (renamed or dropped at the source?)"),
            ),
        ),
    ]
    problems = [problem for problem in (decoder.problem() for decoder in decoders) if problem is not None]
    column_problem = F.coalesce(*problems) if problems else F.lit(None).cast("string")
    return F.when(~F.col(TOMBSTONE), F.coalesce(_first_reason(row_reasons), column_problem))
