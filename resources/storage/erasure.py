"""The erasure ledger and what makes an erase final: per table, one folder per erase request under ``_erasures``.

A request's folder holds the erased keys' hashes (``key_hashes/``, Parquet, written by Spark: no key
value, however many keys) and ``request.json``: when, who (process or run), why, and the partitions
the erase rewrote with the rows it removed. ``request.json`` is written last and replaced atomically
as the erase goes on, so a request without it is one whose erase was killed before it began, and the
intake applies every request that has it (``status`` "erasing", "complete" or "incomplete": erased as
far as it could be, with what is left): a key being erased is already erased for the runs that follow.

Durability: the key hash files and their folders are synced to disk before ``request.json`` first
names them, and ``request.json`` records each file's size and SHA-256 (``key_hash_files``), so a ledger
torn all the same (a key hash file missing, cut short or altered: a disk that lied, a hand that
deleted) is told from a whole one. :func:`requests` marks such a request ``torn`` with what is
wrong, and :func:`torn_ledger_error` says which request it is and how to repair it: the intake stops
with that error rather than run without the request's keys, or fail on a Spark read of a broken file.

An erase is final when it commits and the snapshots that still reference the removed files are expired
and the files deleted (resources/storage/warehouse.py).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from pyspark.sql import DataFrame

from resources.storage.files import Files, delete, fsync_folder, fsync_tree
from resources.storage.layout import WarehouseLayout

REQUEST_FILE = "request.json"
KEY_HASHES_FOLDER = "key_hashes"
# request.json's record of the key hash files as written: {file name: {"bytes": n, "sha256": hex}}.
KEY_HASH_FILES = "key_hash_files"
# A request's record gets this field when its key hashes cannot be trusted: what is wrong with them.
TORN = "torn"
_PARQUET_MAGIC = b"PAR1"  # a Parquet file begins and ends with it: a file cut short has lost its end


class TornLedgerError(RuntimeError):
    """A request of a table's erase ledger whose key hashes are missing or damaged (see :func:`torn_ledger_error`)."""


def new_request_id(fingerprint: str) -> str:
    """A request's folder name: when it began (sorting by time), and which keys (the set's fingerprint)."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{fingerprint[:16]}"


def requests(layout: WarehouseLayout, table: str) -> list[dict]:
    """Every recorded erase request of ``table``, oldest first, each with its ``request_id`` and ``key_hashes``
    folder, and :data:`TORN` (what is wrong) when its record or key hashes are damaged. Reads no Parquet
    with Spark: a few bytes of each key hash file, or all of them where the record has their SHA-256."""
    found, files = [], layout.files
    for request_id in sorted(files.list_names(layout.erasures_path(table))):
        folder = layout.erasures_path(table, request_id)
        try:
            record = json.loads(files.read_bytes(f"{folder}/{REQUEST_FILE}"))
        except FileNotFoundError:
            continue  # killed before its record was written: it erased nothing
        except (ValueError, OSError) as error:  # written atomically, so damaged after the fact
            record = {TORN: f"its {REQUEST_FILE} cannot be read ({error})"}
        paths = {"request_id": request_id, "key_hashes": f"{folder}/{KEY_HASHES_FOLDER}"}
        problem = record.get(TORN) or _key_hashes_problem(files, f"{folder}/{KEY_HASHES_FOLDER}", record.get(KEY_HASH_FILES))
        found.append({**record, **paths, **({TORN: problem} if problem else {})})
    return found


def _key_hashes_problem(files: Files, folder: str, recorded: dict | None) -> str | None:
    """What is wrong with a request's ``key_hashes`` folder, or None when it is whole.

    Checked against the record's sizes and SHA-256 where it has them; a request recorded before they
    were (an earlier release) needs at least one Parquet file, each beginning and ending as one does.
    """
    if not files.is_dir(folder):
        return f"its {KEY_HASHES_FOLDER} folder is missing"
    if recorded is not None:
        for name, written in sorted(recorded.items()):
            path = f"{folder}/{name}"
            if not files.is_file(path):
                return f"{KEY_HASHES_FOLDER}/{name} is missing"
            size = files.size(path)
            if size != written["bytes"]:
                return f"{KEY_HASHES_FOLDER}/{name} holds {size} bytes where {written['bytes']} were written"
            if files.sha256(path) != written["sha256"]:
                return f"{KEY_HASHES_FOLDER}/{name} is not the file that was written (its SHA-256 differs)"
        return None
    names = sorted(name for name in files.list_names(folder) if name.endswith(".parquet"))
    if not names:
        return f"its {KEY_HASHES_FOLDER} folder holds no Parquet file"
    for name in names:
        content = files.read_bytes(f"{folder}/{name}")  # an earlier release's ledger: small files
        head, tail = content[: len(_PARQUET_MAGIC)], content[-len(_PARQUET_MAGIC):]
        if len(content) < 3 * len(_PARQUET_MAGIC) or head != _PARQUET_MAGIC or tail != _PARQUET_MAGIC:
            return f"{KEY_HASHES_FOLDER}/{name} is not a whole Parquet file (cut short?)"
    return None


def torn_ledger_error(layout: WarehouseLayout, table: str, request: dict) -> TornLedgerError:
    """The error for a torn request of ``table``'s ledger: which, what is wrong, and the two ways to repair it."""
    folder = layout.erasures_path(table, request["request_id"])
    return TornLedgerError(
        f"table {table}: the erase ledger's request {folder} is damaged: {request[TORN]}. Its keys cannot be "
        f"told, so no run of {table} goes on (it would bring those keys back). To repair it, run the erase again "
        f"with the same keys file: cdc-erase {table} --keys FILE (it stores the request's key hashes again and "
        "completes it). If the keys file is lost, remove the request's folder: the rows it erased stay erased, "
        "but extracts that bring its keys back are no longer set aside."
    )


