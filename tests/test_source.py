"""Reading, validating and preparing a day's extract from real CSV files in tmp_path."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cdc_assets.config import TableConfig
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH
from cdc_assets.core.incoming import (
    BadRecordsError,
    DateFigures,
    DuplicateKeysError,
    prepare_incoming,
    prepare_incoming_dates,
)
from cdc_assets.core.source import (
    REJECT_REASON,
    SourceError,
    accepted_records,
    read_source,
    validate_records,
)

DAY = date(2024, 1, 2)
DAY_TEXT = DAY.isoformat()


def make_config(tmp_path: Path, **overrides) -> TableConfig:
    data = {
        "name": "orders",
        "start_date": "2024-01-01",
        "load_type": "full",
        "source": {"path": str(tmp_path / "landing" / "{date}") + "/", "format": "csv"},
        "keys": [{"name": "id", "type": "int"}],
        "non_keys": [{"name": "name", "type": "string"}, {"name": "qty", "type": "int"}],
    }
    data.update(overrides)
    return TableConfig.model_validate(data)


def land(tmp_path: Path, text: str, file_name: str = "part-0.csv", day: str = DAY_TEXT) -> Path:
    folder = tmp_path / "landing" / day
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name
    path.write_text(text)
    return path


def read_validated(spark, config):
    return validate_records(read_source(spark, config, DAY_TEXT), config)


def by_id(rows):
    return {row["id"]: row for row in rows}


# --- reading ------------------------------------------------------------------------------------


def test_rfc4180_quoting(spark, tmp_path):
    config = make_config(tmp_path)
    land(tmp_path, 'id,name,qty\n1,"a ""quoted"", value",3\n2,"",4\n3,plain,5\n')
    validated = read_validated(spark, config)
    rows = by_id(accepted_records(validated).collect())
    assert rows[1]["name"] == 'a "quoted", value'
    assert rows[1]["qty"] == 3
    assert rows[3]["name"] == "plain"
    assert set(rows) == {1, 2, 3}
    assert validated.filter(F.col(REJECT_REASON).isNotNull()).count() == 0


def test_quoted_line_breaks_need_the_multiline_option(spark, tmp_path):
    land(tmp_path, 'id,name,qty\n1,"multi\nline",4\n2,plain,5\n')
    config = make_config(tmp_path, source={"path": str(tmp_path / "landing" / "{date}") + "/", "options": {"multiLine": True}})
    rows = by_id(accepted_records(read_validated(spark, config)).collect())
    assert rows[1]["name"] == "multi\nline" and rows[1]["qty"] == 4
    assert rows[2]["name"] == "plain"


def test_columns_matched_by_header_name_not_position(spark, tmp_path):
    config = make_config(tmp_path)
    land(tmp_path, "qty,NAME,id\n10,alpha,1\n20,beta,2\n")
    accepted = accepted_records(read_validated(spark, config))
    assert accepted.columns == ["id", "name", "qty"]
    assert {(r["id"], r["name"], r["qty"]) for r in accepted.collect()} == {(1, "alpha", 10), (2, "beta", 20)}


def test_headerless_file_is_positional_in_config_order(spark, tmp_path):
    land(tmp_path, "1,alpha,10\n2,beta\n3,gamma,30\n")
    config = make_config(tmp_path, source={"path": str(tmp_path / "landing" / "{date}") + "/", "options": {"header": False}})
    batch = prepare_incoming(spark, config, DAY)
    try:
        assert (batch.rows_read, batch.rows_accepted, batch.rows_rejected) == (3, 2, 1)
        assert {(r["id"], r["name"], r["qty"]) for r in batch.accepted.collect()} == {(1, "alpha", 10), (3, "gamma", 30)}
        (rejected,) = batch.rejected.collect()
        assert rejected["raw_record"] == "2,beta" and "malformed" in rejected["reason"]
    finally:
        batch.release()


def test_missing_configured_column(spark, tmp_path):
    config = make_config(tmp_path)
    land(tmp_path, "id,name\n1,alpha\n")
    with pytest.raises(SourceError, match="qty"):
        read_source(spark, config, DAY_TEXT)


def test_extra_column_is_an_error_unless_allowed(spark, tmp_path):
    land(tmp_path, "id,name,qty,surprise\n1,alpha,3,x\n")
    with pytest.raises(SourceError, match="surprise"):
        read_source(spark, make_config(tmp_path), DAY_TEXT)
    allowed = make_config(tmp_path, allow_extra_columns=True)
    accepted = accepted_records(read_validated(spark, allowed))
    assert accepted.columns == ["id", "name", "qty"]
    assert [(r["id"], r["name"], r["qty"]) for r in accepted.collect()] == [(1, "alpha", 3)]


def test_missing_input_path_names_the_resolved_path(spark, tmp_path):
    config = make_config(tmp_path)
    expected = str(tmp_path / "landing" / "2024-01-09") + "/"
    with pytest.raises(SourceError) as raised:
        read_source(spark, config, "2024-01-09")
    assert expected in str(raised.value)
    with pytest.raises(SourceError):
        prepare_incoming(spark, config, date(2024, 1, 9))


def test_empty_input_folder_is_not_an_empty_extract(spark, tmp_path):
    config = make_config(tmp_path)
    (tmp_path / "landing" / DAY_TEXT).mkdir(parents=True)
    with pytest.raises(SourceError) as raised:
        read_source(spark, config, DAY_TEXT)
    assert str(tmp_path / "landing" / DAY_TEXT) in str(raised.value)


def test_header_only_file_is_an_empty_extract(spark, tmp_path):
    config = make_config(tmp_path)
    land(tmp_path, "id,name,qty\n")
    batch = prepare_incoming(spark, config, DAY)
    try:
        assert (batch.rows_read, batch.rows_rejected, batch.rows_accepted) == (0, 0, 0)
        assert batch.accepted.count() == 0
    finally:
        batch.release()


def test_source_file_recorded_across_several_files(spark, tmp_path):
    config = make_config(tmp_path)
    land(tmp_path, "id,name,qty\n1,a,1\n2,b,x\n", "part-0.csv")
    land(tmp_path, "id,name,qty\n3,c,3\n4,d,y\n", "part-1.csv")
    batch = prepare_incoming(spark, config, DAY)
    try:
        assert (batch.rows_read, batch.rows_accepted, batch.rows_rejected) == (4, 2, 2)
        files = {json.loads(r["raw_record"])["id"]: r["source_file"] for r in batch.rejected.collect()}
        assert files["2"].endswith("part-0.csv") and files["4"].endswith("part-1.csv")
    finally:
        batch.release()


# --- bad records --------------------------------------------------------------------------------

BAD_CSV = (
    "id,name,qty\n"
    "1,alpha,10\n"  # record 1: good
    "2,beta\n"  # record 2: too few fields
    "3,gamma,abc\n"  # record 3: qty does not cast to int
    ",delta,4\n"  # record 4: empty key
    '5,"eps, ""x""",6\n'  # record 5: good
    "6,zeta,7,extra\n"  # record 6: too many fields
    "7,eta,1.5\n"  # record 7: not an int either
)


