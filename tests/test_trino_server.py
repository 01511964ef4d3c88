"""The Trino reader's setup without a server (cdc_assets/cli/trino_server.py): the files it generates listen on
loopback only and refuse writes, a warehouse it cannot serve is named, and the Java it needs is found or named.
The server itself: tests/test_trino.py."""

from __future__ import annotations

import pytest

from cdc_assets.model import settings
from cdc_assets.cli.trino_server import TrinoSetupError, catalog_properties, java_home, server_files
from resources.storage.lake import LakeCatalog
from resources.storage.object_store import ObjectStore


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_the_server_listens_on_loopback_and_its_catalog_is_the_warehouses_read_only(tmp_path):
    files = server_files(18080, tmp_path / "state", LakeCatalog(root=str(tmp_path / "warehouse")))
    node, config = _properties(files["node.properties"]), _properties(files["config.properties"])
    assert node["node.bind-ip"] == node["node.internal-address"] == "127.0.0.1"
    assert config["http-server.http.port"] == "18080" and config["discovery.uri"] == "http://127.0.0.1:18080"
    catalog = _properties(files["catalog/lake.properties"])
    assert catalog["iceberg.security"] == "read_only"
    assert catalog["iceberg.jdbc-catalog.connection-url"] == f"jdbc:sqlite:{tmp_path / 'warehouse' / 'lake_catalog.db'}"
    assert catalog["iceberg.jdbc-catalog.catalog-name"] == "lake"  # the name the project's catalog has in the file
    keys = [key for name, text in files.items() if name.endswith(".properties") for key in _properties(text)]
    assert len(keys) > 15 and not any("secret" in key or "password" in key or "key" in key for key in keys), keys


def _lake() -> LakeCatalog:
    store = ObjectStore(endpoint="http://127.0.0.1:18333", region="us-east-1")
    return LakeCatalog(root="s3://cdc/warehouse", uri="http://127.0.0.1:18181", warehouse="s3://lake", signing_name="s3tables", store=store)


def test_a_lakes_rest_catalog_is_signed_read_only_and_its_keys_are_environment_references(monkeypatch):
    monkeypatch.setenv(settings.ACCESS_KEY.name, "the-key-id")
    monkeypatch.setenv(settings.SECRET_KEY.name, "the-secret-value")
    catalog = catalog_properties(_lake())
    assert catalog["iceberg.catalog.type"] == "rest" and catalog["iceberg.security"] == "read_only"
    assert (catalog["iceberg.rest-catalog.uri"], catalog["iceberg.rest-catalog.warehouse"]) == ("http://127.0.0.1:18181", "s3://lake")
    assert (catalog["iceberg.rest-catalog.sigv4-enabled"], catalog["iceberg.rest-catalog.signing-name"]) == ("true", "s3tables")
    assert (catalog["s3.endpoint"], catalog["s3.path-style-access"], catalog["s3.region"]) == ("http://127.0.0.1:18333", "true", "us-east-1")
    assert catalog["s3.aws-access-key"] == "${ENV:AWS_ACCESS_KEY_ID}" and catalog["s3.aws-secret-key"] == "${ENV:AWS_SECRET_ACCESS_KEY}"
    assert not any("the-key-id" in value or "the-secret-value" in value for value in catalog.values())


def test_a_lake_without_keys_in_the_environment_is_named(monkeypatch):
    monkeypatch.delenv(settings.SECRET_KEY.name, raising=False)
    with pytest.raises(TrinoSetupError, match=f"needs the lake's keys in {settings.SECRET_KEY.name}"):
        catalog_properties(_lake())


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
