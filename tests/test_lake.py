"""The pipeline on an S3 lake: the warehouse's records, the Iceberg tables (a REST catalog) and the extracts all
in SeaweedFS on loopback, started by each test on free ports (tests/lake.py), and every result equal to the
same run on the local default (a folder, the embedded catalog, local extracts).

Five dates of each load type run on the lake (a change set one Dagster run per date, the others as one range
run) and as one range run locally; the readers (current state, SCD2, changes between dates; Spark and DuckDB) agree; an erase with --verify leaves
no stored file holding the keys; and no secret reaches a log, the run config or the UI.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import duckdb
import pytest
from dagster import DagsterInstance

from cdc_assets.model.config import TableConfig
from cdc_assets.usecases.readers import changes_between, current_duckdb_sql, current_state, scd2_view
from cdc_assets.model.names import CURRENT, HASHED_INCOMING, HISTORY
from resources.storage import WarehouseStorage
from resources.storage.lake import LakeCatalog
from tests.lake import lake_variables, pointed_at, upload
from tests.pipeline import AUDIT_COLUMNS, definitions_for, run_dates, run_range, write_table_config

pytestmark = [pytest.mark.lake, pytest.mark.slow]

DAYS = ["2024-03-01", "2024-03-02", "2024-03-03", "2024-03-04", "2024-03-05"]
KEYS = [{"name": "id", "type": "int"}]
NON_KEYS = [{"name": "name", "type": "string"}, {"name": "amount", "type": "decimal(12,2)"}]
CHANGESET = {
    "untracked_columns": [{"name": "changed_at", "type": "timestamp"}],
    "changes": {
        "operation_column": "op", "insert_values": ["I"], "update_values": ["U"], "delete_values": ["D"],
        "sequence_columns": ["changed_at"],
    },
}  # fmt: skip


def _history_of_a_table(seed: int = 35) -> dict[str, list[tuple[str, int, str, str]]]:
    """Per date, the day's changes as (op, id, name, amount), oldest first: 30 rows on the first date, then
    each date deletes 3, updates 6 and inserts 4 (one key updated twice in a day)."""
    rng = random.Random(seed)
    live: dict[int, tuple[str, str]] = {}
    changes: dict[str, list] = {}
    next_id = 1
    for index, day in enumerate(DAYS):
        today = []
        if index:
            for key in rng.sample(sorted(live), 3):
                today.append(("D", key, *live.pop(key)))
            updated = rng.sample(sorted(live), 6)
            for key in updated + updated[:1]:
                live[key] = (f"name-{key}-{day}-{len(today)}", f"{rng.randint(0, 99999) / 100:.2f}")
                today.append(("U", key, *live[key]))
        for _ in range(30 if not index else 4):
            live[next_id] = (f"name-{next_id}", f"{rng.randint(0, 99999) / 100:.2f}")
            today.append(("I", next_id, *live[next_id]))
            next_id += 1
        changes[day] = today
    return changes


def _write_extracts(folder: Path, load_type: str) -> None:
    """Each date's extract of the load type: every live row (full), the rows inserted or updated that day
    (delta), or every change with its op and time (changeset)."""
    live: dict[int, tuple[str, str]] = {}
    for day, today in _history_of_a_table().items():
        path = folder / load_type / f"{day}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as stream:
            out = csv.writer(stream)
            if load_type == "changeset":
                out.writerow(["op", "id", "name", "amount", "changed_at"])
                for second, (op, key, name, amount) in enumerate(today):
                    out.writerow([op, key, name, amount, f"{day} 08:00:{second % 60:02d}.{second // 60:03d}"])
                continue
            touched = {}
            for op, key, name, amount in today:
                if op == "D":
                    live.pop(key, None)
                else:
                    live[key] = touched[key] = (name, amount)
            out.writerow(["id", "name", "amount"])
            for key, (name, amount) in sorted((live if load_type == "full" else touched).items()):
                out.writerow([key, name, amount])


def _config(folder: Path, load_type: str):
    extra = CHANGESET if load_type == "changeset" else {}
    return write_table_config(
        folder, f"lake_{load_type}", f"{load_type}/{{date}}.csv", load_type=load_type, start_date=DAYS[0], keys=KEYS,
        non_keys=NON_KEYS, **extra,
    )


class LocalDefault(NamedTuple):
    """A load type's five dates run as one range on the local default: its extracts, its config (and the
    folder of it) and the warehouse the run wrote."""

    extracts: Path
    configs: Path
    config: TableConfig
    warehouse: Path


@pytest.fixture(scope="module")
def on_the_local_default(spark, tmp_path_factory) -> Callable[[str], LocalDefault]:
    """``on_the_local_default(load_type)``: that load type's :class:`LocalDefault`, run once for the module
    (each run costs seconds) and read only; the lake's runs of the same extracts must equal it. A date's
    outputs do not depend on later dates, so it is also the reference of a run of the first dates only."""
    made: dict[str, LocalDefault] = {}

    def reference(load_type: str) -> LocalDefault:
        if load_type not in made:
            root = tmp_path_factory.mktemp(f"local_{load_type}")
            extracts, configs, warehouse = root / "extracts", root / "configs", root / "warehouse"
            _write_extracts(extracts, load_type)
            config = _config(configs, load_type)
            with pytest.MonkeyPatch.context() as patch, pointed_at(patch, {"CDC_WAREHOUSE": str(warehouse), "CDC_DATA_ROOT": str(extracts)}):
                assert run_range(definitions_for(config), DAYS[0], DAYS[-1]).success
            made[load_type] = LocalDefault(extracts, configs, config, warehouse)
        return made[load_type]

    return reference


def _extracts_in_the_lake(tmp_path: Path, lake, load_type: str):
    """The load type's extracts, written locally and uploaded to the lake; the table's config; the lake's variables."""
    extracts = tmp_path / "extracts"
    _write_extracts(extracts, load_type)
    config = _config(tmp_path / "configs", load_type)
    upload(extracts, lake)
    return extracts, config, lake_variables(lake)


