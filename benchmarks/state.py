"""state: a big table and a small change, day 2 in each way of storing the state (issues 13, 23; `make benchmark-state`).

A table with `load_type: delta` (a key missing from the day's file is X, kept with its payload; a delta has
no deletes). Day 1: a full load of --rows rows (`cdc-generate ROWS 0 5 10 1.0 0.0 0.0`'s day-1 file), a
cold CLI run. Day 2: a delta of --changed rows, --update-share of them day-1 keys with all ten non-key
values changed, the rest new keys (built with DuckDB). Day 1 runs once per table shape (snapshot: a
partition per date; incremental: one table with a tag per date), and its warehouse is copied once per
--modes entry of that shape for day 2, loaded in each by a cold CLI run with Spark's event log on:
`snapshot` (current_table stores the whole state per date), `incremental` (a date applies its changes
with one MERGE), `compaction` (incremental with `compact_after_dates: 1`: day 2 replaces the whole state). Per mode: wall seconds against day 1, JVM peak RSS,
shuffle, spill, the bytes each asset wrote for the date; checked: history_partition and
hash_join_classification I/U, deletes empty (X is counted, not stored), current_table I/U/X (snapshot,
compaction, and incremental as of day 2). Targets (issues 23, 34), for the biggest table: incremental
day 2 / its own day 1 <= 0.05, incremental day 2 writes <= 64 MiB, compaction / snapshot day 2 <= 1.0.
--compare-rows 1000000 applies the same delta to a 1M-row table as well. About 30-40 minutes and 40 GB of
disk at the defaults. Small check:
    python -m benchmarks state --rows 200000 --changed 1000
"""

from __future__ import annotations

import shutil

import duckdb

from benchmarks.data import DAY1, DAY2, KEYS, NON_KEYS, check_counts, dated, folder_bytes, generate, partition_bytes, write_config
from benchmarks.harness import describe, log, mib, print_table, run_env, verdict

TABLE = "big_delta"
MODES = {"snapshot": "{current: snapshot}", "incremental": "{current: incremental}",
         "compaction": "{current: incremental, compact_after_dates: 1}"}
TARGETS = {"incremental_day2/day1": 0.05, "incremental_written_mib": 64, "compaction/snapshot": 1.0}
DISK_PER_ROW = 3000  # bytes: 2.4 KB measured at 200k rows (day-1 CSV, two dates of outputs) plus Spark's scratch


def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the table (day 1), default 10,000,000")
    parser.add_argument("--changed", type=int, default=1000, help="rows in the day-2 delta, default 1,000")
    parser.add_argument("--update-share", type=float, default=0.5, help="share of the delta that updates day-1 keys (default 0.5)")
    parser.add_argument("--compare-rows", default="", help="comma-separated other table sizes to apply the same delta to")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated storage modes for day 2, of {', '.join(MODES)}")
    parser.add_argument("--seed", type=int, default=7, help="cdc-generate --seed (default 7)")


