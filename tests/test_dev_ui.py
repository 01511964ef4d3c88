"""``make ui``'s preparation of the instance: every table's pool limit exists before the daemon's first pass
(closing the gap in which two queued runs of a new table could start together), and a limit set by hand
is kept. A real Dagster instance on SQLite in a temp DAGSTER_HOME; no Spark."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from dagster import DagsterInstance

from cdc_assets.cli.dev_ui import create_table_pools
from tests.pipeline import write_table_config

REPO = Path(__file__).resolve().parent.parent


def test_table_pools_are_created_once_and_a_set_limit_is_kept(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    configs = tmp_path / "table_configs"
    for name in ("alpha", "beta", "gamma"):
        write_table_config(configs, name, f"data/{name}/{{date}}/")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))
    with DagsterInstance.get() as instance:
        instance.event_log_storage.set_concurrency_slots("cdc_beta", 3)

    assert create_table_pools() == ["cdc_alpha", "cdc_gamma"]

    with DagsterInstance.get() as instance:
        storage = instance.event_log_storage
        assert {"cdc_alpha", "cdc_beta", "cdc_gamma"} <= storage.get_concurrency_keys()
        limits = {pool: storage.get_concurrency_info(pool).slot_count for pool in ("cdc_alpha", "cdc_beta", "cdc_gamma")}
    # instance/dagster.yaml's default_limit (1) for the new pools; the hand-set 3 untouched.
    assert limits == {"cdc_alpha": 1, "cdc_beta": 3, "cdc_gamma": 1}
    # A second start creates nothing and changes nothing.
    assert create_table_pools() == []
    with DagsterInstance.get() as instance:
        assert instance.event_log_storage.get_concurrency_info("cdc_beta").slot_count == 3


def test_a_config_that_does_not_load_does_not_stop_the_ui(tmp_path, monkeypatch, capsys):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    configs = tmp_path / "table_configs"
    configs.mkdir()
    (configs / "broken.yaml").write_text("name: broken\nstart_date: someday\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))

    assert create_table_pools() == []
    assert "broken.yaml" in capsys.readouterr().err


def test_table_pools_on_an_instance_given_by_the_caller(tmp_path, monkeypatch):
    """benchmarks/many_tables.py prepares each phase's instance the way make ui does."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "instance" / "dagster.yaml", home / "dagster.yaml")
    configs = tmp_path / "table_configs"
    write_table_config(configs, "delta", "data/delta/{date}/")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("CDC_TABLE_CONFIGS", str(configs))

    with DagsterInstance.from_config(str(home)) as instance:
        assert create_table_pools(instance) == ["cdc_delta"]
        assert instance.event_log_storage.get_concurrency_info("cdc_delta").slot_count == 1
        assert create_table_pools(instance) == []


def test_the_shipped_instance_holds_one_run_per_table_and_four_in_all(tmp_path):
    """instance/dagster.yaml, which make ui and make demo copy: the pools' limit and the run queue's size."""
    shutil.copy(REPO / "instance" / "dagster.yaml", tmp_path / "dagster.yaml")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        concurrency = instance.get_concurrency_config()
    assert concurrency.pool_config.default_pool_limit == 1
    assert concurrency.pool_config.pool_granularity.value == "run"
    # Dagster's default is 10 runs: 10 Spark drivers of 4g do not fit the 24 GiB reference machine.
    assert concurrency.run_queue_config.max_concurrent_runs == 4


def test_make_ui_adopts_only_a_server_whose_make_ui_is_gone():
    """A `make ui` killed with SIGKILL leaves its server running; the next one adopts it and stops it at its end,
    but never one that `make spark-server` or a live `make ui` started."""
    from cdc_assets.cli.dev_ui import WarmSpark

    gone = subprocess.Popen(["true"])  # a pid that existed and is gone
    gone.wait()
    assert WarmSpark._orphaned(f"make ui (pid {gone.pid})")
    assert not WarmSpark._orphaned(f"make ui (pid {os.getpid()})")
    assert not WarmSpark._orphaned("make spark-server")
    assert not WarmSpark._orphaned(None)
