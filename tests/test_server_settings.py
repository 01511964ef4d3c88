"""What a warm Spark server records of the settings it was started with, and the check a run makes against
it (cdc_assets/engines/server_settings.py): no Spark here, the records of real folders. The same check with
real servers, a real lake and real runs is tests/test_warm_server_settings.py's."""

from __future__ import annotations

import stat

from cdc_assets.engines import lake_server, server_settings

LOCAL = {"CDC_WAREHOUSE": "./warehouse", "CDC_SPARK_CONF": '{"spark.sql.shuffle.partitions": "4"}'}
LAKE_KEYS = {"AWS_ACCESS_KEY_ID": "lakekey", "AWS_SECRET_ACCESS_KEY": "lake-secret-value-1234", "AWS_REGION": "us-east-1"}
LAKE = {
    **LOCAL, **LAKE_KEYS, "CDC_WAREHOUSE": "s3://cdc/warehouse", "CDC_CATALOG_URI": "http://127.0.0.1:8181",
    "CDC_S3_ENDPOINT": "http://127.0.0.1:8333",
}  # fmt: skip
URL = "sc://127.0.0.1:15002"


def test_the_record_holds_no_secret_and_is_its_owners_only(tmp_path):
    path = server_settings.record(tmp_path, LAKE)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    for secret in (LAKE_KEYS["AWS_SECRET_ACCESS_KEY"], LAKE_KEYS["AWS_ACCESS_KEY_ID"], "shuffle.partitions"):
        assert secret not in text
    assert server_settings.why_not_served(tmp_path, URL, LAKE) is None  # the same settings: served


def test_a_lake_run_is_not_served_by_a_server_started_without_the_lakes_keys(tmp_path):
    server_settings.record(tmp_path, LOCAL)
    why = server_settings.why_not_served(tmp_path, URL, LAKE)
    assert why is not None
    assert f"the warm server at {URL} serves CDC_WAREHOUSE=./warehouse, this run CDC_WAREHOUSE=s3://cdc/warehouse" in why, why
    assert "AWS_ACCESS_KEY_ID (unset there, set here)" in why and "AWS_SECRET_ACCESS_KEY (unset there, set here)" in why, why
    assert LAKE_KEYS["AWS_SECRET_ACCESS_KEY"] not in why
    # A local run needs no keys of the server: it is served, whatever keys either side has.
    assert server_settings.why_not_served(tmp_path, URL, {**LOCAL, "CDC_WAREHOUSE": "/elsewhere", **LAKE_KEYS}) is None


def test_a_server_started_with_the_lakes_keys_serves_lake_and_local_runs_but_not_other_keys(tmp_path):
    server_settings.record(tmp_path, LAKE)
    assert server_settings.why_not_served(tmp_path, URL, LOCAL) is None
    other = {**LAKE, "AWS_SECRET_ACCESS_KEY": "another-secret-5678"}
    why = server_settings.why_not_served(tmp_path, URL, other)
    assert why is not None and "AWS_SECRET_ACCESS_KEY (another value; not shown)" in why, why
    assert "another-secret-5678" not in why and LAKE_KEYS["AWS_SECRET_ACCESS_KEY"] not in why
    # Extracts in a bucket reach the store as a warehouse there does.
    assert server_settings.reaches_object_store({"CDC_DATA_ROOT": "s3://landing/x"})
    assert not server_settings.reaches_object_store({"CDC_WAREHOUSE": "/tmp/w", "CDC_DATA_ROOT": "/tmp/x"})


def test_the_jvms_own_settings_must_match_for_every_run(tmp_path):
    server_settings.record(tmp_path, LOCAL)
    conf = server_settings.why_not_served(tmp_path, URL, {**LOCAL, "CDC_SPARK_CONF": '{"spark.sql.shuffle.partitions": "8"}'})
    assert conf is not None and "CDC_SPARK_CONF (another value; not shown)" in conf, conf
    unset = server_settings.why_not_served(tmp_path, URL, {"CDC_WAREHOUSE": "./warehouse"})
    assert unset is not None and "CDC_SPARK_CONF (set there, unset here)" in unset, unset
    master = server_settings.why_not_served(tmp_path, URL, {**LOCAL, "CDC_SPARK_MASTER": "spark://127.0.0.1:7077"})
    assert master is not None and "CDC_SPARK_MASTER (unset there, set here)" in master, master
    umask = server_settings.why_not_served(tmp_path, URL, {**LOCAL, "CDC_UMASK": "027"})
    assert umask is not None and "CDC_UMASK (077 there, 027 here)" in umask, umask


def test_a_server_without_a_record_is_not_trusted_with_a_run(tmp_path):
    why = server_settings.why_not_served(tmp_path, URL, LOCAL)
    assert why is not None and "records no settings" in why
    (tmp_path / server_settings.SETTINGS_FILE).write_text("{not json")
    assert server_settings.recorded(tmp_path) is None


def test_lake_env_says_nothing_of_a_server_when_none_runs(tmp_path):
    assert lake_server.warm_server_comment({"CDC_SPARK_SERVER_DIR": str(tmp_path), **LAKE}) is None
