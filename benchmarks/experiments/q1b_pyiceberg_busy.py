"""Question 1, pyiceberg's side: what pyiceberg's SqlCatalog sees when another process holds the SQLite
catalog locked for longer than its busy timeout, and which setting makes it wait. No JVM.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.experiments.q1b_pyiceberg_busy

The catalog here is made by pyiceberg alone (a throwaway warehouse); the lock is ``CatalogLock``
(``BEGIN EXCLUSIVE`` from another connection, as a commit in flight would hold it, only longer).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.experiments.lake_env import CatalogLock, describe_error, pyiceberg_catalog

HOLD_SECONDS = 8


def attempt(root: str, uri_query: str) -> None:
    import pyarrow as pa

    catalog = pyiceberg_catalog(root, uri_query)
    table = catalog.load_table("exp.t")
    lock = CatalogLock(root)
    lock.acquire()
    threading.Timer(HOLD_SECONDS, lock.release).start()
    started = time.monotonic()
    try:
        table.append(pa.table({"id": pa.array([1], pa.int64())}))
        outcome = "committed"
    except Exception as error:  # noqa: BLE001 - the finding
        outcome = describe_error(error)
    print(f"uri query {uri_query or '(none: pysqlite default 5 s)'!r}, catalog locked {HOLD_SECONDS} s: "
          f"after {time.monotonic() - started:.1f} s: {outcome}", flush=True)
    time.sleep(max(0.0, HOLD_SECONDS + 0.5 - (time.monotonic() - started)))


def main() -> int:
    import pyarrow as pa

    folder = Path(tempfile.mkdtemp(prefix="ice-q1b-"))
    try:
        root = str(folder)
        catalog = pyiceberg_catalog(root)
        catalog.create_namespace("exp")
        catalog.create_table("exp.t", schema=pa.schema([("id", pa.int64())]))
        attempt(root, "")
        attempt(root, "timeout=60")
    finally:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
