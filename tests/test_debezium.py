"""Reading Debezium change events (``source.format: debezium``) from the checked-in files in tests/data/debezium.

2024-03-01.jsonl, one line each (record ids follow the line order):
 0 wrapped r id 1: Date days, MicroTimestamp, precise decimal 123.45
 1 wrapped c id 2: negative days, Timestamp millis, precise decimal -123.45
 2 line 1 again (an exactly repeated event)
 3 wrapped u id 1: ZonedTimestamp string, precise decimal 0
 4 bare c id 3: key "NAME" in upper case, numeric timestamp without schema, string-mode decimal
 5 bare u id 3: timestamp string, double-mode decimal
 6 bare d id 2: the row in before
 7 null (tombstone)
 8 bare t: no before/after
 9 malformed JSON
10 wrapped c id 9: precise decimal 2^128, beyond decimal(38)
11 wrapped c id 10: NanoTimestamp -1, precise decimal -0.01
12 blank line (tombstone)
13 {"foo":1}: no op
14 bare c id 11: a base64 decimal without schema
15 bare c id 12: a VariableScaleDecimal {"scale":2,"value":...}
2024-03-02.jsonl: wrapped u id 1, wrapped d id 3 (key-only before), null, wrapped c id 4.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from cdc_assets.model.config import TableConfig, load_table_config
from cdc_assets.core.intake.debezium import BAD, FLAG, RAW_LINE, TOMBSTONE, read_debezium, sequence_columns
from cdc_assets.core.intake.source import RECORD_ID, SOURCE_FILE, SourceError

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "debezium"
DAY1, DAY2 = "2024-03-01", "2024-03-02"


def make_config(tmp_path: Path, path: str | None = None, options: dict | None = None, **overrides) -> TableConfig:
    """The test table as a YAML file read back through validation; "Name" is configured in another case
    than the events' "name"/"NAME" keys on purpose."""
    document = {
        "name": "accounts",
        "start_date": DAY1,
        "load_type": "changeset",
        "source": {"path": path or str(DATA / "{date}.jsonl"), "format": "debezium", "options": options or {}},
        "keys": [{"name": "id", "type": "int"}],
        "non_keys": [
            {"name": "Name", "type": "string"},
            {"name": "active", "type": "boolean"},
            {"name": "birth_date", "type": "date"},
            {"name": "balance", "type": "decimal(12,2)"},
        ],
        "untracked_columns": [{"name": "updated_at", "type": "timestamp"}],
        "changes": {"sequence_columns": ["source.lsn"]},
        **overrides,
    }
    file = tmp_path / f"accounts_{len(list(tmp_path.glob('accounts_*.yaml')))}.yaml"
    file.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_table_config(file)


def rows(frame) -> list[dict]:
    """The (small) test output as dicts in line order."""
    return [row.asDict() for row in frame.orderBy(RECORD_ID).collect()]


def typed(frame, config: TableConfig) -> list[dict]:
    """What validation will make of the texts: try_cast to each configured type, in line order."""
    casts = [F.expr(f"try_cast(`{column.name}` AS {column.type})").alias(column.name) for column in config.columns]
    return [row.asDict() for row in frame.orderBy(RECORD_ID).select(*casts).collect()]


def values(row: dict, config: TableConfig) -> dict:
    return {column.name: row[column.name] for column in config.columns}


def test_output_columns_are_the_configured_ones_then_the_working_ones(spark, tmp_path):
    config = make_config(tmp_path, changes={"sequence_columns": ["source.lsn", "ts_ms"]})
    frame = read_debezium(spark, config, DAY1)
    assert frame.columns == [
        "id", "Name", "active", "birth_date", "balance", "updated_at",
        FLAG, "__cdc_sequence_0", "__cdc_sequence_1", "__cdc_unavailable", TOMBSTONE, BAD, RAW_LINE, SOURCE_FILE,
        RECORD_ID,
    ]
    assert sequence_columns(config) == ["__cdc_sequence_0", "__cdc_sequence_1"]
    types = {field.name: field.dataType.simpleString() for field in frame.schema.fields}
    assert types == {name: "string" for name in frame.columns} | {
        TOMBSTONE: "boolean", RECORD_ID: "bigint", "__cdc_unavailable": "array<string>",
    }
    found = rows(frame)
    assert len(found) == 16  # one row per line, tombstones and bad lines included
    assert found[0]["__cdc_sequence_1"] == "1709251200050"  # ts_ms, a number's text
    assert {row[SOURCE_FILE] for row in found} == {f"file:{DATA}/{DAY1}.jsonl"}
    assert found[9][RAW_LINE] == '{"before":null,"after":{"id":4,"name":"Dan"'


