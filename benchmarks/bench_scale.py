"""Scale (issue 13): day 2 at 1M and at 10M rows per day, in one invocation, same settings as bench_targets' (b).

    .venv/bin/python benchmarks/bench_scale.py [--rows 1000000,10000000] [--seed 7] [--workdir DIR] [--keep]
        [--results-dir DIR]

For each value of ``--rows`` (ascending), with its own data, DAGSTER_HOME and warehouse:

1. ``cdc-generate ROWS ROWS 5 10 0.2 0.4 0.4 DAY1 DAY2 --seed 7``, the data of bench_targets' (b);
2. day 1, then day 2, each ``dagster asset materialize -m cdc_assets.definitions --select group:synthetic
   --partition D`` in a fresh process (cold JVM), with Spark's event log switched on for the run through
   ``CDC_SPARK_CONF`` (spark_eventlog.py; the caller's own CDC_SPARK_CONF is kept and extended);
3. for each run: wall seconds; the JVM's peak RSS (VmHWM, sampled by bench_targets' JvmMonitor: in local
   mode one JVM holds the driver and the executors); from the event log, the shuffle bytes written
   and read (remote + local), spill, the peak JVM heap in use, and the driver-side figures (the largest
   task result, the largest total a single action returned to the driver, broadcast sizes); the bytes
   of every asset's day-2 partition in the warehouse; the step times the CLI logged;
4. day-2 current_table I/U/N and history_partition I/U/D counts against the generator's (as
   bench_targets does); the data of a size is deleted once it is measured (unless ``--keep``).

Then the ratio day 2 (largest rows) / day 2 (smallest rows) against the target (rows ratio x 1.1, i.e.
10M day 2 <= 11 x 1M day 2), and the same ratios for shuffle bytes and driver-side figures: a
driver figure that grows with rows is the thing to look for.

Prints each figure as it finishes, then a table; writes JSON to ``benchmarks/results/bench_scale_<rows>_<UTC>.json``
(git-ignored). Every run is a child process in its own process group and is killed with it (its JVM
included) on failure, Ctrl-C or SIGTERM. Exit status: 0 ok, 1 a run failed, 2 wrong counts, 130 interrupted.

Cost: at the defaults about 35 minutes on the idle 2-core machine (measured 1,989 s: 1M day 1 + day 2
about 5 min; 10M about 27 min), and about 35-40 GB of disk in the workdir at 10M (a size's data is
deleted before the next size starts). Small check (about 4 minutes, mostly JVM and Dagster start-up):
    .venv/bin/python benchmarks/bench_scale.py --rows 20000,100000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_backfill  # noqa: E402 - its table config writer
import spark_eventlog as ev  # noqa: E402
from bench_targets import (  # noqa: E402 - the same sampler and process handling as make benchmark
    GIB,
    Interrupted,
    OutputsWrong,
    StepFailed,
    git_commit,
    run_process,
)

TABLE = "synthetic"
DAY1, DAY2 = "2019-06-18", "2019-06-19"
TARGET_SLACK = 1.1  # 10x rows may cost at most 11x the time
MARKER = ".cdc_bench_scale"


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", flush=True)


def dagster_bin(name: str) -> str:
    path = REPO / ".venv" / "bin" / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def base_env() -> dict:
    """The caller's environment without anything that would point a run at another instance, warehouse or server."""
    # Cold runs: neither an inherited SPARK_REMOTE nor the project's running server (found by default).
    return {**{k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "DAGSTER_HOME", "CDC_WAREHOUSE", "CDC_TABLE_CONFIGS")}, "CDC_SPARK": "local"}