def _uploaded(local: LocalDefault, lake) -> dict[str, str]:
    """The local default's extracts uploaded to the lake; the lake's variables."""
    upload(local.extracts, lake)
    return lake_variables(lake)


def _rows(storage: WarehouseStorage, spark, table: str, asset: str, day: str) -> list[tuple]:
    frame = storage.read_one(spark, table, asset, day).drop(*AUDIT_COLUMNS)
    return sorted((tuple(row) for row in frame.collect()), key=repr)


def _readers(spark, config) -> tuple[list, list, list, list]:
    """What current_state, scd2_view, changes_between (Spark) and current_duckdb_sql (DuckDB) read, as sorted
    tuples without the audit columns (who wrote a row differs between any two runs)."""

    def rows(frame) -> list:
        return sorted(map(tuple, frame.drop(*AUDIT_COLUMNS).collect()), key=repr)

    audit = ", ".join(AUDIT_COLUMNS)
    return (
        rows(current_state(spark, config)),
        rows(scd2_view(spark, config)),
        rows(changes_between(spark, config, DAYS[1], DAYS[-1])),
        sorted(duckdb.sql(f"SELECT * EXCLUDE ({audit}) FROM ({current_duckdb_sql(config)})").fetchall(), key=repr),
    )


@pytest.mark.parametrize("load_type", ["full", "delta", "changeset"])
def test_five_dates_on_the_lake_equal_the_same_dates_on_the_local_default(spark, monkeypatch, load_type, lake, on_the_local_default):
    reference = on_the_local_default(load_type)
    config, local_root = reference.config, reference.warehouse
    variables = _uploaded(reference, lake)
    local = WarehouseStorage(str(local_root))
    with pointed_at(monkeypatch, variables):
        # Day by day for a change set, as one range run for the others (the suite's time: each run costs seconds).
        if load_type == "changeset":
            assert all(result.success for result in run_dates(definitions_for(config), DAYS, DagsterInstance.ephemeral()))
        else:
            assert run_range(definitions_for(config), DAYS[0], DAYS[-1]).success
        on_lake = WarehouseStorage(variables["CDC_WAREHOUSE"])
        assert isinstance(on_lake.lake, LakeCatalog) and on_lake.lake.uri == variables["CDC_CATALOG_URI"]
        assert on_lake.root == f"s3://{lake.records_bucket}/warehouse"
        # Nothing of the lake's run is a local file: the tables are in the table bucket, the records in the other.
        assert on_lake.tables.location(config.name, CURRENT).startswith(f"s3://{lake.table_bucket}/")
        assert on_lake.list_names(on_lake.runs_log_path()), "the runs log is in the bucket"
        assert not (Path.cwd() / "warehouse" / config.name).exists()
        for day in DAYS:
            for asset in (CURRENT, HISTORY):
                assert _rows(on_lake, spark, config.name, asset, day) == _rows(local, spark, config.name, asset, day), (asset, day)
        assert on_lake.stored_dates(config.name, CURRENT) == DAYS
        # The readers, through Spark and DuckDB, read the lake as they read the folder.
        on_the_lake = _readers(spark, config)
    with pointed_at(monkeypatch, {"CDC_WAREHOUSE": str(local_root)}):
        assert on_the_lake == _readers(spark, config)
    lake_current, _, lake_changes, _ = on_the_lake
    if load_type == "delta":  # the SQL endpoint's spark-sql on the lake (once: a JVM or two of its own)
        _sql_endpoint_reads_the_lake(config, reference.configs, variables, on_lake)
    # 30 keys, 4 inserted a date; a delta never deletes (a key it does not name is not supplied).
    assert len(lake_current) == 30 + 4 * 4 - (0 if load_type == "delta" else 3 * 4)
    assert lake_changes, "keys changed between the second date and the last"


