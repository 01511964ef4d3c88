"""The warehouse storage: :class:`WarehouseStorage` and what its callers need, one concern per module.

- ``lake``: the Iceberg catalog (its name, its SQLite file, how Spark and pyiceberg open it);
- ``tables``: each asset as an Iceberg table: writing dates in one commit, reading them, their metadata;
- ``merged``: a state as one table changed by each date's MERGE, with a tag per date (``storage: incremental``);
- ``layout``: the paths of the project's own records and :func:`warehouse_root`, the one reading of ``CDC_WAREHOUSE``;
- ``lock``: the per-table writer lock; ``lease``: the same for a warehouse in a bucket, on any host;
- ``retention``: which dates ``retention.current_days`` / ``staging_days`` drop, and the record of a drop;
- ``reading``: what a reader is told about a date that is not stored;
- ``erasure``: the erase ledger;
- ``rollback``: undo (``cdc-rollback``): a table's outputs back to a date, kept restorable by tags;
- ``files``: the POSIX operations the ledger needs;
- ``fault_injection``: the one test seam, pausing a write so a fault test can kill the run there.
"""

from resources.storage.erasure import TornLedgerError
from resources.storage.layout import (
    DEFAULT_WAREHOUSE,
    LOCK_FILE,
    WAREHOUSE_ENV,
    UnsupportedWarehouseError,
    WarehouseLayout,
    warehouse_location,
    warehouse_root,
)
from resources.storage.lease import DEFAULT_LEASE_SECONDS, LEASE_SECONDS_ENV, WriterLeaseLost
from resources.storage.merged import OPERATION_DATE, StateOrderError
from resources.storage.lock import DEFAULT_LOCK_TIMEOUT_SECONDS, LOCK_TIMEOUT_ENV, WriterLockTimeout
from resources.storage.reading import DroppedPartitionError, MissingPartitionError, StateLayout
from resources.storage.tables import ConcurrentWriteError, as_stored
from resources.storage.warehouse import WarehouseStorage

__all__ = [
    "ConcurrentWriteError",
    "DEFAULT_LOCK_TIMEOUT_SECONDS",
    "DEFAULT_WAREHOUSE",
    "LOCK_FILE",
    "LOCK_TIMEOUT_ENV",
    "DEFAULT_LEASE_SECONDS",
    "LEASE_SECONDS_ENV",
    "WriterLeaseLost",
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
    "warehouse_location",
    "OPERATION_DATE",
    "StateOrderError",
    "warehouse_root",
]
