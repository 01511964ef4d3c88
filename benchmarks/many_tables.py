"""many: N tables through the run queue, warm on one Connect server against cold (issues 13, 22; `make benchmark-many`).

Issue 22's target: day 2 of twenty tables of 100,000 rows through the run queue on the warm server, total wall
<= 0.2 x the same runs cold through the queue, in the same invocation; and the server's peak RSS meanwhile.
Each table (many_t01, ...) has its own extracts (`cdc-generate ROWS ROWS 5 10 0.2 0.4 0.4`, seed --seed + i).
Each phase: a fresh DAGSTER_HOME (instance/dagster.yaml, a QueuedRunCoordinator, the phase's run limit),
each table's pool limit created first as `make ui` does, a `dagster-daemon` of its own; each table's daily
schedule is evaluated for the date and its request made a run as the scheduler daemon makes one, then
queued. Wall: first submission to the last run's end. Phases: setup (day 1 on the server, untimed; a failed
run is submitted once more), warm (every run on the server, CDC_SPARK=server as under `make ui`; its VmHWM
reset at the start), cold (a JVM per run, the limit sized to memory and cores). Per run, from its event log:
queue wait, launch, to first step, Spark session, steps, between steps, teardown (Dagster's bookkeeping is
launch + to first step + between steps + teardown). Checked: every run succeeded, the limit held, warm runs
on the server's application, cold runs on JVMs of their own, every table's outputs as generated.

    python -m benchmarks many                                        # 20 x 100k, day 2 warm then cold, ~45-60 min
    python -m benchmarks many --tables 65 --rows 20000 --skip-cold   # seed 003's 65 tables, one date, warm
    python -m benchmarks many --tables 3 --rows 2000 --warm-concurrent 2   # small check, ~6 min
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import time
import warnings
from datetime import date, datetime, time as dtime, timedelta, timezone

import psutil
import yaml

from benchmarks.data import DAY1, DAY2, check_counts, dated, expected_day2, generate, write_config
from benchmarks.harness import GIB, REPO, Child, OutputsWrong, StepFailed, cold_env, log, print_table, proc_status, tool

LOCATION = "cdc_assets"
ENDED = {"SUCCESS", "FAILURE", "CANCELED"}
TARGET = 0.2
RESERVE_GIB, OVERHEAD_GIB = 2.0, 1.0  # the OS, daemon and code servers; per run above the driver heap
SESSION_READY = re.compile(r"Spark session ready in ([\d.]+) s on application (\S+)")
SPARK_FOR_RUN = "Spark for this run:"
BOOKKEEPING = ("launch", "to_first_step", "between_steps", "teardown")
OVERHEAD = {"queue_wait": "queue wait (ENQUEUED -> STARTING)", "launch": "launch (STARTING -> RUN_START)",
            "to_first_step": "RUN_START -> first STEP_START", "spark_session": "Spark session ready", "steps": "steps (sum)",
            "steps_without_session": "steps minus the session", "between_steps": "between steps",
            "teardown": "last step -> RUN_SUCCESS", "bookkeeping": "Dagster bookkeeping", "run": "run (STARTING -> RUN_SUCCESS)"}


def add_arguments(parser) -> None:
    parser.add_argument("--tables", type=int, default=20, help="tables (default 20)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table and date (default 100,000)")
    parser.add_argument("--dates", type=int, choices=(1, 2), help="2: day 1 set up untimed, day 2 timed (the default); "
                        "1: day 1 timed from an empty warehouse (the default with --skip-cold)")
    parser.add_argument("--max-concurrent", type=int, help="max_concurrent_runs of the cold phase (default: sized to memory and cores)")
    parser.add_argument("--warm-concurrent", type=int, default=4, help="max_concurrent_runs of set-up and the warm phase (default 4)")
    parser.add_argument("--skip-cold", action="store_true", help="warm phase only")
    parser.add_argument("--restart-server", action="store_true", help="a fresh server JVM between set-up and the warm phase")
    parser.add_argument("--no-pool-setup", action="store_true", help="leave the tables' pool limits to the daemon (make ui creates them first)")
    parser.add_argument("--dequeue-interval", type=int, default=1, help="dequeue_interval_seconds (default 1; Dagster's is 5)")
    parser.add_argument("--timeout", type=int, default=4 * 3600, help="seconds to wait for a phase's runs (default 4 h)")
    parser.add_argument("--seed", type=int, default=11, help="generator seed of table 1 (table i: seed + i)")


def check_arguments(parser, args) -> None:
    args.dates = args.dates or (1 if args.skip_cold else 2)
    if not 1 <= args.tables <= 99 or args.rows < 10 or args.warm_concurrent < 1 or (args.max_concurrent or 1) < 1:
        parser.error("need 1 <= --tables <= 99, --rows >= 10, and limits >= 1")
    if args.restart_server and args.dates != 2:
        parser.error("--restart-server needs --dates 2 (there is no set-up to restart after)")


def label(args) -> str:
    return f"{args.tables}x{args.rows}"


def measure(bench) -> None:
    Many(bench).run()


def sizing() -> dict:
    """The cold phase's default limit: as many drivers as fit in memory, at most 2 per core."""
    from cdc_assets.engines.spark_conf import LOCAL_DEFAULTS, spark_conf_from_env

    driver = spark_conf_from_env().get("spark.driver.memory", LOCAL_DEFAULTS["spark.driver.memory"])
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)b?", driver.strip().lower()).groups()
    driver_gib = float(number) * {"": 2**-30, "k": 2**-20, "m": 2**-10, "g": 1, "t": 1024}[unit]
    total = psutil.virtual_memory().total / GIB
    by_memory = max(1, math.floor((total - RESERVE_GIB) / (driver_gib + OVERHEAD_GIB)))
    chosen = min(by_memory, 2 * psutil.cpu_count())
    return {"max_concurrent": chosen, "explanation": f"min(floor(({total:.1f} GiB - {RESERVE_GIB:g} reserve) / ({driver} driver + "
            f"{OVERHEAD_GIB:g})) = {by_memory}, 2 x {psutil.cpu_count()} cores) = {chosen}"}