def test_bad_records_quarantined(spark, tmp_path):
    config = make_config(tmp_path, bad_records="quarantine")
    source_file = land(tmp_path, BAD_CSV)
    batch = prepare_incoming(spark, config, DAY)
    try:
        accepted = batch.accepted.collect()
        rejected = batch.rejected.collect()
        assert batch.rows_read == 7
        assert batch.rows_read == batch.rows_accepted + batch.rows_rejected
        assert (batch.rows_accepted, batch.rows_rejected) == (len(accepted), len(rejected)) == (2, 5)
        assert {r["id"] for r in accepted} == {1, 5}
        assert set(batch.rejected.columns) == {"raw_record", "reason", "source_file"}
        reasons = {r["raw_record"]: r["reason"] for r in rejected}
        assert all(r["source_file"].endswith(source_file.name) for r in rejected)
        assert all(r["raw_record"] for r in rejected)
        # Malformed records keep their raw text as read.
        assert "malformed" in reasons["2,beta"]
        assert "malformed" in reasons["6,zeta,7,extra"]
        # Records that parsed keep their raw field values.
        parsed = {json.loads(raw)["name"]: (json.loads(raw), reason) for raw, reason in reasons.items() if raw.startswith("{")}
        assert set(parsed) == {"gamma", "delta", "eta"}
        record, reason = parsed["gamma"]
        assert record["qty"] == "abc"
        assert "column qty" in reason and "abc" in reason and "int" in reason
        record, reason = parsed["eta"]
        assert "column qty" in reason and "1.5" in reason
        record, reason = parsed["delta"]
        assert record.get("id") is None and record["qty"] == "4"
        assert "key column id" in reason and "NULL or empty" in reason
    finally:
        batch.release()


