"""targets: every performance target of issues 10, 11 and 23 in one invocation (`make benchmark`).

Each figure is a fresh process (the `dagster asset materialize` CLI with a fresh DAGSTER_HOME and
warehouse, or the yardstick) unless it says warm; warm runs are the same CLI with SPARK_REMOTE on a Spark
Connect server started for the purpose. Data: `cdc-generate ROWS ROWS 5 10 0.2 0.4 0.4 ... --seed 7`.
Measurements (names for --only):

  a            the yardstick ../shared/bench/plain_cdc.py (plain PySpark, no Dagster): day 1, then day 2,
               cold processes. (a) = day-2 wall seconds. Without the yardstick, the others print absolute
               figures and no ratio to (a).
  b            the pipeline, day 1 then day 2, cold CLI runs. b/a <= 1.0; also the day-2 JVM's peak RSS.
  c            the same on a Connect server started just before (cold for day 1, warm for day 2). c/a <= 0.7;
               the server JVM's peak RSS <= 3 GiB; then the yardstick's two days on the same server (c').
  range-cold   --range-days dates of --range-rows rows: one CLI run per date, then one --partition-range run
               into a fresh warehouse; both must hold the same. range / single (mean of dates 2..N) <= 2.0
               (<= 2.5 acceptable).
  range-warm   the same on a Connect server of its own. <= 1.5.
  changeset    a flagged change set (issue 11): day 1 = the day-1 rows as inserts, day 2 = --changeset-records
               records (40% updates, 20% upserts that change nothing, 20% inserts, 20% deletes). Against (b).
  b-incremental          (b) with `storage: {current: incremental}` (issue 23). b-incremental / b <= 1.0.
  b-lake       (b) against a lake started for it (issue 35): SeaweedFS on loopback holding the extracts, the
               warehouse's records and the tables (its Iceberg REST catalog). b-lake / b printed, no target;
               the day's S3 requests by type, from SeaweedFS's own counters.
  changeset-incremental  changeset with `storage: {current: incremental}`. Day 2 / (b)'s day 2 <= 0.15.
  b-direct     (b) without the table's `published` step (its eight outputs selected by key): every output written
               straight to main, as before write-audit-publish (issue 48). b / b-direct <= 1.1: what staging on a
               branch, checking it and publishing cost a date.

Small check (about 10 minutes, mostly JVM start-up):
    python -m benchmarks targets --rows 20000 --range-days 3 --range-rows 2000
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import duckdb

from benchmarks.catalog_proxy import CountingProxy
from benchmarks.data import (DAY1, DAY2, KEYS, NON_KEYS, business_dates, cdc_current, check_counts, dated, dated_extracts, expected_day2, generate,
                             partition_bytes, write_config)
from benchmarks.harness import YARDSTICK, OutputsWrong, cold_env, describe, log, mib, print_table, run_env, verdict

MEASUREMENTS = ("a", "b", "c", "range-cold", "range-warm", "changeset", "b-incremental", "changeset-incremental", "b-lake", "b-direct")
TARGETS = {"b/a": 1.0, "c/a": 0.7, "server_rss_gib": 3.0, "range_cold": 2.0, "range_cold_acceptable": 2.5, "range_warm": 1.5,
           "b_incremental/b": 1.0, "changeset_incremental/b": 0.15, "b/b_direct": 1.1}
# The synthetic table's outputs: (b-direct) selects them without the `published` step that publishes them.
OUTPUTS = ("hashed_incoming", "rejects", "hash_join_classification", "inserts", "deletes", "updates", "current_table", "history_partition")
TABLE, CHANGESET, RANGE = "synthetic", "synthetic_changes", "backfill_bench"
CHANGESET_MIX = {"U": 0.4, "N": 0.2, "I": 0.2, "D": 0.2}  # updates, upserts that change nothing, inserts, deletes
INCREMENTAL = "storage: {current: incremental}\n"
CHANGES = "untracked_columns:\n  - {name: seq, type: bigint}\nchanges:\n  operation_column: op\n  sequence_columns: [seq]\n"


def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per day for a, b, c, changeset (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=7, help="cdc-generate --seed (default 7, as the yardstick's figures)")
    parser.add_argument("--range-days", type=int, default=10, help="dates in the range measurements (default 10)")
    parser.add_argument("--range-rows", type=int, default=10_000, help="rows per date in the range measurements (default 10,000)")
    parser.add_argument("--range-seed", type=int, default=3, help="seed of the range data (default 3)")
    parser.add_argument("--changeset-records", type=int, default=100_000, help="records in the change set's day 2 (default 100,000)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(MEASUREMENTS)} ('range' = both range ones)")
    parser.add_argument("--skip-warm", action="store_true", help="no Connect server: skip c and range-warm")
    parser.add_argument("--skip-range", action="store_true", help="skip range-cold and range-warm")
    parser.add_argument("--yardstick", type=Path, default=YARDSTICK, help=f"plain_cdc.py (default {YARDSTICK})")
    parser.add_argument("--server-conf", type=json.loads, help="JSON object of Spark conf for the Connect servers")


def check_arguments(parser, args) -> None:
    if args.rows < 10 or args.range_rows < 100 or args.range_days < 2:
        parser.error("need --rows >= 10, --range-rows >= 100 and --range-days >= 2")
    wanted = set(MEASUREMENTS)
    if args.only:
        names = {n.strip().replace("_", "-") for n in args.only.split(",") if n.strip()}
        if names - wanted - {"range"}:
            parser.error(f"--only: unknown {', '.join(sorted(names - wanted - {'range'}))}; choose from {', '.join(MEASUREMENTS)}, range")
        wanted = (names & wanted) | ({"range-cold", "range-warm"} if "range" in names else set())
    wanted -= {"c", "range-warm"} if args.skip_warm else set()
    wanted -= {"range-cold", "range-warm"} if args.skip_range else set()
    args.selected = [m for m in MEASUREMENTS if m in wanted]
    if not args.selected:
        parser.error("nothing left to measure")
    args.yardstick = args.yardstick.resolve()


def gb(n_mib: float | None) -> float | None:
    return None if n_mib is None else round(n_mib / 1024, 2)


def label(args) -> str:
    return f"{args.rows}rows"


def measure(bench) -> None:
    targets = Targets(bench)
    bench.results["yardstick"] = {"path": str(bench.args.yardstick), "present": bench.args.yardstick.exists()}
    if not bench.results["yardstick"]["present"]:
        log(f"the yardstick is absent ({bench.args.yardstick} not found): absolute figures only, no ratio to (a)")
    steps = {"a": targets.measure_a, "b": targets.measure_b, "c": targets.measure_c, "changeset": targets.measure_changeset,
             "b-incremental": partial(targets.measure_b, incremental=True), "range-cold": partial(targets.measure_range, warm=False),
             "changeset-incremental": partial(targets.measure_changeset, incremental=True), "range-warm": partial(targets.measure_range, warm=True),
             "b-lake": targets.measure_b_lake, "b-direct": targets.measure_b_direct}
    for name in bench.args.selected:
        if name != "a" or bench.results["yardstick"]["present"]:
            bench.measure(name, steps[name])
    bench.results["generation"] = targets.generated


class Targets:
    def __init__(self, bench):
        self.bench, self.args, self.workdir = bench, bench.args, bench.workdir
        self.generated, self._changeset, self._range = None, None, None

    # data -------------------------------------------------------------------------------------------------
    def data(self) -> Path:
        if self.generated is None:
            root = self.workdir / "data" / TABLE
            self.generated = generate(self.args.rows, self.args.rows, (0.2, 0.4, 0.4), root / DAY1, root / DAY2, self.args.seed)
            write_config(self.workdir / "configs" / TABLE, TABLE, root)
            write_config(self.workdir / "configs" / f"{TABLE}_incremental", TABLE, root, extra=INCREMENTAL)
            log(f"generated {self.args.rows:,} + {self.args.rows:,} rows in {self.generated['seconds']}s: {self.generated}")
        return self.workdir / "data" / TABLE

    def changeset_data(self) -> dict:
        """Day 1: the synthetic day-1 rows as insert records; day 2: ``--changeset-records`` records of the mix."""
        if self._changeset is None:
            source, root = self.data(), self.workdir / "data" / CHANGESET
            g = self.generated  # a small table has fewer rows of a kind than the mix asks for
            available = {"U": g["updated"], "N": g["unchanged"], "I": g["inserted"], "D": g["deleted"]}
            counts = {op: min(int(self.args.changeset_records * share), available[op]) for op, share in CHANGESET_MIX.items()}
            on = " AND ".join(f"d1.{k} = d2.{k}" for k in KEYS)
            differs = " OR ".join(f"d1.{c} <> d2.{c}" for c in NON_KEYS)
            d1, d2 = (", ".join(f"{t}.{c}" for c in KEYS + NON_KEYS) for t in ("d1", "d2"))
            db = duckdb.connect()
            for day, name in ((DAY1, "d1"), (DAY2, "d2")):
                db.sql(f"CREATE TABLE {name} AS SELECT * FROM read_csv('{source / day}/*.csv', header=true, all_varchar=true)")
                (root / day).mkdir(parents=True)
            db.sql(f"COPY (SELECT 'I' AS op, {d1}, 1::BIGINT AS seq FROM d1) TO '{root / DAY1 / 'changes.csv'}' (HEADER)")
            db.sql(f"""COPY ((SELECT 'U' AS op, {d2}, 2::BIGINT AS seq FROM d2 JOIN d1 ON {on} WHERE {differs} LIMIT {counts['U']})
                  UNION ALL (SELECT 'U', {d2}, 2 FROM d2 JOIN d1 ON {on} WHERE NOT ({differs}) LIMIT {counts['N']})
                  UNION ALL (SELECT 'I', {d2}, 2 FROM d2 ANTI JOIN d1 ON {on} LIMIT {counts['I']})
                  UNION ALL (SELECT 'D', {d1}, 2 FROM d1 ANTI JOIN d2 ON {on} LIMIT {counts['D']})
                ) TO '{root / DAY2 / 'changes.csv'}' (HEADER)""")
            rows = db.sql("SELECT count(*) FROM d1").fetchall()[0][0]
            for suffix, extra in (("", CHANGES), ("_incremental", CHANGES + INCREMENTAL)):
                write_config(self.workdir / "configs" / f"{CHANGESET}{suffix}", CHANGESET, root, "changeset", extra)
            self._changeset = {"day1_records": rows, "day2_records": sum(counts.values()), "expected": {
                "current_table": {"I": counts["I"], "U": counts["U"], "N": counts["N"], "X": rows - counts["U"] - counts["N"] - counts["D"]},
                "history_partition": {"I": counts["I"], "U": counts["U"], "D": counts["D"]}}}
            log(f"change set data: {rows:,} insert records, then {sum(counts.values()):,} change records")
        return self._changeset

    def range_data(self) -> list[str]:
        """--range-days dates of --range-rows rows: from one date to the next 5% of the rows deleted and as many
        inserted, about 10% with new non-key values (:func:`benchmarks.data.dated_extracts`)."""
        if self._range is None:
            dates, root = business_dates(self.args.range_days), self.workdir / "range_data"
            dated_extracts(duckdb.connect(), root, self.args.range_rows, dates, self.args.range_rows // 20, 10, self.args.range_seed)
            write_config(self.workdir / "configs" / RANGE, RANGE, root, start=dates[0])
            self._range = dates
        return self._range

    # measurements -----------------------------------------------------------------------------------------
    def yardstick_days(self, name: str, what: str, env: dict, server: int | None = None) -> dict:
        """The yardstick's day 1, then day 2; day 2's counts checked in its outputs (Parquet, ``<asset>/business_date=<date>``)."""
        result = self.bench.yardstick_days(name, self.data(), env, what, (DAY1, DAY2), server)
        stored = {asset: Path(result["out"]) / asset / f"business_date={DAY2}" for asset in ("current_table", "history_partition")}
        return {**result, "day2_counts": check_counts(what, stored, expected_day2(self.generated))}

    def measure_a(self, result: dict) -> None:
        result.update(self.yardstick_days("a_yardstick", "(a) yardstick, cold", cold_env()))

    def pipeline_days(self, result: dict, name: str, what: str, env: dict, table: str, expected: dict, incremental: bool = False,
                      server: int | None = None) -> None:
        """Day 1, then day 2 of ``table`` through the CLI; the day-2 partitions' bytes; day 2's counts checked
        (an incremental state's through cdc-current, as of day 2)."""
        result.update(self.bench.cli_days(name, env, table, what, (DAY1, DAY2), server))
        result["day2_bytes"] = partition_bytes(Path(env["CDC_WAREHOUSE"]), table, DAY2)
        log(f"{what}: day-2 partitions (MiB): " + ", ".join(f"{k} {mib(v)}" for k, v in result["day2_bytes"].items()))
        folders = dated(Path(env["CDC_WAREHOUSE"]) / table, ("current_table", "history_partition"))
        if incremental:
            folders["current_table"] = cdc_current(env, table, DAY2)
        result["day2_counts"] = check_counts(what, folders, expected)

    def measure_b(self, result: dict, incremental: bool = False) -> None:
        self.data()
        name, what = ("b_incremental", "(b, incremental) pipeline, cold CLI") if incremental else ("b_cold", "(b) pipeline, cold CLI")
        env = run_env(self.workdir / "runs" / name, self.workdir / "configs" / (f"{TABLE}_incremental" if incremental else TABLE))
        self.pipeline_days(result, name, what, env, TABLE, expected_day2(self.generated), incremental)

    def measure_b_direct(self, result: dict) -> None:
        """(b) with the outputs selected by key, without ``published``: nothing staged, every write to main."""
        self.data()
        env = run_env(self.workdir / "runs" / "b_direct", self.workdir / "configs" / TABLE)
        select = ",".join(f"{TABLE}/{asset}" for asset in OUTPUTS)
        result.update(self.bench.cli_days("b_direct", env, TABLE, "(b-direct) pipeline without publication, cold CLI", (DAY1, DAY2), select=select))
        folders = dated(Path(env["CDC_WAREHOUSE"]) / TABLE, ("current_table", "history_partition"))
        result["day2_counts"] = check_counts("(b-direct)", folders, expected_day2(self.generated))

    def measure_b_lake(self, result: dict) -> None:
        """(b) with everything in a lake: SeaweedFS's counters give each day's S3 requests, and a counting proxy
        in front of the REST catalog its requests (SeaweedFS serves the catalog from its filer, uncounted)."""
        from unittest import mock

        import pyarrow.fs as pafs

        from cdc_assets.engines import lake_server
        from cdc_assets.engines.process import free_port
        from resources.storage.object_store import ObjectStore

        data = self.data()
        handle = lake_server.start(self.workdir / "lake", s3_port=free_port(), catalog_port=free_port(), metrics=True)
        proxy = CountingProxy(handle.catalog_port)
        variables = {**lake_server.lake_environment(handle), "CDC_CATALOG_URI": proxy.url}

        def counted(run: str, env: dict, *partition: str) -> dict:
            before, catalog_before = _s3_requests(handle.metrics()), proxy.snapshot()
            figures = self.bench.cli(run, env, TABLE, *partition)
            after = _s3_requests(handle.metrics())
            figures["s3_requests"] = {kind: n - before.get(kind, 0) for kind, n in sorted(after.items()) if n != before.get(kind, 0)}
            figures["catalog_requests"] = dict(sorted((proxy.snapshot() - catalog_before).items()))
            log(f"{run}: S3 requests {figures['s3_requests']}; catalog requests {sum(figures['catalog_requests'].values())} "
                f"{figures['catalog_requests']}")
            return figures

        # This process uploads the extracts and reads the counts back: with the lake's keys, as the runs do.
        with mock.patch.dict(os.environ, variables):
            try:
                landing = f"{handle.records_bucket}/landing/{TABLE}"
                pafs.copy_files(str(data), landing, destination_filesystem=ObjectStore.from_environment().filesystem())
                configs = write_config(self.workdir / "configs" / f"{TABLE}_lake", TABLE, f"s3://{landing}")
                env = {**run_env(self.workdir / "runs" / "b_lake", configs), **variables}
                result.update(self.bench.days("b_lake", "(b-lake) pipeline on the lake, cold CLI", (DAY1, DAY2),
                                              lambda run, day: counted(run, env, "--partition", day)))
                stored = {name: (variables["CDC_WAREHOUSE"], TABLE, name, DAY2) for name in ("current_table", "history_partition")}
                result["day2_counts"] = check_counts("(b-lake) pipeline", stored, expected_day2(self.generated))
            finally:
                proxy.stop()
                lake_server.stop(handle.state_dir)

    def measure_c(self, result: dict) -> None:
        self.data()
        server = self.bench.server("c", self.args.server_conf)
        try:
            result["server_start_seconds"] = server.start()
            env = run_env(self.workdir / "runs" / "c_warm", self.workdir / "configs" / TABLE, remote=server.handle.client_url)
            what = "(c) pipeline on the Connect server (cold for day 1, warm for day 2)"
            self.pipeline_days(result, "c_warm", what, env, TABLE, expected_day2(self.generated), server=server.jvm)
            result["server_jvm_peak_rss_mib"] = mib(server.peak_rss())
            log(f"(c) server JVM peak RSS (VmHWM) {gb(result['server_jvm_peak_rss_mib'])} GiB")
            if self.bench.results["yardstick"]["present"]:  # reference: the yardstick on the same warm server
                env = {**cold_env(), "SPARK_REMOTE": server.handle.client_url}
                result["yardstick_warm"] = self.yardstick_days("c_yardstick_warm", "(c') yardstick on the same server", env, server.jvm)
        finally:
            server.stop()

    def measure_changeset(self, result: dict, incremental: bool = False) -> None:
        data = self.changeset_data()
        name = "changeset_incremental" if incremental else "changeset"
        env = run_env(self.workdir / "runs" / name, self.workdir / "configs" / (f"{CHANGESET}_incremental" if incremental else CHANGESET))
        what = f"{name} ({data['day1_records']:,} inserts, then {data['day2_records']:,} changes), cold CLI"
        self.pipeline_days(result, name, what, env, CHANGESET, data["expected"], incremental)
        result.update(day2_records=data["day2_records"], current_rows=data["day1_records"])

    def measure_range(self, result: dict, warm: bool) -> None:
        dates, what = self.range_data(), "range-warm" if warm else "range-cold"
        configs = self.workdir / "configs" / RANGE
        result.update(dates=len(dates), rows_per_date=self.args.range_rows)
        server = self.bench.server("range", self.args.server_conf) if warm else None
        try:
            if server:
                result["server_start_seconds"] = server.start()
            remote, pid = (server.handle.client_url, server.jvm) if server else (None, None)
            single_env = run_env(self.workdir / "runs" / f"{what}_single", configs, remote)
            singles = result["single_runs"] = []
            for index, day in enumerate(dates, start=1):
                singles.append(self.bench.cli(f"{what}_single_{day}", single_env, RANGE, "--partition", day, server=pid))
                log(f"{what}: one-date run {index}/{len(dates)} ({day}): {describe(singles[-1])}")
            range_env = run_env(self.workdir / "runs" / f"{what}_one_run", configs, remote)
            result["one_run"] = one = self.bench.cli(f"{what}_one_run", range_env, RANGE, "--partition-range", f"{dates[0]}...{dates[-1]}", server=pid)
            later = singles[1:]  # date 1 has no previous state to join
            single = sum(r["seconds"] for r in later) / len(later)
            result.update(single_seconds=round(single, 2), single_seconds_all_dates=round(sum(r["seconds"] for r in singles) / len(singles), 2),
                          single_other_processes_avg_cores=round(sum(r["other_processes_avg_cores"] for r in later) / len(later), 2),
                          ratio=round(one["seconds"] / single, 2))
            if server:
                result["server_jvm_peak_rss_mib"] = mib(server.peak_rss())
            log(f"{what}: one run of {len(dates)} dates: {describe(one)}; single date {single:.1f}s; ratio {result['ratio']:.2f}")
            result["outputs_identical"] = range_counts(single_env) == range_counts(range_env)
            if not result["outputs_identical"]:
                raise OutputsWrong(f"{what}: the one-run range wrote other counts than the one-date runs")
        finally:
            if server:
                server.stop()


def _s3_requests(metrics: str) -> dict[str, int]:
    """SeaweedFS's S3 requests so far by type (GET, PUT, HEAD, LIST, DELETE, ...), all buckets and codes."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith("SeaweedFS_s3_request_total{"):
            labels, value = line.rsplit(" ", 1)
            kind = labels.split('type="', 1)[1].split('"', 1)[0]
            counts[kind] = counts.get(kind, 0) + int(float(value))
    return counts


def range_counts(env: dict) -> list[tuple]:
    """(business date, operation, rows) of history_partition, then of current_table: equal lists, same outputs."""
    from pyiceberg.catalog import load_catalog

    from resources.storage.lake import CATALOG_NAME, pyiceberg_properties

    catalog = load_catalog(CATALOG_NAME, **pyiceberg_properties(str(Path(env["CDC_WAREHOUSE"]).resolve())))
    found = []
    for asset in ("history_partition", "current_table"):
        rows = catalog.load_table((RANGE, asset)).scan(selected_fields=("business_date", "operation")).to_arrow()  # noqa: F841
        found += duckdb.sql("select cast(business_date as varchar), operation, count(*) from rows group by all order by all").fetchall()
    return found


def summary(results: dict) -> None:
    m, rows, yardstick = results["measurements"], [], results.get("yardstick") or {"present": False, "path": str(YARDSTICK)}
    a, b, c, cs = (m.get(k) if m.get(k, {}).get("seconds") else None for k in ("a", "b", "c", "changeset"))

    def run(what, figures, value=None, target=None, met=None, note=""):
        rows.append([what, figures and figures["seconds"], figures and figures["other_processes_avg_cores"], value, target, met, note])

    def ratio(label, figure, base, base_name, target=None, text=None):
        if base:
            value = round(figure["seconds"] / base["seconds"], 2)
            rows.append([f"    {label}", None, None, value, text, verdict(value, target) if target else None, "" if target else "no target"])
        else:
            why = "the yardstick is absent" if base_name == "a" and not yardstick["present"] else f"needs {base_name} (--only {base_name},...)"
            rows.append([f"    {label}", None, None, None, text, "-", why])

    if a:
        run("(a) yardstick day 1, cold process", a["day1"])
        run("(a) yardstick day 2, cold process", a["day2"], note=f"JVM peak RSS {gb(a['day2']['jvm_peak_rss_mib'])} GiB")
    if b:
        run("(b) pipeline day 1, cold CLI", b["day1"], note=f"JVM peak RSS {gb(b['day1']['jvm_peak_rss_mib'])} GiB")
        run("(b) pipeline day 2, cold CLI", b["day2"], note=f"JVM peak RSS (VmHWM) {gb(b['jvm_peak_rss_mib'])} GiB, no target")
        ratio("b/a", b, a, "a", TARGETS["b/a"], "<= 1.0")
    if c:
        run("(c) pipeline day 1, Connect server cold", c["day1"], note=f"server start {c['server_start_seconds']} s, not counted")
        run("(c) pipeline day 2, Connect server warm", c["day2"])
        ratio("c/a", c, a, "a", TARGETS["c/a"], "<= 0.7")
        rss = gb(c["server_jvm_peak_rss_mib"])
        rows.append(["    server JVM peak RSS, GiB (VmHWM)", None, None, rss, "<= 3", verdict(rss, TARGETS["server_rss_gib"]),
                     "server start + (c) day 1 + day 2"])
        y = c.get("yardstick_warm", {})
        if "seconds" in y:
            run("(c') yardstick day 2 on the same warm server", y["day2"], round(c["seconds"] / y["seconds"], 2),
                note=f"value = c / c'; reference, no target; day 1 {y['day1']['seconds']} s")
    for name, target, acceptable in (("range-cold", TARGETS["range_cold"], TARGETS["range_cold_acceptable"]), ("range-warm", TARGETS["range_warm"], None)):
        r = m.get(name, {})
        if "ratio" in r:
            rows.append([f"{name}: one-date run (mean of dates 2..{r['dates']})", r["single_seconds"], r["single_other_processes_avg_cores"],
                         None, None, None, f"{r['rows_per_date']:,} rows/date; all {r['dates']} dates: {r['single_seconds_all_dates']} s"])
            run(f"{name}: one run of {r['dates']} dates", r["one_run"])
            rows.append(["    range / single", None, None, r["ratio"], f"<= {target}" + (f" (<= {acceptable})" if acceptable else ""),
                         verdict(r["ratio"], target, acceptable), "outputs identical" if r.get("outputs_identical") else "OUTPUTS DIFFER"])
    if cs:
        run(f"changeset day 2: {cs['day2_records']:,} records on {cs['current_rows']:,} rows, cold CLI", cs["day2"])
        ratio("changeset day 2 / full load day 2 (b)", cs, b, "b")
    bi, csi = (m.get(k) if m.get(k, {}).get("seconds") else None for k in ("b-incremental", "changeset-incremental"))
    stored = lambda r: r and "day2_bytes" in r and mib(sum(r["day2_bytes"].values()))  # noqa: E731
    if bi:
        run("(b, incremental) pipeline day 2, cold CLI", bi["day2"], note=f"wrote {stored(bi)} MiB; (b) wrote {stored(b)} MiB")
        ratio("b-incremental / b", bi, b, "b", TARGETS["b_incremental/b"], "<= 1.0")
    if csi:
        run(f"changeset day 2, incremental: {csi['day2_records']:,} records on {csi['current_rows']:,} rows, cold CLI", csi["day2"],
            note=f"wrote {stored(csi)} MiB; snapshot changeset wrote {stored(cs)} MiB")
        ratio("changeset-incremental day 2 / (b) day 2", csi, b, "b", TARGETS["changeset_incremental/b"], "<= 0.15")
    direct = m.get("b-direct") if m.get("b-direct", {}).get("seconds") else None
    if direct:
        run("(b-direct) pipeline day 2 without publication, cold CLI", direct["day2"])
        if b:
            ratio("b / b-direct (what publishing a date costs)", b, direct, "b-direct", TARGETS["b/b_direct"], "<= 1.1")
    lake = m.get("b-lake") if m.get("b-lake", {}).get("seconds") else None
    if lake:
        run("(b-lake) pipeline day 2 on the lake, cold CLI", lake["day2"], note=f"S3 requests: {lake['day2']['s3_requests']}")
        ratio("b-lake / b", lake, b, "b")
        ratio("b-lake / a", lake, a, "a")
    s = results["settings"]
    title = (f"PERFORMANCE TARGETS (issues 10, 11, 23, 35, 48)  rows/day={s['rows']:,}  range={s['range_days']}x{s['range_rows']:,}  "
             f"at {results['git_commit']}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s")
    notes = ["seconds: wall seconds of one fresh process (CLI or yardstick) unless warm; other: average cores other processes",
             "kept busy meanwhile (on 2 cores, above ~0.2 the seconds are not comparable with an idle run)"]
    if not yardstick["present"]:
        notes.append(f"the yardstick is absent ({yardstick['path']} not found): absolute figures, no ratio to (a)")
    print_table(title, ["", "seconds", "other", "value", "target", "verdict", "note"], rows, notes)
