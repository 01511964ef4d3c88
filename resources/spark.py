"""The Spark resource: one SparkSession per run, configured from the environment or resource config.

Every step of a run executes in the run's process (``in_process_executor``), so the JVM starts once
per run, not once per step. The same code runs on a cluster or through Spark Connect by setting
``CDC_SPARK_MASTER`` / ``SPARK_REMOTE`` and ``CDC_SPARK_CONF``; nothing in the pipeline assumes local mode.
"""

import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr
from pyspark.sql import SparkSession

T = TypeVar("T")

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
}
# How many small independent pieces of Spark work run at once: a range's per-date source header
# checks (a job each where Spark must infer the header), previews of large dates, and the checks'
# aggregations. Small jobs cost latency rather than work,
# and Spark takes jobs from several threads; on 2 cores 4 did better than 1 and than 8.
DATES_IN_PARALLEL = 4


def map_dates(work: Callable[[str], T], days: Sequence[str]) -> list[T]:
    """``work(day)`` for every date, results in date order; up to ``DATES_IN_PARALLEL`` at once.

    A failure is raised (the oldest failing date's) once every date has finished.
    """
    return side_by_side(*(partial(work, day) for day in days))


def side_by_side(*work: Callable[[], T]) -> list[T]:
    """Each ``work()``, up to ``DATES_IN_PARALLEL`` at once; results in argument order.

    For independent Spark jobs too small to keep the cores busy on their own. A single piece of work
    runs in the calling thread. A failure is raised (the first failing argument's) once all of it has
    finished.
    """
    if len(work) <= 1:
        return [item() for item in work]
    with ThreadPoolExecutor(max_workers=min(len(work), DATES_IN_PARALLEL)) as pool:
        futures = [pool.submit(item) for item in work]
        return [future.result() for future in futures]


# Only for the embedded local default: a single JVM holds driver and executors.
LOCAL_DEFAULTS: dict[str, str] = {"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "8"}


def spark_conf_from_env() -> dict[str, str]:
    """``CDC_SPARK_CONF`` as a JSON object of Spark conf keys to values, e.g. '{"spark.executor.memory": "8g"}'."""
    raw = os.environ.get("CDC_SPARK_CONF", "").strip()
    if not raw:
        return {}
    try:
        conf = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"CDC_SPARK_CONF must be a JSON object of Spark conf keys to values: {error}") from None
    if not isinstance(conf, dict):
        raise ValueError("CDC_SPARK_CONF must be a JSON object of Spark conf keys to values")
    return {str(key): str(value) for key, value in conf.items()}


def build_spark_session(master: str | None = None, conf: dict[str, Any] | None = None, app_name: str = "cdc_assets") -> SparkSession:
    """Create (or reuse) the process's SparkSession.

    Precedence, lowest first: pipeline defaults, ``CDC_SPARK_CONF``, ``conf``. The master is ``master``,
    else ``CDC_SPARK_MASTER``, else ``local[*]`` (ignored when ``SPARK_REMOTE`` selects Spark Connect).
    ``getOrCreate`` keeps an existing session's static conf, so the first session in a process wins.
    """
    builder = SparkSession.builder.appName(app_name)
    remote = os.environ.get("SPARK_REMOTE")
    merged = {**PIPELINE_DEFAULTS}
    if not remote:
        resolved_master = master or os.environ.get("CDC_SPARK_MASTER") or "local[*]"
        builder = builder.master(resolved_master)
        if resolved_master.startswith("local"):
            merged.update(LOCAL_DEFAULTS)
    merged.update(spark_conf_from_env())
    merged.update({key: str(value) for key, value in (conf or {}).items()})
    for key, value in merged.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    # Session (runtime) conf does apply to a reused session; the time zone must hold for every run.
    session.conf.set("spark.sql.session.timeZone", merged["spark.sql.session.timeZone"])
    return session


class SparkResource(ConfigurableResource):
    """The run's SparkSession, created lazily on first use so sensors and schedules never start a JVM."""

    master: str | None = None
    spark_conf: dict[str, str] = {}

    _session: SparkSession | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._session = None

    @property
    def spark_session(self) -> SparkSession:
        if self._session is None:
            self._session = build_spark_session(self.master, self.spark_conf)
        return self._session
