"""The Spark resource (dagster-pyspark's), one SparkSession per run, configured by its fields.

Every step of a run executes in the run's process (``in_process_executor``), so a run has one session.
Where that session lives is chosen when the run first needs Spark (resources/spark_target.py): the
project's warm Spark Connect server when one is running (``make ui`` keeps one), any server named by
``SPARK_REMOTE``, or a JVM of the run's own, on a cluster with ``CDC_SPARK_MASTER``; more conf in
``CDC_SPARK_CONF``. In a run those two reach the resource as its ``spark_master`` and ``spark_conf_json``
fields (definitions.py); outside one, :func:`build_spark_session` reads them. Nothing in the pipeline
assumes local mode or a JVM in its own process.
"""

import json
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource
from dagster_pyspark.resources import spark_session_from_config
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from cdc_assets.core.caching import release_persisted
from cdc_assets.services.iceberg_runtime import with_iceberg_runtime
from cdc_assets.services.process import HOST
from cdc_assets.services.spark_home import write_properties_file
from resources.fields import resolved_field
from resources.storage.object_store import ObjectStore
from resources.spark_target import (
    MASTER_ENV as SPARK_MASTER_ENV,
    REMOTE_MODE,
    SparkTarget,
    connect_session,
    explain_server_loss,
    resolve_spark_target,
    spark_master_from_env,
)

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
    # HotSpot never JIT-compiles a method of more than 8,000 bytes of bytecode: such a whole-stage
    # method runs interpreted on every run, on a warm JVM as on a cold one. The intake's validation
    # and hashing together made one of about 11 KB (15 columns) and ran at a third of the speed; Spark
    # falls back from whole-stage codegen for a stage whose method would pass this limit (its own
    # advice for HotSpot; Spark's default, 65,535, is the JVM's hard limit). A session conf, so it
    # reaches a Connect server's sessions too.
    "spark.sql.codegen.hugeMethodLimit": "8000",
}
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


SPARK_CONF_ENV = "CDC_SPARK_CONF"


def spark_conf_from_env() -> dict[str, str]:
    """``CDC_SPARK_CONF`` as a JSON object of Spark conf keys to values, e.g. '{"spark.executor.memory": "8g"}'.

    The one reading of the variable, for what runs outside a Dagster run (scripts, tests, the servers);
    a run gets it from the Spark resource's ``spark_conf_json`` field.
    """
    return parse_spark_conf(os.environ.get(SPARK_CONF_ENV, ""), SPARK_CONF_ENV)


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


# Conf a Spark Connect client cannot set on its session: the server's JVM is already running (it has the
# Iceberg runtime's jars and extensions of its own: cdc_assets/services/connect_server.py).
_SERVER_ONLY_PREFIXES = (
    "spark.master", "spark.driver.", "spark.executor.", "spark.ui.", "spark.app.name", "spark.python.", "spark.jars", "spark.sql.extensions",
)  # fmt: skip


def spark_config_from_environment(master: str | None = None, conf: dict[str, Any] | None = None) -> dict[str, str]:
    """The Spark conf of a session outside a Dagster run: pipeline defaults, then ``CDC_SPARK_CONF``, then ``conf``.

    Without ``SPARK_REMOTE`` the master is ``master``, else ``CDC_SPARK_MASTER``, else ``local[*]``
    (:func:`spark_config`). With ``SPARK_REMOTE`` (Spark Connect) pyspark connects to that server and
    only session conf is sent.
    """
    remote = bool(os.environ.get("SPARK_REMOTE", "").strip())
    return spark_config(master or spark_master_from_env(), spark_conf_from_env(), conf, remote=remote)


def spark_config(master: str | None, extra: dict[str, str], conf: dict[str, Any] | None, remote: bool) -> dict[str, str]:
    """Pipeline defaults, then ``extra`` (the user's conf), then ``conf``, as a session on ``remote`` takes them.

    Without ``remote`` the master is ``master``, else ``local[*]``, the driver listens on loopback
    (``LOOPBACK_DEFAULTS``), the local defaults apply to a local master only, and the JVM loads the Iceberg
    runtime (:func:`~cdc_assets.services.iceberg_runtime.with_iceberg_runtime`: raises when ``make install``
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
    if target.is_remote:
        return connect_session(target.url, session_conf(conf, remote=True))
    _launch_jvm(conf)
    return spark_session_from_config(conf)


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

    ``getOrCreate`` keeps an existing session's static conf, so the first session in a process wins.
    """
    target = resolve_spark_target(start_server=False)
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