def store_key_hashes(hashes: DataFrame, layout: WarehouseLayout, table: str, request_id: str) -> dict[str, dict]:
    """Write the request's key hashes (one ``key_hash`` column) into its folder, durably; returns each
    file's size and SHA-256, for the record (:data:`KEY_HASH_FILES`).

    On a local folder: written beside, synced, and renamed in, so a ``key_hashes`` folder is always
    whole; the rename is synced too, and the request's folder in the ledger's, before this returns: only
    then may a ``request.json`` name them (a power loss must not leave a record of hashes that never
    reached the disk). In a bucket, where there is no rename, Spark writes the folder in place (each object
    is whole once it is there, and durable once acknowledged), and the record's sizes and SHA-256 are what
    tell a whole folder from a torn one. A folder left by a killed attempt is replaced.
    """
    files = layout.files
    folder = layout.erasures_path(table, request_id)
    final = f"{folder}/{KEY_HASHES_FOLDER}"
    if files.remote:
        files.delete(final)
        hashes.coalesce(1).write.parquet(final)
    else:
        staged = f"{folder}/.{KEY_HASHES_FOLDER}.staged"
        delete(staged)
        hashes.coalesce(1).write.parquet(staged)
        fsync_tree(staged)  # Spark's local writes are not synced
        delete(final)
        os.rename(staged, final)
        fsync_folder(folder)
        # The request's folder (and the ledger's, on a table's first erase) are new entries too.
        fsync_folder(layout.erasures_path(table))
        fsync_folder(os.path.dirname(layout.erasures_path(table)))
    return {
        name: {"bytes": files.size(f"{final}/{name}"), "sha256": files.sha256(f"{final}/{name}")}
        for name in sorted(files.list_names(final))
        if name.endswith(".parquet")
    }


def write_request(layout: WarehouseLayout, table: str, request_id: str, record: dict) -> None:
    """Write (or replace) the request's record atomically: a reader sees the old one or the new one."""
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    layout.files.write_atomically(f"{layout.erasures_path(table, request_id)}/{REQUEST_FILE}", text.encode("utf-8"))


def discard_unrecorded(layout: WarehouseLayout, table: str) -> None:
    """Delete request folders a killed erase left without a record (they hold hashes only, and applied nothing)."""
    files = layout.files
    for request_id in files.list_names(layout.erasures_path(table)):
        folder = layout.erasures_path(table, request_id)
        if not files.exists(f"{folder}/{REQUEST_FILE}"):
            files.delete(folder)
