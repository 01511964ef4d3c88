"""scale: day 2 at 1M and at 10M rows per day (issue 13), each size in the same invocation (`make benchmark-scale`).

For each --rows value (ascending), with its own data, DAGSTER_HOME and warehouse: the data of the targets'
(b) (`cdc-generate ROWS ROWS 5 10 0.2 0.4 0.4 ... --seed 7`), then day 1 and day 2 as cold CLI runs with
Spark's event log on (benchmarks/eventlog.py). Per run: wall seconds, JVM peak RSS, shuffle, spill, heap
peak, the driver-side figures, the steps' seconds and the bytes of each asset's day-2 partition; day-2
counts checked against the generator's. Then day 2 (largest) / day 2 (smallest) against the rows ratio x 1.1
(10M day 2 <= 11 x 1M day 2), and the same ratio of JVM CPU, RSS, shuffle and the driver-side figures
(x1 = does not grow with rows). A size's data goes before the next size starts (unless --keep): 10M rows
need about 35-40 GB. About 35 minutes at the defaults on the idle 2-core machine. Small check:
    python -m benchmarks scale --rows 20000,100000
"""

from __future__ import annotations


from benchmarks.data import DAY1, DAY2, check_counts, dated, expected_day2, folder_bytes, generate, partition_bytes, write_config
from benchmarks.harness import GIB, log, mib, print_table, run_env

TABLE = "synthetic"
SLACK = 1.1  # 10x rows may cost at most 11x the time
DISK_PER_ROW = 4000  # bytes: 3.6 KB measured at 5k rows (two CSV days, two dates of outputs) plus Spark's scratch


def add_arguments(parser) -> None:
    parser.add_argument("--rows", default="1000000,10000000", help="comma-separated rows per day (default 1000000,10000000)")
    parser.add_argument("--seed", type=int, default=7, help="cdc-generate --seed (default 7, as the targets')")


def check_arguments(parser, args) -> None:
    try:
        args.rows = sorted({int(r.replace("_", "")) for r in args.rows.split(",") if r.strip()})
    except ValueError:
        parser.error(f"--rows: not a comma-separated list of integers: {args.rows!r}")
    if not args.rows or min(args.rows) < 10:
        parser.error("--rows needs values >= 10")


def label(args) -> str:
    return "_".join(map(str, args.rows))


def measure(bench) -> None:
    bench.each_size(bench.args.rows, measure_size, DISK_PER_ROW)
    bench.results["ratio"] = ratios(bench.results["measurements"])


def measure_size(result: dict, bench, rows: int) -> None:
    base = bench.workdir / f"r{rows}"
    data = base / "data" / TABLE
    result["generation"] = generated = generate(rows, rows, (0.2, 0.4, 0.4), data / DAY1, data / DAY2, bench.args.seed)
    log(f"{rows:,} rows: generated in {generated['seconds']}s: {generated}")
    env = run_env(base, write_config(base / "configs", TABLE, data))
    result.update(bench.cli_days(f"r{rows}", env, TABLE, f"{rows:,} rows, cold CLI:", (DAY1, DAY2), eventlog=True))
    log(f"{rows:,} rows: day-2 steps: " + ", ".join(f"{k} {v}s" for k, v in result["day2"]["steps"].items()))
    result["day2_partition_bytes"] = sizes = partition_bytes(base / "warehouse", TABLE, DAY2)
    result["data_bytes"] = {day: folder_bytes(data / day) for day in (DAY1, DAY2)}
    log(f"{rows:,} rows: day-2 partitions (MiB): " + ", ".join(f"{k} {mib(v)}" for k, v in sizes.items()))
    tables = dated(base / "warehouse" / TABLE, ("current_table", "history_partition"))
    result["day2_counts"] = check_counts(f"{rows:,} rows, day 2", tables, expected_day2(generated))


