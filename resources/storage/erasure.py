"""The erasure ledger and what makes an erase final: per table, one folder per erase request under ``_erasures``.

A request's folder holds the erased keys' hashes (``key_hashes/``, Parquet, written by Spark: no key
value, however many keys) and ``request.json``: when, who (process or run), why, and the partitions
the erase rewrote with the rows it removed. ``request.json`` is written last and replaced atomically
as the erase goes on, so a request without it is one whose erase was killed before it began, and the
intake applies every request that has it (``status`` "erasing" or "complete"): a key being erased is
already erased for the runs that follow.

An erase is final when it commits: the versions its commits replaced are deleted at once, not after
the readers' grace period (:func:`purge_replaced_versions`), since they hold the keys.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from pyspark.sql import DataFrame

from resources.storage.files import delete, fsync_folder, list_names
from resources.storage.layout import WarehouseLayout
from resources.storage.retention import sweep_retired

REQUEST_FILE = "request.json"
KEY_HASHES_FOLDER = "key_hashes"


def new_request_id(fingerprint: str) -> str:
    """A request's folder name: when it began (sorting by time), and which keys (the set's fingerprint)."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{fingerprint[:16]}"


def requests(layout: WarehouseLayout, table: str) -> list[dict]:
    """Every recorded erase request of ``table``, oldest first, each with its ``request_id`` and ``key_hashes`` folder."""
    found = []
    for request_id in sorted(list_names(layout.erasures_path(table))):
        folder = layout.erasures_path(table, request_id)
        try:
            with open(f"{folder}/{REQUEST_FILE}", encoding="utf-8") as stream:
                record = json.load(stream)
        except FileNotFoundError:
            continue  # killed before its record was written: it erased nothing
        found.append({**record, "request_id": request_id, "key_hashes": f"{folder}/{KEY_HASHES_FOLDER}"})
    return found


def store_key_hashes(hashes: DataFrame, layout: WarehouseLayout, table: str, request_id: str) -> str:
    """Write the request's key hashes (one ``key_hash`` column) into its folder; returns the folder.

    Written beside and renamed in, so a ``key_hashes`` folder is always whole. A folder left by a
    killed attempt is replaced.
    """
    folder = layout.erasures_path(table, request_id)
    final, staged = f"{folder}/{KEY_HASHES_FOLDER}", f"{folder}/.{KEY_HASHES_FOLDER}.staged"
    delete(staged)
    hashes.coalesce(1).write.parquet(staged)
    delete(final)
    os.rename(staged, final)
    fsync_folder(folder)
    return final


def write_request(layout: WarehouseLayout, table: str, request_id: str, record: dict) -> None:
    """Write (or replace) the request's record atomically: a reader sees the old one or the new one."""
    folder = layout.erasures_path(table, request_id)
    os.makedirs(folder, exist_ok=True)
    hidden = f"{folder}/.{REQUEST_FILE}.tmp"
    with open(hidden, "w", encoding="utf-8") as stream:
        json.dump(record, stream, indent=2, sort_keys=True)
        stream.write("\n")
        stream.flush()
        os.fsync(stream.fileno())
    os.rename(hidden, f"{folder}/{REQUEST_FILE}")
    fsync_folder(folder)


def discard_unrecorded(layout: WarehouseLayout, table: str) -> None:
    """Delete request folders a killed erase left without a record (they hold hashes only, and applied nothing)."""
    for request_id in list_names(layout.erasures_path(table)):
        folder = layout.erasures_path(table, request_id)
        if not os.path.exists(f"{folder}/{REQUEST_FILE}"):
            delete(folder)


def purge_replaced_versions(layout: WarehouseLayout, table: str) -> None:
    """Delete every retired version of ``table`` now (replaced by a commit, or dropped by retention),
    whatever the grace period: after an erase no stored file may hold the erased keys. A reader still
    reading a replaced version fails and reads again. Only the holder of the table's lock calls this."""
    sweep_retired(layout, table, grace=0.0)


def version_folders(layout: WarehouseLayout, table: str) -> list[tuple[str, str, str, bool]]:
    """Every stored version of every asset of ``table``, current or not, as (asset, date, folder, current),
    and folders a killed write left under ``_staging`` as (asset, "", folder, False): what a verification
    scans, since a key must be gone from all of them."""
    found = []
    for folder, current, names in layout.dated_version_folders(table):
        asset = os.path.basename(os.path.dirname(folder))
        day = os.path.basename(folder).split("=", 1)[1]
        for name in names:
            path = f"{folder}/{name}"
            if os.path.isdir(path):
                found.append((asset, day, path, path == current))
    for asset in list_names(layout.table_path(table)):
        if asset.startswith(("_", ".")):
            continue
        for dated in list_names(layout.asset_path(table, asset)):
            path = f"{layout.asset_path(table, asset)}/{dated}"
            if not os.path.islink(path) and os.path.isdir(path):  # a real folder an earlier release wrote
                found.append((asset, dated.split("=", 1)[-1], path, True))
    for asset in list_names(layout.staging_path(table)):
        for name in list_names(layout.staging_path(table, asset)):
            found.append((asset, "", f"{layout.staging_path(table, asset)}/{name}", False))
    return found
