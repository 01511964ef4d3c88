"""The Trino reader's setup without a server (cdc_assets/cli/trino_server.py): the files it generates listen on
loopback only and refuse writes, a warehouse it cannot serve is named, and the Java it needs is found or named.
The server itself: tests/test_trino.py."""

from __future__ import annotations

import pytest

from cdc_assets.model import settings
from cdc_assets.cli.trino_server import TrinoSetupError, catalog_properties, java_home, server_files


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_the_server_listens_on_loopback_and_its_catalog_is_the_warehouses_read_only(tmp_path):
    files = server_files(18080, tmp_path / "state", str(tmp_path / "warehouse"))
    node, config = _properties(files["node.properties"]), _properties(files["config.properties"])
    assert node["node.bind-ip"] == node["node.internal-address"] == "127.0.0.1"
    assert config["http-server.http.port"] == "18080" and config["discovery.uri"] == "http://127.0.0.1:18080"
    catalog = _properties(files["catalog/lake.properties"])
    assert catalog["iceberg.security"] == "read_only"
    assert catalog["iceberg.jdbc-catalog.connection-url"] == f"jdbc:sqlite:{tmp_path / 'warehouse' / 'lake_catalog.db'}"
    assert catalog["iceberg.jdbc-catalog.catalog-name"] == "lake"  # the name the project's catalog has in the file
    keys = [key for name, text in files.items() if name.endswith(".properties") for key in _properties(text)]
    assert len(keys) > 15 and not any("secret" in key or "password" in key or "key" in key for key in keys), keys


def test_a_warehouse_behind_a_rest_catalog_is_named_not_served():
    with pytest.raises(TrinoSetupError, match="s3://cdc/warehouse is in object storage"):
        catalog_properties("s3://cdc/warehouse")


def _jdk(folder, version: str):
    folder.mkdir(parents=True)
    (folder / "release").write_text(f'JAVA_VERSION="{version}"\n')
    return folder


def test_java_home_takes_the_configured_jdk_only_when_it_is_new_enough(tmp_path, monkeypatch):
    monkeypatch.setenv(settings.TRINO_JAVA_HOME.name, str(_jdk(tmp_path / "jdk25", "25.0.1")))
    assert java_home() == tmp_path / "jdk25"
    monkeypatch.setenv(settings.TRINO_JAVA_HOME.name, str(_jdk(tmp_path / "jdk17", "17.0.15")))
    with pytest.raises(TrinoSetupError, match=f"needs Java 24 or later and {settings.TRINO_JAVA_HOME.name}=.*jdk17 is"):
        java_home()