def max_overlap(intervals) -> int:
    """The most [start, end) intervals holding one instant (an end before a start at the same moment)."""
    points = sorted([p for s, e in intervals if s is not None for p in ((s, 1), (math.inf if e is None else e, -1))])
    current = best = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


def overhead(row: dict, steps: dict) -> dict:
    """Seconds of each part of a run (module docstring); a part whose events are missing is left out."""
    spans = [s for s in steps.values() if "start" in s and "end" in s]
    end = row.get("success", row.get("failure", row.get("canceled")))
    found = {}
    for key, first, last in (("queue_wait", "enqueued", "starting"), ("launch", "starting", "started_event"), ("run", "starting", None)):
        later = end if last is None else row.get(last)
        if row.get(first) is not None and later is not None:
            found[key] = later - row[first]
    if row.get("spark_session_seconds") is not None:
        found["spark_session"] = row["spark_session_seconds"]
    if spans:
        first, last = min(s["start"] for s in spans), max(s["end"] for s in spans)
        found["steps"] = sum(s["end"] - s["start"] for s in spans)
        found["steps_without_session"] = found["steps"] - found.get("spark_session", 0.0)
        found["between_steps"] = last - first - found["steps"]
        if row.get("started_event") is not None:
            found["to_first_step"] = first - row["started_event"]
        if end is not None:
            found["teardown"] = end - last
    if all(part in found for part in BOOKKEEPING):
        found["bookkeeping"] = sum(found[part] for part in BOOKKEEPING)
    return {key: round(value, 2) for key, value in found.items()}


