"""The Apache Iceberg runtime on every Spark the project starts: a run's own session, the Spark Connect
server, the SQL server and spark-sql (and, through the driver, a standalone cluster's executors).

``make install`` copies the pinned jars (the Iceberg Spark runtime and the SQLite JDBC driver of the
embedded catalog, see the Makefile's ``jars`` target) into ``.jars/`` of the project; nothing is
downloaded here. Each JVM gets them as ``spark.jars`` and Iceberg's SQL extensions (its ``CALL``
procedures, ``ALTER TABLE ... CREATE TAG``, ...) as ``spark.sql.extensions``. Both are static: a JVM takes them
when it starts, and a Spark Connect client cannot set them (the server has them).

No Dagster import.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

JARS_FOLDER = ".jars"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
# The jars without which Spark cannot open the catalog, by the start of their file names.
REQUIRED_JARS = {"iceberg-spark-runtime-": "the Iceberg Spark runtime", "sqlite-jdbc-": "the SQLite JDBC driver"}
JARS_KEY = "spark.jars"
EXTENSIONS_KEY = "spark.sql.extensions"


class IcebergRuntimeMissing(RuntimeError):
    """The project's ``.jars/`` lacks a jar Spark needs for the Iceberg catalog."""


def project_root() -> Path:
    """The project's folder: the one holding the ``cdc_assets`` package (an editable install's checkout)."""
    return Path(__file__).resolve().parents[2]


def jars_folder() -> Path:
    return project_root() / JARS_FOLDER


def iceberg_jars() -> list[str]:
    """The absolute paths of every jar in the project's ``.jars/``, sorted.

    Raises :class:`IcebergRuntimeMissing`, naming what is missing and ``make install``, when the Iceberg
    runtime or the SQLite driver is not there.
    """
    folder = jars_folder()
    jars = sorted(str(path) for path in folder.glob("*.jar") if path.is_file())
    names = [Path(jar).name for jar in jars]
    missing = [what for prefix, what in REQUIRED_JARS.items() if not any(name.startswith(prefix) for name in names)]
    if missing:
        raise IcebergRuntimeMissing(
            f"{' and '.join(missing)} for Spark {'are' if len(missing) > 1 else 'is'} not in {folder}: run `make install` "
            "(it copies the pinned jars with Maven; without Maven Central, see the README's \"Without Maven Central\")"
        )
    unusable = [jar for jar in jars if "," in jar]
    if unusable:
        # spark.jars is a comma-separated list.
        raise IcebergRuntimeMissing(f"Spark cannot load a jar whose path holds a comma: {unusable[0]}; move the project to a folder without one")
    return jars


def with_iceberg_runtime(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with the project's jars and Iceberg's SQL extensions in front of any jars and extensions it
    names already (a user's ``CDC_SPARK_CONF`` adds to them rather than replacing them).

    For the conf a JVM starts with; raises :class:`IcebergRuntimeMissing` as :func:`iceberg_jars` does.
    """
    merged = dict(conf)
    merged[JARS_KEY] = _prepend(iceberg_jars(), merged.get(JARS_KEY, ""))
    merged[EXTENSIONS_KEY] = _prepend([ICEBERG_EXTENSIONS], merged.get(EXTENSIONS_KEY, ""))
    return merged


def _prepend(ours: list[str], theirs: str) -> str:
    items = list(ours)
    for item in (part.strip() for part in theirs.split(",")):
        if item and item not in items:
            items.append(item)
    return ",".join(items)