def _sql_endpoint_reads_the_lake(config, configs: Path, variables: dict[str, str], on_lake: WarehouseStorage) -> None:
    """``cdc-catalog sql`` (spark-sql on the SQL catalog) reads the REST catalog's tables by name, as stored."""
    env = {**os.environ, **variables, "CDC_TABLE_CONFIGS": str(configs), "PYTHONPATH": str(REPO)}
    env.pop("SPARK_REMOTE", None)
    query = f"SELECT business_date, count(*) FROM cdc.{config.name}_current GROUP BY 1 ORDER BY 1"
    done = subprocess.run([str(Path(sys.executable).parent / "cdc-catalog"), "sql", "-S", "-e", query], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    counts = {day: int(count) for day, count in (line.split("\t") for line in done.stdout.splitlines() if line.strip())}
    assert counts == on_lake.row_counts(config.name, CURRENT, DAYS), done.stdout
    # The metastore is where the lake's variables put it, a local folder; nothing of it in the bucket.
    assert (Path(variables["CDC_CATALOG_DIR"]) / "metastore_db").is_dir()
    assert not on_lake.list_names(f"{on_lake.root}/_catalog")


def _erase(config, keys: Path, verify: bool = False) -> int:
    from cdc_assets.cli.erase import main

    return main([config.name, "--keys", str(keys), *(["--verify"] if verify else [])])


def test_an_erase_on_the_lake_verifies_and_no_secret_reaches_a_log_the_run_config_or_a_command_line(spark, tmp_path, monkeypatch, capsys, lake):
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    extracts, configs = tmp_path / "extracts", tmp_path / "configs"
    _write_extracts(extracts, "full")
    config = _config(configs, "full")
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))
    # cdc-erase tells the instance under DAGSTER_HOME when it is set (`make test` sets one): not this test's concern.
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    keys = tmp_path / "keys.csv"
    keys.write_text("id\n1\n2\n")
    variables = lake_variables(lake)
    upload(extracts, lake)
    home = tmp_path / "dagster_home"
    home.mkdir()
    local_root = tmp_path / "warehouse"

    with pointed_at(monkeypatch, {"CDC_WAREHOUSE": str(local_root), "CDC_DATA_ROOT": str(extracts)}):
        run_range(definitions_for(config), DAYS[0], DAYS[2])
        assert _erase(config, keys) == 0
        local = WarehouseStorage(str(local_root))
        erased_locally = {day: _rows(local, spark, config.name, CURRENT, day) for day in DAYS[:3]}
    with pointed_at(monkeypatch, variables), DagsterInstance.local_temp(str(home)) as instance:
        assert all(result.success for result in run_dates(definitions_for(config), DAYS[:3], instance))
        assert _erase(config, keys, verify=True) == 1, "before the erase, stored files hold the keys"
        assert _erase(config, keys) == 0
        capsys.readouterr()
        assert _erase(config, keys, verify=True) == 0, "every data file in the bucket scanned: none holds the keys"
        assert "0 stored files hold the keys" in capsys.readouterr().out
        on_lake = WarehouseStorage(variables["CDC_WAREHOUSE"])
        assert [request["status"] for request in on_lake.erasure_requests(config.name)] == ["complete"]
        for day in DAYS[:3]:
            stored = _rows(on_lake, spark, config.name, CURRENT, day)
            assert stored == erased_locally[day], day
            assert not {row[0] for row in stored} & {1, 2}
        run_configs = [json.dumps(run.run_config, default=str) for run in instance.get_runs()]
        session_conf = json.dumps(on_lake.tables.session_for(spark).conf.getAll)
    # The secret key was in this process's environment all along, and the lake checked every request with it:
    # it is in no file of the Dagster instance (event log, compute logs), no run config, no Spark conf, no
    # process's command line (SeaweedFS's, the JVM's), and not in the lake's own log.
    assert len(run_configs) == 3
    assert not [text for text in run_configs if secret in text]
    assert secret not in session_conf and secret not in json.dumps(dict(spark.sparkContext.getConf().getAll()))
    written = [path for path in home.rglob("*") if path.is_file() and secret.encode() in path.read_bytes()]
    assert written == []
    assert secret.encode() not in (lake.state_dir / "weed.log").read_bytes()
    command_lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command_lines.append(cmdline.read_bytes())
        except OSError:  # a process that ended meanwhile
            continue
    assert any(b"weed" in line for line in command_lines) and not [line for line in command_lines if secret.encode() in line]


