"""Reading, validating and preparing a day's extract from real CSV files in tmp_path."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from datetime import date, datetime, timedelta, timezone
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_assets.model.config import TableConfig
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH
from cdc_assets.core.intake.incoming import (
    BadRecordsError,
    DateFigures,
    DuplicateKeysError,
    prepare_incoming_dates,
)
from cdc_assets.core.intake.source import (
    RECORD_ID,
    REJECT_REASON,
    SOURCE_FILE,
    SourceError,
    accepted_records,
    header_mismatch,
    read_source,
    validate_records,
)

DAY = date(2024, 1, 2)
DAY_TEXT = DAY.isoformat()


@dataclass
class IncomingBatch:
    """One date's input after validation, as these tests look at it. ``release()`` frees the cached rows."""

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


def prepare_incoming(spark: SparkSession, config: TableConfig, business_date: date) -> IncomingBatch:
    """Read one date's extract and split it into accepted (typed, hashed) and rejected rows:
    :func:`prepare_incoming_dates` for a single date, without the date column; raises as it does."""
    day = business_date.isoformat()
    prepared = prepare_incoming_dates(config, {day: read_source(spark, config, day)})
    figures = prepared.figures[day]
    return IncomingBatch(
        accepted=prepared.accepted.drop(BUSINESS_DATE),
        rejected=prepared.rejected.drop(BUSINESS_DATE),
        rows_read=figures.rows_read,
        rows_rejected=figures.rows_rejected,
        duplicate_keys=figures.duplicate_keys,
        _cached=prepared._cached,
    )


