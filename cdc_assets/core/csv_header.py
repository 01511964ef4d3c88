"""A CSV extract's header, read on the driver from the first line of its first file.

Spark infers a CSV header with a job per extract, and a range run has an extract per date. Reading
one line through the session's own Hadoop file system costs a few JVM round trips instead, and sees
the same files Spark will read (listed by Spark, with the reader's options). The line is parsed and
named the way Spark names header columns, so the result equals Spark's inference for the options
handled here. With any other reader option, or through Spark Connect (no JVM handle), the caller
lets Spark infer (:func:`can_read_header`).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping

from pyspark.sql import SparkSession

# Reader options that do not change how a header line is split or named (formats, parse modes,
# file selection). Options that do (sep, quote, escape, nullValue, header, encoding) are handled
# below; any option not listed leaves the header to Spark.
_NO_EFFECT_ON_HEADER = {
    "mode", "dateformat", "timestampformat", "timestampntzformat", "locale", "emptyvalue", "nanvalue",
    "positiveinf", "negativeinf", "maxcolumns", "maxcharspercolumn", "unescapedquotehandling",
    "enforceschema", "columnnameofcorruptrecord", "inferschema", "compression", "pathglobfilter",
    "recursivefilelookup", "modifiedbefore", "modifiedafter", "ignorecorruptfiles", "ignoremissingfiles",
}
_HANDLED = {"header", "sep", "delimiter", "quote", "escape", "nullvalue", "encoding", "charset"}
_UTF8 = {"utf-8", "utf8"}


def _dialect(options: Mapping[str, str]) -> dict | None:
    """Python ``csv`` settings equal to Spark's for these options, or None if there are none."""
    lowered = {key.lower(): str(value) for key, value in options.items()}
    if any(key not in _NO_EFFECT_ON_HEADER | _HANDLED for key in lowered):
        return None
    if lowered.get("encoding", lowered.get("charset", "utf-8")).lower() not in _UTF8:
        return None
    sep = lowered.get("sep", lowered.get("delimiter", ","))
    quote, escape = lowered.get("quote", '"'), lowered.get("escape", "\\")
    if len(sep) != 1 or len(quote) != 1 or len(escape) != 1:
        return None  # multi-character or escaped separators, or no quoting: Spark's parser decides
    if escape == quote:
        return {"delimiter": sep, "quotechar": quote, "doublequote": True}
    return {"delimiter": sep, "quotechar": quote, "doublequote": False, "escapechar": escape}


def _first_line(spark: SparkSession, files: list[str]) -> str | None:
    """The first non-blank line of the first file that has one; None if every file is blank."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    codecs = jvm.org.apache.hadoop.io.compress.CompressionCodecFactory(conf)
    for uri in files:
        # Spark lists files as URIs (a space is %20); a Path built from the URI decodes them.
        path = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri))
        stream = path.getFileSystem(conf).open(path)
        try:
            codec = codecs.getCodec(path)  # by extension, as Spark's reader decides (e.g. .csv.gz)
            if codec is not None:
                stream = codec.createInputStream(stream)
            reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
            line = reader.readLine()
            while line is not None and not line.strip():
                line = reader.readLine()
        finally:
            stream.close()  # closes the decompressor and the file alike
        if line is not None:
            return line.removeprefix("\ufeff")  # Hadoop's line reader skips a UTF-8 byte order mark too
    return None


def spark_header_names(fields: list[str], null_value: str = "") -> list[str]:
    """Column names for header fields as Spark makes them (``CSVUtils.makeSafeHeader``, case-insensitive).

    An empty field (or the null value) becomes ``_c<index>``; a name that occurs more than once
    (ignoring case) gets its index appended.
    """
    lowered = [field.lower() for field in fields]
    duplicated = {name for name in lowered if lowered.count(name) > 1}
    names = []
    for index, field in enumerate(fields):
        if field == "" or field == null_value:
            names.append(f"_c{index}")
        elif field.lower() in duplicated:
            names.append(f"{field}{index}")
        else:
            names.append(field)
    return names


def can_read_header(spark: SparkSession, options: Mapping[str, str]) -> bool:
    """Whether :func:`read_csv_header` gives Spark's names for these reader options on this session."""
    return _dialect(options) is not None and not type(spark).__module__.startswith("pyspark.sql.connect")


def read_csv_header(spark: SparkSession, files: list[str], options: Mapping[str, str]) -> list[str]:
    """The column names Spark would infer for these CSV files (check :func:`can_read_header` first).

    ``files`` are the files Spark lists for the extract (``DataFrame.inputFiles()``). Returns ``[]``
    when there is no line at all (no files, or only blank ones): no input.
    """
    dialect = _dialect(options)
    if dialect is None:
        raise ValueError(f"reader options {dict(options)} need Spark's own header inference")
    line = _first_line(spark, sorted(files))
    if line is None:
        return []
    fields = next(csv.reader([line], **dialect))
    lowered = {key.lower(): str(value) for key, value in options.items()}
    if lowered.get("header", "true").lower() != "true":
        return [f"_c{index}" for index in range(len(fields))]
    return spark_header_names(fields, lowered.get("nullvalue", ""))
