"""``cdc-rollback TABLE --to D [--reason TEXT]`` and ``cdc-rollback TABLE --undo``.

Puts every output of the table back to what it stored as of business date D (the dates after it are
removed from every output, kept restorable for ``publish.keep_rolled_back_days``), or undoes the newest
rollback. The table is found by name in the table config folder (``CDC_TABLE_CONFIGS``), the warehouse
in ``CDC_WAREHOUSE``, Spark as for a run. A run writing the table is waited for (``CDC_WRITER_LOCK_TIMEOUT``),
then the rollback fails naming it. With ``DAGSTER_HOME`` set, the Dagster instance there is told (an
observation per partition removed or restored), as the ``<table>_rollback`` job does from the UI.

Exit codes: 0 done (or nothing after D to roll back); 2 a usage error, an unknown table, or a rollback or
undo refused (nothing changed, the reason said); 3 done, but the Dagster instance could not be told.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from datetime import datetime, timezone

from cdc_assets.cli.writer_session import writer_session
from cdc_assets.defs.rollback_job import log_rollback, rollback_observations
from cdc_assets.model.config import TableConfigError
from cdc_assets.model.file_modes import apply_umask
from cdc_assets.usecases.readers import table_config
from cdc_assets.usecases.rollback import describe_rollback, roll_back_table, undo_rollback
from resources.storage import WriterLockTimeout
from resources.storage.rollback import RollbackError, UnfinishedRollbackError


def main(argv: Sequence[str] | None = None) -> int:
    apply_umask()
    parser = argparse.ArgumentParser(
        prog="cdc-rollback",
        description="Put every output of a table back to what it stored as of a business date (the later dates are "
        "removed, kept restorable for publish.keep_rolled_back_days), or undo the newest rollback.",
    )
    parser.add_argument("table", help="table name, as in its config's name field")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--to", metavar="DATE", help="the business date (YYYY-MM-DD) to go back to; the next run continues from it")
    what.add_argument("--undo", action="store_true", help="undo the newest rollback (refused if a later date was run since)")
    parser.add_argument("--reason", default="", help="why (a ticket id), recorded with the rollback; never a key value")
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    try:
        config = table_config(args.table)
    except (ValueError, TableConfigError) as error:
        print(f"cdc-rollback: error: {error}", file=sys.stderr)
        return 2
    found = writer_session("cdc-rollback")
    if found is None:
        return 2
    io_manager, spark = found
    storage = io_manager.storage
    started_at = datetime.now(timezone.utc)
    who = f"cdc-rollback pid {os.getpid()} on {socket.gethostname()} ({os.environ.get('USER', 'unknown user')})"
    try:
        found_record = undo_rollback(spark, storage, config) if args.undo else roll_back_table(spark, storage, config, args.to, args.reason, who)
        if found_record is None:
            print(f"cdc-rollback: {config.name}: no output stores a date after {args.to}: nothing to roll back")
            return 0
        record = found_record
        log_rollback(storage, config, record, args.undo, started_at)
    except (RollbackError, UnfinishedRollbackError, WriterLockTimeout) as error:
        print(f"cdc-rollback: error: {error}", file=sys.stderr)
        return 2
    finally:
        storage.release()
    print(f"cdc-rollback: {describe_rollback(record, undone=args.undo)}")
    if not os.environ.get("DAGSTER_HOME"):
        print("cdc-rollback: DAGSTER_HOME is not set: no Dagster instance was told; the runs log and the table record it")
        return 0
    try:
        from dagster import DagsterInstance

        instance = DagsterInstance.get()
        events = rollback_observations(config, record, args.undo)
        for event in events:
            instance.report_runless_asset_event(event)
    except Exception as error:  # noqa: BLE001 - the rollback is done; what Dagster was not told is said instead
        print(f"cdc-rollback: error: done, but the Dagster instance was not told ({type(error).__name__}: {error})", file=sys.stderr)
        return 3
    print(f"cdc-rollback: told the Dagster instance in {os.environ['DAGSTER_HOME']}: {len(events)} observation(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
