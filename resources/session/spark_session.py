"""Spark sessions outside Dagster's resource: their conf (pipeline defaults, ``CDC_SPARK_CONF``, where they
run), starting one (a JVM of the process's own, or a Spark Connect client), and running small Spark jobs side
by side. What scripts, commands and tests start, and what the run's resource (``spark.py``) builds on. No
Dagster here: the consumer commands start Spark without importing it.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from pyspark.sql import SparkSession

from cdc_assets.model import settings
from cdc_assets.engines.iceberg_runtime import with_iceberg_runtime
from cdc_assets.engines.spark_conf import (
    LOCAL_DEFAULTS,
    LOOPBACK,
    LOOPBACK_DEFAULTS,
    PIPELINE_DEFAULTS,
    file_mode_conf,
    spark_conf_from_env,
)
from cdc_assets.engines.spark_home import write_properties_file
from resources.session.spark_target import SparkTarget, connect_session, resolve_spark_target, spark_master_from_env
from resources.storage.object_store import ObjectStore

T = TypeVar("T")

# How many small independent pieces of Spark work run at once: a range's per-date source header
# checks (a job each where Spark must infer the header), previews of large dates, and the checks'
# aggregations. Small jobs cost latency rather than work,
# and Spark takes jobs from several threads; on 2 cores 4 did better than 1 and than 8.
SMALL_JOBS_AT_ONCE = 4


def for_each_date(work: Callable[[str], T], days: Sequence[str]) -> list[T]:
    """``work(day)`` for every date, results in date order; up to ``SMALL_JOBS_AT_ONCE`` at once.

    A failure is raised (the oldest failing date's) once every date has finished.
    """
    return side_by_side(*(partial(work, day) for day in days))


def side_by_side(*work: Callable[[], T]) -> list[T]:
    """Each ``work()``, up to ``SMALL_JOBS_AT_ONCE`` at once; results in argument order.

    For independent Spark jobs too small to keep the cores busy on their own. A single piece of work
    runs in the calling thread. A failure is raised (the first failing argument's) once all of it has
    finished.
    """
    if len(work) <= 1:
        return [item() for item in work]
    with ThreadPoolExecutor(max_workers=min(len(work), SMALL_JOBS_AT_ONCE)) as pool:
        futures = [pool.submit(item) for item in work]
        return [future.result() for future in futures]


# Conf a Spark Connect client cannot set on its session: the server's JVM is already running (it has the
# Iceberg runtime's jars and extensions of its own: cdc_assets/engines/connect_server.py).
_SERVER_ONLY_PREFIXES = (
    "spark.master", "spark.driver.", "spark.executor.", "spark.ui.", "spark.app.name", "spark.python.", "spark.jars", "spark.sql.extensions",
)  # fmt: skip


def spark_config_from_environment(master: str | None = None, conf: dict[str, Any] | None = None) -> dict[str, str]:
    """The Spark conf of a session outside a Dagster run: pipeline defaults, then ``CDC_SPARK_CONF``, then ``conf``.

    Without ``SPARK_REMOTE`` the master is ``master``, else ``CDC_SPARK_MASTER``, else ``local[*]``
    (:func:`spark_config`). With ``SPARK_REMOTE`` (Spark Connect) pyspark connects to that server and
    only session conf is sent.
    """
    remote = settings.SPARK_REMOTE.is_set()
    return spark_config(master or spark_master_from_env(), spark_conf_from_env(), conf, remote=remote)


def spark_config(master: str | None, extra: dict[str, str], conf: dict[str, Any] | None, remote: bool) -> dict[str, str]:
    """Pipeline defaults, then ``extra`` (the user's conf), then ``conf``, as a session on ``remote`` takes them.

    Without ``remote`` the master is ``master``, else ``local[*]``, the driver listens on loopback
    (``LOOPBACK_DEFAULTS``), the local defaults apply to a local master only, and the JVM loads the Iceberg
    runtime (:func:`~cdc_assets.engines.iceberg_runtime.with_iceberg_runtime`: raises when ``make install``
    has not put its jars in ``.jars/``). With ``remote`` (Spark Connect) only session conf is kept: what the server's
    JVM fixed at its start (master, driver and executor settings, the UI) belongs in the server's own
    conf. A run that finds the project's server later drops the same keys (:func:`session_conf`).
    """
    # S3A reaches the object store the environment names (CDC_S3_ENDPOINT, AWS_REGION) from the start: a
    # command's or a server's first read of an s3:// path needs no session of the warehouse first. A JVM takes
    # Hadoop's keys as spark.hadoop.*, a Connect session (on a server started without them) as they are.
    store = ObjectStore.from_environment()
    merged = {**PIPELINE_DEFAULTS, **(store.hadoop_conf() if remote else store.spark_conf())}
    if not remote:
        resolved_master = master or "local[*]"
        merged["spark.master"] = resolved_master
        merged.update(LOOPBACK_DEFAULTS)
        merged.update(file_mode_conf())  # a JVM of the run's own: its Hadoop writes obey CDC_UMASK
        if resolved_master.startswith("local"):
            merged.update(LOCAL_DEFAULTS)
    merged.update(extra)
    merged.update({key: str(value) for key, value in (conf or {}).items()})
    if not remote:
        merged = with_iceberg_runtime(merged)
    return session_conf(merged, remote=remote)


def session_conf(conf: dict[str, str], remote: bool) -> dict[str, str]:
    """``conf`` as a session on a Connect server (``remote``) can take it: without the server's own keys."""
    if not remote:
        return dict(conf)
    return {key: value for key, value in conf.items() if not key.startswith(_SERVER_ONLY_PREFIXES)}


def start_session(target: SparkTarget, conf: dict[str, str]) -> SparkSession:
    """The session ``conf`` describes, on ``target``: a Connect client, or a session of the process's own."""
    if target.url is not None:  # a Connect server's
        return connect_session(target.url, session_conf(conf, remote=True))
    _launch_jvm(conf)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _launch_jvm(conf: dict[str, str]) -> None:
    """Start this process's JVM, if it has none yet, with ``conf`` read from a file only the owner reads.

    pyspark would pass the builder's conf to ``spark-submit`` as ``--conf key=value``, on the JVM's command
    line, which any local user reads (``ps``); and the JVM's web UI binds to every interface unless
    ``SPARK_LOCAL_IP`` is set when it starts. Once it runs, the builder's conf reaches the session
    through the JVM, never a command line.
    """
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        return
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
    with tempfile.TemporaryDirectory(prefix="cdc-spark-conf-") as folder:  # mode 0700
        properties = write_properties_file(Path(folder) / "spark.properties", conf)
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {shlex.quote(str(properties))} {previous or 'pyspark-shell'}"
        try:
            SparkSession.builder.getOrCreate()  # no conf of its own: spark-submit reads the file
        finally:
            if previous is None:
                os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
            else:
                os.environ["PYSPARK_SUBMIT_ARGS"] = previous


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client of a server) rather than a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def build_spark_session(master: str | None = None, conf: dict[str, Any] | None = None, app_name: str = "cdc_assets") -> SparkSession:
    """The process's SparkSession with the run's conf (:func:`spark_config_from_environment`), for scripts and tests.

    ``getOrCreate`` keeps an existing session's static conf, so the first session in a process wins. Where
    the project's warm server runs but cannot serve the command's settings, a line on stderr says so (the
    session is then the command's own); where ``SPARK_REMOTE`` names that server,
    :class:`~resources.session.spark_target.ServerCannotServeRunError` is raised.
    """
    target = resolve_spark_target(start_server=False)
    if target.refusal:  # the one line that says why a command runs cold beside a warm server
        print(f"{app_name}: Spark: {target.description}", file=sys.stderr)
    config = spark_config_from_environment(master, conf)
    if not target.is_remote:
        config["spark.app.name"] = app_name
    session = start_session(target, config)
    # Session conf does apply to a reused session; the time zone must hold for every run.
    session.conf.set("spark.sql.session.timeZone", config["spark.sql.session.timeZone"])
    return session


# The session conf that puts a session's jobs into a FAIR scheduler pool (Spark copies session conf
# onto each job's local properties); the project's Connect server schedules its pools fairly.
SCHEDULER_POOL = "spark.scheduler.pool"
