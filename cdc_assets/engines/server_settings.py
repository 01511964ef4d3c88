"""What a Spark Connect server fixes when it starts and no run can change on its session: recorded beside
the server when it starts, and compared with a run's settings before the run is sent to it.

A Connect session sets session conf on the server's JVM (the catalog, S3A's endpoint, shuffle partitions),
but not what that JVM took when it started:

- its environment's S3 keys and region (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``AWS_REGION``), which S3A and Iceberg's S3 client read from the JVM's own
  environment and from nowhere else;
- its static conf, ``CDC_SPARK_CONF`` (jars, memory, extensions, Hadoop's defaults), and its master,
  ``CDC_SPARK_MASTER``;
- the Iceberg runtime's jars in ``.jars/`` and the mode of the files it writes (``CDC_UMASK``).

The JVM's settings must be the run's for every run. The keys and the region matter only to a run that
reaches an object store (a warehouse or extracts in a bucket, or a REST catalog): a server started without
them still serves local runs, and one started with them serves local runs too. A value that may hold a
secret (the keys, ``CDC_SPARK_CONF``) is recorded as a digest keyed by a salt of the server's own, never as
itself, and the record (``server.settings`` in the server's folder) is its owner's only.

No Dagster, no Spark: the runner (resources/session/spark_target.py), ``make ui`` and ``make -s lake-env``
read it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from cdc_assets.model import settings
from cdc_assets.model.settings import Setting

SETTINGS_FILE = "server.settings"  # mode 0600, beside server.pid
_VERSION = 1
_UNSET = ""
_OBJECT_SCHEMES = ("s3", "s3a")

# Compared for every run: what the JVM took at its start. Secret: recorded as a keyed digest.
_FIXED_AT_START: tuple[tuple[Setting, bool], ...] = (
    (settings.SPARK_CONF, True),
    (settings.SPARK_MASTER, False),
    (settings.UMASK, False),
)
# Compared for a run that reaches an object store: what the JVM's S3 clients read from its environment.
_STORE: tuple[tuple[Setting, bool], ...] = (
    (settings.ACCESS_KEY, True),
    (settings.SECRET_KEY, True),
    (settings.SESSION_TOKEN, True),
    (settings.REGION, False),
)
JARS = "the Iceberg runtime's jars"


@dataclass(frozen=True)
class ServerSettings:
    """What a server was (or would be) started with: each fixed setting as shown, or as a digest."""

    jvm: dict[str, str]
    store: dict[str, str]
    warehouse: str  # CDC_WAREHOUSE as given, for messages
    salt: str

    def as_json(self) -> str:
        return json.dumps({"version": _VERSION, "salt": self.salt, "jvm": self.jvm, "store": self.store, "warehouse": self.warehouse}, indent=1)


def settings_of(env: Mapping[str, str], salt: str, jars: list[str] | None = None) -> ServerSettings:
    """The fixed settings of ``env`` (a process's environment), secrets digested with ``salt``; ``jars``:
    the Iceberg runtime's (default: those in ``.jars/`` now)."""

    def shown(group: tuple[tuple[Setting, bool], ...]) -> dict[str, str]:
        values = {}
        for setting, secret in group:
            value = env.get(setting.name, "").strip()
            if secret:
                values[setting.name] = _digest(salt, value) if value else _UNSET
            else:
                values[setting.name] = value or setting.default
        return values

    jvm = shown(_FIXED_AT_START)
    jvm[JARS] = ",".join(sorted(Path(jar).name for jar in (_project_jars() if jars is None else jars)))
    return ServerSettings(jvm=jvm, store=shown(_STORE), warehouse=settings.WAREHOUSE.value(env), salt=salt)


def record(state_dir: str | Path, env: Mapping[str, str] | None = None) -> Path:
    """Record, in ``state_dir``, the fixed settings of ``env`` (this process's environment, which the
    server it starts inherits), with a fresh salt; mode 0600."""
    path = Path(state_dir) / SETTINGS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(settings_of(os.environ if env is None else env, secrets.token_hex(16)).as_json() + "\n")
    return path


def recorded(state_dir: str | Path) -> ServerSettings | None:
    """The settings recorded in ``state_dir``, or None (no record, or one this version cannot read)."""
    try:
        data = json.loads((Path(state_dir) / SETTINGS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return None
    try:
        return ServerSettings(jvm=dict(data["jvm"]), store=dict(data["store"]), warehouse=str(data["warehouse"]), salt=str(data["salt"]))
    except (KeyError, TypeError, ValueError):
        return None


def forget(state_dir: str | Path) -> None:
    (Path(state_dir) / SETTINGS_FILE).unlink(missing_ok=True)


def reaches_object_store(env: Mapping[str, str] | None = None) -> bool:
    """Whether a run with ``env`` reads or writes an object store: its warehouse or extracts in a bucket,
    or its catalog a REST one."""
    env = os.environ if env is None else env
    in_bucket = (settings.WAREHOUSE.value(env), settings.DATA_ROOT.value(env))
    return settings.CATALOG_URI.is_set(env) or any(urlparse(path).scheme.lower() in _OBJECT_SCHEMES for path in in_bucket)


def why_not_served(state_dir: str | Path, server_url: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why the server recorded in ``state_dir`` (at ``server_url``, for the message) cannot serve a run with
    ``env`` (default: this process's environment), in one line; None when it can.

    E.g. ``the warm server at sc://127.0.0.1:15002 serves CDC_WAREHOUSE=warehouse, this run
    CDC_WAREHOUSE=s3://cdc/warehouse, and it was started with other settings, which a run cannot change:
    AWS_ACCESS_KEY_ID (unset there, set here), ...``. Values that may hold a secret are never shown.
    """
    env = os.environ if env is None else env
    server = recorded(state_dir)
    run_warehouse = settings.WAREHOUSE.value(env)
    if server is None:
        return (
            f"the warm server at {server_url} records no settings it was started with (it was started by an older version of "
            "the project), so whether it can serve this run is unknown"
        )
    run = settings_of(env, server.salt)
    differences = _differences(server.jvm, run.jvm)
    if reaches_object_store(env):
        differences += _differences(server.store, run.store)
    if not differences:
        return None
    return (
        f"the warm server at {server_url} serves {settings.WAREHOUSE.name}={server.warehouse}, this run "
        f"{settings.WAREHOUSE.name}={run_warehouse}, and it was started with other settings, which a run cannot change: "
        + ", ".join(differences)
    )


def served_description(state_dir: str | Path) -> str:
    """What the server recorded in ``state_dir`` serves, for ``make -s lake-env``'s comment line."""
    server = recorded(state_dir)
    if server is None:
        return "settings not recorded (started by an older version)"
    keys = "with S3 keys" if server.store.get(settings.ACCESS_KEY.name) else "without S3 keys"
    return f"started for {settings.WAREHOUSE.name}={server.warehouse}, {keys}"


# -- internals -------------------------------------------------------------------------------------


def _digest(salt: str, value: str) -> str:
    return "hmac-sha256:" + hmac.new(salt.encode(), value.encode(), hashlib.sha256).hexdigest()


def _differences(server: Mapping[str, str], run: Mapping[str, str]) -> list[str]:
    found = []
    for name, theirs in server.items():
        ours = run.get(name, _UNSET)
        if ours == theirs:
            continue
        if theirs.startswith("hmac-sha256:") or ours.startswith("hmac-sha256:") or _UNSET in (theirs, ours):
            if theirs == _UNSET:
                found.append(f"{name} (unset there, set here)")
            elif ours == _UNSET:
                found.append(f"{name} (set there, unset here)")
            else:
                found.append(f"{name} (another value; not shown)")
        else:
            found.append(f"{name} ({theirs} there, {ours} here)")
    return found


def _project_jars() -> list[str]:
    from cdc_assets.engines.iceberg_runtime import IcebergRuntimeMissing, iceberg_jars

    try:
        return iceberg_jars()
    except IcebergRuntimeMissing:
        return []