def test_wrapped_and_bare_events_decode_to_texts_that_cast_to_the_configured_types(spark, tmp_path):
    config = make_config(tmp_path)
    frame = read_debezium(spark, config, DAY1)
    found, cast = rows(frame), typed(frame, config)

    assert values(found[0], config) == {
        "id": "1", "Name": "Alice", "active": "true", "birth_date": "1990-01-01", "balance": "123.45",
        "updated_at": "2024-03-01 00:00:00.123456",
    }
    assert values(cast[0], config) == {
        "id": 1, "Name": "Alice", "active": True, "birth_date": date(1990, 1, 1), "balance": Decimal("123.45"),
        "updated_at": datetime(2024, 3, 1, 0, 0, 0, 123456),
    }
    # Negative days, epoch millis, a negative precise decimal.
    assert values(found[1], config) == {
        "id": "2", "Name": "Bob", "active": "true", "birth_date": "1969-12-31", "balance": "-123.45",
        "updated_at": "2024-03-01 01:00:00.000000",
    }
    assert (cast[1]["birth_date"], cast[1]["balance"], cast[1]["updated_at"]) == (
        date(1969, 12, 31), Decimal("-123.45"), datetime(2024, 3, 1, 1, 0),
    )
    # A ZonedTimestamp string passes through; Spark reads it (nanoseconds cut to microseconds).
    assert (found[3]["Name"], found[3]["updated_at"], found[3]["balance"]) == (
        "Alice B", "2024-03-01T10:15:30.123456789Z", "0.00",
    )
    assert (cast[3]["updated_at"], cast[3]["balance"]) == (datetime(2024, 3, 1, 10, 15, 30, 123456), Decimal("0.00"))
    # Bare: the upper-case key "NAME" matches the configured "Name"; string-mode decimal; days 0.
    assert (found[4]["Name"], found[4]["balance"], found[4]["birth_date"], found[4]["active"]) == (
        "Carol", "-0.50", "1970-01-01", "false",
    )
    assert (cast[4]["balance"], cast[4]["active"]) == (Decimal("-0.50"), False)
    # Double-mode decimal and a timestamp string pass through.
    assert (found[5]["balance"], found[5]["updated_at"]) == ("1234.5", "2024-03-01 04:00:00")
    assert (cast[5]["balance"], cast[5]["updated_at"]) == (Decimal("1234.50"), datetime(2024, 3, 1, 4, 0))
    # Nanoseconds before the epoch round down to the microsecond; -1 as a one-byte precise decimal.
    assert (found[11]["updated_at"], found[11]["balance"]) == ("1969-12-31 23:59:59.999999", "-0.01")
    assert cast[11]["updated_at"] == datetime(1969, 12, 31, 23, 59, 59, 999999)
    # Debezium's VariableScaleDecimal carries its own scale.
    assert (found[15]["balance"], cast[15]["balance"]) == ("123.45", Decimal("123.45"))
    assert [found[index][BAD] for index in (0, 1, 2, 3, 5, 11, 15)] == [None] * 7


def test_flags_and_sequences_are_the_envelope_texts(spark, tmp_path):
    found = rows(read_debezium(spark, make_config(tmp_path), DAY1))
    assert [row[FLAG] for row in found] == [
        "r", "c", "c", "u", "c", "u", "d", None, "t", None, "c", "c", None, None, "c", "c",
    ]
    assert [row["__cdc_sequence_0"] for row in found] == [
        "1000", "1100", "1100", "1200", "1300", "1400", "1500", None, "1600", None, "1700", "1710", None, None,
        "1720", "1730",
    ]


def test_a_delete_takes_its_values_from_before(spark, tmp_path):
    config = make_config(tmp_path, options={"timestamp_unit": "millis"})
    found = rows(read_debezium(spark, config, DAY1))
    assert values(found[6], config) == {
        "id": "2", "Name": "Bob", "active": "true", "birth_date": "1969-12-31", "balance": "-123.45",
        "updated_at": "2024-03-01 01:00:00.000000",
    }
    assert (found[6][FLAG], found[6][BAD]) == ("d", None)