def test_bad_records_fail_names_file_record_and_reason(spark, tmp_path):
    config = make_config(tmp_path, bad_records="fail")
    source_file = land(tmp_path, BAD_CSV)
    with pytest.raises(BadRecordsError) as raised:
        prepare_incoming(spark, config, DAY)
    message = str(raised.value)
    assert "5 bad record(s)" in message
    lines = message.splitlines()
    line_for = {n: next((line for line in lines if f"record {n}:" in line), None) for n in range(1, 8)}
    assert line_for[1] is None and line_for[5] is None
    for n in (2, 3, 4, 6, 7):
        assert line_for[n] is not None, message
        assert source_file.name in line_for[n]
    assert "malformed" in line_for[2]
    assert "column qty" in line_for[3] and "abc" in line_for[3]
    assert "key column id" in line_for[4]


def test_whitespace_only_key_is_rejected(spark, tmp_path):
    config = make_config(tmp_path, keys=[{"name": "id", "type": "string"}])
    land(tmp_path, 'id,name,qty\n"  ",a,1\nk,b,2\n')
    batch = prepare_incoming(spark, config, DAY)
    try:
        assert (batch.rows_accepted, batch.rows_rejected) == (1, 1)
        (row,) = batch.rejected.collect()
        assert "key column id" in row["reason"]
    finally:
        batch.release()


# --- duplicate keys -----------------------------------------------------------------------------

DUPLICATES_CSV = (
    "id,name,qty\n"
    "1,a,1\n"
    "1,a,1\n"  # fully identical to the row above
    "2,b,2\n"
    "2,c,3\n"  # same key, other payload
    "2,d,4\n"
    "3,e,5\n"
)


def test_duplicate_keys_fail(spark, tmp_path):
    config = make_config(tmp_path, duplicate_keys="fail")
    land(tmp_path, DUPLICATES_CSV)
    with pytest.raises(DuplicateKeysError) as raised:
        prepare_incoming(spark, config, DAY)
    message = str(raised.value)
    assert "2 key(s)" in message
    assert "id=1} x2" in message
    assert "id=2} x3" in message
    assert "id=3" not in message


def test_duplicate_keys_quarantined(spark, tmp_path):
    config = make_config(tmp_path, duplicate_keys="quarantine", bad_records="quarantine")
    land(tmp_path, DUPLICATES_CSV + "4,f,notanint\n")
    batch = prepare_incoming(spark, config, DAY)
    try:
        accepted = batch.accepted.collect()
        rejected = batch.rejected.collect()
        assert batch.rows_read == 7
        assert batch.duplicate_keys == 2
        assert (batch.rows_accepted, batch.rows_rejected) == (len(accepted), len(rejected)) == (1, 6)
        assert [(r["id"], r["name"], r["qty"]) for r in accepted] == [(3, "e", 5)]
        duplicated = [r for r in rejected if "duplicate" in r["reason"]]
        assert sorted((json.loads(r["raw_record"])["id"], json.loads(r["raw_record"])["name"]) for r in duplicated) == [
            ("1", "a"),
            ("1", "a"),
            ("2", "b"),
            ("2", "c"),
            ("2", "d"),
        ]
        assert all(r["source_file"].endswith("part-0.csv") for r in duplicated)
        (bad,) = [r for r in rejected if "duplicate" not in r["reason"]]
        assert "qty" in bad["reason"]
    finally:
        batch.release()


def test_duplicate_detection_uses_the_typed_key(spark, tmp_path):
    # "01" and "1" are the same int key once cast.
    config = make_config(tmp_path, duplicate_keys="fail")
    land(tmp_path, "id,name,qty\n1,a,1\n01,b,2\n")
    with pytest.raises(DuplicateKeysError, match=r"id=1\} x2"):
        prepare_incoming(spark, config, DAY)


# --- typing -------------------------------------------------------------------------------------