class Many:
    def __init__(self, bench):
        self.bench, self.args, self.workdir = bench, bench.args, bench.workdir
        self.tables = [f"many_t{i:02d}" for i in range(1, self.args.tables + 1)]
        self.configs, self.workspace = self.workdir / "configs", self.workdir / "workspace.yaml"
        self.generated: dict[str, dict] = {}
        self.server = None

    def prepare(self) -> None:
        started = time.perf_counter()
        for index, table in enumerate(self.tables, start=1):
            data = self.workdir / "data" / table
            if self.args.dates == 2:  # the Makefile's demo scenario: 20% deleted, 40% updated, 40% unchanged
                self.generated[table] = generate(self.args.rows, self.args.rows, (0.2, 0.4, 0.4), data / DAY1, data / DAY2, self.args.seed + index)
            else:
                generate(self.args.rows, 0, (1.0, 0.0, 0.0), data / DAY1, data / "_scratch", self.args.seed + index)
            write_config(self.configs, table, data)
        self.workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": {
            "module_name": "cdc_assets.defs.definitions", "location_name": LOCATION, "working_directory": str(REPO),
            "executable_path": tool("python")}}]}))
        log(f"{len(self.tables)} tables x {self.args.dates} date(s) of {self.args.rows:,} rows generated in {time.perf_counter() - started:.1f}s")
        os.environ["CDC_TABLE_CONFIGS"] = str(self.configs)  # the Definitions the code location builds, to evaluate schedules here
        with warnings.catch_warnings(action="ignore"):  # Dagster's preview and resource warnings
            from cdc_assets.defs.definitions import defs
        self.defs = defs

    def instance(self, home, limit: int):
        """A DAGSTER_HOME at ``home``: the project's dagster.yaml with the queue's limit and coordinator settings."""
        home.mkdir(parents=True, exist_ok=True)
        settings = yaml.safe_load((REPO / "instance" / "dagster.yaml").read_text())
        settings.setdefault("concurrency", {})["runs"] = {"max_concurrent_runs": limit}
        config = {"dequeue_interval_seconds": self.args.dequeue_interval}
        settings["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator", "config": config}
        (home / "dagster.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
        return home

    def start_server(self) -> None:
        # The server sizes its heap for the run limit of the instance DAGSTER_HOME names: the warm phases'.
        self.server = self.bench.server("warm", instance_home=self.instance(self.workdir / "server_home", self.args.warm_concurrent))
        seconds = self.server.start()
        self.bench.results.setdefault("server_starts", []).append({"seconds": seconds, **self.server.confs})

    # runs -------------------------------------------------------------------------------------------------
    def submit(self, instance, tables: list[str], day: str) -> tuple[list[str], float]:
        """Each table's daily schedule evaluated for the tick that materializes ``day`` (01:00 UTC the day after),
        its request made a run as the scheduler daemon does and queued; the run ids and the first submission time."""
        __import__("dagster._daemon")  # first: dagster._scheduler.scheduler imports it back (an import cycle)
        from dagster import build_schedule_context
        from dagster._core.definitions.selector import JobSubsetSelector
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import WorkspaceFileTarget
        from dagster._scheduler.scheduler import _create_scheduler_run

        tick = datetime.combine(date.fromisoformat(day) + timedelta(days=1), dtime(1, 0), tzinfo=timezone.utc)
        requests = []
        with warnings.catch_warnings(action="ignore"):  # Dagster's preview and resource warnings
            for table in tables:
                data = self.defs.get_schedule_def(f"{table}_daily").evaluate_tick(build_schedule_context(instance=instance, scheduled_execution_time=tick))
                if len(data.run_requests or []) != 1 or data.run_requests[0].partition_key != day:
                    raise StepFailed(f"{table}_daily at {tick}: expected one request for {day}, got {data.run_requests} ({data.skip_message})")
                requests.append((f"{table}_daily", data.run_requests[0]))
        run_ids = []
        target = WorkspaceFileTarget(paths=[str(self.workspace)])
        with warnings.catch_warnings(action="ignore"), WorkspaceProcessContext(instance, target, code_server_log_level="ERROR") as process:
            context = process.create_request_context()
            if context.get_code_location_error(LOCATION):
                raise StepFailed(f"code location {LOCATION} did not load: {context.get_code_location_error(LOCATION).to_string()}")
            location = context.get_code_location(LOCATION)
            [repository] = location.get_repositories().values()
            first = time.time()
            for name, request in requests:
                schedule = repository.get_schedule(name)
                job = location.get_job(JobSubsetSelector(location_name=location.name, repository_name=repository.name, job_name=schedule.job_name,
                                                         op_selection=None, asset_selection=request.asset_selection,
                                                         asset_check_selection=request.asset_check_keys))
                run = _create_scheduler_run(instance, tick, location, schedule, job, request)
                instance.submit_run(run.run_id, context)
                run_ids.append(run.run_id)
        return run_ids, first

    def wait(self, instance, daemon: Child, run_ids: list[str], phase: str) -> None:
        from dagster import RunsFilter

        deadline, last = time.time() + self.args.timeout, None
        while True:
            statuses = [r.dagster_run.status.value for r in instance.get_run_records(RunsFilter(run_ids=run_ids))]
            counts = {s: statuses.count(s) for s in sorted(set(statuses))}
            if counts != last:
                log(f"{phase}: " + ", ".join(f"{s.lower()} {n}" for s, n in counts.items()))
                last = counts
            if len(statuses) == len(run_ids) and all(s in ENDED for s in statuses):
                return
            if not daemon.alive():
                raise StepFailed(f"dagster-daemon exited before the runs ended; log {daemon.log_path}:\n{daemon.tail()}")
            if time.time() > deadline:
                raise StepFailed(f"{phase}: runs still not ended after --timeout {self.args.timeout}s: {counts}")
            time.sleep(2)

    @staticmethod
    def timeline(instance, run_ids: list[str], t0: float) -> list[dict]:
        """Each run's moments (seconds from ``t0``), its Spark and its overhead, from its record and event log."""
        from dagster import DagsterEventType as E, RunsFilter

        kinds = {E.RUN_ENQUEUED: "enqueued", E.RUN_STARTING: "starting", E.RUN_START: "started_event", E.RUN_SUCCESS: "success",
                 E.RUN_FAILURE: "failure", E.RUN_CANCELED: "canceled"}
        records = {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=run_ids))}
        rows = []
        for run_id in run_ids:
            record, steps, errors = records[run_id], {}, []
            run = record.dagster_run
            row = {"run_id": run_id, "table": run.tags.get("dagster/schedule_name", "").removesuffix("_daily"), "status": run.status.value,
                   "start": record.start_time and round(record.start_time - t0, 2), "end": record.end_time and round(record.end_time - t0, 2)}
            for entry in instance.all_logs(run_id):
                moment, event = round(entry.timestamp - t0, 2), entry.dagster_event
                if event is None:  # a log line of the run's own code
                    message = entry.user_message or ""
                    if SPARK_FOR_RUN in message:
                        row.setdefault("spark_target", message.split(SPARK_FOR_RUN, 1)[1].strip())
                    if match := SESSION_READY.search(message):
                        row.setdefault("spark_session_seconds", float(match[1]))
                        row.setdefault("spark_application", match[2])
                    continue
                if event.event_type in kinds:
                    row.setdefault(kinds[event.event_type], moment)
                if event.event_type == E.STEP_START:
                    steps.setdefault(entry.step_key, {})["start"] = moment
                elif event.event_type in (E.STEP_SUCCESS, E.STEP_FAILURE):
                    steps.setdefault(entry.step_key, {})["end"] = moment
                if event.event_type in (E.RUN_FAILURE, E.STEP_FAILURE):
                    errors.append((event.message or "")[:300])
            # Dagster 1.13 defines RUN_DEQUEUED but never writes it: RUN_STARTING is when the daemon took the run.
            row["launched"] = row.get("starting", row["start"])
            row["seconds"] = round(row["end"] - row["start"], 1) if row["start"] is not None and row["end"] is not None else None
            row["steps"], row["overhead"] = len(steps), overhead(row, steps)
            if errors:
                row["error"] = " | ".join(errors)[:1200]
            rows.append(row)
        return rows

    # a phase ----------------------------------------------------------------------------------------------
    def phase(self, result: dict, name: str, limit: int, day: str, warm: bool, retry: bool = False) -> None:
        """Every table's ``day`` through the queue at ``limit``, on the warm server or cold."""
        from dagster import DagsterInstance

        base = self.workdir / "phases" / name
        shutil.rmtree(base, ignore_errors=True)
        home, warehouse = self.instance(base / "dagster_home", limit), base / "warehouse"
        result.update(max_concurrent_runs=limit, tables=len(self.tables), rows=self.args.rows, date=day, spark="server" if warm else "local")
        if day == DAY2 and name != "setup":
            shutil.copytree(self.workdir / "phases" / "setup" / "warehouse", warehouse, symlinks=True)  # relative date symlinks
        if warm and not self.server.alive():
            raise StepFailed(f"{name}: the Spark Connect server is not running")
        instance = DagsterInstance.from_config(str(home))
        if not self.args.no_pool_setup:  # as make ui does: no pool is unlimited on the daemon's first pass
            from cdc_assets.cli.dev_ui import create_table_pools

            os.environ["CDC_TABLE_CONFIGS"] = str(self.configs)
            log(f"{name}: {len(create_table_pools(instance))} pool limits created before the daemon starts")
        env = {**cold_env(), **(self.server.env() if warm else {}),
               "DAGSTER_HOME": str(home), "CDC_WAREHOUSE": str(warehouse), "CDC_TABLE_CONFIGS": str(self.configs)}
        daemon = Child(f"daemon_{name}", [tool("dagster-daemon"), "run", "-w", self.workspace], env, self.bench.logs,
                       interval=1.0, rewalk=True, server=self.server.jvm if warm else None)
        self.bench.children.append(daemon)
        try:
            ready = time.time()
            while not ((beat := instance.get_daemon_heartbeats().get("QUEUED_RUN_COORDINATOR")) and beat.timestamp >= ready - 1):
                if not daemon.alive() or time.time() - ready > 180:
                    raise StepFailed(f"dagster-daemon did not come up; log {daemon.log_path}:\n{daemon.tail()}")
                time.sleep(0.5)
            log(f"{name}: dagster-daemon up in {time.time() - ready:.1f}s (log {daemon.log_path}); Spark {result['spark']}, limit {limit}")
            if warm:
                result["server_rss_at_start_gib"] = round(proc_status(self.server.jvm).get("VmRSS", 0) / GIB, 2)
                result["server_hwm_reset"] = self.server.reset_peak()
            run_ids, t0 = self.submit(instance, self.tables, day)
            self.wait(instance, daemon, run_ids, name)
            runs = self.timeline(instance, run_ids, t0)
            failed = [r["table"] for r in runs if r["status"] != "SUCCESS"]
            if failed and retry:  # set-up is untimed: its runs only have to store day 1
                result["failed_first"] = [r for r in runs if r["status"] != "SUCCESS"]
                log(f"{name}: {failed} failed; submitting them once more")
                again, _ = self.submit(instance, failed, day)
                self.wait(instance, daemon, again, f"{name} (again)")
                retried = {r["table"]: r for r in self.timeline(instance, again, t0)}
                runs = [retried.get(r["table"], r) for r in runs]
            if warm:
                result["server_vmhwm_gib"] = round(self.server.peak_rss() / GIB, 2)
        finally:
            result["sampled"] = daemon.stop()
            self.bench.children.remove(daemon)
        self.account(result, runs)
        self.check(result, name, runs, warehouse, day, warm, limit)

    def account(self, result: dict, runs: list[dict]) -> None:
        ends = [r["end"] for r in runs if r["end"] is not None]
        result.update(runs=runs, wall_seconds=round(max(ends), 1) if ends else None,
                      max_started_at_once=max_overlap([(r["start"], r["end"]) for r in runs]),
                      max_in_progress_at_once=max_overlap([(r["launched"], r["end"]) for r in runs]),
                      mean_run_seconds=round(statistics.fmean(r["seconds"] or 0 for r in runs), 1), overhead={})
        for key in OVERHEAD:
            values = [r["overhead"][key] for r in runs if key in r["overhead"]]
            if values:
                result["overhead"][key] = {"median": round(statistics.median(values), 2), "mean": round(statistics.fmean(values), 2),
                                           "min": min(values), "max": max(values)}
        s = result["sampled"]
        log(f"{result['date']}: {len(runs)} runs in {result['wall_seconds']}s; at most {result['max_in_progress_at_once']} in progress "
            f"(limit {result['max_concurrent_runs']}); mean run {result['mean_run_seconds']}s; other processes {s['other_processes_avg_cores']} "
            f"cores; {s['peak_spark_jvms']} Spark JVMs under the daemon at most, {s['peak_spark_jvm_rss_gib']} GiB summed"
            + (f"; server VmHWM {result['server_vmhwm_gib']} GiB" if "server_vmhwm_gib" in result else ""))

    def check(self, result: dict, name: str, runs: list[dict], warehouse, day: str, warm: bool, limit: int) -> None:
        failed = [r for r in runs if r["status"] != "SUCCESS"]
        if failed:
            raise StepFailed(f"{name}: {len(failed)} run(s) did not succeed: " + "; ".join(f"{r['table']} {r.get('error', '')[:200]}" for r in failed))
        problems = [f"{result['max_in_progress_at_once']} runs in progress at once, limit {limit}"] if result["max_in_progress_at_once"] > limit else []
        if warm:
            app = self.server.confs.get("spark.app.id")
            problems += [f"{r['table']} ran on {r.get('spark_target')!r}, application {r.get('spark_application')} (the server's: {app})"
                         for r in runs if "warm Spark Connect server" not in r.get("spark_target", "") or r.get("spark_application") != app]
            problems += [f"{result['sampled']['peak_spark_jvms']} Spark JVM(s) under the daemon"] if result["sampled"]["peak_spark_jvms"] else []
        else:
            problems += [f"{r['table']} ran on {r.get('spark_target')!r}" for r in runs if "of the run's own" not in r.get("spark_target", "")]
            apps = [r.get("spark_application") for r in runs]
            problems += [f"cold runs shared an application: {apps}"] if len(set(apps)) != len(apps) else []
        wrong = {}
        for table in self.tables:
            expected = expected_day2(self.generated[table]) if day == DAY2 else {"current_table": {"I": self.args.rows}}
            try:
                check_counts(table, dated(warehouse / table, expected, day), expected)
            except Exception as error:  # noqa: BLE001 - a missing output is a wrong count too
                wrong[table] = str(error)[:300]
        result["outputs_checked"] = not wrong
        if wrong or problems:
            raise OutputsWrong(f"{name}: " + "; ".join(problems + [json.dumps(wrong)] if wrong else problems))
        log(f"{name}: outputs of {day} as the generator says for {len(self.tables)} tables; every run on the Spark it should be")

    def run(self) -> None:
        args, results = self.args, self.bench.results
        results["sizing"] = size = sizing()
        cold_limit = args.max_concurrent or size["max_concurrent"]
        if not args.skip_cold:
            log(f"cold: max_concurrent_runs {cold_limit}" + (" (--max-concurrent)" if args.max_concurrent else f" = {size['explanation']}"))
        self.prepare()
        self.start_server()
        timed = DAY2 if args.dates == 2 else DAY1
        if args.dates == 2:
            self.bench.measure("setup", self.phase, "setup", args.warm_concurrent, DAY1, True, True)
            if "setup" in results["errors"]:
                log("set-up failed: the day-2 phases have no day 1 to start from; stopping")
                return
            if args.restart_server:
                self.server.stop()
                self.start_server()
        self.bench.measure("warm", self.phase, "warm", args.warm_concurrent, timed, True)
        self.server.stop()
        if not args.skip_cold:
            self.bench.measure("cold", self.phase, "cold", cold_limit, timed, False)
        warm, cold = (results["measurements"].get(k, {}).get("wall_seconds") for k in ("warm", "cold"))
        if warm and cold:
            results["warm_over_cold"] = round(warm / cold, 3)


