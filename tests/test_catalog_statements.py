"""The SQL catalog's sync statements, names and lock, without starting a metastore (tests/test_catalog.py does)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc_assets.usecases.catalog_ddl import catalog_database, catalog_dir, sync_statements
from cdc_assets.cli.sql_server import CatalogBusy, hold_catalog, transient_rejection
from cdc_assets.model.config import load_table_config
from resources.storage import WarehouseStorage

REPO = Path(__file__).resolve().parent.parent


def _store(spark, storage: WarehouseStorage, table: str, asset: str, day: str) -> None:
    storage.write(spark.createDataFrame([("a",)], "key_hash string"), table, asset, [day])
    storage.release()


def test_sync_defines_views_over_the_lake_tables_of_what_is_stored_and_drops_what_is_not(spark, tmp_path, monkeypatch):
    monkeypatch.delenv("CDC_CATALOG_DIR", raising=False)
    root = tmp_path / "ware'house"  # a quote in the path must stay inside the SQL string literal
    storage = WarehouseStorage(str(root))
    _store(spark, storage, "orders", "current_table", "2024-01-01")
    _store(spark, storage, "orders", "history_partition", "2024-01-01")
    configs = [load_table_config(REPO / "table_configs" / f"{name}.yaml") for name in ("orders", "accounts")]
    statements = sync_statements(configs, storage, "cdc")

    creates = [statement for statement in statements if statement.startswith("CREATE")]
    assert creates[0] == f"CREATE DATABASE IF NOT EXISTS `cdc` LOCATION '{tmp_path}/ware\\'house/_catalog/cdc.db'"
    # Views only, none an external table over the data folders (they hold replaced snapshots' files too).
    assert [re.match(r"CREATE (TABLE|OR REPLACE VIEW) (`cdc`\.`\w+`)", statement).groups() for statement in creates[1:]] == [
        ("OR REPLACE VIEW", "`cdc`.`orders_current`"), ("OR REPLACE VIEW", "`cdc`.`orders_history`"),
        ("OR REPLACE VIEW", "`cdc`.`orders_latest`"), ("OR REPLACE VIEW", "`cdc`.`orders_scd2`"),
    ]  # fmt: skip
    assert creates[1].endswith("FROM `lake`.`orders`.`current_table`")
    assert creates[2].endswith("FROM `lake`.`orders`.`history_partition`")
    # The configured columns as configured (NULL while the Iceberg table has none of them), then key_hash as stored.
    assert "CAST(NULL AS date) AS `order_date`" in creates[1] and "CAST(`key_hash` AS string) AS `key_hash`" in creates[1]
    assert "LOCATION" not in " ".join(creates[1:])
    assert "max(business_date)" in creates[3] and "LEAD(business_date)" in creates[4]
    # accounts has nothing stored: its views are dropped (a reset warehouse leaves no stale name).
    assert "DROP VIEW IF EXISTS `cdc`.`accounts_current`" in statements
    assert not [statement for statement in creates if "accounts" in statement or "runs_log" in statement]
    assert statements[-1] == "USE `cdc`"
    # Every statement is one line: the sync file has one per line, ;-terminated.
    assert all("\n" not in statement for statement in statements)


def test_database_name_and_catalog_folder_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_CATALOG_DATABASE", "cdc; DROP")
    with pytest.raises(ValueError, match="CDC_CATALOG_DATABASE"):
        catalog_database()
    monkeypatch.setenv("CDC_CATALOG_DATABASE", "lake_sql")
    assert catalog_database() == "lake_sql"

    monkeypatch.delenv("CDC_CATALOG_DIR", raising=False)
    # A file:// warehouse is a local folder (other URIs are refused): the metastore goes beside its tables.
    by_uri = WarehouseStorage(f"file://{tmp_path}/warehouse")
    assert catalog_dir(by_uri) == tmp_path / "warehouse" / "_catalog"
    monkeypatch.setenv("CDC_CATALOG_DIR", str(tmp_path / "catalog"))
    assert catalog_dir(by_uri) == tmp_path / "catalog"


def test_a_second_opener_is_told_who_holds_the_catalog(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from cdc_assets.cli.sql_server import hold_catalog; "
         "hold_catalog(Path(sys.argv[1]), 'the test holder'); print('held', flush=True); time.sleep(60)", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CatalogBusy, match="open in the test holder.*make sql-server"):
            hold_catalog(tmp_path, "this test")
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:  # the lock goes with its holder's process
        try:
            os.close(hold_catalog(tmp_path, "this test"))
            break
        except CatalogBusy:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert (tmp_path / "catalog.lock").read_text() == "this test"


def test_a_batch_runs_again_only_after_a_rejection_that_ran_nothing():
    refused = ("Error: Could not open client transport with JDBC Uri: jdbc:hive2://127.0.0.1:1/cdc: "
               "java.net.ConnectException: Connection refused (state=08S01,code=0)")  # fmt: skip
    lost = "Error: org.apache.hive.service.cli.HiveSQLException: Invalid OperationHandle: OperationHandle [opType=EXECUTE_STATEMENT]"
    missing = "Error: ... [TABLE_OR_VIEW_NOT_FOUND] The table or view `cdc`.`orders_current` cannot be found."
    one, several = ["-S", "-e", "SELECT 1;"], ["-e", "INSERT INTO t VALUES (1); SELECT 1"]
    # Nothing ran when the connection was refused: any batch may run again.
    assert transient_rejection(several, refused) == "Could not open client transport"
    assert transient_rejection(["-f", "batch.sql"], refused) is not None
    # A lost handle: a single statement runs again, several do not (the first may have run).
    assert transient_rejection(one, lost) == "Invalid OperationHandle"
    assert transient_rejection(several, lost) is None
    # A real error is not transient.
    assert transient_rejection(one, missing) is None


def test_a_warehouse_in_a_bucket_needs_a_local_catalog_folder_and_says_which_variable(tmp_path, monkeypatch):
    from resources.storage.lake import LakeCatalog

    root = "s3://records/warehouse"
    storage = WarehouseStorage(root, lake=LakeCatalog(root=root, uri="http://127.0.0.1:1", warehouse="s3://lake"))
    monkeypatch.delenv("CDC_CATALOG_DIR", raising=False)
    with pytest.raises(ValueError, match=r"s3://records/warehouse is in a bucket.*CDC_CATALOG_DIR"):
        catalog_dir(storage)
    monkeypatch.setenv("CDC_CATALOG_DIR", str(tmp_path / "sql-catalog"))
    assert catalog_dir(storage) == tmp_path / "sql-catalog"


def test_the_sql_servers_keys_go_in_its_conf_file_and_not_its_environment(monkeypatch, tmp_path):
    """A warehouse in a bucket: the SQL server's S3 keys are in the conf it reads from its 0600 file, for S3A,
    Iceberg's S3FileIO and the REST catalog's signer; its environment has none, nor CDC_SPARK_CONF."""
    from cdc_assets.cli.sql_server import credentials_conf, server_env, server_state_dir
    from resources.storage.lake import LakeCatalog

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key-id-1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-2")
    monkeypatch.setenv("CDC_SPARK_CONF", '{"spark.hadoop.fs.s3a.secret.key": "secret-3"}')
    monkeypatch.setenv("CDC_S3_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("CDC_CATALOG_URI", "http://127.0.0.1:2")
    monkeypatch.setenv("CDC_CATALOG_WAREHOUSE", "s3://bucket")
    root = "s3://bucket/warehouse"
    conf = credentials_conf(root, LakeCatalog.from_environment(root))
    assert conf["spark.hadoop.fs.s3a.secret.key"] == conf["spark.sql.catalog.lake.s3.secret-access-key"] == "secret-2"
    assert conf["spark.sql.catalog.lake.rest.access-key-id"] == "key-id-1"
    env = server_env()
    assert not {key for key in env if key.startswith("AWS_") or key.startswith("CDC_")}, sorted(env)
    assert not [value for value in env.values() if "secret-" in value]
    monkeypatch.delenv("CDC_CATALOG_URI")
    assert credentials_conf(str(tmp_path), LakeCatalog.from_environment(str(tmp_path))) == {}  # a local warehouse needs none

    # The server's folder: outside the catalog, 0700, and each catalog's own by default.
    monkeypatch.delenv("CDC_SQL_SERVER_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    state = server_state_dir(tmp_path / "warehouse" / "_catalog")
    assert state.is_relative_to(tmp_path / "home" / ".local" / "state") and (state.stat().st_mode & 0o777) == 0o700
    assert server_state_dir(tmp_path / "other" / "_catalog") != state
