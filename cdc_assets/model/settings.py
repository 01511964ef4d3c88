"""Every environment variable the project reads: its name, its default and what it does, in one place.

A module that reads a variable imports its :class:`Setting` from here and reads it with :meth:`Setting.value`
(where it is needed: a test, a server or a run may set it after this module was imported); the Dagster
resources take theirs as ``EnvVar``-fed fields (``resources/fields.py``). Nothing else in ``cdc_assets`` or
``resources`` spells a variable's name (``tests/test_settings.py``), and the table of ``docs/configuration.md``
is :func:`markdown_table` of :data:`DOCUMENTED` (``python -m cdc_assets.model.settings`` prints it). No Spark, no
Dagster here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``default`` is the value an unset (or blank) variable stands for ("" for
    none: the reader decides); ``shown_default`` and ``meaning`` are what the docs' table says."""

    name: str
    default: str
    shown_default: str
    meaning: str
    documented: bool = True  # False: the tests' own seams and what the project passes to its own processes

    def value(self, env: Mapping[str, str] | None = None) -> str:
        """The variable's value in ``env`` (default: this process's environment), stripped; :attr:`default`
        when it is unset or blank."""
        return (os.environ if env is None else env).get(self.name, "").strip() or self.default

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        return bool((os.environ if env is None else env).get(self.name, "").strip())


def _setting(*args, **kwargs) -> Setting:
    setting = Setting(*args, **kwargs)
    ALL.append(setting)
    return setting


ALL: list[Setting] = []

