"""Question 3 of docs/design/iceberg-commits.md (and the SQLite part of question 1): a real pause inside
an Iceberg commit, and kill -9 of the writer there.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.experiments.q3_kill_mid_commit [--keep DIR]

The pause: this process holds ``BEGIN EXCLUSIVE`` on the catalog's SQLite file (``CatalogLock``). A Spark
writer (``commit_worker``, its own process group and JVM) whose table is in its catalog cache writes its
data files and then, inside the commit, reads the catalog: it waits there for as long as its SQLite busy
timeout lets it.

1. default busy timeout (sqlite-jdbc: 3 s): what the writer sees when the file is locked (it waits at its
   table load), and when another writer holds SQLite's write lock (it waits at its commit's UPDATE);
2. ``jdbc.busy_timeout=600000``, lock held 8 s: the commit waits, then succeeds;
3. the same, and kill -9 of the writer's process group while its commit waits: the table stays at its
   previous snapshot (pyiceberg and Spark), the killed write's files are not read, remove_orphan_files
   (with ``older_than``) removes them, and a re-run succeeds.
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

from benchmarks.experiments.lake_env import (
    CatalogLock,
    describe_error,
    files_under,
    live_files,
    pyiceberg_catalog,
    spark_session,
    start_worker,
)

TABLE, D1 = "lake.exp.killed", "2024-01-01"
ROWS = 1000


def command(folder: Path, number: int, body: dict, worker, timeout: float | None = 300) -> dict | None:
    (folder / f"cmd-{number}.json").write_text(json.dumps(body))
    if timeout is None:
        return None
    return result(folder, number, worker, timeout)


def result(folder: Path, number: int, worker, timeout: float) -> dict:
    path = folder / f"result-{number}.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if worker.poll() is not None:
            raise SystemExit(f"worker exited {worker.returncode}; see {folder / 'worker.log'}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no result {number} within {timeout} s")
        time.sleep(0.1)
    return json.loads(path.read_text())


def write(session: str, run: str) -> dict:
    return {"session": session, "writes": [{"table": TABLE, "date": D1, "run": run, "rows": ROWS}]}


def state(catalog) -> dict:
    table = catalog.load_table("exp.killed")
    arrow = table.scan().to_arrow()
    return {
        "snapshot": table.metadata.current_snapshot_id,
        "runs": sorted(set(arrow["run"].to_pylist())),
        "rows": arrow.num_rows,
        "live": live_files(table),
        "location": table.metadata.location.removeprefix("file:"),
    }


def unreachable_files(spark, table: str, location: Path) -> set[str]:
    """Files under the table's folder that none of its metadata reaches (every snapshot's data and delete
    files, manifests, manifest lists, the metadata files of its log), hidden files aside: what the
    procedure would call orphans, worked out with SQL on the metadata tables (Spark Connect-clean)."""
    reachable = set()
    for query in (
        f"SELECT file_path FROM {table}.all_files",
        f"SELECT path FROM {table}.all_manifests",
        f"SELECT manifest_list FROM {table}.snapshots",
        f"SELECT file FROM {table}.metadata_log_entries",
    ):
        reachable |= {row[0].removeprefix("file:").removeprefix(str(location) + "/") for row in spark.sql(query).collect()}
    present = {name for name in files_under(location) if not Path(name).name.startswith((".", "_"))}
    return present - reachable


def show(label: str, value) -> None:
    print(f"{label}: {value}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this folder and keep it")
    parser.add_argument("--kill-at", choices=("refresh", "update"), default="update",
                        help="refresh: EXCLUSIVE lock, the commit waits at its first catalog read; "
                        "update: IMMEDIATE lock, it waits at the catalog's UPDATE")
    parser.add_argument("--patient-cache", choices=("true", "false"), default="true",
                        help="cache-enabled of the writer's busy-waiting session (false: the recommended conf; "
                        "then only --kill-at update pauses inside the commit)")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="ice-q3-"))
    folder.mkdir(parents=True, exist_ok=True)
    root = folder / "warehouse"
    root.mkdir(exist_ok=True)
    worker = start_worker("commit_worker", [str(root), str(folder), args.patient_cache], folder / "worker.log")
    while not (folder / "ready").exists():
        if worker.poll() is not None:
            raise SystemExit(f"worker exited early; see {folder / 'worker.log'}")
        time.sleep(0.2)
    lock = CatalogLock(str(root))
    catalog = pyiceberg_catalog(str(root))

    show("catalog cache of the busy-waiting session", args.patient_cache)
    show("1 seed", command(folder, 1, write("patient", "seed"), worker))
    # Warm the patient session's cache: the next writes load the table without touching SQLite.
    show("2 warm", command(folder, 2, write("patient", "warm"), worker))

    # -- 1: the default busy timeout -----------------------------------------------------------
    before = state(catalog)
    files_before = files_under(Path(before["location"]))
    lock.acquire()
    started = time.monotonic()
    outcome = command(folder, 3, write("default", "busy-default"), worker, timeout=None) or result(folder, 3, worker, 60)
    waited = time.monotonic() - started
    lock.release()
    show("3 default busy timeout, catalog locked", outcome)
    show("  returned after (s)", round(waited, 1))
    after = state(catalog)
    show("  table snapshot unchanged", after["snapshot"] == before["snapshot"])
    left = sorted(files_under(Path(before["location"])) - files_before)
    show("  files the failed write left", left)

    # -- 1b: the default busy timeout, another writer holding SQLite's write lock (readers pass) ------
    before = state(catalog)
    files_before = files_under(Path(before["location"]))
    writer_lock = CatalogLock(str(root), "IMMEDIATE")
    writer_lock.acquire()
    started = time.monotonic()
    command(folder, 4, write("default", "busy-default-at-update"), worker, timeout=None)
    outcome = result(folder, 4, worker, 60)
    waited = time.monotonic() - started
    writer_lock.release()
    show("4 default busy timeout, catalog write-locked (IMMEDIATE): the commit's UPDATE", outcome)
    show("  returned after (s)", round(waited, 1))
    after = state(catalog)
    show("  table snapshot unchanged", after["snapshot"] == before["snapshot"])
    failed_write_files = files_under(Path(before["location"])) - files_before
    show("  files the failed write left", sorted(failed_write_files))

    # -- 2: busy_timeout lets the commit wait -------------------------------------------------
    lock.acquire()
    command(folder, 5, write("patient", "busy-patient"), worker, timeout=None)
    time.sleep(8)
    waiting = not (folder / "result-5.json").exists()
    lock.release()
    outcome = result(folder, 5, worker, 120)
    show("5 jdbc.busy_timeout=600000, catalog locked 8 s: still waiting at 8 s", waiting)
    show("  then", outcome)
    show("  table now holds run", state(catalog)["runs"])

    # -- 3: kill -9 while the commit waits -------------------------------------------------------
    before = state(catalog)
    location = Path(before["location"])
    files_before = files_under(location)
    kill_lock = CatalogLock(str(root), "EXCLUSIVE" if args.kill_at == "refresh" else "IMMEDIATE")
    kill_lock.acquire()
    command(folder, 6, write("patient", "killed"), worker, timeout=None)
    # refresh: the commit waits reading the catalog, its data files written; update: it waits at the
    # catalog's UPDATE, its manifests, manifest list and metadata file written too.
    wanted = "data/" if args.kill_at == "refresh" else "metadata/0"
    deadline = time.monotonic() + 180
    while not any(name.startswith(wanted) for name in files_under(location) - files_before):
        if time.monotonic() > deadline or worker.poll() is not None:
            raise SystemExit(f"the paused write's {wanted} files never appeared")
        time.sleep(0.1)
    time.sleep(3)
    written = sorted(files_under(location) - files_before)
    time.sleep(2)
    show(f"6 [{args.kill_at}] files of the paused write (commit waiting on the catalog)", written)
    show("  nothing more written in 2 s", sorted(files_under(location) - files_before) == written)
    show("  writer returned", (folder / "result-6.json").exists())
    if args.kill_at == "update":
        # Readers are not blocked by a RESERVED lock: the table reads at its previous snapshot meanwhile.
        show("  pyiceberg reads during the pause (runs, rows)", (state(catalog)["runs"], state(catalog)["rows"]))
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    kill_lock.release()
    show("  killed with SIGKILL; worker exit", worker.returncode)

    after = state(catalog)
    leftovers = files_under(location) - files_before
    show("  pyiceberg: snapshot unchanged", after["snapshot"] == before["snapshot"])
    show("  pyiceberg: runs / rows", (after["runs"], after["rows"]))
    show("  any leftover file read by the current snapshot", bool({str(location / f) for f in leftovers} & after["live"]))

    # -- Spark, another JVM: reads the previous snapshot, removes the orphans, re-runs -------------------
    spark = spark_session(str(root), {"cache-enabled": "false"}, app="q3-recovery")
    rows = spark.sql(f"SELECT run, count(*) AS n FROM {TABLE} GROUP BY run").collect()
    show("  Spark reads", [tuple(row) for row in rows])
    cutoff = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() + 1))
    time.sleep(1.5)
    try:
        spark.sql(f"CALL lake.system.remove_orphan_files(table => 'exp.killed', older_than => TIMESTAMP '{cutoff}')").collect()
        show(f"7 remove_orphan_files(older_than => TIMESTAMP '{cutoff}')", "accepted")
    except Exception as error:  # noqa: BLE001 - the procedure's guard is the finding
        show(f"7 remove_orphan_files(older_than => TIMESTAMP '{cutoff}') refused", describe_error(error)["message"][:260])
    visible = {name for name in leftovers if not Path(name).name.startswith((".", "_"))}
    unreachable = unreachable_files(spark, TABLE, location)
    show("  unreachable by the table's metadata tables (what a project sweep would delete)", sorted(unreachable))
    failed_visible = {name for name in failed_write_files if not Path(name).name.startswith((".", "_"))}
    show("  == the files of the killed write and of the write that failed in §1b (hidden .crc files aside)",
         unreachable == visible | failed_visible)
    default_dry = spark.sql("CALL lake.system.remove_orphan_files(table => 'exp.killed', dry_run => true)").collect()
    show("  default older_than (3 days ago), dry run: would remove", len(default_dry))
    # A test can age the leftovers instead: the procedure then removes them with its own guard untouched.
    three_days_ago = time.time() - 3 * 86400 - 3600
    for name in leftovers:
        os.utime(location / name, (three_days_ago, three_days_ago))
    removed = spark.sql("CALL lake.system.remove_orphan_files(table => 'exp.killed')").collect()
    removed_paths = {row[0].removeprefix("file:").removeprefix(str(location) + "/") for row in removed}
    show("  leftovers aged 3 days + 1 h, then the default call removed", sorted(removed_paths))
    show("  removed == the leftovers (hidden .crc files aside)", removed_paths == visible)
    show("  still on disk of the leftovers (hidden files are never listed)", sorted(leftovers & files_under(location)))
    from pyspark.sql import functions as F

    df = spark.range(ROWS).select(F.lit(D1).cast("date").alias("business_date"), F.col("id"), F.lit("rerun").alias("run"))
    df.writeTo(TABLE).overwrite(F.col("business_date") == F.lit(D1).cast("date"))
    show("8 re-run: Spark reads", [tuple(row) for row in spark.sql(f"SELECT run, count(*) FROM {TABLE} GROUP BY run").collect()])
    spark.stop()
    show("  pyiceberg reads", {k: v for k, v in state(pyiceberg_catalog(str(root))).items() if k in ("runs", "rows")})
    if not args.keep:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