def check_arguments(parser, args) -> None:
    try:
        others = [int(r.replace("_", "")) for r in args.compare_rows.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--compare-rows: not a comma-separated list of integers: {args.compare_rows!r}")
    args.sizes = sorted({args.rows, *others}, reverse=True)  # the big table first
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not args.modes or set(args.modes) - set(MODES):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    if min(args.sizes) < 10 or args.changed < 1 or not 0 <= args.update_share <= 1:
        parser.error("need table rows >= 10, --changed >= 1 and 0 <= --update-share <= 1")
    if round(args.changed * args.update_share) > min(args.sizes):
        parser.error("the delta updates more rows than the smallest table holds")


def label(args) -> str:
    return "_".join(map(str, args.sizes)) + f"_{args.changed}changed"


def measure(bench) -> None:
    bench.each_size(bench.args.sizes, measure_size, DISK_PER_ROW)


def make_data(args, rows: int, data) -> dict:
    """Day 1: ``rows`` rows from cdc-generate; day 2: a delta of updates of day-1 keys, then new keys."""
    generate(rows, 0, (1.0, 0.0, 0.0), data / DAY1, data / "_scratch", args.seed)
    shutil.rmtree(data / "_scratch", ignore_errors=True)
    updates = min(round(args.changed * args.update_share), rows)
    inserts = args.changed - updates
    (data / DAY2).mkdir(parents=True)
    shifted = ", ".join(f"round((cast({c} AS DOUBLE) + 500.0) % 1000.0, 6) AS {c}" for c in NON_KEYS)
    new_keys = ", ".join(f"'new-' || i || '-{k}' AS {k}" for k in KEYS)
    new_values = ", ".join(f"round(((i * 7.31 + {j}) * 13.7) % 1000.0, 6) AS {c}" for j, c in enumerate(NON_KEYS, start=1))
    duckdb.sql(f"""COPY ((SELECT {', '.join(KEYS)}, {shifted}
                   FROM (SELECT * FROM read_csv('{next((data / DAY1).glob('*.csv'))}', header=true, all_varchar=true) LIMIT {updates}))
                  UNION ALL (SELECT {new_keys}, {new_values} FROM range({inserts}) AS t(i))
                ) TO '{data / DAY2 / 'part-00000.csv'}' (HEADER)""")
    return {"rows": rows, "updates": updates, "inserts": inserts,
            "day1_bytes": folder_bytes(data / DAY1), "day2_bytes": folder_bytes(data / DAY2)}


def measure_size(result: dict, bench, rows: int) -> None:
    base, args = bench.workdir / f"r{rows}", bench.args
    result["data"] = data = make_data(args, rows, base / "data")
    log(f"{rows:,} rows: day 1 {mib(data['day1_bytes'])} MiB of CSV; day-2 delta of {data['updates']:,} updates + "
        f"{data['inserts']:,} inserts, {mib(data['day2_bytes'])} MiB")
    # Day 1 (no earlier state) stores the whole state in every mode, in the mode's own table shape (one
    # partition per date, or one table with a tag per date): a day 1 per shape, copied for each mode's day 2.
    for family in sorted({_family(mode) for mode in args.modes}):
        folder = base / f"day1_{family}"
        env = run_env(folder, write_config(folder / "configs", TABLE, base / "data", "delta", f"storage: {MODES[family]}\n"))
        result[f"day1_{family}"] = bench.cli(f"r{rows}_day1_{family}", env, TABLE, "--partition", DAY1, eventlog=True)
        log(f"{rows:,} rows: day 1 (full load of the table, {family}), cold CLI: {describe(result[f'day1_{family}'])}")
    result["day1"] = result.get("day1_snapshot") or result["day1_incremental"]
    for mode in args.modes:
        folder = base / mode
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(base / f"day1_{_family(mode)}", folder, symlinks=True)
        configs = write_config(folder / "configs", TABLE, base / "data", "delta", f"storage: {MODES[mode]}\n")
        env = run_env(folder, configs, fresh=False)
        m = result.setdefault("day2_by_mode", {})[mode] = {}
        m["run"] = bench.cli(f"r{rows}_day2_{mode}", env, TABLE, "--partition", DAY2, eventlog=True)
        log(f"{rows:,} rows, {mode}: day 2 (delta of {args.changed:,} rows), cold CLI: {describe(m['run'])}")
        log(f"{rows:,} rows, {mode}: day-2 steps: " + ", ".join(f"{k} {v}s" for k, v in m["run"]["steps"].items()))
        m["partition_bytes"] = sizes = partition_bytes(folder / "warehouse", TABLE, DAY2)
        m["written_bytes"] = sum(sizes.values())
        log(f"{rows:,} rows, {mode}: day-2 partitions (MiB): " + ", ".join(f"{k} {mib(v)}" for k, v in sizes.items())
            + f"; all {mib(m['written_bytes'])} MiB for a {mib(data['day2_bytes'])} MiB delta")
        touched = {"I": data["inserts"], "U": data["updates"]}
        # current_table as of day 2, in every mode: the state with day 2's labels.
        expected = {"history_partition": touched, "hash_join_classification": touched, "deletes": {},
                    "current_table": {**touched, "X": rows - data["updates"]}}
        expected = {name: {op: n for op, n in ops.items() if n} for name, ops in expected.items()}
        m["counts"] = check_counts(f"{rows:,} rows, {mode}", dated(folder / "warehouse" / TABLE, expected), expected)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def _family(mode: str) -> str:
    """The table shape a mode stores current_table in: ``snapshot`` (a partition per date) or ``incremental``."""
    return "snapshot" if mode == "snapshot" else "incremental"


def summary(results: dict) -> None:
    rows, notes = [], []
    sizes = sorted(((int(r), m) for r, m in results["measurements"].items() if "day1" in m), key=lambda kv: -kv[0])
    for size, m in sizes:
        day1 = m["day1"]["seconds"]
        for family in ("snapshot", "incremental"):
            one = m.get(f"day1_{family}")
            if one:
                rows.append([f"{size:,}", f"day 1 (full) {family}", round(one["seconds"], 1), one["other_processes_avg_cores"],
                             round(one["jvm_peak_rss_mib"] / 1024, 2)])
        for mode, d in m.get("day2_by_mode", {}).items():
            if "written_bytes" not in d:
                continue
            run, e, part = d["run"], d["run"]["eventlog"], d["partition_bytes"]
            rows.append([f"{size:,}", f"day 2 {mode}", round(run["seconds"], 1), run["other_processes_avg_cores"],
                         round(run["jvm_peak_rss_mib"] / 1024, 2), round(run["seconds"] / day1, 3), mib(e.get("shuffle_write_bytes")),
                         mib(e.get("disk_bytes_spilled")), mib(part.get("current_table")),
                         mib(part.get("history_partition")), mib(part.get("deletes")), mib(d["written_bytes"])])
    if sizes:
        size, m = sizes[0]
        by_mode = {mode: d for mode, d in m.get("day2_by_mode", {}).items() if "written_bytes" in d}
        inc, snap, comp = (by_mode.get(k) for k in ("incremental", "snapshot", "compaction"))
        notes.append(f"TARGETS (issue 23) at {size:,} rows, delta of {results['settings']['changed']:,}:")
        if inc:
            # Against the same table shape's own full load.
            value, written = inc["run"]["seconds"] / m.get("day1_incremental", m["day1"])["seconds"], mib(inc["written_bytes"])
            notes.append(f"  incremental day 2 / day 1 = {value:.3f}  target <= {TARGETS['incremental_day2/day1']}: "
                         f"{verdict(value, TARGETS['incremental_day2/day1'])}")
            notes.append(f"  incremental day 2 wrote {written} MiB  target <= {TARGETS['incremental_written_mib']} MiB: "
                         f"{verdict(written, TARGETS['incremental_written_mib'])}")
        if snap:
            part = snap["partition_bytes"]
            copies = sum(part.get(k, 0) for k in ("current_table", "deletes", "hash_join_classification")) / max(part.get("current_table", 1), 1)
            notes.append(f"  snapshot day 2 wrote {mib(snap['written_bytes'])} MiB: current_table, deletes and the classification = "
                         f"{copies:.2f} x current_table (one table copy, X not written)")
        if comp and snap:
            value = comp["run"]["seconds"] / snap["run"]["seconds"]
            notes.append(f"  compaction day 2 / snapshot day 2 = {value:.2f}  target <= {TARGETS['compaction/snapshot']}: "
                         f"{verdict(value, TARGETS['compaction/snapshot'])}")
    notes += ["snapshot: current_table stores the whole state per date; incremental: a date applies its changes to one",
              "table with a MERGE (written: what its commit added); compaction: the date replaces the whole state. X is counted, not written.",
              "x day 1: day-2 wall / the first day 1 listed; MiB columns: the date's partition of each asset (incremental",
              "current_table: what the date's commit added)"]
    print_table(f"A BIG TABLE AND A SMALL CHANGE (issues 13, 23)  delta of {results['settings']['changed']:,} rows  at "
                f"{results['git_commit']}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s",
                ["table rows", "run", "wall s", "other", "JVM RSS GiB", "x day 1", "shuf W MiB", "spill MiB", "current MiB",
                 "history MiB", "deletes MiB", "all MiB"], rows, notes)
