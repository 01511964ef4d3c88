"""The Spark resource (dagster-pyspark's), one SparkSession per run, configured from the environment.

Every step of a run executes in the run's process (``in_process_executor``), so the JVM starts once
per run, not once per step. The same code runs on a cluster (``CDC_SPARK_MASTER``) or through Spark
Connect (``SPARK_REMOTE``, e.g. a long-lived server from ``make spark-server``), with more conf in
``CDC_SPARK_CONF``; nothing in the pipeline assumes local mode or a JVM in its own process.
"""

import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource
from dagster_pyspark.resources import spark_session_from_config
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


# Conf a Spark Connect client cannot set on its session: the server's JVM is already running.
_SERVER_ONLY_PREFIXES = ("spark.master", "spark.driver.", "spark.executor.", "spark.ui.", "spark.app.name", "spark.python.")


def spark_config_from_environment(master: str | None = None, conf: dict[str, Any] | None = None) -> dict[str, str]:
    """The run's Spark conf: pipeline defaults, then ``CDC_SPARK_CONF``, then ``conf``.

    Without ``SPARK_REMOTE`` the master is ``master``, else ``CDC_SPARK_MASTER``, else ``local[*]``
    (the local defaults apply to a local master only). With ``SPARK_REMOTE`` (Spark Connect) pyspark
    connects to that server and only session conf is sent: what the server's JVM fixed at its start
    (master, driver and executor settings, the UI) belongs in the server's own conf.
    """
    remote = os.environ.get("SPARK_REMOTE", "").strip()
    merged = {**PIPELINE_DEFAULTS}
    if not remote:
        resolved_master = master or os.environ.get("CDC_SPARK_MASTER") or "local[*]"
        merged["spark.master"] = resolved_master
        if resolved_master.startswith("local"):
            merged.update(LOCAL_DEFAULTS)
    merged.update(spark_conf_from_env())
    merged.update({key: str(value) for key, value in (conf or {}).items()})
    if remote:
        merged = {key: value for key, value in merged.items() if not key.startswith(_SERVER_ONLY_PREFIXES)}
    return merged


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client of a server) rather than a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def build_spark_session(master: str | None = None, conf: dict[str, Any] | None = None, app_name: str = "cdc_assets") -> SparkSession:
    """The process's SparkSession with the run's conf (:func:`spark_config_from_environment`), for scripts and tests.

    ``getOrCreate`` keeps an existing session's static conf, so the first session in a process wins.
    """
    config = spark_config_from_environment(master, conf)
    if not os.environ.get("SPARK_REMOTE", "").strip():
        config["spark.app.name"] = app_name
    session = spark_session_from_config(config)
    # Session conf does apply to a reused session; the time zone must hold for every run.
    session.conf.set("spark.sql.session.timeZone", config["spark.sql.session.timeZone"])
    return session


class PipelineSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy resource, configured from the environment, that cleans up after its run.

    The session starts on first use, so sensors and schedules never start a JVM; every step of a run
    executes in the run's process (``in_process_executor``), so a run has one session. When the run
    ends, however it ends, operations it still has running are interrupted; a Spark Connect session is
    also closed, so the server releases what the run held there.
    """

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        session = self._spark_session
        self._spark_session = None
        # The IO manager's copy of this resource is torn down too; the first teardown does the work.
        if session is None or getattr(session, "is_stopped", False):
            return
        try:
            session.interruptAll()
            if is_connect(session):
                session.stop()
        except Exception as error:  # noqa: BLE001 - cleanup must not mask the run's own outcome
            context.log.warning(f"Spark session cleanup at the end of the run: {error}")


def pipeline_spark_resource() -> PipelineSparkResource:
    """The resource bound in definitions.py: conf from the environment when the code location loads."""
    return PipelineSparkResource(spark_config=spark_config_from_environment())