def test_tombstones_and_blank_lines_are_flagged_and_hold_nothing_else(spark, tmp_path):
    config = make_config(tmp_path)
    found = rows(read_debezium(spark, config, DAY1))
    assert [index for index, row in enumerate(found) if row[TOMBSTONE]] == [7, 12]
    for index in (7, 12):
        row = found[index]
        assert set(values(row, config).values()) == {None}
        assert (row[FLAG], row["__cdc_sequence_0"], row[BAD]) == (None, None, None)
    assert (found[7][RAW_LINE], found[12][RAW_LINE]) == ("null", "   ")
    assert found[8][TOMBSTONE] is False  # a truncate is an event, not a tombstone


def test_a_repeated_event_is_read_as_often_as_it_occurs(spark, tmp_path):
    found = rows(read_debezium(spark, make_config(tmp_path), DAY1))
    first, second = ({key: value for key, value in found[index].items() if key != RECORD_ID} for index in (1, 2))
    assert first == second
    assert found[1][RECORD_ID] != found[2][RECORD_ID]


def test_a_truncate_has_a_flag_and_a_sequence_but_no_values(spark, tmp_path):
    config = make_config(tmp_path)
    truncate = rows(read_debezium(spark, config, DAY1))[8]
    assert set(values(truncate, config).values()) == {None}
    assert (truncate[FLAG], truncate["__cdc_sequence_0"]) == ("t", "1600")
    assert (truncate[BAD], truncate[TOMBSTONE]) == (None, False)


def test_unusable_lines_say_why(spark, tmp_path):
    found = rows(read_debezium(spark, make_config(tmp_path), DAY1))
    assert found[9][BAD] == "not a Debezium event: not a JSON object, or an envelope field of an unexpected JSON type"
    assert found[13][BAD] == "not a Debezium event: no op"
    assert found[10][BAD] == "column balance: value 'AQAAAAAAAAAAAAAAAAAAAAA=' is beyond decimal(38)"
    assert found[14][BAD].startswith("column balance: value 'MDk=' looks like a precise-mode (base64) decimal")
    # Without source.options.timestamp_unit, a bare event's numeric timestamp cannot be read.
    for index in (4, 6):
        assert "set source.options.timestamp_unit (millis or micros)" in found[index][BAD]
        assert found[index][BAD].startswith("column updated_at: value '17092")
    assert [index for index, row in enumerate(found) if row[BAD] is not None] == [4, 6, 9, 10, 13, 14]


@pytest.mark.parametrize(
    ("unit", "expected"),
    [("millis", datetime(2024, 3, 1, 2, 0)), ("micros", datetime(1970, 1, 20, 18, 47, 38, 400000))],
)
def test_timestamp_unit_reads_numbers_without_a_schema(spark, tmp_path, unit, expected):
    config = make_config(tmp_path, options={"timestamp_unit": unit})
    frame = read_debezium(spark, config, DAY1)
    found, cast = rows(frame), typed(frame, config)
    assert found[4][BAD] is None
    assert cast[4]["updated_at"] == expected
    # A logical type in an embedded schema wins over the option.
    assert cast[0]["updated_at"] == datetime(2024, 3, 1, 0, 0, 0, 123456)


def test_two_days_chain_by_lsn_and_a_key_only_delete_has_null_non_keys(spark, tmp_path):
    config = make_config(tmp_path)
    day1 = rows(read_debezium(spark, config, DAY1))
    frame = read_debezium(spark, config, DAY2)
    day2, cast = rows(frame), typed(frame, config)
    assert [row[FLAG] for row in day2] == ["u", "d", None, "c"]
    assert [row[TOMBSTONE] for row in day2] == [False, False, True, False]
    assert [row[BAD] for row in day2] == [None] * 4
    sequences = [int(row["__cdc_sequence_0"]) for row in day2 if not row[TOMBSTONE]]
    assert sequences == [2000, 2100, 2200]
    assert min(sequences) > max(int(row["__cdc_sequence_0"]) for row in day1 if row["__cdc_sequence_0"])
    assert values(day2[1], config) == {
        "id": "3", "Name": None, "active": None, "birth_date": None, "balance": None, "updated_at": None,
    }
    assert values(cast[3], config) == {
        "id": 4, "Name": "Dan", "active": False, "birth_date": date(2000, 1, 1), "balance": Decimal("-0.05"),
        "updated_at": datetime(2024, 3, 2, 0, 1),
    }
    assert (day2[0]["Name"], cast[0]["updated_at"]) == ("Alice C", datetime(2024, 3, 2))


