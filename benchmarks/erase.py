"""erase: `cdc-erase` of --keys keys from a full-load table of --dates dates x --rows rows (issue 26).

Data (duckdb, a few seconds): a full-load table of the synthetic columns (5 string keys, 10 double non-keys)
over --dates consecutive business dates from 2024-01-01, each date a full snapshot of --rows rows. From one
date to the next, 0.5% of the rows are deleted (the lowest key ids) and as many inserted (new ids), and
about 2% of the rows get new non-key values. The --keys keys erased are spread over the ids present on every
date: the worst case, since they are then in every date of hashed_incoming, hash_join_classification and
current_table, so every date of those is rewritten. Measurements, each a cold process:

  yardstick  ../shared/bench/plain_cdc.py on the last two dates (day 1, then day 2): the unit of the ratios
  load       every date in ONE `dagster asset materialize --partition-range` run (not the target; reported)
  erase      `cdc-erase TABLE --keys keys.csv --reason bench` with the load's DAGSTER_HOME (so the rewritten
             partitions' materializations and their checks are reported too): wall, partitions and bytes
             rewritten against the table's, the time to its summary line and to its Dagster line, and from
             its Spark event log the seconds of each asset's scan and rewrite
  verify     `cdc-erase TABLE --verify --keys keys.csv`: must exit 0

Checked: after the load, each date's current_table holds --rows rows and the last date's history I/U/D are
the data's; after the erase, each asset lost exactly the rows the ledger (`_erasures/*/request.json`)
says, hashed_incoming and current_table --keys rows per date, the checks evaluated again all pass and
--verify finds no file holding the keys. At the defaults about 7 minutes on the idle 2-core machine (the
load about 4.5 of them) and about 2 GB of disk in the workdir. Small check (about 2 minutes idle):
    python -m benchmarks erase --rows 10000 --dates 5
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import duckdb

from benchmarks import eventlog as ev
from benchmarks.data import KEY_COLUMNS, business_dates, check_counts, dated, dated_extracts, write_config
from benchmarks.harness import (YARDSTICK, OutputsWrong, StepFailed, cold_env, describe, log, print_table, run_env, run_row, run_process,
                                step_seconds, tool)
from resources.storage import WarehouseStorage

TABLE = "erase_bench"
UPDATED_ONE_IN = 50  # about 2% of a date's rows get new non-key values
CHURN = 0.005  # deleted, and as many inserted, per date
ASSETS = ("hashed_incoming", "rejects", "hash_join_classification", "inserts", "updates", "deletes", "current_table", "history_partition")
ERASED_LINE = re.compile(r"cdc-erase: .*?(\d+) row\(s\) removed from (\d+) partition\(s\).*?; (\d+) of (\d+) stored bytes rewritten")
TOLD_LINE = re.compile(r"cdc-erase: told the Dagster instance in .*?: (\d+) materialization\(s\), (\d+) check evaluation\(s\)(.*)")


def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=int, default=100_000, help="rows of each date (default 100,000)")
    parser.add_argument("--dates", type=int, default=30, help="business dates, each a full load (default 30)")
    parser.add_argument("--keys", type=int, default=100, help="keys erased, each present on every date (default 100)")
    parser.add_argument("--seed", type=int, default=7, help="seed of which rows change on each date (default 7)")
    parser.add_argument("--current", choices=("snapshot", "incremental"), default="snapshot",
                        help="storage of current_table: a partition per date (default) or one table with a tag per date")
    parser.add_argument("--yardstick", type=Path, default=YARDSTICK, help=f"plain_cdc.py (default {YARDSTICK})")


def churn(rows: int) -> int:
    return max(1, round(rows * CHURN))


def check_arguments(parser, args) -> None:
    if args.dates < 2 or args.keys < 1:
        parser.error("need --dates >= 2 and --keys >= 1")
    on_every_date = args.rows - (args.dates - 1) * churn(args.rows)
    if args.rows < 100 or on_every_date < args.keys:
        parser.error(f"--rows {args.rows} over --dates {args.dates} keeps {max(on_every_date, 0)} keys on every date "
                     f"(0.5% churn a date, at least 100 rows): fewer than --keys {args.keys}")
    args.yardstick = args.yardstick.resolve()


def label(args) -> str:
    return f"{args.dates}x{args.rows}rows_{args.keys}keys_{args.current}"


def measure(bench) -> None:
    args = bench.args
    state = {"dates": business_dates(args.dates)}
    bench.results["yardstick"] = {"path": str(args.yardstick), "present": args.yardstick.exists()}
    bench.results["data"] = state["data"] = make_data(bench.workdir / "data", args, state["dates"])
    log(f"data: {args.dates} dates x {args.rows:,} rows, {state['data']['erased_keys']} keys to erase, in {state['data']['seconds']}s")
    if bench.results["yardstick"]["present"]:
        dates, data = tuple(state["dates"][-2:]), Path(state["data"]["root"])  # the last two dates: day 2 is the unit of the ratios
        bench.measure("yardstick", lambda result: result.update(bench.yardstick_days("yardstick", data, cold_env(), "yardstick", dates)))
    else:
        log(f"the yardstick is absent ({args.yardstick} not found): absolute figures only")
    bench.measure("load", measure_load, bench, state)
    bench.measure("expiry", measure_expiry, bench, state)
    bench.measure("erase", measure_erase, bench, state)
    bench.measure("verify", measure_verify, bench, state)


# data ---------------------------------------------------------------------------------------------------------
def make_data(root: Path, args, dates: list[str]) -> dict:
    """Each date's CSV under ``root/<date>/`` (:func:`dated_extracts`), the keys file, and the counts the checks expect."""
    started, k = time.perf_counter(), churn(args.rows)
    db = duckdb.connect()
    dated_extracts(db, root, args.rows, dates, k, UPDATED_ONE_IN, args.seed)
    # The erased ids: spread evenly over those present on every date.
    low = (args.dates - 1) * k
    erased = [low + (n * (args.rows - low)) // args.keys for n in range(args.keys)]
    db.execute(f"CREATE TABLE erased AS SELECT unnest({erased}) AS i")
    keys_file = root / "keys.csv"
    db.execute(f"COPY (SELECT {', '.join(KEY_COLUMNS)} FROM erased) TO '{keys_file}' (HEADER)")
    # A row of an erased key is in history (and updates) on the dates it was picked: an update.
    erased_updates = db.execute("SELECT count(*) FROM present JOIN erased USING (i) WHERE picked").fetchone()[0]
    last = args.dates - 1
    updated_last = db.execute(f"SELECT count(*) FROM present WHERE d = {last} AND picked AND i < {args.rows} + {(last - 1) * k}").fetchone()[0]
    db.close()
    return {"seconds": round(time.perf_counter() - started, 2), "rows_per_date": args.rows, "dates": args.dates, "churn_per_date": k,
            "erased_keys": len(erased), "erased_key_updates": erased_updates, "keys_file": str(keys_file), "root": str(root),
            "last_date_history": {"I": k, "U": updated_last, "D": k}}


# measurements -------------------------------------------------------------------------------------------------
def measure_load(result: dict, bench, state: dict) -> None:
    dates, data = state["dates"], state["data"]
    storage = f"storage: {{current: {bench.args.current}}}\n"
    configs = write_config(bench.workdir / "configs", TABLE, Path(data["root"]), "full", extra=storage, start=dates[0])
    state["env"] = env = run_env(bench.workdir / "run", configs)
    result.update(bench.cli("load", env, TABLE, "--partition-range", f"{dates[0]}...{dates[-1]}"))
    result["steps"] = step_seconds(env["DAGSTER_HOME"])
    log(f"load of {len(dates)} dates in one run, cold CLI: {describe(result)}; steps: " + ", ".join(f"{k} {v}s" for k, v in result["steps"].items()))
    stored = Path(env["CDC_WAREHOUSE"]) / TABLE
    per_date = stored_rows(stored, "current_table", dates)
    if set(per_date.values()) != {data["rows_per_date"]}:
        raise OutputsWrong(f"load: current_table rows per date {per_date}, expected {data['rows_per_date']} on every date")
    result["last_date_history"] = check_counts("load", dated(stored, ("history_partition",), dates[-1]), {"history_partition": data["last_date_history"]})
    state["loaded"] = True


# A cold process that expires every snapshot of every asset but the current one and the tagged ones
# (retention.snapshot_days: 0), timed per asset: what the load's dates left for expiry to delete.
EXPIRE_ALL = """
import json, sys, time
from resources.session.spark_session import build_spark_session
from resources.storage import WarehouseStorage
build_spark_session(app_name="bench-expiry")  # the active session, which the storage's commits use
storage = WarehouseStorage(sys.argv[1])
figures = {}
for asset in storage.stored_assets(sys.argv[2]):
    started = time.perf_counter()
    expired = storage.expire_snapshots(sys.argv[2], asset, 0)
    figures[asset] = [expired, round(time.perf_counter() - started, 2)]
storage.release()
print("EXPIRED " + json.dumps(figures))
"""


def measure_expiry(result: dict, bench, state: dict) -> None:
    """Snapshot expiry after the load (``retention.snapshot_days: 0``), a cold process: snapshots expired and
    seconds per asset."""
    if not state.get("loaded"):
        raise StepFailed("no table to expire: the load failed")
    env = state["env"]
    command = [sys.executable, "-c", EXPIRE_ALL, env["CDC_WAREHOUSE"], TABLE]
    figures, lines = _run_timed("expiry", command, env, bench.logs)
    result.update(figures)
    printed = next((text for _, text in lines if text.startswith("EXPIRED ")), None)
    if figures["returncode"] != 0 or printed is None:
        raise StepFailed(f"expiry exited with {figures['returncode']}; log {figures['log']}")
    result["by_asset"] = json.loads(printed[len("EXPIRED "):])
    log(f"expiry of every snapshot but the current and tagged ones, cold process: {describe(figures)}; "
        + ", ".join(f"{asset} {n} in {s}s" for asset, (n, s) in result["by_asset"].items()))


def measure_erase(result: dict, bench, state: dict) -> None:
    if not state.get("loaded"):
        raise StepFailed("no table to erase from: the load failed")
    env, dates, data = state["env"], state["dates"], state["data"]
    stored = Path(env["CDC_WAREHOUSE"]) / TABLE
    before = {asset: stored_rows(stored, asset, dates) for asset in ASSETS}
    partitions = {asset: [d for d, n in rows.items() if n is not None] for asset, rows in before.items()}
    result["table_partitions"] = sum(map(len, partitions.values()))
    storage = WarehouseStorage(str(stored.parent))
    result["table_bytes"] = sum(sum(storage.bytes_stored(TABLE, asset, days).values()) for asset, days in partitions.items() if days)
    folder = bench.workdir / "eventlogs" / "erase"
    erase_env = {**env, "CDC_SPARK_CONF": ev.conf_env(folder, env)}
    command = [tool("cdc-erase"), TABLE, "--keys", data["keys_file"], "--reason", "bench"]
    figures, lines = _run_timed("erase", command, erase_env, bench.logs)
    result.update(figures)
    if figures["returncode"] != 0:
        raise StepFailed(f"cdc-erase exited with {figures['returncode']}; log {figures['log']}")
    erased = next((ERASED_LINE.search(text) for _, text in lines if ERASED_LINE.search(text)), None)
    told = next(((t, TOLD_LINE.search(text)) for t, text in lines if TOLD_LINE.search(text)), (None, None))
    if erased is None or told[1] is None:
        raise OutputsWrong(f"cdc-erase printed no summary line or no Dagster line; log {figures['log']}")
    rows, parts, rewritten, total = map(int, erased.groups())
    result["printed"] = {"rows_removed": rows, "partitions": parts, "bytes_rewritten": rewritten, "bytes_stored": total,
                         "materializations": int(told[1].group(1)), "check_evaluations": int(told[1].group(2)),
                         "checks": told[1].group(3).strip(", ")}
    result["phases"] = phases(figures, lines, folder)
    ledger, by_asset = read_ledger(stored / "_erasures")
    result["ledger"] = ledger
    after = {asset: stored_rows(stored, asset, dates) for asset in ASSETS}
    lost = {asset: sum(n or 0 for n in before[asset].values()) - sum(n or 0 for n in after[asset].values()) for asset in ASSETS}
    result["rows_removed_by_asset"] = {a: n for a, n in lost.items() if n}
    log(f"erase of {data['erased_keys']} keys, cold CLI: {describe(figures)}")
    log(f"erase: {rows:,} rows removed from {parts} of {result['table_partitions']} partitions; {rewritten / 2**20:.1f} of {total / 2**20:.1f} MiB "
        f"stored rewritten ({rewritten / total:.0%}); {result['printed']['materializations']} materializations, "
        f"{result['printed']['check_evaluations']} check evaluations ({result['printed']['checks']}); phases: "
        + ", ".join(f"{k} {v}s" for k, v in result["phases"]["seconds"].items()))
    tasks = result["phases"]["task_run_and_cpu_seconds_by_asset"]
    log("erase: Spark SQL seconds (tasks' run / CPU seconds): " + ", ".join(
        f"{name} {seconds} ({'/'.join(map(str, tasks[name]))})" for name, seconds in result["phases"]["spark_by_asset"].items()))
    wrong = []
    per_date = {asset: data["erased_keys"] * len(dates) for asset in ("hashed_incoming", "current_table")}
    if {a: lost[a] for a in per_date} != per_date:
        wrong.append(f"rows removed {lost}, expected {data['erased_keys']} a date from hashed_incoming and current_table")
    if (by_asset != result["rows_removed_by_asset"] or ledger["rows_removed"] != rows or ledger["status"] != "complete"
            or ledger["bytes_rewritten"] != rewritten or ledger["partitions"] != parts):
        wrong.append(f"the ledger says {by_asset} ({ledger}), the stored files lost {result['rows_removed_by_asset']}")
    if result["printed"]["checks"] != "all passed":
        wrong.append(f"checks evaluated again: {result['printed']['checks']}")
    if wrong:
        raise OutputsWrong("erase: " + "; ".join(wrong))
    state["erased"] = True


def measure_verify(result: dict, bench, state: dict) -> None:
    if not state.get("erased"):
        raise StepFailed("nothing to verify: the erase failed")
    command = [tool("cdc-erase"), TABLE, "--verify", "--keys", state["data"]["keys_file"]]
    figures, lines = _run_timed("verify", command, state["env"], bench.logs)
    result.update(figures, said=[text for _, text in lines if text.startswith("cdc-erase:")])
    log(f"verify, cold CLI: {describe(figures)}; exit {figures['returncode']}: {' '.join(result['said'])}")
    if figures["returncode"] != 0:
        raise OutputsWrong(f"cdc-erase --verify exited with {figures['returncode']} (0 expected): {result['said']}")


# helpers ------------------------------------------------------------------------------------------------------
def _run_timed(name: str, command: list, env: dict, logs: Path) -> tuple[dict, list[tuple[float, str]]]:
    """A fresh process whose non-zero exit is returned, and its lines of output with the seconds they appeared at."""
    figures = run_process(name, command, {**env, "PYTHONUNBUFFERED": "1"}, logs, check=False, timed=True)
    return figures, figures.pop("lines")


def read_ledger(erasures: Path) -> tuple[dict, dict[str, int]]:
    """The newest request.json's figures (status, keys, rows, bytes, partitions) and its rows removed per asset."""
    record = json.loads(sorted(erasures.glob("*/request.json"))[-1].read_text())  # the request id starts with its UTC time
    figures = {k: v for k, v in record.items() if k in ("status", "keys", "rows_removed", "bytes_rewritten")}
    figures["partitions"] = len(record["partitions"])
    by_asset: dict[str, int] = {}
    for name, rows in record["partitions"].items():  # "asset/date": rows
        asset = name.split("/")[0]
        by_asset[asset] = by_asset.get(asset, 0) + rows
    return figures, by_asset


def stored_rows(table_root: Path, asset: str, dates: list[str]) -> dict[str, int | None]:
    """Rows of each stored date (the Iceberg table's manifests), None for a date the asset does not hold."""
    storage = WarehouseStorage(str(table_root.parent))
    held = set(storage.stored_dates(table_root.name, asset))
    counts = storage.row_counts(table_root.name, asset, [day for day in dates if day in held])
    return {day: counts[day] if day in held else None for day in dates}


def phases(figures: dict, lines: list[tuple[float, str]], folder: Path) -> dict:
    """Where the erase's time went, in seconds from its start: Python and the JVM starting, Spark's start to its
    first query, the erase (to its summary line: the Spark queries, and the driver's work between them:
    listing, schemas, commits, the purge), Dagster told (materializations, the checks evaluated again), the
    exit; and the erase's Spark SQL seconds by asset and kind (a scan for the keys or a rewrite), from its
    event log ("keys file": the keys read, checked, fingerprinted; "ledger": their hashes written)."""
    summary_at = next(t for t, text in lines if ERASED_LINE.search(text))
    told_at = next(t for t, text in lines if TOLD_LINE.search(text))
    log_ = ev.read(folder, Path(figures["log"]))
    app, executions = ev.sql_executions(sorted(p for p in folder.iterdir() if p.is_file()), TABLE) if folder.is_dir() else (None, [])
    start = figures["started_epoch"]
    by_asset: dict[str, float] = {}
    tasks: dict[str, list[float]] = {}
    erase_sql = dagster_sql = 0.0
    for e in executions:
        if e["asset"]:
            key = f"{e['asset']} {'rewrite' if e['write'] else 'scan'}"
        else:
            key = "ledger write" if e["write"] else "keys file read"
        if e["start"] - start < summary_at:
            by_asset[key] = round(by_asset.get(key, 0.0) + e["seconds"], 2)
            run, cpu = tasks.get(key, [0.0, 0.0])
            tasks[key] = [round(run + e["task_seconds"], 1), round(cpu + e["task_cpu_seconds"], 1)]
            erase_sql += e["seconds"]
        else:
            dagster_sql += e["seconds"]
    seconds = {"Python and JVM start": None, "Spark start to first query": None}
    if app and executions:
        seconds.update({"Python and JVM start": round(app - start, 1), "Spark start to first query": round(executions[0]["start"] - app, 1)})
        first = executions[0]["start"] - start
        seconds.update({"erase: Spark queries": round(erase_sql, 1), "erase: between queries, purge": round(summary_at - first - erase_sql, 1)})
    else:
        seconds["erase"] = summary_at
    seconds.update({"Dagster told": round(told_at - summary_at, 1), "exit": round(figures["seconds"] - told_at, 1)})
    return {"seconds": seconds, "summary_line_at": summary_at, "spark_sql_seconds_dagster": round(dagster_sql, 1),
            "sql_executions": len(executions), "spark_by_asset": by_asset, "task_run_and_cpu_seconds_by_asset": tasks,
            "eventlog": {k: v for k, v in log_.items() if k in ("tasks", "executor_cpu_seconds", "shuffle_write_bytes", "complete")}}


def summary(results: dict) -> None:
    m, d, rows = results["measurements"], results.get("data", {}), []
    unit = m.get("yardstick", {}).get("seconds")
    ratio = lambda s: None if not unit else round(s / unit, 2)  # noqa: E731
    if "seconds" in m.get("yardstick", {}):
        rows.append(run_row("yardstick day 2 (plain PySpark, last date)", m["yardstick"]["day2"], 1.0))
    if "seconds" in m.get("load", {}):
        rows.append(run_row(f"load: {d.get('dates')} dates in one run", m["load"], ratio(m["load"]["seconds"])))
    e = m.get("erase", {})
    if "printed" in e:
        p = e["printed"]
        rows.append(run_row(f"erase: {d.get('erased_keys')} keys", e, ratio(e["seconds"]),
                            f"{p['partitions']} of {e['table_partitions']} partitions, {p['bytes_rewritten'] / 2**20:.1f} of "
                            f"{p['bytes_stored'] / 2**20:.1f} MiB ({p['bytes_rewritten'] / p['bytes_stored']:.0%}), {p['rows_removed']:,} rows"))
        rows += [[f"    {phase}", s] for phase, s in e["phases"]["seconds"].items()]
    if "seconds" in m.get("verify", {}):
        rows.append(run_row("verify (cdc-erase --verify)", m["verify"], ratio(m["verify"]["seconds"]), f"exit {m['verify']['returncode']}"))
    notes = ["x yardstick: wall / the yardstick's day 2 on the same data (absent: no ratio); other: cores other processes kept busy",
             "erase phases: from its event log and the times its lines were printed (erase: to its summary line; Dagster told: to its next line)"]
    print_table(f"ERASING KEYS (issue 26)  {d.get('dates')} dates x {d.get('rows_per_date', 0):,} rows, {d.get('erased_keys')} keys  "
                f"at {results['git_commit']}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s",
                ["measurement", "wall s", "other", "JVM RSS GiB", "x yardstick", "rewritten"], rows, notes)
