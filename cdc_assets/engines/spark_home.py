"""The installed pyspark as Spark's home: the launchers the services start (``bin/spark-submit``,
``spark-class``, ``spark-sql``, ``beeline``) and the environment they run in.

pyspark's wheel ships the launchers and the jars, so nothing is downloaded. No Dagster import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from cdc_assets.model import settings
from cdc_assets.engines.process import HOST

# A launcher given these would start a Spark Connect client instead of the JVM it is to run.
CONNECT_CLIENT_ENV = (settings.SPARK_REMOTE.name, "SPARK_CONNECT_MODE_ENABLED")


def spark_home() -> str:
    """The installed pyspark package: it holds ``bin/spark-submit`` and ``jars/``."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def launcher(name: str) -> str:
    """The path of ``bin/<name>`` in :func:`spark_home`, e.g. ``spark-submit``."""
    return os.path.join(spark_home(), "bin", name)


def spark_env() -> dict[str, str]:
    """This process's environment for a launcher: no Connect client settings, ``SPARK_HOME`` at pyspark,
    and 127.0.0.1 as the address every Spark socket binds to (``SPARK_LOCAL_IP``)."""
    env = {key: value for key, value in os.environ.items() if key not in CONNECT_CLIENT_ENV}
    env["SPARK_HOME"] = spark_home()
    env["SPARK_LOCAL_IP"] = HOST
    return env


# -- Spark conf in a file only the owner reads ----------------------------------------------------------


def write_properties_file(path: Path, conf: Mapping[str, str]) -> Path:
    """``conf`` as a Java properties file at ``path``, readable by its owner only (mode 0600).

    For ``spark-submit --properties-file``: conf given as ``--conf key=value`` is on the process's command
    line, which any local user reads (``ps``), and ``CDC_SPARK_CONF`` may hold credentials.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        for key, value in conf.items():
            handle.write(f"{_escape_property(key, is_key=True)}={_escape_property(value, is_key=False)}\n")
    return path


def _escape_property(text: str, is_key: bool) -> str:
    """``text`` as java.util.Properties reads it back (Spark reads the file as UTF-8)."""
    escaped = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t").replace("\f", "\\f")
    if is_key:
        for special in ("=", ":", " ", "#", "!"):
            escaped = escaped.replace(special, f"\\{special}")
    elif escaped.startswith(" "):
        escaped = "\\" + escaped
    return escaped