def _wrapped_decimal(encoded: str, scale: int | str) -> str:
    field = {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
             "parameters": {"scale": str(scale)}, "field": "amount"}
    schema = {"type": "struct", "fields": [
        {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}, field], "field": "after"},
        {"type": "string", "field": "op"},
    ]}
    return json.dumps({"schema": schema, "payload": {"after": {"id": 1, "amount": encoded}, "op": "c", "ts_ms": 5}})


def _precise(unscaled: int, length: int | None = None) -> str:
    length = length or max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


LARGEST = 10**38 - 1
PRECISE_CASES = [
    (_precise(0), 0, "0"),
    (_precise(1), 2, "0.01"),
    (_precise(-1), 2, "-0.01"),
    (_precise(-1, 16), 2, "-0.01"),  # sign-extended over 16 bytes
    (_precise(255, 4), 0, "255"),  # leading zero bytes
    (_precise(-128), 0, "-128"),
    (_precise(2**63), 3, "9223372036854775.808"),
    (_precise(-(2**63) - 1), 0, "-9223372036854775809"),
    (_precise(7, 1), 5, "0.00007"),
    (_precise(12, 1), -3, "12E3"),
    (_precise(LARGEST), 0, str(LARGEST)),
    (_precise(-LARGEST), 10, "-" + str(LARGEST)[:-10] + "." + str(LARGEST)[-10:]),
    (_precise(2**100 + 12345), 4, f"{(2**100 + 12345) // 10**4}.{(2**100 + 12345) % 10**4:04d}"),
]


