"""The Spark conf every JVM the project starts begins with, and ``CDC_SPARK_CONF``: what a run's session, the
Connect server, the SQL endpoint and the cluster's applications share. Plain dictionaries and the one reading
of the variable, below the resources and the processes that use them (no Spark, no Dagster here)."""

from __future__ import annotations

import json

from cdc_assets.model import settings
from cdc_assets.model.file_modes import configured_umask
from cdc_assets.engines.process import HOST

# Conf the pipeline relies on; anything here can still be overridden.
PIPELINE_DEFAULTS: dict[str, str] = {
    # Timestamps must round-trip through Parquet and hashing the same way on every machine.
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    # Reading one partition folder directly must not pick up a stray sibling's schema.
    "spark.sql.parquet.mergeSchema": "false",
    # PySpark 4 records the Python call site of every DataFrame function for error messages: about 10
    # extra JVM round trips per call. Building one date's validation and hash expressions took 4,778
    # round trips with it and 1,508 without (1.1 s -> 0.5 s per date). Errors still name the failing
    # expression; they lose only the Python line that built it.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Generated classes are cached by their source code. With the stage id in the class name, equal
    # stages of one plan (a range's per-date branches) or of successive queries each compile again;
    # a cold compile of the intake's stage is about 0.1 s. Only stack traces lose the id.
    "spark.sql.codegen.useIdInClassName": "false",
    # HotSpot never JIT-compiles a method of more than 8,000 bytes of bytecode: such a whole-stage
    # method runs interpreted on every run, on a warm JVM as on a cold one. The intake's validation
    # and hashing together made one of about 11 KB (15 columns) and ran at a third of the speed; Spark
    # falls back from whole-stage codegen for a stage whose method would pass this limit (its own
    # advice for HotSpot; Spark's default, 65,535, is the JVM's hard limit). A session conf, so it
    # reaches a Connect server's sessions too.
    "spark.sql.codegen.hugeMethodLimit": "8000",
}


# Only for the embedded local default: a single JVM holds driver and executors.
LOCAL_DEFAULTS: dict[str, str] = {"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "8"}

LOOPBACK = HOST
# Every JVM the project starts (a run's own session, the servers) listens on loopback only: its driver
# and block manager (these two keys) and its web UI (which has no conf key: it binds to SPARK_LOCAL_IP,
# else to every interface, so that is set too where a JVM is launched). The UI shows and cannot kill
# jobs. A cluster on other machines needs an address they reach: CDC_SPARK_CONF overrides these
# (docs/operations.md, "What listens where").
LOOPBACK_DEFAULTS: dict[str, str] = {
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
    "spark.ui.killEnabled": "false",
}
# The commands that print or write a result (cdc-current, cdc-erase, the demo's report, ...): nobody
# looks at a UI that lives as long as the command.
NO_UI: dict[str, str] = {"spark.ui.enabled": "false"}


# Hadoop's file systems (what Spark writes Parquet and Iceberg's metadata through) set each new file's and
# folder's mode from this umask, not the process's: 022 unless told, so 0644 files under a 0077 process.
HADOOP_UMASK = "spark.hadoop.fs.permissions.umask-mode"


def file_mode_conf() -> dict[str, str]:
    """The JVM conf that makes Hadoop's writes obey ``CDC_UMASK`` (cdc_assets/model/file_modes.py); none
    under ``inherit``. Before ``CDC_SPARK_CONF``, which may override it."""
    umask = configured_umask()
    return {} if umask is None else {HADOOP_UMASK: f"{umask:03o}"}


SPARK_CONF_ENV = settings.SPARK_CONF.name


def spark_conf_from_env() -> dict[str, str]:
    """``CDC_SPARK_CONF`` as a JSON object of Spark conf keys to values, e.g. '{"spark.executor.memory": "8g"}'.

    The one reading of the variable, for what runs outside a Dagster run (scripts, tests, the servers);
    a run gets it from the Spark resource's ``spark_conf_json`` field.
    """
    return parse_spark_conf(settings.SPARK_CONF.value(), SPARK_CONF_ENV)


def parse_spark_conf(raw: str, source: str) -> dict[str, str]:
    """``raw``, a JSON object of Spark conf keys to values (empty: none); errors name ``source``."""
    raw = raw.strip()
    if not raw:
        return {}
    try:
        conf = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source} must be a JSON object of Spark conf keys to values: {error}") from None
    if not isinstance(conf, dict):
        raise ValueError(f"{source} must be a JSON object of Spark conf keys to values")
    return {str(key): str(value) for key, value in conf.items()}