RUN_ONE_DATE = """
import sys
from dagster import DagsterInstance
from cdc_assets.model.config import load_table_config
from tests.pipeline import definitions_for

job = definitions_for(load_table_config(sys.argv[1])).resolve_implicit_global_asset_job_def()
job.execute_in_process(partition_key=sys.argv[2], instance=DagsterInstance.ephemeral())
"""
REPO = Path(__file__).resolve().parent.parent


def test_a_run_killed_with_kill_9_halfway_through_a_dates_commits_on_the_lake_and_run_again_equals_an_uninterrupted_run(
    spark, tmp_path, monkeypatch, lake, on_the_local_default
):
    """A run of the second date (its own process and JVM) is paused before current_table's commit, after its
    intake's outputs are staged through the REST catalog, and killed with ``kill -9``. Nothing of it is
    published; the date run again writes what one uninterrupted run writes, on the lake as on the local default."""
    reference = on_the_local_default("full")
    config = reference.config
    variables = _uploaded(reference, lake)
    with pointed_at(monkeypatch, {"CDC_WAREHOUSE": str(reference.warehouse)}):
        local = WarehouseStorage(str(reference.warehouse))
        uninterrupted = {asset: {day: _rows(local, spark, config.name, asset, day) for day in DAYS[:2]} for asset in local.stored_assets(config.name)}
    with pointed_at(monkeypatch, variables):
        assert run_dates(definitions_for(config), DAYS[:1])[0].success
        on_lake = WarehouseStorage(variables["CDC_WAREHOUSE"])
        marker, log = tmp_path / "paused.marker", tmp_path / "killed_run.log"
        env = {
            **os.environ, "PYTHONPATH": str(REPO), "CDC_PAUSE_BEFORE_COMMIT": f"{config.name}/{CURRENT}", "CDC_PAUSE_MARKER": str(marker),
            "CDC_SPARK_CONF": json.dumps({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}),
        }  # fmt: skip
        with log.open("w") as output:
            run = subprocess.Popen(
                [sys.executable, "-c", RUN_ONE_DATE, str(reference.configs / f"{config.name}.yaml"), DAYS[1]],
                env=env, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while not marker.exists():
                assert run.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the run did not reach current_table's commit"
                time.sleep(0.5)
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=60)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(timeout=60)
        assert run.returncode == -signal.SIGKILL
        # The run staged half of the date's tables on its branch (through the REST catalog) and published
        # nothing (docs/publishing.md): every table's main holds the first date only, whole.
        for asset in on_lake.stored_assets(config.name):
            assert on_lake.stored_dates(config.name, asset) == DAYS[:1], asset
        [branch] = on_lake.staging_branches(config.name)
        staged = on_lake.tables.load(config.name, HASHED_INCOMING).snapshot_by_name(branch)
        assert DAYS[1] in on_lake.tables.stored(config.name, HASHED_INCOMING, staged)
        assert run_dates(definitions_for(config), DAYS[1:2])[0].success
        for asset, by_day in uninterrupted.items():
            assert on_lake.stored_dates(config.name, asset) == DAYS[:2], asset
            for day, rows in by_day.items():
                assert _rows(on_lake, spark, config.name, asset, day) == rows, (asset, day)


