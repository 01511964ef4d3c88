"""Question 2, made deterministic across two processes: two writers (two JVMs) commit the same date of the
same table from the same base snapshot, their commits released at the same instant.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.experiments.q2c_two_commits_at_once [--keep DIR]

How: this process holds ``BEGIN IMMEDIATE`` on the catalog (``CatalogLock``); both writers read the
table, write their files and wait at the catalog's UPDATE (``jdbc.busy_timeout``); once both wait, the lock
is released: one commit wins, the other finds the metadata changed (``CommitFailedException``), retries on
the new metadata, and then either re-applies itself (no validation) or fails validation. Scenarios:

- ``overwrite``: ``overwrite(business_date = D)``, no isolation option;
- ``overwrite_serializable``: the same with ``isolation-level=serializable`` and ``validate-from-snapshot-id``;
- ``merge``: SQL ``MERGE`` of the date's rows (the table's default ``write.merge.isolation-level``).

For each: both outcomes, and the date's rows after (pyiceberg): one run's rows, whole, or both.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.experiments.lake_env import CatalogLock, files_under, pyiceberg_catalog, start_worker

D1 = "2024-01-01"
ROWS = 100
SCENARIOS = {
    "overwrite": {},
    "overwrite_serializable": {"options": {"isolation-level": "serializable"}, "validate_from_current": True},
    "merge": {"op": "merge"},
}


def show(label: str, value) -> None:
    print(f"{label}: {value}", flush=True)


class Worker:
    def __init__(self, name: str, root: Path, folder: Path):
        self.folder = folder / name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = start_worker("commit_worker", [str(root), str(self.folder), "false"], folder / f"{name}.log")
        self.number = 0
        while not (self.folder / "ready").exists():
            if self.process.poll() is not None:
                raise SystemExit(f"worker {name} exited early; see {folder / f'{name}.log'}")
            time.sleep(0.2)

    def send(self, body: dict) -> int:
        self.number += 1
        (self.folder / f"cmd-{self.number}.json").write_text(json.dumps(body))
        return self.number

    def result(self, number: int, timeout: float = 300) -> dict | None:
        path = self.folder / f"result-{number}.json"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.1)
        return json.loads(path.read_text())

    def stop(self) -> None:
        self.send({"stop": True})
        self.process.wait(timeout=120)


def date_rows(catalog, table: str) -> dict:
    arrow = catalog.load_table(table).scan().to_arrow()
    return dict(collections.Counter(arrow["run"].to_pylist()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this folder and keep it")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="ice-q2c-"))
    folder.mkdir(parents=True, exist_ok=True)
    root = folder / "warehouse"
    root.mkdir(exist_ok=True)
    # One after the other: the first opens (and creates) the catalog's own tables.
    a = Worker("A", root, folder)
    b = Worker("B", root, folder)
    catalog = pyiceberg_catalog(str(root))
    try:
        for scenario, write in SCENARIOS.items():
            table = f"lake.exp.{scenario}"
            seed = a.send({"session": "patient", "writes": [{"table": table, "date": D1, "run": "seed", "rows": ROWS}]})
            show(f"{scenario}: seed", a.result(seed))
            location = Path(catalog.load_table(table.removeprefix("lake.")).metadata.location.removeprefix("file:"))
            before = files_under(location)
            lock = CatalogLock(str(root), "IMMEDIATE")
            lock.acquire()
            numbers = {}
            for worker, run in ((a, "run-A"), (b, "run-B")):
                body = {"session": "patient", "writes": [{"table": table, "date": D1, "run": run, "rows": ROWS, **write}]}
                numbers[run] = (worker, worker.send(body))
            # Both commits wait at the catalog's UPDATE once two new metadata files are written.
            deadline = time.monotonic() + 240
            while sum(1 for name in files_under(location) - before if name.startswith("metadata/0")) < 2:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            waiting = sorted(name for name in files_under(location) - before if name.startswith("metadata/0"))
            show(f"{scenario}: new metadata files while both wait", len(waiting))
            lock.release()
            for run, (worker, number) in numbers.items():
                outcome = worker.result(number)
                if outcome and not outcome["ok"]:
                    outcome["error"]["message"] = outcome["error"]["message"][:220]
                show(f"{scenario}: {run}", outcome)
            show(f"{scenario}: the date's rows by run after both", date_rows(catalog, table.removeprefix("lake.")))
            snapshots = catalog.load_table(table.removeprefix("lake.")).snapshots()
            show(f"{scenario}: snapshots (operation, cdc.run-id)", [
                (s.summary.operation.value, s.summary.get("cdc.run-id")) for s in sorted(snapshots, key=lambda s: s.timestamp_ms)
            ])
    finally:
        a.stop()
        b.stop()
    if not args.keep:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
