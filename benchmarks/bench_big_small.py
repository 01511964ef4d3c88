"""A big table and a small change (issue 13): a 10M-row current table, then a delta of 1,000 changed rows.

    .venv/bin/python benchmarks/bench_big_small.py [--rows 10000000] [--changed 1000] [--update-share 0.5]
        [--compare-rows 1000000] [--modes snapshot,incremental,compaction] [--seed 7] [--workdir DIR] [--keep]
        [--results-dir DIR]

A table with ``load_type: delta`` (a key missing from the day's extract was not supplied: X, kept with
its previous payload; a delta has no deletes), written to a temp CDC_TABLE_CONFIGS folder:

1. day 1: a full snapshot of ``--rows`` rows from ``cdc-generate ROWS 0 5 10 1.0 0.0 0.0 ...`` (the
   generator's day-1 file; its empty day 2 is discarded), loaded by a cold CLI run: the current table;
2. day 2: a delta file of ``--changed`` rows: ``--update-share`` of them are day-1 keys whose ten
   non-key values all change (U), the rest new keys (I); built with DuckDB from the day-1 file;
3. the day-1 warehouse copied once per storage mode (``--modes``, default all three), and day 2 loaded in
   each by a cold ``dagster asset materialize`` run, with Spark's event log on (as in bench_scale.py):
   ``snapshot`` (current_table stores the whole state), ``incremental`` (day 2 stores its changes) and
   ``compaction`` (incremental, ``compact_after_dates: 1``: day 2 stores a full copy). Measured per
   mode: wall seconds (and the ratio to day 1), the JVM's peak RSS (VmHWM), shuffle bytes, spill, and
   the bytes each asset wrote for the date;
4. checked: history_partition and hash_join_classification I/U = inserts / updates, deletes empty (X is
   counted, not stored), and current_table I/U/X (snapshot, compaction) or current_table_changes I/U
   (incremental).

Prints each figure as it finishes, then a table and the explanation; writes JSON to
``benchmarks/results/bench_big_small_<rows>_<UTC>.json`` (git-ignored). Every run is killed with its
process group (JVM included) on failure, Ctrl-C or SIGTERM. Exit status: 0 ok, 1 a run failed,
2 wrong counts, 130 interrupted.

Cost at the defaults on the idle 2-core machine: day 1 took 718 s at 10M rows, and a snapshot day 2 about six
minutes before X stopped being written; allow 30-40 minutes for all three modes, and about 40 GB of disk. Small check (about 5 minutes):
    .venv/bin/python benchmarks/bench_big_small.py --rows 200000 --changed 1000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import spark_eventlog as ev  # noqa: E402
from bench_scale import base_env, dagster_bin, describe, measure_run, operation_counts, prepare_workdir  # noqa: E402
from bench_targets import GIB, Interrupted, OutputsWrong, StepFailed, git_commit  # noqa: E402

TABLE = "big_delta"
DAY1, DAY2 = "2019-06-18", "2019-06-19"
KEYS = [f"key_{i}" for i in range(1, 6)]
NON_KEYS = [f"nonkey_{i}" for i in range(1, 11)]
MARKER = ".cdc_bench_big_small"


def log(message: str) -> None:
    print(f"[big-small {time.strftime('%H:%M:%S')}] {message}", flush=True)


# Day 2 is measured in each of these: how current_table is stored (storage: in the table config).
MODES = {
    "snapshot": "{current: snapshot}",
    "incremental": "{current: incremental}",  # day 2 stores its changes only
    "compaction": "{current: incremental, compact_after_dates: 1}",  # day 2 stores a full copy: a compaction
}


def write_config(folder: Path, data_root: Path, storage: str = MODES["snapshot"]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    keys = "\n".join(f"  - {{name: {k}, type: string}}" for k in KEYS)
    non_keys = "\n".join(f"  - {{name: {c}, type: double}}" for c in NON_KEYS)
    (folder / f"{TABLE}.yaml").write_text(
        f"name: {TABLE}\nstart_date: '{DAY1}'\nload_type: delta\n"
        f"source:\n  path: {data_root}/{{date}}/\n  format: csv\n"
        f"keys:\n{keys}\nnon_keys:\n{non_keys}\nstorage: {storage}\n"
    )
    return folder


def make_data(rows: int, changed: int, update_share: float, data: Path, seed: int) -> dict:
    """Day 1: ``rows`` rows from cdc-generate; day 2: a delta of ``changed`` rows (updates, then new keys)."""
    started = time.perf_counter()
    scratch = data / "_scratch"
    command = [dagster_bin("cdc-generate"), str(rows), "0", "5", "10", "1.0", "0.0", "0.0",
               str(data / DAY1), str(scratch), "--seed", str(seed)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise StepFailed(f"cdc-generate failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(scratch, ignore_errors=True)
    updates = min(round(changed * update_share), rows)
    inserts = changed - updates
    (data / DAY2).mkdir(parents=True)
    day1_csv = next((data / DAY1).glob("*.csv"))
    shifted = ", ".join(f"round((cast({c} AS DOUBLE) + 500.0) % 1000.0, 6) AS {c}" for c in NON_KEYS)
    new_keys = ", ".join(f"'new-' || i || '-{k}' AS {k}" for k in KEYS)
    new_values = ", ".join(f"round(((i * 7.31 + {j}) * 13.7) % 1000.0, 6) AS {c}" for j, c in enumerate(NON_KEYS, start=1))
    db = duckdb.connect()
    db.sql(
        f"""COPY (
              (SELECT {', '.join(KEYS)}, {shifted}
               FROM (SELECT * FROM read_csv('{day1_csv}', header=true, all_varchar=true) LIMIT {updates}))
              UNION ALL
              (SELECT {new_keys}, {new_values} FROM range({inserts}) AS t(i))
            ) TO '{data / DAY2 / 'part-00000.csv'}' (HEADER)"""
    )
    db.close()
    return {"seconds": round(time.perf_counter() - started, 2), "rows": rows, "updates": updates, "inserts": inserts,
            "day1_bytes": ev.folder_bytes(data / DAY1), "day2_bytes": ev.folder_bytes(data / DAY2)}


def check_day2(data: dict, table_root: Path, mode: str) -> dict:
    rows, updates, inserts = data["rows"], data["updates"], data["inserts"]
    # X is counted, not stored: deletes and the classification hold the touched keys only.
    expected = {
        "history_partition": {"I": inserts, "U": updates},
        "hash_join_classification": {"I": inserts, "U": updates},
        "deletes": {},
        **({"current_table_changes": {"I": inserts, "U": updates}} if mode == "incremental" else
           {"current_table": {"I": inserts, "U": updates, "X": rows - updates}}),
    }
    expected = {name: {op: n for op, n in ops.items() if n} for name, ops in expected.items()}
    found = {name: operation_counts(table_root / name / f"business_date={DAY2}") for name in expected}
    if found != expected:
        raise OutputsWrong(f"day-2 counts {found}, expected {expected}")
    return found


def measure_size(rows: int, args: argparse.Namespace, workdir: Path, result: dict) -> None:
    base = workdir / f"r{rows}"
    shutil.rmtree(base, ignore_errors=True)
    data_root = base / "data"
    need = rows * 3000  # 2.4 KB per row measured at 200k rows (day-1 CSV, two dates of outputs), plus Spark's scratch
    if shutil.disk_usage(workdir).free < need:
        log(f"WARNING: {shutil.disk_usage(workdir).free / GIB:.1f} GiB free in {workdir}, about {need / GIB:.1f} GiB needed")
    result["data"] = data = make_data(rows, args.changed, args.update_share, data_root, args.seed)
    log(f"{rows:,} rows: data in {data['seconds']}s: day 1 {rows:,} rows ({ev.mib(data['day1_bytes'])} MiB CSV), "
        f"day-2 delta {data['updates']:,} updates + {data['inserts']:,} inserts ({ev.mib(data['day2_bytes'])} MiB CSV)")
    # Day 1 (no earlier state) stores a full copy in every mode: one day 1, copied for each mode's day 2.
    day1 = base / "day1"
    configs = write_config(day1 / "configs", data_root)
    home = day1 / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    env = {**base_env(), "DAGSTER_HOME": str(home), "CDC_WAREHOUSE": str(day1 / "warehouse"), "CDC_TABLE_CONFIGS": str(configs)}
    result["day1"] = measure_run(f"r{rows}_day1", workdir, env, DAY1, table=TABLE)
    log(f"{rows:,} rows: day 1 (full load of the table), cold CLI: {describe(result['day1'])}")
    result["day1_partition_bytes"] = ev.partition_bytes(day1 / "warehouse", TABLE, DAY1)
    for mode in args.modes:
        folder = base / mode
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(day1, folder, symlinks=True)
        warehouse = folder / "warehouse"
        write_config(folder / "configs", data_root, MODES[mode])
        env = {**base_env(), "DAGSTER_HOME": str(folder / "dagster_home"), "CDC_WAREHOUSE": str(warehouse),
               "CDC_TABLE_CONFIGS": str(folder / "configs")}
        measured = result.setdefault("day2_by_mode", {})[mode] = {}
        measured["run"] = day2 = measure_run(f"r{rows}_day2_{mode}", workdir, env, DAY2, table=TABLE)
        log(f"{rows:,} rows, {mode}: day 2 (delta of {args.changed:,} rows), cold CLI: {describe(day2)}")
        if day2["steps"]:
            log(f"{rows:,} rows, {mode}: day-2 steps: " + ", ".join(f"{k} {v}s" for k, v in day2["steps"].items()))
        measured["partition_bytes"] = sizes = ev.partition_bytes(warehouse, TABLE, DAY2)
        measured["written_bytes"] = written = sum(sizes.values())
        log(f"{rows:,} rows, {mode}: day-2 partitions (MiB): " + ", ".join(f"{k} {ev.mib(v)}" for k, v in sizes.items())
            + f"; all {ev.mib(written)} MiB for a {ev.mib(data['day2_bytes'])} MiB delta")
        measured["counts"] = check_day2(data, warehouse / TABLE, "incremental" if mode == "incremental" else "full copy")
        log(f"{rows:,} rows, {mode}: day-2 counts as expected: {measured['counts']}")
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    first = args.modes[0]
    result["day2"], result["day2_partition_bytes"] = result["day2_by_mode"][first]["run"], result["day2_by_mode"][first]["partition_bytes"]
    result["day2_written_bytes"] = result["day2_by_mode"][first]["written_bytes"]


def print_table(results: dict) -> None:
    head = (f"{'table rows':>12} {'day-2 wall s':>12} {'other':>5} {'JVM RSS GiB':>11} {'shuf W MiB':>10} {'shuf R MiB':>10} "
            f"{'spill MiB':>9} {'current MiB':>11} {'history MiB':>11} {'deletes MiB':>11} {'all MiB':>9} {'day-1 wall s':>12}")
    print("\n" + "=" * len(head))
    print(f"A BIG TABLE AND A SMALL CHANGE (issue 13)  delta of {results['changed']:,} rows  at {results['git_commit']}  "
          f"{results['started_utc']}  total {results.get('total_seconds', 0):.0f} s")
    print(head)
    for rows, size in sorted(results["sizes"].items(), key=lambda kv: -int(kv[0])):
        run = size.get("day2")
        if not run:
            continue
        e, part = run.get("eventlog", {}), size.get("day2_partition_bytes", {})
        day1 = size.get("day1", {}).get("seconds")
        print(f"{int(rows):>12,} {run['seconds']:>12.1f} {run['other_processes_avg_cores']:>5} {run['jvm_peak_rss_mib'] / 1024:>11.2f} "
              f"{ev.mib(e.get('shuffle_write_bytes')) or 0:>10.1f} {ev.mib(e.get('shuffle_read_bytes')) or 0:>10.1f} "
              f"{ev.mib(e.get('disk_bytes_spilled')) or 0:>9.1f} {ev.mib(part.get('current_table')) or 0:>11.1f} "
              f"{ev.mib(part.get('history_partition')) or 0:>11.1f} {ev.mib(part.get('deletes')) or 0:>11.1f} "
              f"{ev.mib(size.get('day2_written_bytes')) or 0:>9.1f} {day1 or 0:>12.1f}")
    done = sorted((int(r) for r, s in results["sizes"].items() if "day2" in s), reverse=True)
    if done:
        big = results["sizes"][str(done[0])]
        part = big["day2_partition_bytes"]
        history = part.get("history_partition") or 1
        print(f"At {done[0]:,} rows, recording {results['changed']:,} changes wrote {ev.mib(big['day2_written_bytes'])} MiB: "
              f"current_table {ev.mib(part.get('current_table'))} MiB = {part.get('current_table', 0) / history:,.0f} x "
              f"history_partition's {ev.mib(part.get('history_partition'))} MiB. Day 2 took {big['day2']['seconds']:.1f} s, "
              f"{big['day2']['seconds'] / big['day1']['seconds']:.2f} x the table's full load (day 1).")
        if len(done) > 1:
            small = results["sizes"][str(done[-1])]
            print(f"Same delta on {done[-1]:,} rows: day 2 {small['day2']['seconds']:.1f} s; {done[0]:,} / {done[-1]:,} = "
                  f"{big['day2']['seconds'] / small['day2']['seconds']:.2f} x the time for {done[0] / done[-1]:.0f} x the rows, "
                  f"the same change.")
    print("snapshot: current_table stores the whole state per date (the not-supplied X rows carried over). incremental:")
    print("a date stores its changes (current_table_changes); compaction: the date stores a full copy of the state.")
    print("In every mode X is counted, not written: deletes and hash_join_classification hold the touched keys only.")
    for rows, size in sorted(results["sizes"].items(), key=lambda kv: -int(kv[0])):
        day1 = size.get("day1", {}).get("seconds")
        for mode, measured in size.get("day2_by_mode", {}).items():
            if "run" not in measured or "written_bytes" not in measured:
                continue
            part = measured["partition_bytes"]
            print(f"{int(rows):>12,} {mode:<12} day 2 {measured['run']['seconds']:>8.1f} s = "
                  f"{measured['run']['seconds'] / day1 if day1 else 0:.3f} x day 1; wrote {ev.mib(measured['written_bytes'])} MiB: "
                  + ", ".join(f"{name} {ev.mib(n)}" for name, n in part.items() if n))
    for line in target_lines(results):
        print(line)
    for rows, error in results["errors"].items():
        print(f"{rows} rows: {'WRONG COUNTS' if error['kind'] == 'outputs' else 'FAILED'}: {error['message'].strip().splitlines()[0][:160]}")
    if results.get("interrupted"):
        print("INTERRUPTED")
    print("wall s: one fresh `dagster asset materialize` process; other: cores other processes kept busy; JVM RSS: VmHWM;")
    print("shuf W/R: shuffle bytes written / read from Spark's event log; MiB columns: the date's partition of each asset")
    print("=" * len(head), flush=True)


# Issue 23's targets for the big table: incremental day 2 against day 1 (wall), its bytes written, and a
# compaction (a day 2 that stores a full copy) against a snapshot day 2.
TARGETS = {"incremental_day2/day1": 0.05, "incremental_written_mib": 64, "compaction/snapshot": 1.0}


def target_lines(results: dict) -> list[str]:
    """Issue 23's targets for the biggest table measured, each as a ratio with its verdict."""
    done = sorted((int(r) for r, s in results["sizes"].items() if s.get("day2_by_mode")), reverse=True)
    if not done:
        return []
    size = results["sizes"][str(done[0])]
    by_mode = {mode: m for mode, m in size["day2_by_mode"].items() if "run" in m and "written_bytes" in m}
    day1 = size.get("day1", {}).get("seconds")
    verdict = lambda value, target: "MET" if value <= target else "NOT MET"  # noqa: E731
    lines = [f"TARGETS (issue 23) at {done[0]:,} rows, delta of {results['changed']:,}:"]
    incremental, snapshot, compaction = by_mode.get("incremental"), by_mode.get("snapshot"), by_mode.get("compaction")
    if incremental and day1:
        ratio = incremental["run"]["seconds"] / day1
        lines.append(f"  incremental day 2 / day 1 (full load) = {ratio:.3f}  target <= {TARGETS['incremental_day2/day1']}: "
                     f"{verdict(ratio, TARGETS['incremental_day2/day1'])}")
        written = ev.mib(incremental["written_bytes"])
        lines.append(f"  incremental day 2 wrote {written} MiB  target <= {TARGETS['incremental_written_mib']} MiB: "
                     f"{verdict(written, TARGETS['incremental_written_mib'])}")
    if snapshot:
        part = snapshot["partition_bytes"]
        copies = (part.get("current_table", 0) + part.get("deletes", 0) + part.get("hash_join_classification", 0)) / max(
            part.get("current_table", 1), 1)
        lines.append(f"  snapshot day 2 wrote {ev.mib(snapshot['written_bytes'])} MiB: current_table, deletes and the "
                     f"classification = {copies:.2f} x current_table (one table copy, X not written)")
    if compaction and snapshot:
        ratio = compaction["run"]["seconds"] / snapshot["run"]["seconds"]
        lines.append(f"  compaction day 2 / snapshot day 2 = {ratio:.2f}  target <= {TARGETS['compaction/snapshot']}: "
                     f"{verdict(ratio, TARGETS['compaction/snapshot'])}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the table (day 1), default 10,000,000")
    parser.add_argument("--changed", type=int, default=1000, help="rows in the day-2 delta, default 1,000")
    parser.add_argument("--update-share", type=float, default=0.5, help="share of the delta's rows that update day-1 keys (default 0.5; the rest are new keys)")
    parser.add_argument("--compare-rows", help="comma-separated other table sizes to apply the same delta to, e.g. 1000000")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated storage modes to run day 2 in, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--seed", type=int, default=7, help="cdc-generate --seed (default 7)")
    parser.add_argument("--workdir", help="default: a fresh temp dir, deleted at the end unless --keep")
    parser.add_argument("--keep", action="store_true", help="keep data, warehouses, event logs and run logs")
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"), help="'' to skip the JSON copy")
    args = parser.parse_args(argv)
    try:
        others = [int(r.replace("_", "")) for r in (args.compare_rows or "").split(",") if r.strip()]
    except ValueError:
        parser.error(f"--compare-rows: not a comma-separated list of integers: {args.compare_rows!r}")
    args.rows_list = sorted({args.rows, *others}, reverse=True)  # the big table first
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not args.modes or any(mode not in MODES for mode in args.modes):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    if min(args.rows_list) < 10 or args.changed < 1 or not 0.0 <= args.update_share <= 1.0:
        parser.error("need table rows >= 10, --changed >= 1 and 0 <= --update-share <= 1")
    if round(args.changed * args.update_share) > min(args.rows_list):
        parser.error("the delta updates more rows than the smallest table holds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum, frame):
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    workdir, is_temp = prepare_workdir(args.workdir, MARKER, "cdc_big_small_")
    results: dict = {
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "rows": args.rows_list,
        "changed": args.changed,
        "update_share": args.update_share,
        "seed": args.seed,
        "workdir": str(workdir),
        "event_log_conf": ev.EVENT_LOG_CONF,
        "spark_env": {k: os.environ[k] for k in ("CDC_SPARK_CONF", "CDC_SPARK_MASTER") if k in os.environ},
        "machine": {"cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / GIB, 1),
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "sizes": {},
        "errors": {},
        "targets": TARGETS,
    }
    log(f"workdir {workdir}; tables of {', '.join(f'{r:,}' for r in args.rows_list)} rows, delta of {args.changed:,} rows; "
        f"load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    interrupted = False
    try:
        for rows in args.rows_list:
            log(f"--- table of {rows:,} rows ---")
            result = results["sizes"][str(rows)] = {}
            try:
                measure_size(rows, args, workdir, result)
            except OutputsWrong as error:
                results["errors"][str(rows)] = {"kind": "outputs", "message": str(error)}
                log(f"{rows:,} rows: WRONG COUNTS: {error}")
            except Exception as error:  # noqa: BLE001 - report it, measure the other sizes
                message = str(error) if isinstance(error, StepFailed) else traceback.format_exc()
                results["errors"][str(rows)] = {"kind": "failed", "message": message}
                log(f"{rows:,} rows: FAILED: {message}")
            finally:
                if not args.keep:
                    shutil.rmtree(workdir / f"r{rows}", ignore_errors=True)
    except (KeyboardInterrupt, Interrupted):
        interrupted = results["interrupted"] = True
        log("interrupted: the run in progress was stopped with its process group")
    finally:
        results["total_seconds"] = round(time.perf_counter() - started, 1)
        results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        print_table(results)
        text = json.dumps(results, indent=2, default=str) + "\n"
        if not (is_temp and not args.keep):
            (workdir / "results.json").write_text(text)
        if args.results_dir:
            folder = Path(args.results_dir)
            folder.mkdir(parents=True, exist_ok=True)
            label = "_".join(str(r) for r in args.rows_list)
            path = folder / f"bench_big_small_{label}_{args.changed}changed_{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
            path.write_text(text)
            log(f"results written to {path}")
        if is_temp and not args.keep:
            if results["errors"] or interrupted:
                for entry in workdir.iterdir():
                    if entry.name not in ("logs", "eventlogs"):
                        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                log(f"removed {workdir} except its logs/ and eventlogs/ (pass --keep to keep all)")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
                log(f"removed {workdir} (pass --keep to keep it)")
        log(f"total {results['total_seconds']:.0f}s")
    if interrupted:
        return 130
    if any(e["kind"] == "failed" for e in results["errors"].values()):
        return 1
    return 2 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
