"""Question 4 of docs/design/iceberg-commits.md: one date's update commits several tables, one commit
each; the writer is killed (kill -9, inside the third table's commit) after two of them.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.experiments.q4_date_over_tables [--keep DIR]

The scheme prototyped: after the date's tables are committed, the writer publishes the date with ONE
commit to a marker table ``_published`` (business_date, table_name, snapshot_id, run): the snapshot of
each table that holds the date. One commit of one table is atomic, so a date is published whole or not at
all. A reader that wants a whole date reads the marker's rows for it and each table at its snapshot; a
reader of the tables' latest snapshots sees each table whole, but the date mixed while a run is killed or
in flight. The re-run writes every table again and publishes again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from benchmarks.experiments.lake_env import CatalogLock, files_under, pyiceberg_catalog, start_worker

TABLES = ["lake.exp.hashed_incoming", "lake.exp.history_partition", "lake.exp.current_table"]
MARKER = "lake.exp._published"
D1 = "2024-01-01"


def show(label: str, value) -> None:
    print(f"{label}: {value}", flush=True)


def start(folder: Path, root: Path, patient_cache: str):
    for stale in folder.glob("*-*"):
        if stale.name.startswith(("cmd-", "result-", "committed-", "continue-")):
            stale.unlink()
    (folder / "ready").unlink(missing_ok=True)
    worker = start_worker("commit_worker", [str(root), str(folder), patient_cache], folder / f"worker-{time.time():.0f}.log")
    while not (folder / "ready").exists():
        if worker.poll() is not None:
            raise SystemExit("worker exited early")
        time.sleep(0.2)
    return worker


def run_date(folder: Path, number: int, run: str, gated: bool) -> None:
    body = {
        "session": "patient",
        "gated": gated,
        "writes": [{"table": t, "date": D1, "run": run, "rows": 100} for t in TABLES],
        "publish": {"marker": MARKER, "date": D1, "run": run},
    }
    (folder / f"cmd-{number}.json").write_text(json.dumps(body))


def wait(path: Path, worker, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{path.name} never appeared")
        time.sleep(0.05)


def latest_runs(catalog) -> dict[str, list[str]]:
    """What a reader of each table's latest snapshot sees of the date."""
    from pyiceberg.expressions import EqualTo

    return {
        name.split(".")[-1]: sorted(set(catalog.load_table(name.removeprefix("lake.")).scan(
            row_filter=EqualTo("business_date", D1)).to_arrow()["run"].to_pylist()))
        for name in TABLES
    }


def published_runs(catalog) -> dict[str, list[str]] | str:
    """What a reader of the published date sees: each table at the snapshot the marker names."""
    from pyiceberg.expressions import EqualTo

    marker = catalog.load_table(MARKER.removeprefix("lake.")).scan(row_filter=EqualTo("business_date", D1)).to_arrow()
    if marker.num_rows == 0:
        return "not published"
    result = {}
    for name, snapshot_id in zip(marker["table_name"].to_pylist(), marker["snapshot_id"].to_pylist()):
        table = catalog.load_table(name.removeprefix("lake."))
        rows = table.scan(snapshot_id=snapshot_id, row_filter=EqualTo("business_date", D1)).to_arrow()
        result[name.split(".")[-1]] = sorted(set(rows["run"].to_pylist()))
    result["(marker run)"] = sorted(set(marker["run"].to_pylist()))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this folder and keep it")
    parser.add_argument("--patient-cache", choices=("true", "false"), default="false",
                        help="cache-enabled of the writer's session (default false: the recommended conf)")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="ice-q4-"))
    folder.mkdir(parents=True, exist_ok=True)
    root = folder / "warehouse"
    root.mkdir(exist_ok=True)
    catalog = pyiceberg_catalog(str(root))

    worker = start(folder, root, args.patient_cache)
    run_date(folder, 1, "run-1", gated=False)
    wait(folder / "result-1.json", worker)
    show("1 run-1 of D1, published", json.loads((folder / "result-1.json").read_text()))
    show("  latest snapshots", latest_runs(catalog))
    show("  published", published_runs(catalog))

    # run-2 re-runs D1; killed inside the third table's commit (the catalog's UPDATE held by this process).
    run_date(folder, 2, "run-2", gated=True)
    wait(folder / "committed-2-1", worker)
    (folder / "continue-2-1").touch()
    wait(folder / "committed-2-2", worker)
    third = Path(catalog.load_table(TABLES[2].removeprefix("lake.")).metadata.location.removeprefix("file:"))
    before = files_under(third)
    lock = CatalogLock(str(root), "IMMEDIATE")
    lock.acquire()
    (folder / "continue-2-2").touch()
    deadline = time.monotonic() + 180
    while not any(name.startswith("metadata/0") for name in files_under(third) - before):
        if time.monotonic() > deadline or worker.poll() is not None:
            raise SystemExit("the third commit's metadata file never appeared")
        time.sleep(0.1)
    time.sleep(1)
    show("2 run-2 of D1: two tables committed, the third waiting at the catalog's UPDATE", "")
    show("  readers meanwhile: latest snapshots", latest_runs(catalog))
    show("  readers meanwhile: published", published_runs(catalog))
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    lock.release()
    show("  run-2 killed (SIGKILL), exit", worker.returncode)
    show("  after the kill: latest snapshots (each table whole, the date mixed)", latest_runs(catalog))
    show("  after the kill: published (the date whole, as run-1 left it)", published_runs(catalog))

    worker = start(folder, root, args.patient_cache)
    run_date(folder, 1, "run-3", gated=False)
    wait(folder / "result-1.json", worker)
    show("3 re-run (run-3)", json.loads((folder / "result-1.json").read_text()))
    (folder / "cmd-2.json").write_text(json.dumps({"stop": True}))
    worker.wait(timeout=120)
    show("  latest snapshots", latest_runs(catalog))
    show("  published", published_runs(catalog))
    marker = catalog.load_table(MARKER.removeprefix("lake."))
    show("  marker table's snapshots (one per publication)", [
        (s.summary.operation.value, s.summary.get("cdc.run-id")) for s in sorted(marker.snapshots(), key=lambda s: s.timestamp_ms)
    ])
    if not args.keep:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