def make_config(tmp_path: Path, **overrides) -> TableConfig:
    data = {
        "name": "orders",
        "start_date": "2024-01-01",
        "load_type": "full",
        "source": {"path": str(tmp_path / "landing" / "{date}") + "/", "format": "csv"},
        "keys": [{"name": "id", "type": "int"}],
        "non_keys": [{"name": "name", "type": "string"}, {"name": "qty", "type": "int"}],
        # These tests quarantine every bad record; what a full load does with one that names no key
        # (the date fails under `quarantine`) is tested in tests/test_bad_values.py.
        "bad_records": "quarantine_unkeyed",
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


def test_source_column_named_like_the_intakes_own_is_refused_even_as_an_extra(spark, tmp_path):
    """Extra columns are dropped once validated, so one named like an output column changes nothing; one
    named like a column the intake uses on the same frame would (``__cdc_tombstone`` made rows vanish
    uncounted), so the date fails naming the input and the column."""
    config = make_config(tmp_path, allow_extra_columns=True)
    land(tmp_path, "id,name,qty,Business_Date,__CDC_tombstone,_metadata,key_hash\n1,alpha,3,2020-01-01,true,x,h\n")
    with pytest.raises(SourceError) as raised:
        read_source(spark, config, DAY_TEXT)
    message = str(raised.value)
    assert str(tmp_path / "landing" / DAY_TEXT) in message
    assert "['Business_Date', '__CDC_tombstone', '_metadata']" in message and "uses for its own columns" in message
    land(tmp_path, "id,name,qty,key_hash,operation\n1,alpha,3,h,I\n")
    accepted = accepted_records(read_validated(spark, config))
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


# --- the header: Spark's own handling, every file checked -----------------------------------------

# (file contents, extra reader options, columns read_source gives): headers whose splitting or
# naming is not trivial. Every case has the configured id, name and qty; the data row is 1, alpha, 2.
HEADER_CASES = {
    "plain": (b"id,name,qty\n1,alpha,2\n", {}, ["id", "name", "qty"]),
    "case differs from the config": (b"ID,Name,qty\n1,alpha,2\n", {}, ["id", "name", "qty"]),
    "quoted fields": (
        b'"id","full, name","say ""hi""",name,"qty"\n1,"x, y",b,alpha,2\n',
        {},
        ["id", "full, name", 'say "hi"', "name", "qty"],
    ),
    "empty and duplicate names": (
        b"id,,name,qty,x,X\n1,e,alpha,2,p,q\n",
        {},
        ["id", "_c1", "name", "qty", "x4", "X5"],
    ),
    "null value in the header": (b"id,NA,name,qty\n1,z,alpha,2\n", {"nullValue": "NA"}, ["id", "_c1", "name", "qty"]),
    "trailing separator": (b"id,name,qty,\n1,alpha,2,\n", {}, ["id", "name", "qty", "_c3"]),
    "leading blank lines": (b"\n  \nid,name,qty\n1,alpha,2\n", {}, ["id", "name", "qty"]),
    "byte order mark": (b"\xef\xbb\xbfid,name,qty\n1,alpha,2\n", {}, ["id", "name", "qty"]),
    "windows line ends": (b"id,name,qty\r\n1,alpha,2\r\n", {}, ["id", "name", "qty"]),
    "other separator": (b"id;name;qty\n1;alpha;2\n", {"sep": ";"}, ["id", "name", "qty"]),
    "backslash escape": (b'id,"a\\"b",name,qty\n1,z,alpha,2\n', {"escape": "\\"}, ["id", 'a"b', "name", "qty"]),
}


def spaced_config(tmp_path: Path, options: dict | None = None, **overrides) -> TableConfig:
    """A config whose source folder has a space in its path (Spark lists files as URIs: %20)."""
    source = {"path": str(tmp_path / "landing dir" / "{date}") + "/", "options": options or {}}
    return make_config(tmp_path, source=source, allow_extra_columns=True, **overrides)


def land_bytes(tmp_path: Path, contents: bytes, file_name: str = "part-0.csv", day: str = DAY_TEXT) -> Path:
    folder = tmp_path / "landing dir" / day
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name
    path.write_bytes(gzip.compress(contents) if file_name.endswith(".gz") else contents)
    return path


def read_columns(frame) -> list[str]:
    return [name for name in frame.columns if name not in (SOURCE_FILE, RECORD_ID) and not name.startswith("__cdc_")]


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_header_names_and_rows(spark, tmp_path, case):
    contents, options, expected = HEADER_CASES[case]
    land_bytes(tmp_path, contents)
    frame = read_source(spark, spaced_config(tmp_path, options), DAY_TEXT)
    assert read_columns(frame) == [*expected, "_corrupt_record"]
    # The scan checks the file's header against these names (enforceSchema false) and reads the row.
    (row,) = frame.collect()
    assert (row["id"], row["name"], row["qty"], row["_corrupt_record"]) == ("1", "alpha", "2", None)


def test_gzip_and_empty_files_in_one_date(spark, tmp_path):
    land_bytes(tmp_path, b"", "a-empty.csv")
    land_bytes(tmp_path, b"ID,Qty,name\n1,2,alpha\n3,4,beta\n", "b-part.csv.gz")
    frame = read_source(spark, spaced_config(tmp_path), DAY_TEXT)
    assert read_columns(frame) == ["id", "qty", "name", "_corrupt_record"]
    assert sorted((r["id"], r["name"], r["qty"]) for r in frame.collect()) == [("1", "alpha", "2"), ("3", "beta", "4")]


def test_only_empty_files_are_no_input(spark, tmp_path):
    land_bytes(tmp_path, b"", "part-0.csv")
    with pytest.raises(SourceError, match="no input at"):
        read_source(spark, spaced_config(tmp_path), DAY_TEXT)


def test_files_of_one_date_whose_headers_differ_in_order_fail_instead_of_misreading(spark, tmp_path):
    config = make_config(tmp_path)
    land(tmp_path, "id,name,qty\n1,alpha,10\n", "part-0.csv")
    land(tmp_path, "qty,id,name\n20,2,beta\n", "part-1.csv")  # read by position this is id=20, name=2, qty=beta
    frame = read_source(spark, config, DAY_TEXT)  # the header of one file is read; the rows are not yet
    with pytest.raises(Exception) as raised:
        frame.collect()
    error = header_mismatch(config, raised.value)
    assert isinstance(error, SourceError)
    message = str(error)
    # Spark takes the header from one of the two files and fails the other; either way round it says so.
    assert message.startswith("table orders: input file ")
    assert ("part-1.csv" in message) != ("part-0.csv" in message)
    assert "id, name, qty" in message and "qty, id, name" in message
    assert "first difference" in message and "same columns in the same order" in message
    # The whole intake fails on it too (in the job that first reads the rows): no row is read by
    # position. The error is Spark's until the intake wraps it, then the SourceError itself.
    with pytest.raises(Exception) as raised:
        prepare_incoming(spark, config, DAY)
    error = raised.value if isinstance(raised.value, SourceError) else header_mismatch(config, raised.value)
    assert "does not have the header its date was read with" in str(error)


def test_a_file_with_another_number_of_columns_fails(spark, tmp_path):
    config = make_config(tmp_path, allow_extra_columns=True)
    land(tmp_path, "id,name,qty,note\n1,alpha,10,a long note to make this the larger file\n", "part-0.csv")
    land(tmp_path, "id,name,qty\n2,beta,20\n", "part-1.csv")
    with pytest.raises(Exception) as raised:
        read_source(spark, config, DAY_TEXT).collect()
    message = str(header_mismatch(config, raised.value))
    assert "part-1.csv" in message or "part-0.csv" in message
    assert "it has 3 column(s) where the header the date was read with has 4" in message or (
        "it has 4 column(s) where the header the date was read with has 3" in message
    )


def test_headers_differing_only_in_case_are_the_same_header(spark, tmp_path):
    config = make_config(tmp_path)
    land(tmp_path, "id,name,qty\n1,alpha,10\n", "part-0.csv")
    land(tmp_path, "ID,NAME,QTY\n2,beta,20\n", "part-1.csv")
    frame = read_source(spark, config, DAY_TEXT)
    assert sorted((r["id"], r["name"], r["qty"]) for r in frame.collect()) == [("1", "alpha", "10"), ("2", "beta", "20")]


def test_case_sensitive_session_reads_a_header_in_another_case_than_the_config(spark, tmp_path):
    # Spark's per-file check compares names as spark.sql.caseSensitive says: the schema carries the
    # header's own spelling, and the columns are renamed to the configured names afterwards.
    config = make_config(tmp_path)
    land(tmp_path, "ID,Name,qty\n1,alpha,10\n")
    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        frame = read_source(spark, config, DAY_TEXT)
        assert read_columns(frame) == ["id", "name", "qty", "_corrupt_record"]
        assert [(r["id"], r["name"], r["qty"]) for r in frame.collect()] == [("1", "alpha", "10")]
    finally:
        spark.conf.unset("spark.sql.caseSensitive")


def test_made_up_names_with_several_files_are_an_error(spark, tmp_path):
    # Spark names a duplicated field x3, x4; its per-file check compares the raw "x" and can never
    # pass, so with several files nothing would stop one of them being read by position.
    config = make_config(tmp_path, allow_extra_columns=True)
    land(tmp_path, "id,name,qty,x,x\n1,alpha,10,p,q\n", "part-0.csv")
    land(tmp_path, "id,name,qty,x,x\n2,beta,20,r,s\n", "part-1.csv")
    with pytest.raises(SourceError, match=r"(?s)empty or duplicate column names.* 2 files.*\['x3', 'x4'\]"):
        read_source(spark, config, DAY_TEXT)


def test_names_that_only_look_made_up_are_checked_as_usual(spark, tmp_path):
    config = make_config(tmp_path, allow_extra_columns=True)
    land(tmp_path, "id,name,qty,c3,c4\n1,alpha,10,p,q\n", "part-0.csv")
    land(tmp_path, "id,name,qty,c3,c4\n2,beta,20,r,s\n", "part-1.csv")
    frame = read_source(spark, config, DAY_TEXT)
    assert read_columns(frame) == ["id", "name", "qty", "c3", "c4", "_corrupt_record"]
    assert sorted((r["id"], r["c4"]) for r in frame.collect()) == [("1", "q"), ("2", "s")]
    land(tmp_path, "id,name,qty,c4,c3\n3,gamma,30,t,u\n", "part-2.csv")  # the two last swapped
    with pytest.raises(Exception) as raised:
        read_source(spark, config, DAY_TEXT).collect()
    message = str(header_mismatch(config, raised.value))
    # The file's own header names columns the config does not (extra ones): it could be a first record, so it
    # is masked in a message Dagster keeps (model/masking.py); the date's other header is named.
    assert "id, name, qty, c4, c3" in message and "(masked)" in message


def test_header_mismatch_leaves_other_errors_alone(tmp_path):
    config = make_config(tmp_path)
    assert header_mismatch(config, RuntimeError("[FAILED_READ_FILE.NO_HINT] Encountered error while reading file x")) is None
    assert header_mismatch(config, ValueError("CSV header does not conform")) is None


# Through Spark Connect: the same code, the same errors (a Connect client must run in a process
# without a classic session, so it runs in a subprocess).
CONNECT_CLIENT = """
import sys
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from cdc_assets.model.config import TableConfig
from cdc_assets.core.intake.source import SourceError, header_mismatch, read_source

spark = SparkSession.builder.getOrCreate()
print("module", type(spark).__module__)
config = TableConfig.model_validate({
    "name": "orders", "start_date": "2024-01-01", "load_type": "full",
    "source": {"path": sys.argv[1] + "/{date}/", "format": "csv"},
    "keys": [{"name": "id", "type": "int"}],
    "non_keys": [{"name": "name", "type": "string"}, {"name": "qty", "type": "int"}],
})
print("columns", read_source(spark, config, "2024-01-02").columns)
read = read_source(spark, config, "2024-01-02").select("id", "name", "qty", F.split("__cdc_bad", ":").getItem(0))
print("rows", sorted(tuple(r) for r in read.collect()))
for day in ("2024-01-03", "2024-01-04"):  # a missing date, an empty folder
    try:
        read_source(spark, config, day)
    except SourceError as error:
        print("missing", day, "no input at" in str(error))
try:
    read_source(spark, config, "2024-01-05").collect()
except Exception as error:
    print("mismatch", str(header_mismatch(config, error)).replace("\\n", " | "))  # summary | detail, on one line
"""


@pytest.mark.slow
def test_through_spark_connect(connect_server, tmp_path):
    root = tmp_path / "landing"
    for day, name, text in [
        ("2024-01-02", "part-0.csv", b"ID,name,qty\n1,alpha,10\n3,ab\xffc,30\n"),  # 3: not UTF-8, decoded through Connect
        ("2024-01-02", "part-1.csv", b"id,NAME,qty\n2,beta,20\n"),
        ("2024-01-05", "part-0.csv", b"id,name,qty\n1,alpha,10\n"),
        ("2024-01-05", "part-1.csv", b"name,qty,id\nbeta,20,2\n"),
    ]:
        (root / day).mkdir(parents=True, exist_ok=True)
        (root / day / name).write_bytes(text)
    (root / "2024-01-04").mkdir()
    completed = subprocess.run(
        [sys.executable, "-c", CONNECT_CLIENT, str(root)],
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "SPARK_REMOTE": connect_server.client_url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    printed = [line for line in completed.stdout.splitlines() if line]
    assert printed[0] == "module pyspark.sql.connect.session"
    assert printed[1] == "columns ['id', 'name', 'qty', '_corrupt_record', '_source_file', '_record_id', '__cdc_bad', '__cdc_raw_line']"
    assert printed[2] == "rows [('1', 'alpha', '10', None), ('2', 'beta', '20', None), ('3', None, '30', 'invalid_encoding')]"
    assert printed[3:5] == ["missing 2024-01-03 True", "missing 2024-01-04 True"]
    assert printed[5].startswith(f"mismatch table orders: input file file://{root}/2024-01-05/part-"), printed[5]
    assert "first difference" in printed[5]


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
    config = make_config(tmp_path, bad_records="quarantine_unkeyed")
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
    # A key declared not sensitive is named in the error (by default keys are masked: tests/test_masking.py).
    config = make_config(tmp_path, duplicate_keys="fail", keys=[{"name": "id", "type": "int", "sensitive": False}])
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
    config = make_config(tmp_path, duplicate_keys="fail", keys=[{"name": "id", "type": "int", "sensitive": False}])
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


# --- encodings (source.encoding) --------------------------------------------------------------------


def land_raw(tmp_path: Path, contents: bytes) -> None:
    land(tmp_path, "").write_bytes(contents)


def _raw_fields(raw_record: str) -> dict[str, bytes]:
    """A rejected record's fields as the source's bytes: its raw record holds them as ISO-8859-1."""
    return {name: value.encode("latin-1") for name, value in json.loads(raw_record).items()}


def test_bytes_that_are_not_utf8_are_bad_records_not_replacement_characters(spark, tmp_path):
    """Spark alone reads both b'ab\\xffc' and b'ab\\xfec' as 'ab\\ufffdc': one key. Here each is a bad
    record whose raw record holds its own bytes; a U+FFFD the source sent (EF BF BD) is accepted."""
    config = make_config(tmp_path, keys=[{"name": "code", "type": "string"}])
    land_raw(
        tmp_path,
        b"code,name,qty\n"
        b"caf\xc3\xa9,ok,1\n"  # valid UTF-8
        b"ab\xffc,first,2\n"  # two keys that differ only in an invalid byte
        b"ab\xfec,second,3\n"
        b"gen\xef\xbf\xbdu,sent,4\n"  # a replacement character the source did send
        b"plain,bad \xe9 name,5\n"  # an invalid byte in a non-key
        b"x\xff,too,many,fields\n",  # malformed and not UTF-8
    )
    batch = prepare_incoming(spark, config, DAY)
    try:
        assert (batch.rows_read, batch.rows_accepted, batch.rows_rejected) == (6, 2, 4)
        accepted = {row["code"]: row["name"] for row in batch.accepted.collect()}
        assert accepted == {"café": "ok", "gen\ufffdu": "sent"}
        rejected = batch.rejected.collect()
        assert all(row["reason"].startswith("invalid_encoding: ") for row in rejected), rejected
        assert not any("\ufffd" in row["raw_record"] for row in rejected)
        fields = {
            (row["reason"].split(" has ")[0], _raw_fields(row["raw_record"])["code"]): _raw_fields(row["raw_record"])
            for row in rejected if row["raw_record"].startswith("{")
        }
        assert sorted(fields) == [
            ("invalid_encoding: column code", b"ab\xfec"),
            ("invalid_encoding: column code", b"ab\xffc"),
            ("invalid_encoding: column name", b"plain"),
        ]
        assert fields["invalid_encoding: column name", b"plain"]["name"] == b"bad \xe9 name"
        (malformed,) = [row for row in rejected if not row["raw_record"].startswith("{")]
        assert malformed["raw_record"].encode("latin-1") == b"x\xff,too,many,fields"
        assert "the record has bytes that are not valid UTF-8" in malformed["reason"]
    finally:
        batch.release()


def test_single_byte_encodings_are_decoded_and_their_undefined_bytes_rejected(spark, tmp_path):
    latin1 = make_config(tmp_path, source={"path": str(tmp_path / "landing" / "{date}") + "/", "encoding": "latin-1"})
    land_raw(tmp_path, b"id,name,qty\n1,caf\xe9,1\n2,\xff\x80,2\n")
    assert {row["id"]: row["name"] for row in accepted_records(read_validated(spark, latin1)).collect()} == {
        1: "café", 2: "ÿ\x80"
    }
    windows = make_config(
        tmp_path, source={"path": str(tmp_path / "landing" / "{date}") + "/", "encoding": "windows-1252", "options": {"sep": "¦"}}
    )
    land_raw(tmp_path, b"id\xa6name\xa6qty\n1\xa6\x80 5\xa61\n2\xa6a\x81b\xa62\n")  # ¦ is byte A6; 0x81 is undefined
    validated = read_validated(spark, windows)
    assert [(row["id"], row["name"]) for row in accepted_records(validated).collect()] == [(1, "€ 5")]
    (rejected,) = validated.filter(F.col(REJECT_REASON).isNotNull()).collect()
    assert rejected[REJECT_REASON].startswith("invalid_encoding: column name has bytes that are not valid windows-1252")
    assert _raw_fields(rejected["_raw_record"])["name"] == b"a\x81b"


def test_a_json_line_with_bytes_that_are_not_utf8_is_an_invalid_encoding(spark, tmp_path):
    source = {"path": str(tmp_path / "landing" / "{date}") + "/", "format": "json"}
    config = make_config(tmp_path, source=source, allow_extra_columns=True)  # Spark's _corrupt_record is a column
    bad_line = b'{"id":2,"name":"ab\xffc","qty":2}'
    land(tmp_path, "", "part-0.json").write_bytes(b'{"id":1,"name":"caf\xc3\xa9","qty":1}\n' + bad_line + b"\n")
    batch = prepare_incoming(spark, config, DAY)
    try:
        assert (batch.rows_read, batch.rows_accepted, batch.rows_rejected) == (2, 1, 1)
        assert [row["name"] for row in batch.accepted.collect()] == ["café"]
        (rejected,) = batch.rejected.collect()
        assert rejected["reason"].startswith("invalid_encoding: the record has bytes that are not valid UTF-8")
        assert rejected["raw_record"].encode("latin-1") == bad_line
    finally:
        batch.release()


def test_a_run_quarantines_keys_that_differ_only_in_bytes_that_are_not_utf8(spark, tmp_path, warehouse):
    """End to end through the asset graph: the two keys are not collapsed into one 'ab\\ufffdc' in
    current_table; they are in rejects with their own bytes, and the counts reconcile."""
    from tests.pipeline import definitions_for, partition_dir, read_stored, run_dates, write_table_config

    day = "2019-06-18"
    (tmp_path / "extracts" / day).mkdir(parents=True)
    (tmp_path / "extracts" / day / "part-0.csv").write_bytes(b"code,name\nab\xffc,first\nab\xfec,second\ncaf\xc3\xa9,ok\n")
    config = write_table_config(
        tmp_path / "configs", "coded", f"{tmp_path}/extracts/{{date}}/",
        keys=[{"name": "code", "type": "string"}], non_keys=[{"name": "name", "type": "string"}],
    )
    (result,) = run_dates(definitions_for(config), [day])
    assert result.success
    current = read_stored(spark, partition_dir(warehouse, "coded", "current_table", day)).collect()
    assert [(row["code"], row["name"], row["operation"]) for row in current] == [("café", "ok", "I")]
    rejects = read_stored(spark, partition_dir(warehouse, "coded", "rejects", day)).collect()
    assert sorted(_raw_fields(row["raw_record"])["code"] for row in rejects) == [b"ab\xfec", b"ab\xffc"]
    assert all(row["reason"].startswith("invalid_encoding: column code") for row in rejects)
    (read,) = [
        event.event_specific_data.materialization.metadata["rows_read"].value
        for event in result.get_asset_materialization_events()
        if event.asset_key.path[-1] == "hashed_incoming"
    ]
    assert read == len(current) + len(rejects) == 3


# --- typed sources: a lossy cast is a bad record (issue 46, point 9) ------------------------------


def _typed_config(tmp_path: Path, source_format: str, non_keys: list[dict], **overrides) -> TableConfig:
    return make_config(
        tmp_path,
        source={"path": str(tmp_path / "landing" / "{date}") + "/", "format": source_format},
        non_keys=non_keys,
        **overrides,
    )


def _outcome(spark, config) -> dict[int, str | tuple]:
    """Each record's outcome by id: its reason if rejected, else its typed values (the id not included)."""
    validated = read_validated(spark, config)
    names = [column.name for column in config.non_keys]
    return {
        row["id"]: row[REJECT_REASON] if row[REJECT_REASON] else tuple(row[name] for name in names)
        for row in validated.select("id", REJECT_REASON, *names).collect()
    }


def test_a_parquet_value_that_a_cast_would_change_is_rejected_as_a_lossy_cast(spark, tmp_path):
    folder = tmp_path / "landing" / DAY_TEXT
    spark.createDataFrame(
        [(1, 3.7, Decimal("12.345"), 5, True), (2, 3.0, Decimal("12.340"), 5, False), (3, 2.0, Decimal("1.000"), 3_000_000_000, None)],
        "id int, score double, price decimal(10,3), big bigint, flag boolean",
    ).coalesce(1).write.parquet(str(folder))
    config = _typed_config(
        tmp_path,
        "parquet",
        [
            {"name": "score", "type": "int"},
            {"name": "price", "type": "decimal(10,2)"},
            {"name": "big", "type": "int"},
            {"name": "flag", "type": "string"},
        ],
    )

    outcome = _outcome(spark, config)

    assert outcome[1] == "lossy_cast: column score, from double to int: value '3.7'"
    # A value the narrower type holds exactly passes; a boolean into a string column keeps its exact text.
    assert outcome[2] == (3, Decimal("12.34"), 5, "false")
    assert outcome[3] == "lossy_cast: column big, from bigint to int: value '3000000000'"  # an overflow
    rounded = read_validated(spark, _typed_config(tmp_path, "parquet", [{"name": "price", "type": "decimal(10,2)"}], allow_extra_columns=True))
    reasons = {row["id"]: row[REJECT_REASON] for row in rounded.collect()}
    assert reasons == {1: "lossy_cast: column price, from decimal(10,3) to decimal(10,2): value '12.345'", 2: None, 3: None}


def test_a_widening_cast_of_a_typed_source_is_accepted(spark, tmp_path):
    folder = tmp_path / "landing" / DAY_TEXT
    spark.createDataFrame(
        [(1, 2_147_483_647, 1.5, Decimal("12345678.91"), 42)],
        "id int, wide int, ratio float, amount decimal(10,2), whole int",
    ).coalesce(1).write.parquet(str(folder))
    config = _typed_config(
        tmp_path,
        "parquet",
        [
            {"name": "wide", "type": "bigint"},
            {"name": "ratio", "type": "double"},
            {"name": "amount", "type": "decimal(12,2)"},
            {"name": "whole", "type": "decimal(10,2)"},
        ],
    )

    assert _outcome(spark, config) == {1: (2_147_483_647, 1.5, Decimal("12345678.91"), Decimal("42.00"))}


def test_json_numbers_and_csv_decimals_that_a_cast_would_round_are_rejected(spark, tmp_path):
    land(tmp_path, '{"id":1,"qty":3.7,"price":12.345}\n{"id":2,"qty":4,"price":12.3}\n', "part-0.json")
    config = _typed_config(tmp_path, "json", [{"name": "qty", "type": "int"}, {"name": "price", "type": "decimal(10,2)"}])

    outcome = _outcome(spark, config)

    assert outcome[1] == "lossy_cast: column qty, from double to int: value '3.7'"
    assert outcome[2] == (4, Decimal("12.30"))
    csv_config = make_config(tmp_path / "csv", non_keys=[{"name": "price", "type": "decimal(10,2)"}])
    land(tmp_path / "csv", "id,price\n1,12.345\n2,12.3\n3,7\n")
    assert _outcome(spark, csv_config) == {
        1: "lossy_cast: column price, from string to decimal(10,2): value '12.345' has more decimal places",
        2: (Decimal("12.30"),),
        3: (Decimal("7.00"),),
    }
