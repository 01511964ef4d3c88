"""Who may read what the project writes: ``CDC_UMASK`` (default ``077``: folders 0700, files 0600).

The warehouse (Parquet, the SQLite catalog, the erase ledger, the runs log) and ``DAGSTER_HOME`` (the
event log, compute logs) hold row values, so by default only their owner reads them
(docs/operations.md, "File modes"). Three things make that so, as no one of them reaches every writer:

- :func:`apply_umask`, called first by every entry point (the commands, the code location, the servers'
  starters): the process's umask, which every file Python, SQLite and Dagster create there obeys, and
  which every process it starts inherits (the JVMs, ``dagster dev``'s webserver and daemon);
- Hadoop's own umask for what Spark writes through Hadoop's file systems (Parquet, Iceberg's metadata),
  which ignores the process's: ``spark.hadoop.fs.permissions.umask-mode`` (cdc_assets/engines/spark_conf.py);
- :func:`tighten_root` on the roots the project uses: a folder made before (by an older release, or under
  another umask) loses the bits the umask removes. Only the root: no other user passes a folder of mode
  0700 to reach anything under it, whatever the modes below, and a walk of a large warehouse at every
  start would cost more than it protects.

``CDC_UMASK=inherit`` leaves all three alone. No Spark, no Dagster here.
"""

from __future__ import annotations

import os
import stat

from cdc_assets.model import settings

INHERIT = "inherit"


def configured_umask() -> int | None:
    """``CDC_UMASK`` as a number (``077`` -> 0o077), or None for ``inherit``; an error names the variable."""
    raw = settings.UMASK.value().strip().lower()
    if raw == INHERIT:
        return None
    try:
        value = int(raw, 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o777:
        raise ValueError(f"{settings.UMASK.name}={raw!r}: an octal umask such as 077 or 027, or {INHERIT}")
    return value


def apply_umask() -> int | None:
    """Set the process's umask to ``CDC_UMASK`` (before anything is written or started); the umask set,
    or None when ``inherit`` left it as it was."""
    value = configured_umask()
    if value is not None:
        os.umask(value)
    return value


def tighten_root(path: str | os.PathLike) -> str | None:
    """Take from an existing folder the permission bits ``CDC_UMASK`` removes (never add any); what was
    done, to say, or None when nothing was (``inherit``, no such local folder, not ours, already tight)."""
    value = configured_umask()
    if value is None or "://" in str(path):
        return None
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        return None
    mode = stat.S_IMODE(found.st_mode)
    if mode & value == 0:
        return None
    os.chmod(path, mode & ~value)
    return f"{path}: mode {mode:04o} -> {mode & ~value:04o} ({settings.UMASK.name}={value:03o})"


def tighten_files_in(folder: str | os.PathLike) -> list[str]:
    """:func:`tighten_root` for ``folder`` and for each file directly in it (not below): what was done.
    For the few files a tool creates before the project's code sets the umask (Dagster's instance databases)."""
    value = configured_umask()
    done = [tightened for tightened in (tighten_root(folder),) if tightened]
    if value is None or not os.path.isdir(folder):
        return done
    with os.scandir(os.fspath(folder)) as entries:
        for entry in entries:
            if not entry.is_file(follow_symlinks=False):
                continue
            found = entry.stat(follow_symlinks=False)
            mode = stat.S_IMODE(found.st_mode)
            if found.st_uid == os.geteuid() and mode & value:
                os.chmod(entry.path, mode & ~value)
                done.append(f"{entry.path}: mode {mode:04o} -> {mode & ~value:04o}")
    return done


def owner_only_folder(path: str | os.PathLike) -> str | None:
    """Make the folder (and its parents) under ``CDC_UMASK``, or tighten it if it is there (:func:`tighten_root`)."""
    value = configured_umask()
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o777 & ~(value or 0), exist_ok=True)
    return tighten_root(path)