def summary(results: dict) -> None:
    phases = {n: p for n, p in results["measurements"].items() if "runs" in p}
    rows = [[n, p["spark"], p["date"], p["max_concurrent_runs"], len(p["runs"]), p["wall_seconds"], p["sampled"]["other_processes_avg_cores"],
             p["max_in_progress_at_once"], p["mean_run_seconds"], p["sampled"]["peak_spark_jvms"], p["sampled"]["peak_spark_jvm_rss_gib"],
             p.get("server_vmhwm_gib"), results["errors"].get(n, {}).get("kind", "ok")] for n, p in phases.items()]
    notes = []
    if "warm_over_cold" in results:
        notes.append(f"warm / cold wall = {phases['warm']['wall_seconds']} / {phases['cold']['wall_seconds']} = {results['warm_over_cold']:.3f}  "
                     f"(target <= {TARGET}: {'MET' if results['warm_over_cold'] <= TARGET else 'NOT MET'})")
    if "warm" in phases and "server_vmhwm_gib" in phases["warm"]:
        w, start = phases["warm"], (results.get("server_starts") or [{}])[-1]
        notes.append(f"server (driver memory {start.get('spark.driver.memory')}): VmHWM{' over the warm phase' if w.get('server_hwm_reset') else ''} "
                     f"{w['server_vmhwm_gib']} GiB with up to {w['max_in_progress_at_once']} runs in progress, "
                     f"{w.get('server_rss_at_start_gib')} GiB at the phase's start")
    if phases:
        notes.append("per-run overhead, s, median / mean, from the runs' event logs: " + "  ".join(phases))
        for key, text in OVERHEAD.items():
            cells = [f"{o[key]['median']:.1f} / {o[key]['mean']:.1f}" if key in o else "-" for o in (p["overhead"] for p in phases.values())]
            notes.append(f"  {text:<36}" + "".join(f"{c:>18}" for c in cells))
    if "cold" in phases:
        notes.append(f"cold sizing: {results['sizing']['explanation']}")
    notes += ["wall s: first submission to the last run's end; other: cores other processes kept busy (above ~0.2: not idle);",
              "in progress: most runs between launch (RUN_STARTING) and end at one instant; JVMs / RSS: Spark JVMs under the daemon"]
    s = results["settings"]
    print_table(f"MANY TABLES (issues 13, 22)  {s['tables']} tables x {s['rows']:,} rows through the run queue, warm vs cold  at "
                f"{results['git_commit']}  {results['started_utc']}  total {results.get('total_seconds', 0):.0f} s",
                ["phase", "Spark", "date", "limit", "runs", "wall s", "other", "in progress", "mean run s", "JVMs", "their RSS GiB",
                 "server GiB", "result"], rows, notes)