# Where each run in this process runs Spark, by run id: the resource is set up twice per run (its own
# key and inside the IO manager), and the choice, and its log line, is made once; so is the session's.
_RUN_TARGETS: dict[str, SparkTarget] = {}
_RUN_SESSIONS_LOGGED: set[str] = set()


class PipelineSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy resource, configured by its fields, that cleans up after its run.

    When a run starts, it chooses where Spark runs (the project's warm Connect server, ``SPARK_REMOTE``,
    or a session of its own: resources/spark_target.py) and says so in the run's first log lines. The
    session itself starts on first use, so sensors and schedules never start a JVM; its conf is the
    pipeline's defaults, then ``spark_conf_json``, then ``spark_config``. When the run ends, however it
    ends, operations it still has running are interrupted, DataFrames it cached are released, and a
    Spark Connect session is closed, so a shared server keeps nothing of the run.
    """

    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Spark conf over the pipeline's defaults and spark_conf_json: keys to values.",
    )
    spark_master: str = Field(
        default="",
        description=(
            f"The master of a session of the run's own, e.g. spark://host:7077 ({SPARK_MASTER_ENV}); empty: "
            "local[*]. With a master set and CDC_SPARK=auto, a run uses it rather than a running Connect server."
        ),
    )
    spark_conf_json: str = Field(
        default="",
        description=f"More Spark conf, a JSON object of keys to values ({SPARK_CONF_ENV}), over the pipeline's defaults.",
    )

    _target: SparkTarget | None = PrivateAttr(default=None)
    _log: Any = PrivateAttr(default=None)
    _run_id: str = PrivateAttr(default="")

    def setup_for_execution(self, context: InitResourceContext) -> None:
        run_id = context.run_id or ""
        target = _RUN_TARGETS.get(run_id)
        if target is None:
            target = resolve_spark_target(master=self._master())
            if run_id:
                _RUN_TARGETS[run_id] = target
            if context.log is not None:
                context.log.info(f"Spark for this run: {target.description}")
        self._target = target
        self._log = context.log
        self._run_id = run_id

    @property
    def spark_target(self) -> SparkTarget:
        if self._target is None:
            self._target = resolve_spark_target(master=self._master())
        return self._target

    def session_config(self) -> dict[str, str]:
        """The conf the run's session starts with (:func:`spark_config`), from the fields."""
        extra = parse_spark_conf(resolved_field(self.spark_conf_json), f"spark_conf_json ({SPARK_CONF_ENV})")
        # Only a server named by SPARK_REMOTE goes without the local master's conf: on the project's
        # own server, found or started, start_session drops the server's keys and keeps the rest.
        return spark_config(self._master() or None, extra, self.spark_config, remote=self.spark_target.mode == REMOTE_MODE)

    def _master(self) -> str:
        return resolved_field(self.spark_master).strip()

    def _init_session(self) -> None:
        if self._spark_session is None:
            started = time.perf_counter()
            self._spark_session = start_session(self.spark_target, self.session_config())
            if self._log is not None and self._run_id not in _RUN_SESSIONS_LOGGED:
                _RUN_SESSIONS_LOGGED.add(self._run_id)
                # The application id names the JVM: runs on one warm server share it.
                application = self._spark_session.conf.get("spark.app.id", "unknown")
                self._log.info(f"Spark session ready in {time.perf_counter() - started:.1f} s on application {application}")

    def server_loss_explained(self):
        """A context in which a failure while the run's Connect server is gone says so (and what to do)."""
        return explain_server_loss(self._target if self._target is not None and self._target.is_remote else None)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        session = self._spark_session
        self._spark_session = None
        _RUN_TARGETS.pop(context.run_id or "", None)
        _RUN_SESSIONS_LOGGED.discard(context.run_id or "")
        # The IO manager's copy of this resource is torn down too; the first teardown does the work.
        if session is None or getattr(session, "is_stopped", False):
            return
        try:
            session.interruptAll()
            release_persisted()
            if is_connect(session):
                session.stop()
        except Exception as error:  # noqa: BLE001 - cleanup must not mask the run's own outcome
            context.log.warning(f"Spark session cleanup at the end of the run: {error}")