TABLE_CONFIGS = _setting("CDC_TABLE_CONFIGS", "", "`table_configs/` in the project", "folder of table YAMLs")
WAREHOUSE = _setting(
    "CDC_WAREHOUSE", "warehouse", "`./warehouse`",
    "output root, made absolute (a Connect server resolves relative paths in its own directory); which URIs work: "
    "[operations.md](operations.md#storage-which-uris-work-and-what-each-side-needs)",
)  # fmt: skip
DATA_ROOT = _setting("CDC_DATA_ROOT", ".", "working directory", "base of relative `source.path`s: a folder, or an `s3://` prefix")
CATALOG_URI = _setting(
    "CDC_CATALOG_URI", "", "none: the embedded catalog",
    "an Iceberg REST catalog's URL ([object-storage.md](object-storage.md#the-variables), as are the five below)",
)  # fmt: skip
CATALOG_WAREHOUSE = _setting("CDC_CATALOG_WAREHOUSE", "", "none", "the REST catalog's warehouse, e.g. `s3://lake`")
CATALOG_SIGNING_NAME = _setting(
    "CDC_CATALOG_SIGNING_NAME", "", "none: unsigned", "the SigV4 signing name of the catalog's requests (`s3tables`, `glue`)"
)
S3_ENDPOINT = _setting("CDC_S3_ENDPOINT", "", "none: AWS", "the S3 API's URL for another store, e.g. `http://127.0.0.1:8333`")
LAKE_SERVER_DIR = _setting(
    "CDC_LAKE_SERVER_DIR", "", "none: the store compacts on its own schedule",
    "the folder of the SeaweedFS lake `make lake-up` runs on this machine (`make -s lake-env` sets it): an erase has it "
    "vacuum the deleted files' bytes out of its volumes ([object-storage.md](object-storage.md#what-a-store-does-with-deleted-objects))",
)  # fmt: skip
REGION = _setting("AWS_REGION", "us-east-1", "`us-east-1`", "the S3 region")
ACCESS_KEY = _setting(
    "AWS_ACCESS_KEY_ID", "", "none: a profile or an instance role",
    "the S3 and catalog access key, read by every client from its own environment",
)  # fmt: skip
SECRET_KEY = _setting(
    "AWS_SECRET_ACCESS_KEY", "", "none: a profile or an instance role",
    "the secret key, read the same way; never a setting of the project, never on a command line or in a log",
)  # fmt: skip
SPARK_MASTER = _setting("CDC_SPARK_MASTER", "", "`local[*]`", "Spark master; ignored when `SPARK_REMOTE` selects Spark Connect")
SPARK_CONF = _setting(
    "CDC_SPARK_CONF", "", "none",
    'JSON object of Spark conf, e.g. `{"spark.executor.memory": "8g", "spark.hadoop.fs.s3a.endpoint": "…"}`; a JVM gets it in '
    "a file only its owner reads, never on its command line ([what listens where](operations.md#what-listens-where)); its "
    "`spark.jars` and `spark.sql.extensions` are added after the Iceberg runtime's "
    "([operations.md](operations.md#the-iceberg-runtime-on-every-spark))",
)  # fmt: skip
SPARK_REMOTE = _setting(
    "SPARK_REMOTE", "", "none",
    "a Spark Connect URL, e.g. `sc://127.0.0.1:15002`: runs become clients of that server "
    "([operations.md](operations.md#spark-warm-by-default-where-runs-repeat))",
)  # fmt: skip
SPARK_MODE = _setting(
    "CDC_SPARK", "auto", "`auto`",
    "`auto`: the project's Connect server if running, else a session of the run's own; `server`: that server, started if "
    "needed (what `make ui` sets); `local`: never a server",
)  # fmt: skip
SPARK_SERVER_DIR = _setting(
    "CDC_SPARK_SERVER_DIR", ".spark-server", "`./.spark-server`",
    "where the project's server keeps its pid, port and log (the Makefile passes the project's)",
)  # fmt: skip
SPARK_CONNECT_PORT = _setting("SPARK_CONNECT_PORT", "15002", "`15002`", "the project's server's port")
SPARK_CONNECT_TIMEOUT = _setting(
    "CDC_SPARK_CONNECT_TIMEOUT", "30", "`30`", "seconds a run waits for a Connect server that stopped answering before it fails"
)
WRITER_LOCK_TIMEOUT = _setting(
    "CDC_WRITER_LOCK_TIMEOUT", "900", "`900`", "seconds a run waits for another run's writer lock on the same table before failing"
)
WRITER_LEASE_SECONDS = _setting(
    "CDC_WRITER_LEASE_SECONDS", "60", "`60`",
    "a warehouse in a bucket: seconds a run's writer lease lasts unrenewed (renewed every quarter; a holder whose renewals "
    "fail stops committing half a term after the last one); a host that dies blocks the table that long ([object-storage.md](object-storage.md#many-hosts))",
)  # fmt: skip
CATALOG_DATABASE = _setting(
    "CDC_CATALOG_DATABASE", "cdc", "`cdc`", "the SQL catalog's database ([consumers.md](consumers.md#querying-by-name-the-sql-catalog))"
)
CATALOG_DIR = _setting(
    "CDC_CATALOG_DIR", "", "`<warehouse>/_catalog`",
    "where the SQL catalog's Derby metastore lives (a local folder: required when the warehouse is in a bucket)",
)  # fmt: skip
SQL_PORT = _setting(
    "CDC_SQL_PORT", "10000", "`10000`",
    "the SQL server's port for `cdc-catalog server start` without `--port` (`make sql-server` passes `SQL_PORT`)",
)  # fmt: skip
SQL_SERVER_DIR = _setting(
    "CDC_SQL_SERVER_DIR", "", "`~/.local/state/cdc_assets/sql-server/<catalog>`",
    "the SQL server's own folder, outside the warehouse (mode 0700): its password, pid, ports, conf and logs "
    "([consumers.md](consumers.md#the-sql-server-reads-only))",
)  # fmt: skip
TRINO_DIR = _setting(
    "CDC_TRINO_DIR", "", "`~/.local/state/cdc_assets/trino`",
    "the folder of the Trino server `make trino-up` starts (mode 0700): its generated `etc/`, log, pid and port "
    "([consumers.md](consumers.md#reading-the-tables-directly-spark-pyiceberg-duckdb))",
)  # fmt: skip
TRINO_JAVA_HOME = _setting(
    "CDC_TRINO_JAVA_HOME", "", "the newest JDK of 24 or later in `/usr/lib/jvm`",
    "the Java home Trino runs on (Trino 476 does not run on Java 17)",
)  # fmt: skip
GIT_COMMIT = _setting(
    "CDC_GIT_COMMIT", "", "the source tree's `git rev-parse HEAD`",
    "the commit the runs log records ([operations.md](operations.md#audit-columns-and-the-runs-log))",
)  # fmt: skip
ALERT_WEBHOOK_URL = _setting(
    "CDC_ALERT_WEBHOOK_URL", "", "none",
    "the `http(s)://` URL where the alert sensor POSTs each alert as JSON (checked when the code location loads; redirects "
    "are not followed); unset: alerts go to its log ([freshness and alerts](operations.md#freshness-and-alerts))",
)  # fmt: skip
UI_BASE_URL = _setting("CDC_UI_BASE_URL", "http://127.0.0.1:3000", "`http://127.0.0.1:3000`", "the Dagster UI's address, for the links in alerts")
DAGSTER_HOME = _setting(
    "DAGSTER_HOME", "", "`.dagster_home/` under `make`",
    "the Dagster instance: runs, schedules, sensors, pools (`make demo` and `make ui` copy `instance/dagster.yaml` into it)",
)  # fmt: skip
SHOW_VALUES = _setting(
    "CDC_SHOW_VALUES", "masked", "`masked`",
    "which row values previews, errors and logs show (Dagster keeps them: [erasure.md](erasure.md#what-dagster-keeps)): "
    "`masked`, non-key columns not `sensitive: true` only; `none`, no row value; `all`, every value (data that is no one's)",
)  # fmt: skip
UMASK = _setting(
    "CDC_UMASK", "077", "`077`",
    "the umask the project's commands, code location and servers set, inherited by their JVMs: `077`, folders 0700 and "
    "files 0600; e.g. `027` lets the group read; `inherit` keeps the one they were started with "
    "([file modes](operations.md#file-modes))",
)  # fmt: skip

