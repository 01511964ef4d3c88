"""The Spark resource (dagster-pyspark's), one SparkSession per run, configured by its fields.

Every step of a run executes in the run's process (``in_process_executor``), so a run has one session.
Where that session lives is chosen when the run first needs Spark (resources/session/spark_target.py): the
project's warm Spark Connect server when one is running (``make ui`` keeps one), any server named by
``SPARK_REMOTE``, or a JVM of the run's own, on a cluster with ``CDC_SPARK_MASTER``; more conf in
``CDC_SPARK_CONF``. In a run those two reach the resource as its ``spark_master`` and ``spark_conf_json``
fields (definitions.py); outside one, ``spark_session.build_spark_session`` reads them. Nothing in the pipeline
assumes local mode or a JVM in its own process.
"""

import time
from typing import Any

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr

from cdc_assets.core.caching import release_persisted
from cdc_assets.engines.spark_conf import SPARK_CONF_ENV, parse_spark_conf
from resources.fields import env_or_default, resolved_field
from resources.session.spark_session import is_connect, spark_config, start_session
from resources.session.spark_target import (
    MASTER_ENV as SPARK_MASTER_ENV,
    REMOTE_MODE,
    SparkTarget,
    explain_server_loss,
    resolve_spark_target,
)

# Where each run in this process runs Spark, by run id: the resource is set up twice per run (its own
# key and inside the IO manager), and the choice, and its log line, is made once; so is the session's.
_RUN_TARGETS: dict[str, SparkTarget] = {}
_RUN_SESSIONS_LOGGED: set[str] = set()


class PipelineSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy resource, configured by its fields, that cleans up after its run.

    When a run starts, it chooses where Spark runs (the project's warm Connect server, ``SPARK_REMOTE``,
    or a session of its own: resources/session/spark_target.py) and says so in the run's first log lines. The
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

    @classmethod
    def from_environment(cls, spark_config: dict[str, Any] | None = None) -> "PipelineSparkResource":
        """The resource with ``spark_master`` and ``spark_conf_json`` fed by their variables (``EnvVar``s the
        UI shows by name) where they are set: what the code location and the command-line tools use."""
        return cls(
            spark_master=env_or_default(SPARK_MASTER_ENV, ""), spark_conf_json=env_or_default(SPARK_CONF_ENV, ""),
            spark_config=spark_config or {},
        )

    def setup_for_execution(self, context: InitResourceContext) -> None:
        run_id = context.run_id or ""
        target = _RUN_TARGETS.get(run_id)
        if target is None:
            target = resolve_spark_target(master=self._master(), spark_conf=resolved_field(self.spark_conf_json))
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
            self._target = resolve_spark_target(master=self._master(), spark_conf=resolved_field(self.spark_conf_json))
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
            session = start_session(self.spark_target, self.session_config())
            self._spark_session = session  # type: ignore[assignment]  # dagster-pyspark declares it None
            if self._log is not None and self._run_id not in _RUN_SESSIONS_LOGGED:
                _RUN_SESSIONS_LOGGED.add(self._run_id)
                # The application id names the JVM: runs on one warm server share it.
                application = session.conf.get("spark.app.id", "unknown")
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
