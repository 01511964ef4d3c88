"""``cdc-erase TABLE --keys FILE [--reason TEXT]`` and ``cdc-erase TABLE --verify --keys FILE``.

The table is found by name in the table config folder (``CDC_TABLE_CONFIGS``), the warehouse in
``CDC_WAREHOUSE``, Spark as for a run. With ``DAGSTER_HOME`` set, the Dagster instance there is told
(the erased partitions' materializations and their checks, evaluated again), so the UI shows the
erase; without it, the ledger under the table's ``_erasures`` is the only record.

Exit codes: 0 done and verified (or, with ``--verify``, no stored file holds the keys and nothing that
may hold them went unchecked); 1 the erase is incomplete (what is left is listed, and recorded in the
ledger), or ``--verify`` found files that still hold the keys or records it could not check; 2 a usage
error, an unknown table, or a bad keys file (nothing erased); 3 the erase is done but the Dagster
instance could not be told (what it was not told is listed).

At the end the command says what it did not erase outside the warehouse (:data:`NOT_ERASED`).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence

from dagster import DagsterInstance

from cdc_assets.model.file_modes import apply_umask
from cdc_assets.model.masking import what_dagster_keeps
from cdc_assets.model.config import TableConfigError
from cdc_assets.usecases.readers import table_config
from cdc_assets.core.capture.erasure import KeysFileError
from cdc_assets.usecases.erasure import MAY_HOLD, Verification, erase_keys, verify_erased
from cdc_assets.defs.erasure_events import describe, erasure_check_evaluations, erasure_materializations, not_rechecked, touched_days
from cdc_assets.cli.writer_session import writer_session
from resources.storage.erasure import TORN, torn_ledger_error

# What the erase leaves outside the warehouse, said at the end of every erase (docs/erasure.md, "What holds
# key values"): Dagster's event log keeps what the runs' materializations and logs recorded.
NOT_ERASED = (
    "cdc-erase: not erased (outside the warehouse): the source extracts under the landing path; Dagster's "
    "event log and compute logs in DAGSTER_HOME (what runs recorded, said above), which "
    "Dagster's own tools wipe (dagster asset wipe, deleting the runs); copies made by "
    "consumers (cdc-current, cdc-scd2, cdc-changes outputs, exports); backups and file-system snapshots. "
    "See docs/erasure.md, \"What holds key values\"."
)


def main(argv: Sequence[str] | None = None) -> int:
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
    parser = argparse.ArgumentParser(
        prog="cdc-erase",
        description="Erase keys (a right-to-be-forgotten request) from every stored partition of a table, the data "
        "files of replaced snapshots included, and record it in the table's ledger; or, with --verify, scan every "
        "data file under the table for them.",
    )
    parser.add_argument("table", help="table name, as in its config's name field")
    parser.add_argument(
        "--keys",
        required=True,
        help="CSV file with a header naming the table's key columns, a key per line, each as the extracts hold it "
        "(spaces and case are part of a string key; RFC 4180 quoting)",
    )
    parser.add_argument("--reason", default="", help="why (a ticket or request id), recorded in the ledger; never a key value")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="erase nothing: scan every data file under the table (live or not), by key hash and by key value, and "
        "print where the keys still are",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    try:
        config = table_config(args.table)
        if not os.path.isfile(args.keys):
            raise ValueError(f"keys file {args.keys} does not exist")
    except (ValueError, TableConfigError) as error:
        print(f"cdc-erase: error: {error}", file=sys.stderr)
        return 2
    found = writer_session("cdc-erase")  # where Spark runs: the warm server only if it can serve this
    if found is None:
        return 2
    io_manager, spark = found
    storage = io_manager.storage
    try:
        if args.verify:
            return _report_verification(config.name, verify_erased(spark, storage, config, args.keys))
        who = f"cdc-erase pid {os.getpid()} on {socket.gethostname()} ({os.environ.get('USER', 'unknown user')})"
        result = erase_keys(spark, storage, config, args.keys, args.reason, who)
    except KeysFileError as error:
        print(f"cdc-erase: error: {error}", file=sys.stderr)
        return 2
    finally:
        storage.release()
    print(f"cdc-erase: {describe(config, result)}")
    print(f"cdc-erase: {what_dagster_keeps()}")
    for line in result.left:
        print(f"cdc-erase: left: {line}")
    code = 1 if result.left else 0
    try:
        _tell_dagster(config, io_manager, result)
    except Exception as error:  # noqa: BLE001 - the erase is recorded; what Dagster was not told is said instead
        print(
            f"cdc-erase: error: the erase is recorded in the ledger, but telling the Dagster instance in "
            f"{os.environ.get('DAGSTER_HOME')} failed ({type(error).__name__}: {error}). Left: the materializations "
            f"and check evaluations of {', '.join(touched_days(result)) or 'no date'} were not reported, so the UI "
            "shows these dates' figures as they were before the erase; a run of such a date reports them anew.",
            file=sys.stderr,
        )
        code = code or 3
    # Another request's torn ledger stops every run of the table: say so where the erase is run.
    for request in storage.erasure_requests(config.name):
        if request.get(TORN):
            print(f"cdc-erase: warning: {torn_ledger_error(storage.layout, config.name, request)}", file=sys.stderr)
    print(NOT_ERASED)
    return code


def _report_verification(table: str, found: Verification) -> int:
    if found.passed:
        print(f"cdc-erase: {table}: 0 stored files hold the keys (every data file under the table scanned, live or not)")
        return 0
    if found.unchecked:
        print(f"cdc-erase: {table}: {len(found.unchecked)} stored file(s) hold records that could not be checked ({MAY_HOLD}):")
        for asset, day, path, live, rows in found.unchecked:
            print(f"  {asset} {day or '(undated)'}: {rows} record(s) in {'a live' if live else 'a replaced'} file {path}")
    if not found.holding:
        print(f"cdc-erase: {table}: no stored file holds the keys by key hash or key value, but the records above may hold them")
        return 1
    print(f"cdc-erase: {table}: {len(found.holding)} stored file(s) still hold the keys:")
    for asset, day, path, live, rows in found.holding:
        by_value = found.by_value_only.get(path)
        # A live file is one a table's current snapshot reads; any other is a replaced snapshot's (or a killed write's).
        print(
            f"  {asset} {day or '(undated)'}: {rows} row(s) in {'a live' if live else 'a replaced'} file {path}"
            + (f" ({by_value} of them found by key value only)" if by_value else "")
        )
    if found.by_value_only:
        print(
            "cdc-erase: rows found by key value only hold a key_hash other than the one the intake computes for the "
            "key (stored under an earlier key definition?): an erase, which matches key hashes, does not remove them"
        )
    return 1


def _tell_dagster(config, io_manager, result) -> None:
    """Report the erase to the Dagster instance under ``DAGSTER_HOME``, when there is one."""
    if not os.environ.get("DAGSTER_HOME"):
        print("cdc-erase: DAGSTER_HOME is not set: no Dagster instance was told; the ledger records the erase")
        return
    instance = DagsterInstance.get()
    events = erasure_materializations(instance, config, io_manager.storage, result)
    for event in events:
        instance.report_runless_asset_event(event)
    checks = erasure_check_evaluations(instance, io_manager, config, touched_days(result))
    for check in checks:
        instance.report_runless_asset_event(check)
    failed = [f"{c.asset_key.to_user_string()}:{c.check_name} {c.partition}" for c in checks if not c.passed]
    skipped = not_rechecked(instance, io_manager.storage, config, touched_days(result))
    print(
        f"cdc-erase: told the Dagster instance in {os.environ['DAGSTER_HOME']}: {len(events)} materialization(s), "
        f"{len(checks)} check evaluation(s)" + (f", failing: {', '.join(failed)}" if failed else ", all passed")
        + (f"; their earlier results stand for {'; '.join(f'{d}: {why}' for d, why in sorted(skipped.items()))}"
           if skipped else "")
    )


if __name__ == "__main__":
    sys.exit(main())