# A column added on the third date, one renamed on the fourth (renamed_from: by Iceberg field id, through the
# REST catalog), one dropped on the fifth.
EVOLVING_COLUMNS = {
    DAYS[0]: [("name", "string", None), ("amount", "decimal(12,2)", None)],
    DAYS[1]: [("name", "string", None), ("amount", "decimal(12,2)", None)],
    DAYS[2]: [("name", "string", None), ("amount", "decimal(12,2)", None), ("note", "string", None)],
    DAYS[3]: [("name", "string", None), ("total", "decimal(12,2)", "amount"), ("note", "string", None)],
    DAYS[4]: [("total", "decimal(12,2)", "amount"), ("note", "string", None)],
}


def _evolving_extracts(folder: Path) -> None:
    live: dict[int, tuple[str, str]] = {}
    for day, today in _history_of_a_table().items():
        for op, key, name, amount in today:
            if op == "D":
                live.pop(key, None)
            else:
                live[key] = (name, amount)
        columns = [name for name, _, _ in EVOLVING_COLUMNS[day]]
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / f"{day}.csv").open("w", newline="") as stream:
            out = csv.writer(stream)
            out.writerow(["id", *columns])
            for key, (name, amount) in sorted(live.items()):
                values = {"name": name, "amount": amount, "total": amount, "note": f"note-{key % 3}"}
                out.writerow([key, *(values[column] for column in columns)])


def _evolving_config(folder: Path, day: str):
    non_keys = [
        {"name": name, "type": kind, **({"renamed_from": former} if former else {})} for name, kind, former in EVOLVING_COLUMNS[day]
    ]
    return write_table_config(folder, "lake_evolving", "evolving/{date}.csv", start_date=DAYS[0], keys=KEYS, non_keys=non_keys)


def test_columns_added_renamed_and_dropped_on_the_lake_read_as_on_the_local_default(spark, tmp_path, monkeypatch, lake):
    extracts = tmp_path / "extracts"
    _evolving_extracts(extracts / "evolving")
    variables = lake_variables(lake)
    upload(extracts, lake)
    local_root = tmp_path / "warehouse"
    stored = {}
    for place, pointing in (("local", {"CDC_WAREHOUSE": str(local_root), "CDC_DATA_ROOT": str(extracts)}), ("lake", variables)):
        with pointed_at(monkeypatch, pointing):
            for day in DAYS:  # each date's config written before its run, as a user edits the YAML
                config = _evolving_config(tmp_path / f"configs-{place}", day)
                assert run_dates(definitions_for(config), [day])[0].success, (place, day)
            storage = WarehouseStorage(os.environ["CDC_WAREHOUSE"])
            stored[place] = {(asset, day): _rows(storage, spark, config.name, asset, day) for asset in (CURRENT, HISTORY) for day in DAYS}
            now = storage.tables.load(config.name, CURRENT).schema()
            names = [field.name for field in now.fields]
            assert "total" in names and "amount" not in names and "name" not in names and "note" in names, (place, names)
    assert stored["lake"] == stored["local"]


