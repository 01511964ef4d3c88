"""The per-table writer lock: one run at a time writes a table, in this process or any other on the machine.

The lock is an ``flock`` on ``{table}/_writer.lock``: the kernel releases it when the holding process
ends, however it ends, so a killed run's lock is stale the moment it is gone. The file names the holder
(run id, host, pid) for the message of a writer that gives up waiting. Readers never take it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO

from cdc_assets.model import settings
from cdc_assets.core.errors import SummarizedError

LOCK_TIMEOUT_ENV = settings.WRITER_LOCK_TIMEOUT.name
DEFAULT_LOCK_TIMEOUT_SECONDS = float(settings.WRITER_LOCK_TIMEOUT.default)
_log = logging.getLogger(__name__)


class WriterLockTimeout(SummarizedError, RuntimeError):
    """Another run held the table's writer lock for longer than this run was willing to wait."""


@dataclass
class _HeldLock:
    handle: IO[str]  # the open, flock-ed lock file
    path: str
    pid: int  # the process that took it: only that process lets it go


@dataclass
class WriterLocks:
    """The writer locks one run holds, by table; a table's lock is taken once and kept until :meth:`release`."""

    run_id: str
    timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS
    _held: dict[str, _HeldLock] = field(default_factory=dict)

    def holds(self, table: str) -> bool:
        return table in self._held

    def take(self, table: str, path: str) -> None:
        """Lock ``path`` for ``table``, waiting up to ``timeout`` seconds for another holder to let go."""
        import fcntl  # POSIX only, like the rest of the warehouse

        holder = {"run_id": self.run_id, "host": socket.gethostname(), "pid": os.getpid(),
                  "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")  # O_CREAT: created atomically if absent
        deadline = time.monotonic() + self.timeout
        waiting = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    handle.close()
                    raise
            if not waiting and self.timeout > 0:
                waiting = True
                handle.seek(0)
                _log.warning(
                    f"table {table}: waiting for the writer lock held by {handle.read().strip() or 'another run'} "
                    f"(up to {self.timeout:.0f}s, {LOCK_TIMEOUT_ENV})"
                )
            if time.monotonic() >= deadline:
                handle.seek(0)
                current = handle.read().strip() or "unknown"
                handle.close()
                raise WriterLockTimeout(
                    f"table {table}: another run is writing it (writer lock {path} held by {current}); waited "
                    f"{self.timeout:.0f}s ({LOCK_TIMEOUT_ENV}). Wait for that run to finish, or stop it."
                )
            time.sleep(0.5)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder) + "\n")
        handle.flush()
        self._held[table] = _HeldLock(handle=handle, path=path, pid=os.getpid())

    def confirm(self, table: str) -> None:
        """Nothing to check: a held ``flock`` cannot be taken from its holder (a lease can, ``lease.py``)."""

    def release(self) -> None:
        """Give up every lock this process holds.

        The lock file stays: deleting it would let a waiting writer and a new one lock two different
        files. A copy of this object in another process (a fork) releases nothing it did not take.
        """
        for table, held in list(self._held.items()):
            if held.pid == os.getpid():
                held.handle.close()  # closing the file releases the flock
            del self._held[table]
