"""schema: a date whose config adds a column against a normal date (issue 25; part of `make benchmark`).

A full-load table of --rows rows (`cdc-generate ROWS ROWS 5 10 0.2 0.4 0.4`: day 2 keeps 20%, updates 40%,
deletes 20% and inserts 20% of the rows). Day 1 is loaded once, and the warehouse copied; day 2 is then run
twice by cold CLI runs: `normal` with the config unchanged, and `added column` with a config that adds a
string non-key `region` (the day-2 extract carries it, the same value on every row). The added column
re-versions no key: both runs must classify day 2 alike (I/U/D/N counts). The figure is the schema-change
date's wall against the normal date's: the extra work is one pass over the previous state (its columns
projected and its hashes recomputed, joined with the day's new-column values). Small check:
    python -m benchmarks schema --rows 100000
"""

from __future__ import annotations

import shutil

import duckdb

from benchmarks.data import DAY1, DAY2, dated, expected_day2, check_counts, generate, write_config
from benchmarks.harness import describe, log, print_table, run_env

TABLE = "evolving"
ADDED = "  - {name: region, type: string}\n"
RUNS = {"normal": "", "added column": ADDED}


def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=7, help="cdc-generate --seed (default 7)")


def check_arguments(parser, args) -> None:
    if args.rows < 10:
        parser.error("--rows must be at least 10")


def label(args) -> str:
    return f"{args.rows}"


def measure(bench) -> None:
    bench.measure(str(bench.args.rows), measure_size, bench, bench.args.rows)


def measure_size(result: dict, bench, rows: int) -> None:
    base = bench.workdir / f"r{rows}"
    data, data_added = base / "data", base / "data_added"
    result["generated"] = generated = generate(rows, rows, (0.2, 0.4, 0.4), data / DAY1, data / DAY2, bench.args.seed)
    # The same day 2 with the new column (and day 1 as it was, for the copied warehouse's config).
    shutil.copytree(data / DAY1, data_added / DAY1)
    (data_added / DAY2).mkdir(parents=True)
    duckdb.sql(f"""COPY (SELECT *, 'emea' AS region FROM read_csv('{data / DAY2}/*.csv', header=true, all_varchar=true))
                   TO '{data_added / DAY2 / 'part-00000.csv'}' (HEADER)""")
    env = run_env(base / "day1", write_config(base / "day1" / "configs", TABLE, data, "full"))
    result["day1"] = bench.cli(f"r{rows}_day1", env, TABLE, "--partition", DAY1, eventlog=True)
    log(f"{rows:,} rows: day 1, cold CLI: {describe(result['day1'])}")
    expected = expected_day2(generated)
    for run, extra in RUNS.items():
        folder = base / run.replace(" ", "_")
        shutil.copytree(base / "day1", folder, symlinks=True)  # the date pointers are relative symlinks
        configs = write_config(folder / "configs", TABLE, data_added if extra else data, "full", extra)
        figures = result.setdefault("day2", {})[run] = bench.cli(f"r{rows}_day2_{run}", run_env(folder, configs, fresh=False), TABLE,
                                                                 "--partition", DAY2, eventlog=True)  # fmt: skip
        log(f"{rows:,} rows, {run}: day 2, cold CLI: {describe(figures)}; steps: "
            + ", ".join(f"{k} {v}s" for k, v in figures["steps"].items()))
        # An added column re-versions no key: the counts are those of the normal date.
        figures["counts"] = check_counts(f"{rows:,} rows, {run}", dated(folder / "warehouse" / TABLE, expected), expected)
        if not bench.args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def summary(results: dict) -> None:
    rows, notes = [], []
    for size, m in results["measurements"].items():
        day2 = m.get("day2", {})
        for run, figures in day2.items():
            ratio = figures["seconds"] / day2["normal"]["seconds"] if "normal" in day2 else None
            rows.append([f"{int(size):,}", f"day 2, {run}", round(figures["seconds"], 1), figures["other_processes_avg_cores"],
                         round(figures["jvm_peak_rss_mib"] / 1024, 2), None if ratio is None else round(ratio, 2),
                         figures.get("steps", {}).get(f"{TABLE}__cdc")])
        if "normal" in day2 and "added column" in day2:
            ratio = day2["added column"]["seconds"] / day2["normal"]["seconds"]
            notes.append(f"a schema-change date costs {ratio:.2f}x a normal date at {int(size):,} rows (same counts: no key re-versioned)")
    notes.append("x normal: the run's wall / the normal date's; cdc step s: the CDC step's seconds in the run")
    print_table(f"A SCHEMA CHANGE (issue 25)  at {results['git_commit']}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s",
                ["table rows", "run", "wall s", "other", "JVM RSS GiB", "x normal", "cdc step s"], rows, notes)