def test_a_range_through_spark_connect_on_the_lake_equals_the_local_default_and_the_server_shows_no_secret(
    spark, tmp_path, monkeypatch, connect_server, lake, on_the_local_default
):
    """The dagster CLI through the suite's Connect server (started without the lake's settings): each session
    reaches the lake with session conf, the keys come from the server's environment."""
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    reference = on_the_local_default("changeset")
    config, configs = reference.config, reference.configs
    variables = _uploaded(reference, lake)
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        **{key: value for key, value in os.environ.items() if key != "SPARK_REMOTE"}, **variables,
        "PYTHONPATH": str(REPO), "DAGSTER_HOME": str(home), "CDC_TABLE_CONFIGS": str(configs), "SPARK_REMOTE": connect_server.client_url,
    }  # fmt: skip
    command = [str(REPO / ".venv/bin/dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions",
               "--select", f"group:{config.name}", "--partition-range", f"{DAYS[0]}...{DAYS[-1]}"]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    output = done.stdout + done.stderr
    assert "Spark for this run" in output and f"SPARK_REMOTE=sc://localhost:{connect_server.port}/;token=<redacted>" in output, output[-6000:]
    assert connect_server.token not in output  # the server's token is in no log
    local = WarehouseStorage(str(reference.warehouse))
    with pointed_at(monkeypatch, variables):
        on_lake = WarehouseStorage(variables["CDC_WAREHOUSE"])
        for day in DAYS:
            for asset in (CURRENT, HISTORY):
                assert _rows(on_lake, spark, config.name, asset, day) == _rows(local, spark, config.name, asset, day), (asset, day)
    assert secret not in done.stdout + done.stderr
    assert secret.encode() not in Path(f"/proc/{connect_server.pid}/cmdline").read_bytes()
    for path in [*connect_server.state_dir.iterdir(), *home.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_the_landing_sensor_lists_a_dates_files_in_the_bucket_without_spark(tmp_path, monkeypatch, lake):
    """A folder, a glob and one file, each as source.path names a date: data files only, with their sizes;
    a ready marker found; a file replaced changes the fingerprint."""
    from cdc_assets.defs.automation import fingerprint
    from cdc_assets.usecases.landing import exists, landed

    extracts = tmp_path / "extracts"
    day = extracts / "orders" / DAYS[0]
    day.mkdir(parents=True)
    (day / "part-0.csv").write_text("id\n1\n")
    (day / "part-1.csv").write_text("id\n2\n3\n")
    (day / "_SUCCESS").write_text("")
    (day / ".part-0.csv.crc").write_text("x")
    (day / "nested").mkdir()
    (day / "nested" / "deeper.csv").write_text("id\n4\n")
    (extracts / "orders" / f"{DAYS[1]}.csv").write_text("id\n5\n")
    prefix = upload(extracts, lake)
    with pointed_at(monkeypatch, lake_variables(lake)):
        folder = landed(f"{prefix}/orders/{DAYS[0]}/")
        assert [(found.path, found.size) for found in folder] == [
            (f"{prefix}/orders/{DAYS[0]}/part-0.csv", 5), (f"{prefix}/orders/{DAYS[0]}/part-1.csv", 7),
        ]  # fmt: skip
        assert [found.path for found in landed(f"{prefix}/orders/{DAYS[0]}/*.csv")] == [found.path for found in folder]
        assert [found.path for found in landed(f"{prefix}/orders/{DAYS[1]}.csv")] == [f"{prefix}/orders/{DAYS[1]}.csv"]
        assert landed(f"{prefix}/orders/{DAYS[2]}/") == []
        assert exists(f"{prefix}/orders/{DAYS[0]}/_SUCCESS") and not exists(f"{prefix}/orders/{DAYS[2]}/_SUCCESS")
        before = fingerprint(folder)
        (day / "part-1.csv").write_text("id\n2\n3\n6\n")
        upload(extracts, lake)
        after = fingerprint(landed(f"{prefix}/orders/{DAYS[0]}/"))
        assert (after.files, after.size) == (2, 5 + 9) and after.digest != before.digest


# -- who can reach the lake (issue 46, point 8) --------------------------------------------------------------


def _listening_sockets(group: int) -> tuple[list[int], list[str]]:
    """Every TCP port and Unix socket the processes of ``group`` listen on, from /proc (not the ports the
    project recorded: what the kernel says those processes hold)."""
    inodes = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != group:
                continue
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # a process that ended meanwhile
            continue
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].split(":")
                assert address in ("0100007F", "00000000000000000000000001000000"), f"port {int(port, 16)} listens beyond loopback"
                ports.append(int(port, 16))
    unix = sorted({f[7] for f in (line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]) if f[6] in inodes and len(f) > 7})
    return sorted(set(ports)), unix


