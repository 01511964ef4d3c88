"""The warehouse storage: :class:`WarehouseStorage` and what its callers need, one concern per module.

- ``layout``: every path (partitions, versions, staging, a state's changes, the runs log, the catalog),
  which version a date's pointer names, and :func:`warehouse_root`, the one reading of ``CDC_WAREHOUSE``;
- ``commit``: stage a write, commit each date by swapping its pointer, recover after a kill;
- ``lock``: the per-table writer lock;
- ``retention``: dropping partitions outside ``retention.current_days`` / ``staging_days``, the retired versions' grace period;
- ``reading``: stored dates, a date's current version and its rows (no lock, no write);
- ``files``: the POSIX operations underneath;
- ``fault_injection``: the one test seam, pausing a commit so a fault test can kill the run there.
"""

from resources.storage.commit import as_stored
from resources.storage.erasure import TornLedgerError
from resources.storage.layout import (
    DEFAULT_WAREHOUSE,
    LOCK_FILE,
    VERSION_KEY,
    WAREHOUSE_ENV,
    UnsupportedWarehouseError,
    WarehouseLayout,
    local_warehouse_path,
    state_changes_asset,
    warehouse_root,
)
from resources.storage.lock import DEFAULT_LOCK_TIMEOUT_SECONDS, LOCK_TIMEOUT_ENV, WriterLockTimeout
from resources.storage.reading import DroppedPartitionError, MissingPartitionError, StateLayout, folder_schema
from resources.storage.retention import DEFAULT_RETIRED_GRACE_SECONDS, RETIRED_GRACE_ENV
from resources.storage.warehouse import WarehouseStorage

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_SECONDS",
    "DEFAULT_RETIRED_GRACE_SECONDS",
    "DEFAULT_WAREHOUSE",
    "LOCK_FILE",
    "LOCK_TIMEOUT_ENV",
    "RETIRED_GRACE_ENV",
    "VERSION_KEY",
    "WAREHOUSE_ENV",
    "DroppedPartitionError",
    "MissingPartitionError",
    "StateLayout",
    "TornLedgerError",
    "UnsupportedWarehouseError",
    "WarehouseLayout",
    "WarehouseStorage",
    "WriterLockTimeout",
    "as_stored",
    "folder_schema",
    "local_warehouse_path",
    "state_changes_asset",
    "warehouse_root",
]