def test_precise_decimals_decode_exactly_up_to_decimal_38(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    overflowing = [_precise(LARGEST + 1), _precise(-LARGEST - 1), _precise(-(2**127), 16), _precise(1 << 200)]
    lines = [_wrapped_decimal(encoded, scale) for encoded, scale, _ in PRECISE_CASES]
    lines += [_wrapped_decimal(encoded, 2) for encoded in overflowing]
    lines += [_wrapped_decimal("not base64!", 2), _wrapped_decimal(_precise(5), "x")]
    (landing / f"{DAY1}.jsonl").write_text("\n".join(lines) + "\n")
    config = make_config(
        tmp_path, path=str(landing / "{date}.jsonl"), keys=[{"name": "id", "type": "int"}],
        non_keys=[{"name": "amount", "type": "decimal(38,0)"}], untracked_columns=[],
        changes={"sequence_columns": ["ts_ms"]},
    )
    found = rows(read_debezium(spark, config, DAY1))
    decoded = found[: len(PRECISE_CASES)]
    assert [row["amount"] for row in decoded] == [expected for _, _, expected in PRECISE_CASES]
    assert [row[BAD] for row in decoded] == [None] * len(PRECISE_CASES)
    assert all(Decimal(row["amount"]) == Decimal(expected) for row, (_, _, expected) in zip(decoded, PRECISE_CASES))
    beyond = found[len(PRECISE_CASES): len(PRECISE_CASES) + len(overflowing)]
    assert [row[BAD] for row in beyond] == [
        f"column amount: value '{encoded}' is beyond decimal(38)" for encoded in overflowing
    ]
    not_base64, no_scale = found[-2:]
    assert not_base64[BAD] == (
        "column amount: value 'not base64!' is not a base64-encoded decimal (decimal.handling.mode=precise)"
    )
    assert no_scale[BAD] == "column amount: value 'BQ==' is a precise decimal without a valid scale in its schema"


def test_sequence_fields_may_be_nested_top_level_or_a_row_column(spark, tmp_path):
    config = make_config(tmp_path, changes={"sequence_columns": ["source.txId", "ts_ms", "after.id"]})
    found = rows(read_debezium(spark, config, DAY1))
    assert [found[index]["__cdc_sequence_0"] for index in (0, 4, 8)] == ["100", "130", "160"]
    assert found[1]["__cdc_sequence_1"] == "1709254800100"
    assert [found[index]["__cdc_sequence_2"] for index in (0, 6, 8)] == ["1", None, None]
    # A column of the row is matched in any case, as configured columns are: line 4 spells it "NAME".
    config = make_config(tmp_path, changes={"sequence_columns": ["after.Name", "after.ID"]})
    found = rows(read_debezium(spark, config, DAY1))
    assert [found[index]["__cdc_sequence_0"] for index in (0, 4)] == ["Alice", "Carol"]
    assert [found[index]["__cdc_sequence_1"] for index in (0, 4, 6)] == ["1", "3", None]


def test_conflicting_sequence_paths_are_a_source_error(spark, tmp_path):
    config = make_config(tmp_path, changes={"sequence_columns": ["source", "source.lsn"]})
    with pytest.raises(SourceError, match="one is inside the other"):
        read_debezium(spark, config, DAY1)


def test_missing_input_is_an_error_not_an_empty_day(spark, tmp_path):
    config = make_config(tmp_path, path=str(tmp_path / "landing" / "{date}"))
    with pytest.raises(SourceError, match="no input at"):
        read_debezium(spark, config, DAY1)
    (tmp_path / "landing" / DAY1).mkdir(parents=True)
    with pytest.raises(SourceError, match="no input at"):
        read_debezium(spark, config, DAY1)
    (tmp_path / "landing" / DAY1 / "part-0.jsonl").write_text((DATA / f"{DAY2}.jsonl").read_text())
    assert read_debezium(spark, config, DAY1).count() == 4


def test_the_sample_table_reads_without_bad_records(spark, monkeypatch):
    monkeypatch.setenv("CDC_DATA_ROOT", str(REPO))
    config = load_table_config(REPO / "table_configs" / "customers_debezium.yaml")
    seen_flags: set[str] = set()
    last_sequence = -1
    for day in ("2024-03-01", "2024-03-02", "2024-03-03"):
        frame = read_debezium(spark, config, day)
        found, cast = rows(frame), typed(frame, config)
        assert [row[BAD] for row in found] == [None] * len(found)
        assert 10 <= len(found) <= 30
        assert sum(row[TOMBSTONE] for row in found) == sum(row[FLAG] == "d" for row in found) >= 1
        events = [(row, typed_row) for row, typed_row in zip(found, cast) if not row[TOMBSTONE]]
        for row, typed_row in events:
            seen_flags.add(row[FLAG])
            for column in config.columns:  # every text there is casts to its type
                assert (row[column.name] is None) == (typed_row[column.name] is None), (day, column.name, row)
            assert typed_row["customer_id"] is not None
        sequences = [int(row["__cdc_sequence_0"]) for row, _ in events]
        assert sequences == sorted(sequences) and sequences[0] > last_sequence
        last_sequence = sequences[-1]
        raw = [row[RAW_LINE] for row, _ in events]
        if day != "2024-03-02":
            assert len(raw) > len(set(raw))  # a repeated event
    assert seen_flags == {"r", "c", "u", "d"}


@pytest.mark.slow
def test_spark_connect_reads_the_same_rows(spark, tmp_path, connect_server):
    """The reader uses the DataFrame API only: through Spark Connect it gives the classic session's rows."""
    config = make_config(tmp_path, options={"timestamp_unit": "millis"})
    script = (
        "import json, sys\n"
        "from pyspark.sql import SparkSession\n"
        "from cdc_assets.model.config import load_table_config\n"
        "from cdc_assets.core.intake.debezium import read_debezium\n"
        "spark = SparkSession.builder.getOrCreate()\n"
        "config = load_table_config(sys.argv[1])\n"
        "frame = read_debezium(spark, config, sys.argv[2]).drop('_record_id').orderBy('__cdc_raw_line')\n"
        "print(json.dumps([list(row) for row in frame.collect()]))\n"
    )
    env = {**os.environ, "SPARK_REMOTE": connect_server.client_url, "PYTHONPATH": str(REPO)}
    config_file = sorted(tmp_path.glob("accounts_*.yaml"))[-1]
    for day in (DAY1, DAY2):
        result = subprocess.run(
            [sys.executable, "-c", script, str(config_file), day], env=env, capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        classic = read_debezium(spark, config, day).drop(RECORD_ID).orderBy(RAW_LINE)
        assert json.loads(result.stdout.strip().splitlines()[-1]) == [list(row) for row in classic.collect()]


def _landed(tmp_path: Path, lines: list[str]) -> str:
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    (landing / f"{DAY1}.jsonl").write_text("\n".join(lines) + "\n")
    return str(landing / "{date}.jsonl")


FULL_ROW = {"id": 1, "Name": "A", "active": True, "birth_date": 0, "balance": "1.00", "updated_at": "2024-03-01T00:00:00Z"}


def test_a_row_missing_a_configured_column_is_bad_naming_it(spark, tmp_path):
    renamed = {key: value for key, value in FULL_ROW.items() if key != "Name"} | {"full_name": "A"}
    lines = [
        json.dumps({"after": renamed, "op": "u", "source": {"lsn": 1}}),
        json.dumps({"after": {k: v for k, v in renamed.items() if k != "active"}, "op": "c", "source": {"lsn": 2}}),
        json.dumps({"after": FULL_ROW | {"Name": None}, "op": "r", "source": {"lsn": 3}}),  # NULL is a value
        json.dumps({"before": {"id": 1}, "op": "d", "source": {"lsn": 4}}),  # a key-only before is enough
    ]
    config = make_config(tmp_path, path=_landed(tmp_path, lines))
    found = rows(read_debezium(spark, config, DAY1))
    assert [row[BAD] for row in found] == [
        "op 'u' event's after row has no configured column(s) Name (renamed or dropped at the source?)",
        "op 'c' event's after row has no configured column(s) Name, active (renamed or dropped at the source?)",
        None,
        None,
    ]


def test_a_wrapped_null_is_a_tombstone_and_counted_as_one(spark, tmp_path):
    from cdc_assets.core.intake.incoming import prepare_incoming_dates

    lines = [
        '{"schema":null,"payload":null}',
        ' { "payload" : null , "schema" : null } ',
        '{"payload":null}',
        json.dumps({"after": FULL_ROW, "op": "c", "source": {"lsn": 1}}),
        '{"schema":null,"payload":null,"x":1}',  # not Kafka's tombstone: not an event either
    ]
    config = make_config(tmp_path, path=_landed(tmp_path, lines))
    found = rows(read_debezium(spark, config, DAY1))
    assert [row[TOMBSTONE] for row in found] == [True, True, True, False, False]
    assert [row[BAD] for row in found] == [None, None, None, None, "not a Debezium event: no op"]
    prepared = prepare_incoming_dates(config, {DAY1: read_debezium(spark, config, DAY1)})
    try:
        figures = prepared.figures[DAY1]
        assert (figures.rows_read, figures.tombstone_lines, figures.rows_rejected, figures.rows_accepted) == (5, 3, 1, 1)
    finally:
        prepared.release()


def _wrapped(fields: list[tuple[str, str, str | None]], after: dict) -> str:
    """A wrapped c event whose schema gives each (column, Connect type, logical name) of the row."""
    row = [{"type": kind, "optional": True, "field": name, **({"name": logical} if logical else {})} for name, kind, logical in fields]
    if any(logical == "org.apache.kafka.connect.data.Decimal" for _, _, logical in fields):
        row = [entry | ({"parameters": {"scale": "2"}} if entry.get("name", "").endswith("Decimal") else {}) for entry in row]
    schema = {"type": "struct", "fields": [{"type": "struct", "fields": row, "field": "after"}]}
    return json.dumps({"schema": schema, "payload": {"after": after, "op": "c", "ts_ms": 5}})


LOGICAL_COLUMNS = {
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [
        {"name": "t", "type": "timestamp"},
        {"name": "d", "type": "date"},
        {"name": "s", "type": "string"},
        {"name": "amount", "type": "decimal(10,2)"},
    ],
    "untracked_columns": [],
    "changes": {"sequence_columns": ["ts_ms"]},
}
GOOD = {"t": ("int64", "io.debezium.time.MicroTimestamp", 1_000_000), "d": ("int32", "io.debezium.time.Date", 1),
        "s": ("string", None, "x"), "amount": ("bytes", "org.apache.kafka.connect.data.Decimal", "AQ==")}


def _event_with(**overrides) -> str:
    spec = GOOD | overrides
    fields = [("id", "int32", None)] + [(name, kind, logical) for name, (kind, logical, _) in spec.items()]
    return _wrapped(fields, {"id": 1, **{name: value for name, (_, _, value) in spec.items()}})


def test_logical_types_a_column_does_not_take_are_bad_records(spark, tmp_path):
    lines = [
        _event_with(),
        _event_with(t=("int64", "io.debezium.time.MicroTime", 3_600_000_000)),  # a time of day, in micros
        _event_with(t=("int64", "io.debezium.time.NanoTime", 3_600_000_000_000)),
        _event_with(t=("int32", "org.apache.kafka.connect.data.Time", 3_600_000)),
        _event_with(t=("string", "io.debezium.time.ZonedTime", "10:15:30Z")),
        _event_with(d=("int32", "io.debezium.time.Year", 2024)),
        _event_with(s=("bytes", "org.apache.kafka.connect.data.Decimal", "AQ==")),
        _event_with(amount=("int64", "io.debezium.time.MicroTime", 5)),
    ]
    config = make_config(tmp_path, path=_landed(tmp_path, lines), **LOGICAL_COLUMNS)
    frame = read_debezium(spark, config, DAY1)
    found, cast = rows(frame), typed(frame, config)
    assert found[0][BAD] is None
    assert values(cast[0], config) == {
        "id": 1, "t": datetime(1970, 1, 1, 0, 0, 1), "d": date(1970, 1, 2), "s": "x", "amount": Decimal("0.01"),
    }
    assert [row[BAD] for row in found[1:]] == [
        "column t: value '3600000000' has logical type 'io.debezium.time.MicroTime', which a timestamp column does not take",
        "column t: value '3600000000000' has logical type 'io.debezium.time.NanoTime', which a timestamp column does not take",
        "column t: value '3600000' has logical type 'org.apache.kafka.connect.data.Time', which a timestamp column does not take",
        "column t: value '10:15:30Z' has logical type 'io.debezium.time.ZonedTime', which a timestamp column does not take",
        "column d: value '2024' has logical type 'io.debezium.time.Year', which a date column does not take",
        "column s: value 'AQ==' has logical type 'org.apache.kafka.connect.data.Decimal', which a string column does not take",
        "column amount: value '5' has logical type 'io.debezium.time.MicroTime', which a decimal(10,2) column does not take",
    ]


def test_temporal_numbers_decode_up_to_the_range_ends_and_are_bad_beyond(spark, tmp_path):
    days_first, days_last = -719_162, 2_932_896
    micros_first, micros_last = -62_135_596_800_000_000, 253_402_300_799_999_999
    cases = [
        (days_first, micros_first), (days_last, micros_last), (days_first - 1, micros_first - 1), (days_last + 1, micros_last + 1),
    ]
    lines = [_event_with(d=("int32", "io.debezium.time.Date", d), t=("int64", "io.debezium.time.MicroTimestamp", t)) for d, t in cases]
    config = make_config(tmp_path, path=_landed(tmp_path, lines), **LOGICAL_COLUMNS)
    frame = read_debezium(spark, config, DAY1)
    found = rows(frame)
    assert [(row["d"], row["t"]) for row in found[:2]] == [
        ("0001-01-01", "0001-01-01 00:00:00.000000"), ("9999-12-31", "9999-12-31 23:59:59.999999"),
    ]
    # The texts cast to the very ends of Spark's ranges (compared in Spark: Python's datetime cannot
    # take year 1 through the local time zone).
    cast = frame.orderBy(RECORD_ID).select(
        F.expr("try_cast(d AS date) IN (DATE'0001-01-01', DATE'9999-12-31')").alias("d_end"),
        F.expr(
            "try_cast(t AS timestamp) IN (TIMESTAMP'0001-01-01 00:00:00', TIMESTAMP'9999-12-31 23:59:59.999999')"
        ).alias("t_end"),
    ).collect()
    assert [(row["d_end"], row["t_end"]) for row in cast[:2]] == [(True, True), (True, True)]
    assert [row[BAD] for row in found] == [
        None, None,
        f"column t: value '{micros_first - 1}' (micros) is outside 0001-01-01..9999-12-31",
        f"column t: value '{micros_last + 1}' (micros) is outside 0001-01-01..9999-12-31",
    ]
    # The date column's own reason comes after the timestamp column's: both are out of range.
    assert all(found[index]["d"] == str(days) for index, days in ((2, days_first - 1), (3, days_last + 1)))


def _landed_bytes(tmp_path: Path, lines: list[bytes]) -> str:
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    (landing / f"{DAY1}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return str(landing / "{date}.jsonl")


def _coded(tmp_path: Path, lines: list[bytes], **overrides) -> TableConfig:
    """A table keyed by a string code, with one non-key (Name), reading ``lines``."""
    return make_config(
        tmp_path, path=_landed_bytes(tmp_path, lines), keys=[{"name": "code", "type": "string"}],
        non_keys=[{"name": "Name", "type": "string"}], untracked_columns=[], **overrides,
    )


def test_lines_with_bytes_that_are_not_utf8_are_bad_records_not_replacement_characters(spark, tmp_path):
    """Spark's JSON parsing alone makes b'ab\\xffc' and b'ab\\xfec' one key, 'ab\\ufffdc'."""
    from cdc_assets.core.intake.incoming import prepare_incoming_dates

    lines = [
        b'{"after":{"code":"ab\xffc","Name":"first"},"op":"c","source":{"lsn":1}}',
        b'{"after":{"code":"ab\xfec","Name":"second"},"op":"c","source":{"lsn":2}}',
        b'{"after":{"code":"caf\xc3\xa9","Name":"gen\xef\xbf\xbdu"},"op":"c","source":{"lsn":3}}',  # sent U+FFFD
        b'{"after":{"code":"esc","Name":"\\ufffd"},"op":"c","source":{"lsn":4}}',  # sent as a JSON escape
    ]
    config = _coded(tmp_path, lines)
    prepared = prepare_incoming_dates(config, {DAY1: read_debezium(spark, config, DAY1)})
    try:
        figures = prepared.figures[DAY1]
        assert (figures.rows_read, figures.rows_accepted, figures.rows_rejected) == (4, 2, 2)
        assert {row["code"]: row["Name"] for row in prepared.accepted.collect()} == {"café": "gen\ufffdu", "esc": "\ufffd"}
        rejected = prepared.rejected.collect()
        assert {row["reason"] for row in rejected} == {
            "invalid_encoding: the line has bytes that are not valid UTF-8 (raw_record: its bytes as ISO-8859-1)"
        }
        assert sorted(row["raw_record"].encode("latin-1") for row in rejected) == sorted(lines[:2])
    finally:
        prepared.release()


def test_a_single_byte_encoding_is_decoded(spark, tmp_path):
    lines = [
        b'{"after":{"code":"caf\xe9","Name":"\x80 5"},"op":"c","source":{"lsn":1}}',
        b'{"after":{"code":"x","Name":"a\x81b"},"op":"c","source":{"lsn":2}}',  # 0x81: undefined in windows-1252
    ]
    found = rows(read_debezium(spark, _coded(tmp_path, lines, source={
        "path": _landed_bytes(tmp_path, lines), "format": "debezium", "encoding": "windows-1252",
    }), DAY1))
    assert [(row["code"], row["Name"], row[BAD]) for row in found] == [
        ("café", "€ 5", None),
        (None, None, "invalid_encoding: the line has bytes that are not valid windows-1252 (raw_record: its bytes as ISO-8859-1)"),
    ]
    assert found[1][RAW_LINE].encode("latin-1") == lines[1]


def test_an_event_value_that_its_column_does_not_hold_exactly_is_a_bad_record(spark, tmp_path):
    """A number in an event (decimal.handling.mode=double, or a double column) is a text to cast: 3.7 is not
    an int (ANSI), and 12.345 is not a decimal(10,2), which the cast would round to 12.35 (issue 46, point 9)."""
    from cdc_assets.core.intake.source import REJECT_REASON, validate_records

    events = [
        {"after": {"id": 1, "score": 3.7, "amount": 12.3}, "op": "c", "ts_ms": 1},
        {"after": {"id": 2, "score": 4, "amount": 12.345}, "op": "c", "ts_ms": 2},
        {"after": {"id": 3, "score": 4, "amount": 12.34}, "op": "c", "ts_ms": 3},
    ]
    config = make_config(
        tmp_path, path=_landed(tmp_path, [json.dumps(event) for event in events]),
        non_keys=[{"name": "score", "type": "int"}, {"name": "amount", "type": "decimal(10,2)"}], untracked_columns=[],
        changes={"sequence_columns": ["ts_ms"]},
    )

    validated = validate_records(read_debezium(spark, config, DAY1), config)

    reasons = {row["id"]: row[REJECT_REASON] for row in validated.select("id", REJECT_REASON).collect()}
    assert reasons == {
        1: "column score: value '3.7' is not a valid int",
        2: "lossy_cast: column amount, from string to decimal(10,2): value '12.345' has more decimal places",
        3: None,
    }