def _answers_unsigned(port: int, bucket: str) -> list[str]:
    """What an unsigned client got from ``port``: each request (plain HTTP, TLS without a client certificate,
    plain gRPC) that was answered with success. Empty: every one was refused."""
    import http.client
    import ssl

    import grpc

    answered = []
    requests = [
        ("GET", "/dir/assign"), ("GET", "/dir/lookup?volumeId=1"), ("GET", "/1,01"), ("GET", "/vol/status"),
        ("GET", f"/buckets/{bucket}/warehouse/probe.txt"), ("GET", f"/{bucket}/warehouse/probe.txt"),
        ("PUT", f"/buckets/{bucket}/warehouse/intruder.txt"), ("DELETE", f"/buckets/{bucket}/warehouse/probe.txt"),
        ("GET", "/v1/namespaces"), ("GET", "/metrics"), ("GET", "/"),
    ]  # fmt: skip
    no_client_certificate = ssl.create_default_context()
    no_client_certificate.check_hostname, no_client_certificate.verify_mode = False, ssl.CERT_NONE
    for scheme, connect in (("http", lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=5)),
                            ("https", lambda: http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=no_client_certificate))):  # fmt: skip
        for method, path in requests:
            connection = connect()
            try:
                connection.request(method, path, body=b"intruder" if method == "PUT" else None)
                response = connection.getresponse()
                if response.status < 300:
                    answered.append(f"{scheme} {method} {path}: {response.status} {response.read(200)!r}")
            except (OSError, http.client.HTTPException):  # refused: TLS wanted, a certificate wanted, not HTTP
                pass
            finally:
                connection.close()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # any method: a server that answers at all was reached
        for method in ("/master_pb.Seaweed/GetMasterConfiguration", "/filer_pb.SeaweedFiler/GetFilerConfiguration"):
            try:
                channel.unary_unary(method)(b"", timeout=5)
                answered.append(f"grpc {method}: OK")
            except grpc.RpcError as error:
                if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    answered.append(f"grpc {method}: reached ({error.code().name})")
    return answered


