"""The driver-side CSV header read gives the column names Spark's own inference gives, on real files."""

from __future__ import annotations

import gzip

import pytest

from cdc_assets.core.csv_header import can_read_header, read_csv_header, spark_header_names
from cdc_assets.core.source import CSV_DEFAULTS

# (file contents, reader options): header lines whose splitting or naming is not trivial.
CASES = {
    "plain": (b"id,name,qty\n1,a,2\n", {}),
    "quoted fields": (b'"id","full, name","say ""hi"""\n1,a,b\n', {}),
    "empty and duplicate names": (b"id,,Name,name,qty\n1,,a,b,2\n", {}),
    "leading blank lines": (b"\n  \nid,name\n1,a\n", {}),
    "byte order mark": (b"\xef\xbb\xbfid,name\n1,a\n", {}),
    "windows line ends": (b"id,name\r\n1,a\r\n", {}),
    "other separator": (b"id;name;qty\n1;a;2\n", {"sep": ";"}),
    "backslash escape": (b'id,"a\\"b",c\n1,2,3\n', {"escape": "\\"}),
    "null value": (b"id,NA,qty\n1,2,3\n", {"nullValue": "NA"}),
    "no header": (b"1,a,2\n", {"header": "false"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_header_equals_spark_inference(spark, tmp_path, case):
    contents, extra = CASES[case]
    folder = tmp_path / "extract"
    folder.mkdir()
    (folder / "part-0.csv").write_bytes(contents)
    options = {**CSV_DEFAULTS, **extra}
    assert can_read_header(spark, options)
    inferred = spark.read.options(**options).csv(str(folder)).columns
    files = spark.read.options(**options).schema("`_` string").csv(str(folder)).inputFiles()
    assert read_csv_header(spark, files, options) == inferred


def test_compressed_and_blank_files(spark, tmp_path):
    folder = tmp_path / "extract dir"  # a space: Spark lists files as URIs (%20)
    folder.mkdir()
    (folder / "a-empty.csv").write_bytes(b"")
    with gzip.open(folder / "b-part.csv.gz", "wb") as handle:
        handle.write(b"id,Qty\n1,2\n")
    files = spark.read.options(**CSV_DEFAULTS).schema("`_` string").csv(str(folder)).inputFiles()
    assert len(files) == 2
    assert read_csv_header(spark, files, CSV_DEFAULTS) == ["id", "Qty"]
    assert read_csv_header(spark, [f for f in files if "empty" in f], CSV_DEFAULTS) == []  # no input


def test_options_it_does_not_know_leave_the_header_to_spark(spark):
    assert not can_read_header(spark, {**CSV_DEFAULTS, "multiLine": "true"})
    assert not can_read_header(spark, {**CSV_DEFAULTS, "encoding": "ISO-8859-1"})
    assert not can_read_header(spark, {**CSV_DEFAULTS, "sep": "||"})
    assert can_read_header(spark, {**CSV_DEFAULTS, "dateFormat": "yyyy-MM-dd", "encoding": "UTF-8"})
    with pytest.raises(ValueError, match="multiLine"):
        read_csv_header(spark, [], {"multiLine": "true"})


def test_spark_header_names():
    assert spark_header_names(["id", "", "ID", "x"]) == ["id0", "_c1", "ID2", "x"]
    assert spark_header_names(["a", "NA"], null_value="NA") == ["a", "_c1"]