def test_types_cast_and_nullable_non_key_stays_null(spark, tmp_path):
    config = make_config(
        tmp_path,
        keys=[{"name": "id", "type": "bigint"}, {"name": "day", "type": "date"}],
        non_keys=[
            {"name": "amount", "type": "decimal(10,2)"},
            {"name": "ts", "type": "timestamp"},
            {"name": "flag", "type": "boolean"},
            {"name": "qty", "type": "int"},
            {"name": "ratio", "type": "double"},
            {"name": "note", "type": "string"},
        ],
        untracked_columns=[{"name": "loaded_by", "type": "string"}],
    )
    land(
        tmp_path,
        "id,day,amount,ts,flag,qty,ratio,note,loaded_by\n"
        "9000000000,2024-02-29,1.5,2024-01-02 03:04:05.123456,true,7,3.1E-4,,etl\n"
        "2,2024-01-01,-12.30,2024-01-01T00:00:00Z,false,-3,0.00031,hello,\n"
        "3,2024-02-30,1,2024-01-01,true,1,1,x,etl\n",  # 30 February: rejected
    )
    batch = prepare_incoming(spark, config, DAY)
    try:
        assert (batch.rows_read, batch.rows_accepted, batch.rows_rejected) == (3, 2, 1)
        assert "day" in batch.rejected.first()["reason"]
        fields = {f.name: f.dataType.simpleString() for f in batch.accepted.schema.fields}
        assert fields == {
            "id": "bigint",
            "day": "date",
            "amount": "decimal(10,2)",
            "ts": "timestamp",
            "flag": "boolean",
            "qty": "int",
            "ratio": "double",
            "note": "string",
            "loaded_by": "string",
            KEY_HASH: "string",
            NON_KEY_HASH: "string",
        }
        rows = by_id(batch.accepted.withColumn("ts_micros", F.unix_micros("ts")).collect())
        first, second = rows[9000000000], rows[2]
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        assert first["day"] == date(2024, 2, 29)
        assert first["amount"] == Decimal("1.50")
        assert first["ts_micros"] == (datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc) - epoch) // timedelta(
            microseconds=1
        )
        assert first["flag"] is True and first["qty"] == 7
        assert first["note"] is None
        assert second["amount"] == Decimal("-12.30")
        assert second["ts_micros"] == (datetime(2024, 1, 1, tzinfo=timezone.utc) - epoch) // timedelta(microseconds=1)
        assert second["flag"] is False and second["qty"] == -3
        assert second["note"] == "hello" and second["loaded_by"] is None
        # Same double, two spellings: same value, and the hashes differ only by the note.
        assert first["ratio"] == second["ratio"] == 3.1e-4
    finally:
        batch.release()


# --- several dates in one query -----------------------------------------------------------------


def _sources(spark, config, days):
    return {day: read_source(spark, config, day) for day in days}


def test_several_dates_keep_their_own_figures_and_duplicates(spark, tmp_path):
    config = make_config(tmp_path, duplicate_keys="quarantine", bad_records="quarantine")
    days = ["2024-01-02", "2024-01-03", "2024-01-04"]
    land(tmp_path, "id,name,qty\n1,a,1\n2,b,x\n", day=days[0])  # one bad value
    land(tmp_path, "ID,NAME,QTY\n1,a,1\n2,b,2\n", day=days[1])  # same keys as the day before: no duplicate
    land(tmp_path, "id,name,qty\n", day=days[2])  # empty extract
    prepared = prepare_incoming_dates(config, _sources(spark, config, days))
    try:
        assert prepared.figures == {
            days[0]: DateFigures(rows_read=2, rows_rejected=1, duplicate_keys=0),
            days[1]: DateFigures(rows_read=2, rows_rejected=0, duplicate_keys=0),
            days[2]: DateFigures(),
        }
        accepted = sorted((r["business_date"].isoformat(), r["id"], r["qty"]) for r in prepared.accepted.collect())
        assert accepted == [(days[0], 1, 1), (days[1], 1, 1), (days[1], 2, 2)]
        assert [(r["business_date"].isoformat(), json.loads(r["raw_record"])["qty"]) for r in prepared.rejected.collect()] == [
            (days[0], "x")
        ]
        # A header in another case lines up with the configured names.
        assert prepared.accepted.columns == ["id", "name", "qty", "business_date", KEY_HASH, NON_KEY_HASH]
    finally:
        prepared.release()


def test_several_dates_fail_on_the_oldest_date_that_breaks_a_policy(spark, tmp_path):
    config = make_config(tmp_path, bad_records="fail")
    days = ["2024-01-02", "2024-01-03", "2024-01-04"]
    land(tmp_path, "id,name,qty\n1,a,1\n", day=days[0])
    land(tmp_path, "id,name,qty\n1,a,one\n", day=days[1])
    land(tmp_path, "id,name,qty\n1,a,two\n", day=days[2])
    with pytest.raises(BadRecordsError) as raised:
        prepare_incoming_dates(config, _sources(spark, config, days))
    assert days[1] in str(raised.value) and "'one'" in str(raised.value)
    assert days[2] not in str(raised.value)