SESSION_TOKEN = _setting("AWS_SESSION_TOKEN", "", "", "AWS's session token, beside temporary keys (object-storage.md)", documented=False)
# Not for users: what `make ui` tells the servers it starts, and the fault tests' seam (resources/storage/fault_injection.py).
SPARK_SERVER_OWNER = _setting("CDC_SPARK_SERVER_OWNER", "", "", "who started the project's Connect server", documented=False)
PAUSE_BEFORE_COMMIT = _setting("CDC_PAUSE_BEFORE_COMMIT", "", "", "a test's pause: <table>/<asset>", documented=False)
PAUSE_BEFORE_PUBLISH = _setting("CDC_PAUSE_BEFORE_PUBLISH", "", "", "a test's pause: <table>/<asset>", documented=False)
PAUSE_MARKER = _setting("CDC_PAUSE_MARKER", "", "", "a test's pause: the file the paused run writes its pid to", documented=False)
PAUSE_SECONDS = _setting("CDC_PAUSE_SECONDS", "600", "", "a test's pause: how long", documented=False)
PAUSE_RELEASE = _setting("CDC_PAUSE_RELEASE", "", "", "a test's pause: the file that ends it", documented=False)

DOCUMENTED: tuple[Setting, ...] = tuple(setting for setting in ALL if setting.documented)


def markdown_table(settings: tuple[Setting, ...] = DOCUMENTED) -> str:
    """The docs' table of variables (``docs/configuration.md``, "Environment")."""
    rows = ["| variable | default | what |", "| --- | --- | --- |"]
    rows += [f"| `{setting.name}` | {setting.shown_default} | {setting.meaning} |" for setting in settings]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
