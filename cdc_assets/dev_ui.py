"""``make ui``: ``dagster dev`` with every table's pool in place, and Ctrl-C and SIGTERM working however it
was started.

Pools. Each table's runs share the pool ``cdc_<table>`` (limit 1 from instance/dagster.yaml). Dagster
1.13.27 creates a pool's limit row on the daemon's first pass over it, after it has read the known
pools, so two queued runs of a table the instance has never seen could start together (found by
benchmarks/bench_many_tables.py). Creating each table's limit before the daemon starts closes that gap;
a limit someone already set (``dagster instance concurrency set``) is left as it is.

Signals. A shell script that starts ``make ui &`` hands it SIGINT ignored (POSIX: a non-interactive
shell's background jobs ignore SIGINT and SIGQUIT). An ignored SIGINT survives ``exec``, so ``dagster dev``
would inherit it, and because it maps SIGTERM onto whatever SIGINT does, it then ignores SIGTERM too:
neither Ctrl-C, ``kill <pid>``, nor the SIGTERM that make passes on to its recipe would stop it. This
module resets both signals to their defaults and then becomes ``dagster dev`` (same pid, so make's
SIGTERM reaches it), which installs its own handlers and shuts its webserver, daemon and code servers
down.

    python -m cdc_assets.dev_ui [dagster dev arguments]
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster import DagsterInstance


def create_table_pools(instance: DagsterInstance | None = None) -> list[str]:
    """Each configured table's pool limit at the instance default, unless it exists; the pools created.

    ``instance`` defaults to ``DagsterInstance.get()`` (``DAGSTER_HOME``); the tables are those of
    ``CDC_TABLE_CONFIGS``.

    Nothing here may keep the UI from starting: a table config that does not load is reported by the
    code location in the UI itself, and an instance without pool support just has no pools to create.
    """
    from cdc_assets.config import TableConfigError, load_table_configs
    from cdc_assets.names import pool_name

    try:
        configs = load_table_configs()
    except TableConfigError as error:
        print(f"dev_ui: no table pools created, the table configs do not load: {error}", file=sys.stderr)
        return []
    pools = [pool_name(config) for config in configs]
    if instance is None:
        from dagster import DagsterInstance

        with DagsterInstance.get() as owned:
            return _create_missing_pools(owned, pools)
    return _create_missing_pools(instance, pools)


def _create_missing_pools(instance: DagsterInstance, pools: list[str]) -> list[str]:
    storage = instance.event_log_storage
    known = storage.get_concurrency_keys()
    return [pool for pool in pools if pool not in known and storage.initialize_concurrency_limit_to_default(pool)]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    created = create_table_pools()
    if created:
        print(f"dev_ui: created pool limits for {', '.join(created)}", file=sys.stderr, flush=True)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    dagster = Path(sys.executable).parent / "dagster"
    os.execv(str(dagster), [str(dagster), "dev", *args])


if __name__ == "__main__":
    main()
