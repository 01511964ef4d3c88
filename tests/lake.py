"""A lake of the test's own: SeaweedFS serving S3 and an Iceberg REST catalog on free loopback ports, with
buckets of its own names, and the environment that points the project at it (or back at the local default)."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from cdc_assets.engines import lake_server
from cdc_assets.engines.process import free_port
from resources.storage.object_store import ObjectStore

# What points the project at a lake; the local default is all of them unset.
LAKE_VARIABLES = (
    "CDC_WAREHOUSE", "CDC_CATALOG_URI", "CDC_CATALOG_WAREHOUSE", "CDC_CATALOG_SIGNING_NAME", "CDC_S3_ENDPOINT", "CDC_DATA_ROOT", "CDC_CATALOG_DIR",
    "CDC_LAKE_SERVER_DIR",
)  # fmt: skip


def start_lake(state_dir: Path) -> lake_server.LakeHandle:
    """A new lake with the test session's key pair (tests/conftest.py puts it in the environment)."""
    suffix = uuid.uuid4().hex[:8]
    return lake_server.start(
        state_dir, s3_port=free_port(), catalog_port=free_port(), table_bucket=f"lake-{suffix}", records_bucket=f"cdc-{suffix}",
        key_pair=(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]),
    )  # fmt: skip


def lake_variables(handle: lake_server.LakeHandle) -> dict[str, str]:
    """What ``make -s lake-env`` prints for the lake, and the landing prefix of its records bucket as the data root."""
    variables = lake_server.lake_environment(handle)
    assert variables["AWS_SECRET_ACCESS_KEY"] == os.environ["AWS_SECRET_ACCESS_KEY"]
    return {**variables, "CDC_DATA_ROOT": f"s3://{handle.records_bucket}/landing"}


@contextlib.contextmanager
def pointed_at(monkeypatch, variables: dict[str, str] | None):
    """The project pointed at a lake (``variables``), or at the local default (None), inside the block."""
    with monkeypatch.context() as patch:
        for name in LAKE_VARIABLES:
            patch.delenv(name, raising=False)
        for name, value in (variables or {}).items():
            patch.setenv(name, value)
        yield


def upload(local_folder: Path, handle: lake_server.LakeHandle, prefix: str = "landing") -> str:
    """Copy a local folder of extracts into the lake's records bucket; the s3:// prefix it went to."""
    store = ObjectStore(endpoint=f"http://127.0.0.1:{handle.s3_port}")
    target = f"{handle.records_bucket}/{prefix}"
    pafs.copy_files(str(local_folder), target, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=store.filesystem())
    return f"s3://{target}"