def generate(rows: int, data: Path, seed: int) -> dict:
    """bench_targets' data: ``cdc-generate ROWS ROWS 5 10 0.2 0.4 0.4 ... --seed``; the generator's counts."""
    command = [dagster_bin("cdc-generate"), str(rows), str(rows), "5", "10", "0.2", "0.4", "0.4",
               str(data / DAY1), str(data / DAY2), "--seed", str(seed)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise StepFailed(f"cdc-generate failed:\n{done.stderr[-3000:]}")
    summary = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", done.stdout)}
    return {"seconds": round(time.perf_counter() - started, 2), **summary}


def step_seconds(home: Path) -> dict[str, float]:
    """Seconds of each step of the instance's latest run, from its STEP_SUCCESS events (the CLI's log lines
    can be cut by the JVM's output on the same stream)."""
    import warnings

    from dagster import DagsterEventType, DagsterInstance

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with DagsterInstance.from_config(str(home)) as instance:
            runs = instance.get_runs(limit=1)
            if not runs:
                return {}
            events = instance.all_logs(runs[0].run_id, of_type=DagsterEventType.STEP_SUCCESS)
            return {e.step_key: round(e.dagster_event.event_specific_data.duration_ms / 1000, 2) for e in events}


def operation_counts(folder: Path) -> dict:
    import duckdb

    rows = duckdb.sql(f"select operation, count(*) from read_parquet('{folder}/*.parquet') group by all").fetchall()
    return {op: n for op, n in sorted(rows)}


def check_day2(generated: dict, table_root: Path) -> dict:
    """Day-2 current_table I/U/N and history_partition I/U/D against the generator's exact counts."""
    expected = {
        "current_table": {"I": generated["inserted"], "U": generated["updated"], "N": generated["unchanged"]},
        "history_partition": {"I": generated["inserted"], "U": generated["updated"], "D": generated["deleted"]},
    }
    expected = {name: {op: n for op, n in ops.items() if n} for name, ops in expected.items()}
    found = {name: operation_counts(table_root / name / f"business_date={DAY2}") for name in expected}
    if found != expected:
        raise OutputsWrong(f"day-2 counts {found}, expected {expected}")
    return found


def measure_run(name: str, workdir: Path, env: dict, day: str, table: str = TABLE) -> dict:
    """One cold CLI run with its own event log folder; process figures plus the event log's."""
    logs_dir = workdir / "eventlogs" / name
    shutil.rmtree(logs_dir, ignore_errors=True)
    run_env = {**env, "CDC_SPARK_CONF": ev.spark_conf_env(ev.event_log_conf(logs_dir), env)}
    command = [dagster_bin("dagster"), "asset", "materialize", "-m", "cdc_assets.definitions",
               "--select", f"group:{table}", "--partition", day]
    figures = run_process(name, command, run_env, workdir / "logs")
    figures["steps"] = step_seconds(Path(env["DAGSTER_HOME"]))
    closed = ev.wait_for_event_log(logs_dir)
    figures["eventlog"] = ev.summarize_event_log(logs_dir)
    figures["eventlog"]["closed_by_jvm"] = closed
    dropped = "Dropping event from queue" in Path(figures["log"]).read_text(errors="replace")
    figures["eventlog"]["events_dropped"] = dropped
    return figures


def describe(run: dict) -> str:
    e = run.get("eventlog", {})
    text = (f"{run['seconds']:.1f}s, JVM peak RSS {run['jvm_peak_rss_mib'] / 1024:.2f} GiB, "
            f"other processes {run['other_processes_avg_cores']} cores")
    if "error" in e:
        return text + f"; event log: {e['error']}"
    return text + (f"; shuffle write {ev.gib(e['shuffle_write_bytes'])} GiB, read {ev.gib(e['shuffle_read_bytes'])} GiB, "
                   f"spill {ev.gib(e['disk_bytes_spilled'])} GiB; heap peak {ev.gib(e['peak_jvm_heap_bytes'])} GiB; "
                   f"driver: max task result {ev.mib(e['driver_max_task_result_bytes'])} MiB, max action result "
                   f"{ev.mib(e['driver_max_result_stage_bytes'])} MiB, max broadcast {ev.mib(e['broadcast_max_bytes'])} MiB"
                   + ("; EVENTS DROPPED" if e.get("events_dropped") else "")
                   + ("" if e.get("complete") else "; event log incomplete"))


def measure_size(rows: int, args: argparse.Namespace, workdir: Path, result: dict) -> None:
    base = workdir / f"r{rows}"
    shutil.rmtree(base, ignore_errors=True)
    data = base / "data" / TABLE
    free = shutil.disk_usage(workdir).free
    need = rows * 4000  # 3.6 KB per row measured at 5k rows (2 CSV days + two dates of outputs), plus Spark's scratch
    if free < need:
        log(f"WARNING: {free / GIB:.1f} GiB free in {workdir}, about {need / GIB:.1f} GiB needed for {rows:,} rows")
    result["generation"] = generated = generate(rows, data, args.seed)
    log(f"{rows:,} rows: generated in {generated['seconds']}s: deleted={generated['deleted']} updated={generated['updated']} "
        f"unchanged={generated['unchanged']} inserted={generated['inserted']}")
    configs = base / "configs"
    bench_backfill.write_config(configs, data, table=TABLE, start=DAY1)
    home = base / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    env = {**base_env(), "DAGSTER_HOME": str(home), "CDC_WAREHOUSE": str(base / "warehouse"), "CDC_TABLE_CONFIGS": str(configs)}
    result["day1"] = measure_run(f"r{rows}_day1", workdir, env, DAY1)
    log(f"{rows:,} rows: day 1, cold CLI: {describe(result['day1'])}")
    result["day2"] = day2 = measure_run(f"r{rows}_day2", workdir, env, DAY2)
    log(f"{rows:,} rows: day 2, cold CLI: {describe(day2)}")
    if day2["steps"]:
        log(f"{rows:,} rows: day-2 steps: " + ", ".join(f"{k} {v}s" for k, v in day2["steps"].items()))
    result["day2_partition_bytes"] = sizes = ev.partition_bytes(base / "warehouse", TABLE, DAY2)
    result["data_bytes"] = {day: ev.folder_bytes(data / day) for day in (DAY1, DAY2)}
    log(f"{rows:,} rows: day-2 partitions (MiB): " + ", ".join(f"{k} {ev.mib(v)}" for k, v in sizes.items()))
    result["day2_counts"] = check_day2(generated, base / "warehouse" / TABLE)
    log(f"{rows:,} rows: day-2 counts as the generator says: {result['day2_counts']}")


def ratios(results: dict) -> dict | None:
    sizes = results["sizes"]
    done = sorted((int(r) for r, s in sizes.items() if "day2" in s))
    if len(done) < 2:
        return None
    small, large = sizes[str(done[0])]["day2"], sizes[str(done[-1])]["day2"]
    rows_ratio = done[-1] / done[0]
    target = round(rows_ratio * TARGET_SLACK, 2)
    value = large["seconds"] / small["seconds"]

    def r(key):
        a, b = small["eventlog"].get(key), large["eventlog"].get(key)
        return round(b / a, 2) if a and b is not None else None

    return {
        "small_rows": done[0], "large_rows": done[-1], "rows_ratio": rows_ratio,
        "day2_seconds_ratio": round(value, 2), "target": target, "met": value <= target,
        "jvm_cpu_ratio": round(large["jvm_cpu_seconds"] / small["jvm_cpu_seconds"], 2) if small.get("jvm_cpu_seconds") else None,
        "jvm_peak_rss_ratio": round(large["jvm_peak_rss_mib"] / small["jvm_peak_rss_mib"], 2) if small["jvm_peak_rss_mib"] else None,
        **{f"{key}_ratio": r(key) for key in ("shuffle_write_bytes", "shuffle_read_bytes", "driver_max_task_result_bytes",
                                               "driver_max_result_stage_bytes", "broadcast_max_bytes", "peak_jvm_heap_bytes")},
    }


def print_table(results: dict) -> None:
    head = (f"{'rows/day':>12} {'day':>3} {'wall s':>8} {'other':>5} {'JVM RSS GiB':>11} {'heap GiB':>8} {'shuf W GiB':>10} "
            f"{'shuf R GiB':>10} {'spill GiB':>9} {'max task res KiB':>16} {'max action res KiB':>18} {'max bcast MiB':>13} {'current MiB':>11} {'history MiB':>11}")
    print("\n" + "=" * len(head))
    print(f"SCALE (issue 13)  rows={results['rows']}  at {results['git_commit']}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s")
    print(head)
    for rows, size in sorted(results["sizes"].items(), key=lambda kv: int(kv[0])):
        for day in ("day1", "day2"):
            run = size.get(day)
            if not run:
                continue
            e = run.get("eventlog", {})
            part = size.get("day2_partition_bytes", {}) if day == "day2" else {}
            kib = lambda n: "" if n is None else f"{n / 1024:,.1f}"  # noqa: E731
            print(f"{int(rows):>12,} {day[-1]:>3} {run['seconds']:>8.1f} {run['other_processes_avg_cores']:>5} "
                  f"{run['jvm_peak_rss_mib'] / 1024:>11.2f} {ev.gib(e.get('peak_jvm_heap_bytes')) or 0:>8.2f} "
                  f"{ev.gib(e.get('shuffle_write_bytes')) or 0:>10.3f} {ev.gib(e.get('shuffle_read_bytes')) or 0:>10.3f} "
                  f"{ev.gib(e.get('disk_bytes_spilled')) or 0:>9.3f} {kib(e.get('driver_max_task_result_bytes')):>16} "
                  f"{kib(e.get('driver_max_result_stage_bytes')):>18} {ev.mib(e.get('broadcast_max_bytes')) or 0:>13.1f} "
                  f"{ev.mib(part.get('current_table')) or '':>11} {ev.mib(part.get('history_partition')) or '':>11}")
    ratio = results.get("ratio")
    if ratio:
        print(f"day 2: {ratio['large_rows']:,} / {ratio['small_rows']:,} rows = {ratio['day2_seconds_ratio']} x the time "
              f"(target <= {ratio['target']}: {'MET' if ratio['met'] else 'NOT MET'}); JVM CPU x{ratio['jvm_cpu_ratio']}, "
              f"JVM peak RSS x{ratio['jvm_peak_rss_ratio']}, shuffle write x{ratio['shuffle_write_bytes_ratio']}, "
              f"read x{ratio['shuffle_read_bytes_ratio']}")
        print(f"driver side, {ratio['large_rows']:,} against {ratio['small_rows']:,}: max task result x{ratio['driver_max_task_result_bytes_ratio']}, "
              f"max action result x{ratio['driver_max_result_stage_bytes_ratio']}, max broadcast x{ratio['broadcast_max_bytes_ratio']}, "
              f"heap peak x{ratio['peak_jvm_heap_bytes_ratio']} (x1 = does not grow with rows; None: "
              f"zero in both runs, e.g. no broadcast)")
    for rows, error in results["errors"].items():
        print(f"{rows} rows: {'WRONG COUNTS' if error['kind'] == 'outputs' else 'FAILED'}: {error['message'].strip().splitlines()[0][:160]}")
    if results.get("interrupted"):
        print("INTERRUPTED")
    print("wall s: one fresh `dagster asset materialize` process (JVM start included); other: cores other processes kept busy;")
    print("JVM RSS: VmHWM of the one local-mode JVM (driver + executors); heap: peak JVM heap in use (Spark's executor metrics);")
    print("shuf W/R: shuffle bytes written / read (remote + local), summed over tasks; res: bytes tasks returned to the driver")
    print("=" * len(head), flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000000,10000000", help="comma-separated rows per day (default 1000000,10000000)")
    parser.add_argument("--seed", type=int, default=7, help="cdc-generate --seed (default 7, as bench_targets)")
    parser.add_argument("--workdir", help="default: a fresh temp dir, deleted at the end unless --keep")
    parser.add_argument("--keep", action="store_true", help="keep data, warehouses, event logs and run logs")
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"), help="'' to skip the JSON copy")
    args = parser.parse_args(argv)
    try:
        args.rows_list = sorted({int(r.replace("_", "")) for r in args.rows.split(",") if r.strip()})
    except ValueError:
        parser.error(f"--rows: not a comma-separated list of integers: {args.rows!r}")
    if not args.rows_list or min(args.rows_list) < 10:
        parser.error("--rows needs values >= 10")
    return args


def prepare_workdir(requested: str | None, marker: str, prefix: str) -> tuple[Path, bool]:
    """The workdir and whether it is a fresh temp dir. A given folder must be empty or carry ``marker``
    (made by the same script before), and is then emptied but for the marker."""
    if requested is None:
        workdir = Path(tempfile.mkdtemp(prefix=prefix))
        (workdir / marker).touch()
        return workdir, True
    workdir = Path(requested).resolve()
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / marker).exists():
            sys.exit(f"--workdir {workdir} is not empty and was not made by this script; pick another folder")
        for entry in workdir.iterdir():
            if entry.name != marker:
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / marker).touch()
    return workdir, False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum, frame):
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    workdir, is_temp = prepare_workdir(args.workdir, MARKER, "cdc_scale_")
    results: dict = {
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "rows": args.rows_list,
        "seed": args.seed,
        "workdir": str(workdir),
        "settings": "cdc-generate ROWS ROWS 5 10 0.2 0.4 0.4 --seed SEED; cold `dagster asset materialize` day 1 then day 2",
        "event_log_conf": ev.EVENT_LOG_CONF,
        "spark_env": {k: os.environ[k] for k in ("CDC_SPARK_CONF", "CDC_SPARK_MASTER") if k in os.environ},
        "machine": {"cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / GIB, 1),
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "sizes": {},
        "errors": {},
    }
    log(f"workdir {workdir}; rows per day {', '.join(f'{r:,}' for r in args.rows_list)}; load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    interrupted = False
    try:
        for rows in args.rows_list:
            log(f"--- {rows:,} rows ---")
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
                if not args.keep:  # the next size needs the disk; keep the logs the errors name
                    shutil.rmtree(workdir / f"r{rows}", ignore_errors=True)
    except (KeyboardInterrupt, Interrupted):
        interrupted = results["interrupted"] = True
        log("interrupted: the run in progress was stopped with its process group")
    finally:
        results["total_seconds"] = round(time.perf_counter() - started, 1)
        results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        results["ratio"] = ratios(results)
        print_table(results)
        text = json.dumps(results, indent=2, default=str) + "\n"
        if not (is_temp and not args.keep):
            (workdir / "results.json").write_text(text)
        if args.results_dir:
            folder = Path(args.results_dir)
            folder.mkdir(parents=True, exist_ok=True)
            label = "_".join(str(r) for r in args.rows_list)
            path = folder / f"bench_scale_{label}_{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
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
