"""Questions 1 and 2 of docs/design/iceberg-commits.md: two writer processes (two JVMs sharing only the
warehouse folder and its SQLite catalog) overwrite one ``business_date`` of one table in a loop, and
different dates; then the same with Iceberg's conflict validation, with dynamic overwrite, and with
pyiceberg creating tags while a Spark writer commits.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.experiments.q1_q2_concurrent_writers [--iterations 6] [--keep DIR]

This process starts no JVM: it writes the plan, starts the two writers (``writer_loop``), creates tags
with pyiceberg during the ``tags`` phase, then checks every phase with pyiceberg alone:

- every attempt that returned is a snapshot of the table, and no failed attempt is;
- at every snapshot of ``main``'s log, each date holds exactly one write, whole (no mixed or doubled date);
- the date's final content is the write of the last commit that touched it.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.experiments.lake_env import append_jsonl, describe_error, pyiceberg_catalog, read_jsonl, start_worker

D1, D2 = "2024-01-01", "2024-01-02"
SERIALIZABLE = {"isolation-level": "serializable"}


def plan(iterations: int, rows: int) -> dict:
    def phase(name, op, dates, **extra):
        return {"name": name, "table": f"lake.exp.{name}", "op": op, "dates": dates, "rows": rows,
                "iterations": extra.pop("iterations", iterations), **extra}

    return {
        "phases": [
            phase("same_default", "overwrite", {"A": D1, "B": D1}),
            phase("diff_default", "overwrite", {"A": D1, "B": D2}),
            phase("same_serializable", "overwrite", {"A": D1, "B": D1},
                  write_options=SERIALIZABLE, validate_from_current=True),
            phase("same_serializable_no_base", "overwrite", {"A": D1, "B": D1},
                  write_options=SERIALIZABLE, iterations=2),
            phase("diff_serializable", "overwrite", {"A": D1, "B": D2},
                  write_options=SERIALIZABLE, validate_from_current=True),
            phase("same_dynamic_default", "overwritePartitions", {"A": D1, "B": D1}),
            phase("same_dynamic_serializable", "overwritePartitions", {"A": D1, "B": D1},
                  write_options=SERIALIZABLE, validate_from_current=True),
            phase("same_snapshot_isolation", "overwrite", {"A": D1, "B": D1},
                  write_options={"isolation-level": "snapshot"}, validate_from_current=True),
            # pyiceberg tags the table (from this process) while A overwrites it.
            phase("tags", "overwrite", {"A": D1}, iterations=iterations * 2, think_seconds=0.1),
        ]
    }


def tag_while_writing(root: str, folder: Path, results: Path, uri_query: str) -> None:
    """Create tags with pyiceberg for as long as writer A runs the ``tags`` phase."""
    catalog = pyiceberg_catalog(root, uri_query)
    ready, done = folder / "tags.ready.A", folder / "tags.done.A"
    while not ready.exists():
        time.sleep(0.05)
    number = 0
    while not done.exists():
        number += 1
        record = {"phase": "tags", "writer": "pyiceberg", "iteration": number, "tag": f"t{number}"}
        started = time.time()
        try:
            table = catalog.load_table("exp.tags")
            table.manage_snapshots().create_tag(table.metadata.current_snapshot_id, f"t{number}").commit()
            record["ok"] = True
            record["snapshot_id"] = table.metadata.current_snapshot_id
        except Exception as error:  # noqa: BLE001 - recorded, as the loser sees it
            record["ok"] = False
            record["error"] = describe_error(error)
        record["seconds"] = round(time.time() - started, 2)
        append_jsonl(results, record)
        time.sleep(0.05)


def check_phase(catalog, name: str, attempts: list[dict], rows: int) -> dict:
    table = catalog.load_table(f"exp.{name}")
    by_id = {snapshot.snapshot_id: snapshot for snapshot in table.snapshots()}
    committed = []
    for entry in table.history():  # main's snapshot log, oldest first
        summary = by_id[entry.snapshot_id].summary
        committed.append((summary.get("cdc.writer"), summary.get("cdc.iteration"), entry.snapshot_id))
    spark_attempts = [a for a in attempts if a["writer"] in ("A", "B")]
    succeeded = {(a["writer"], str(a["iteration"])) for a in spark_attempts if a["ok"]}
    failed = {(a["writer"], str(a["iteration"])) for a in spark_attempts if not a["ok"]}
    commits = {(w, i) for w, i, _ in committed if w in ("A", "B")}
    problems = []
    if succeeded - commits:
        problems.append(f"succeeded but not a snapshot of main: {sorted(succeeded - commits)}")
    if failed & commits:
        problems.append(f"failed but committed: {sorted(failed & commits)}")
    # Every snapshot of main: each date present is one write, whole.
    for writer, iteration, snapshot_id in committed:
        arrow = table.scan(snapshot_id=snapshot_id).to_arrow()
        per_date = collections.defaultdict(collections.Counter)
        for date, w, i in zip(arrow["business_date"].to_pylist(), arrow["writer"].to_pylist(), arrow["iteration"].to_pylist()):
            per_date[str(date)][(w, i)] += 1
        for date, writes in per_date.items():
            if len(writes) != 1 or next(iter(writes.values())) != rows:
                problems.append(f"snapshot {snapshot_id} ({writer}/{iteration}): date {date} holds {dict(writes)}")
    # The final content of each date is the last commit's write that touched the date.
    final = table.scan().to_arrow()
    final_writes = collections.defaultdict(set)
    for date, w, i in zip(final["business_date"].to_pylist(), final["writer"].to_pylist(), final["iteration"].to_pylist()):
        final_writes[str(date)].add((w, str(i)))
    last_per_date = {}
    for a in spark_attempts:
        if a["ok"]:
            last_per_date.setdefault(a["date"], set())
    for writer, iteration, _ in committed:
        if writer in ("A", "B"):
            date = next(a["date"] for a in spark_attempts if a["writer"] == writer and str(a["iteration"]) == iteration)
            last_per_date[date] = {(writer, iteration)}
    for date, last in last_per_date.items():
        if final_writes.get(date) != last:
            problems.append(f"date {date}: final content {final_writes.get(date)} is not the last commit {last}")
    errors = collections.Counter(
        re.sub(r"file:\S+", "<file>", re.sub(r"\d{5,}", "<n>", a["error"]["message"]))[:200] for a in attempts if not a["ok"]
    )
    return {
        "phase": name,
        "attempts": len(spark_attempts),
        "succeeded": len(succeeded),
        "failed": len(failed),
        "snapshots_of_main": len(committed),
        "problems": problems or "none",
        "errors": dict(errors),
        "per_writer": {
            w: f"{sum(a['ok'] for a in attempts if a['writer'] == w)} ok / {sum(not a['ok'] for a in attempts if a['writer'] == w)} failed"
            for w in sorted({a["writer"] for a in attempts})
        },
        "refs": len(table.metadata.refs),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--catalog-props", default="{}", help="JSON: extra catalog properties for both writers")
    parser.add_argument("--table-props", default="{}", help="JSON: table properties of every phase's table")
    parser.add_argument("--pyiceberg-uri-query", default="", help="e.g. timeout=30")
    parser.add_argument("--only", help="comma-separated phase names to run (default: all)")
    parser.add_argument("--keep", help="work in this folder and keep it")
    args = parser.parse_args()

    folder = Path(args.keep or tempfile.mkdtemp(prefix="ice-q1-"))
    folder.mkdir(parents=True, exist_ok=True)
    root = str(folder / "warehouse")
    Path(root).mkdir(exist_ok=True)
    the_plan = plan(args.iterations, args.rows)
    if args.only:
        the_plan["phases"] = [phase for phase in the_plan["phases"] if phase["name"] in args.only.split(",")]
    the_plan["catalog_props"] = json.loads(args.catalog_props)
    for phase in the_plan["phases"]:
        phase["table_props"] = json.loads(args.table_props)
    plan_path = folder / "plan.json"
    plan_path.write_text(json.dumps(the_plan, indent=1))
    results = folder / "results.jsonl"

    started = time.time()
    # A creates the catalog's tables first; B starts once it has (two JVMs must not both create them).
    writer_a = start_worker("writer_loop", [root, "A", str(plan_path), str(results)], folder / "A.log")
    while not (folder / f"{the_plan['phases'][0]['name']}.ready.A").exists():
        if writer_a.poll() is not None:
            raise SystemExit(f"writer A exited early: see {folder / 'A.log'}")
        time.sleep(0.2)
    writer_b = start_worker("writer_loop", [root, "B", str(plan_path), str(results)], folder / "B.log")
    if any(phase["name"] == "tags" for phase in the_plan["phases"]):
        tag_while_writing(root, folder, results, args.pyiceberg_uri_query)
    for worker, log in ((writer_a, "A.log"), (writer_b, "B.log")):
        if worker.wait(timeout=1200) != 0:
            print(f"writer exited {worker.returncode}: {folder / log}")
    print(f"writers took {time.time() - started:.0f} s; catalog props {the_plan['catalog_props']}, table props {args.table_props}")

    attempts = read_jsonl(results)
    catalog = pyiceberg_catalog(root)
    any_problem = False
    for phase in the_plan["phases"]:
        report = check_phase(catalog, phase["name"], [a for a in attempts if a["phase"] == phase["name"]], args.rows)
        any_problem |= report["problems"] != "none"
        print(json.dumps(report, indent=1))
    if not args.keep:
        shutil.rmtree(folder)
    return 1 if any_problem else 0


if __name__ == "__main__":
    raise SystemExit(main())