def ratios(measured: dict) -> dict | None:
    done = sorted(int(r) for r, m in measured.items() if "day2" in m and "error" not in m["day2"]["eventlog"])
    if len(done) < 2:
        return None
    small, large = measured[str(done[0])]["day2"], measured[str(done[-1])]["day2"]

    def r(a, b):
        return round(b / a, 2) if a and b is not None else None

    value = large["seconds"] / small["seconds"]
    return {"small_rows": done[0], "large_rows": done[-1], "rows_ratio": done[-1] / done[0], "day2_seconds_ratio": round(value, 2),
            "target": round(done[-1] / done[0] * SLACK, 2), "met": value <= done[-1] / done[0] * SLACK,
            "jvm_cpu_ratio": r(small["jvm_cpu_seconds"], large["jvm_cpu_seconds"]),
            "jvm_peak_rss_ratio": r(small["jvm_peak_rss_mib"], large["jvm_peak_rss_mib"]),
            **{f"{k}_ratio": r(small["eventlog"][k], large["eventlog"][k]) for k in (
                "shuffle_write_bytes", "shuffle_read_bytes", "driver_max_task_result_bytes", "driver_max_result_stage_bytes",
                "broadcast_max_bytes", "peak_jvm_heap_bytes")}}


def summary(results: dict) -> None:
    rows = []
    for size, m in sorted(results["measurements"].items(), key=lambda kv: int(kv[0])):
        for key in ("day1", "day2"):
            if key not in m:
                continue
            run, e = m[key], m[key]["eventlog"]
            part = m.get("day2_partition_bytes", {}) if key == "day2" else {}
            rows.append([f"{int(size):,}", key[-1], round(run["seconds"], 1), run["other_processes_avg_cores"], round(run["jvm_peak_rss_mib"] / 1024, 2)]
                        + ([round(e["peak_jvm_heap_bytes"] / GIB, 2), round(e["shuffle_write_bytes"] / GIB, 3), round(e["shuffle_read_bytes"] / GIB, 3),
                            round(e["disk_bytes_spilled"] / GIB, 3), round(e["driver_max_task_result_bytes"] / 1024, 1),
                            round(e["driver_max_result_stage_bytes"] / 1024, 1), mib(e["broadcast_max_bytes"])] if "error" not in e else [""] * 7)
                        + [mib(part.get("current_table")), mib(part.get("history_partition"))])
    notes = []
    q = results.get("ratio")
    if q:
        notes += [f"day 2: {q['large_rows']:,} / {q['small_rows']:,} rows = {q['day2_seconds_ratio']} x the time (target <= {q['target']}: "
                  f"{'MET' if q['met'] else 'NOT MET'}); JVM CPU x{q['jvm_cpu_ratio']}, JVM peak RSS x{q['jvm_peak_rss_ratio']}, "
                  f"shuffle write x{q['shuffle_write_bytes_ratio']}, read x{q['shuffle_read_bytes_ratio']}",
                  f"driver side: max task result x{q['driver_max_task_result_bytes_ratio']}, max action result "
                  f"x{q['driver_max_result_stage_bytes_ratio']}, max broadcast x{q['broadcast_max_bytes_ratio']}, heap peak "
                  f"x{q['peak_jvm_heap_bytes_ratio']} (x1 = does not grow with rows; None: zero in both, e.g. no broadcast)"]
    notes += ["wall s: one fresh `dagster asset materialize` (JVM start included); other: cores other processes kept busy; JVM RSS:",
              "VmHWM of the one local-mode JVM; heap: peak JVM heap in use; shuf W/R: shuffle bytes written / read; res: bytes tasks",
              "returned to the driver, per task and per action; current / history: MiB of the day-2 partition"]
    print_table(f"SCALE (issue 13)  rows={results['settings']['rows']}  at {results['git_commit']}  {results['started_utc']}  "
                f"total {results.get('total_seconds', 0):.0f} s",
                ["rows/day", "day", "wall s", "other", "JVM RSS GiB", "heap GiB", "shuf W GiB", "shuf R GiB", "spill GiB",
                 "max task res KiB", "max action res KiB", "max bcast MiB", "current MiB", "history MiB"], rows, notes)