def test_every_port_of_the_lake_refuses_an_unsigned_client_while_signed_s3_and_the_catalog_work(lake):
    """Any local user can connect to loopback: every server of the lake must need its keys or its certificate."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    from cdc_assets.engines import lake_server

    signed = boto3.client("s3", endpoint_url=lake.s3_endpoint, region_name="us-east-1")
    signed.put_object(Bucket=lake.records_bucket, Key="warehouse/probe.txt", Body=b"the lake's own")
    ports, unix_sockets = _listening_sockets(lake.pid)
    assert {lake.s3_port, lake.catalog_port} < set(ports) and len(ports) >= 8, ports  # master, volume, filer, admin and gRPC
    answered = {port: _answers_unsigned(port, lake.records_bucket) for port in ports}
    assert {port: what for port, what in answered.items() if what} == {}
    with pytest.raises(Exception, match="AccessDenied|403"):
        boto3.client("s3", endpoint_url=lake.s3_endpoint, region_name="us-east-1", config=Config(signature_version=UNSIGNED)).get_object(
            Bucket=lake.records_bucket, Key="warehouse/probe.txt"
        )
    # Nothing an unsigned client sent took: the object is as written, no intruder's object, and signed clients work.
    assert signed.get_object(Bucket=lake.records_bucket, Key="warehouse/probe.txt")["Body"].read() == b"the lake's own"
    assert "Contents" not in signed.list_objects_v2(Bucket=lake.records_bucket, Prefix="warehouse/intruder")
    assert lake_server._list_namespaces(lake, os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == []
    # The Unix sockets it opens (in /tmp, where anyone may look) take connections from their owner only.
    assert unix_sockets and all(path.startswith("/") for path in unix_sockets)
    assert {path: oct(os.stat(path).st_mode & 0o777) for path in unix_sockets if os.stat(path).st_mode & 0o077} == {}
    # Its folder, data and records (the ports file too) are the owner's alone: every folder 0700 (so nothing in it
    # is reached by another user, whatever its mode: weed writes a volume's .vif 0644 whatever the umask), and
    # every file of data, keys and ports 0600.
    folders = [lake.state_dir, *(path for path in lake.state_dir.rglob("*") if path.is_dir())]
    assert [path for path in folders if os.stat(path).st_mode & 0o077] == []
    held = [path for path in lake.state_dir.rglob("*") if path.is_file() and path.suffix != ".vif"]
    assert len(held) > 10 and any(path.suffix == ".dat" for path in held)
    assert [path for path in held if os.stat(path).st_mode & 0o077] == []
    assert os.environ["AWS_SECRET_ACCESS_KEY"].encode() not in (lake.state_dir / "security.toml").read_bytes()


# -- an erase leaves no byte on the lake's disk (issue 46, point 6) ------------------------------------------


def _files_holding(folder: Path, needle: bytes) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file() and not path.is_symlink() and needle in path.read_bytes())


def test_an_erase_on_the_lake_leaves_the_erased_value_in_no_file_of_the_lakes_data_folder(spark, tmp_path, monkeypatch, lake):
    import secrets

    value = f"erasable-{secrets.token_hex(12)}"
    extracts, configs = tmp_path / "extracts", tmp_path / "configs"
    (extracts / "full").mkdir(parents=True)
    (extracts / "full" / f"{DAYS[0]}.csv").write_text(f"id,name,amount\n1,kept-one,1.00\n2,{value},2.00\n3,kept-three,3.00\n")
    config = _config(configs, "full")
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    keys = tmp_path / "keys.csv"
    keys.write_text("id\n2\n")
    data = lake.state_dir / "data"
    (tmp_path / "home").mkdir()
    # The extract stays local (the erase is not its owner's deletion of it): the lake holds only what the runs wrote.
    variables = {**lake_variables(lake), "CDC_DATA_ROOT": str(extracts)}
    with pointed_at(monkeypatch, variables), DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        assert all(result.success for result in run_dates(definitions_for(config), DAYS[:1], instance))
        held = _files_holding(data, value.encode())
        assert any(path.endswith(".dat") for path in held), f"before the erase, a volume file holds the value: {held}"
        assert _erase(config, keys) == 0
        assert _files_holding(data, value.encode()) == [], "after the erase, no file of the lake's disk holds the value"
        on_lake = WarehouseStorage(lake_variables(lake)["CDC_WAREHOUSE"])
        assert [row[0] for row in _rows(on_lake, spark, config.name, CURRENT, DAYS[0])] == [1, 3]
        assert [request["status"] for request in on_lake.erasure_requests(config.name)] == ["complete"]


def test_compacting_refuses_a_versioned_bucket_naming_it_and_vacuums_the_lake_otherwise(lake, monkeypatch):
    """A versioned bucket keeps what an erase deleted as noncurrent versions: the erase must not be recorded complete."""
    import boto3

    from resources.storage.object_store import ObjectStore, VersionedBucketError, compact_deleted_objects

    client = boto3.client("s3", endpoint_url=lake.s3_endpoint, region_name="us-east-1")
    versioned = f"versioned-{lake.records_bucket}"
    client.create_bucket(Bucket=versioned)
    client.put_bucket_versioning(Bucket=versioned, VersioningConfiguration={"Status": "Enabled"})
    client.put_object(Bucket=versioned, Key="t/data.parquet", Body=b"an old version")
    client.delete_object(Bucket=versioned, Key="t/data.parquet")
    assert len(client.list_object_versions(Bucket=versioned, Prefix="t/").get("Versions", [])) == 1, "the old version stays"
    store = ObjectStore(endpoint=lake.s3_endpoint)
    monkeypatch.setenv("CDC_LAKE_SERVER_DIR", str(lake.state_dir))
    with pytest.raises(VersionedBucketError, match=f"bucket {versioned} has versioning enabled.*run the erase again"):
        compact_deleted_objects(store, [f"s3://{lake.records_bucket}/warehouse", f"s3://{versioned}/t"])
    client.put_object(Bucket=lake.records_bucket, Key="warehouse/gone.bin", Body=os.urandom(4096))
    client.delete_object(Bucket=lake.records_bucket, Key="warehouse/gone.bin")
    assert compact_deleted_objects(store, [f"s3://{lake.records_bucket}/warehouse", "/a/local/folder"]) >= 4096
    assert compact_deleted_objects(store, ["/a/local/folder"]) == 0, "a local warehouse: nothing to ask"
