"""The per-table writer lease of a warehouse in a bucket: one run at a time writes a table, on any host.

A bucket has no ``flock``. Its writer lock is an object, ``{root}/{table}/_writer.lease``, created with a
conditional PUT (``If-None-Match: *``: the store refuses the second of two creations, on any host), renewed
by the holder every quarter of its term with a conditional PUT on its own version (``If-Match``), and
deleted the same way when the run ends. Two Dagster instances sharing nothing but the lake therefore keep
out of each other's way as two runs of one machine do (``lock.py``): a date's update spans several Iceberg
tables, and an erase must not run between a date's read of the state and its commit.

A lease nobody renews lapses: it is stale once the store's own clock (its ``Date`` header, so no host's
clock matters) is more than one term past the object's last write. A lease of a process that is gone from
this very machine (same host name, boot and PID namespace; a ``kill -9``) is stale at once. A stale lease is
taken over by a conditional PUT on the version read, so two hosts cannot both take it over.

A holder whose renewal is refused (a pause longer than the term let another run take over) has lost the
table: its next write raises :class:`WriterLeaseLost` before anything more is committed, and Iceberg's
serializable commits (``tables.py``) refuse what it might still try. A holder also fences itself: once its
last successful renewal was sent longer ago than half the term (by its own monotonic clock), whatever kept
the renewals from the store (unreachable, timing out, answering 5xx), it commits nothing more and its next
write raises :class:`WriterLeaseLost` naming the lease (a fenced lease is not renewed again: the run is
over). Another run takes over no sooner than a whole term after that renewal reached the store, so the
other half of the term is the margin for a commit under way and the two clocks' drift. Renewals come
every quarter of the term, a failed one again after a twelfth, and each request gives up within an eighth,
tried once (``ObjectStore.client(within=...)``): a renewal never hangs past the fence. Readers never take
a lease.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from urllib.parse import urlparse

from cdc_assets.model import settings
from cdc_assets.core.errors import SummarizedError
from resources.storage.lock import LOCK_TIMEOUT_ENV, WriterLockTimeout
from resources.storage.object_store import ObjectStore

LEASE_SECONDS_ENV = settings.WRITER_LEASE_SECONDS.name
DEFAULT_LEASE_SECONDS = float(settings.WRITER_LEASE_SECONDS.default)
# A holder commits only while its last successful renewal was sent less than this fraction of the term ago.
FENCE_FRACTION = 0.5
# It renews every quarter of the term, a failed renewal again after a twelfth, and each request of the lease
# (to take, renew or let go of it) gives up within an eighth: a renewal that hangs leaves time for another
# before the fence, and quick failures two or three.
RENEW_FRACTION = 1 / 4
RETRY_FRACTION = 1 / 12
REQUEST_FRACTION = 1 / 8
_log = logging.getLogger(__name__)


class WriterLeaseLost(SummarizedError, RuntimeError):
    """Another run took over this run's writer lease on a table (this run stopped renewing it for a whole term)."""


@lru_cache(maxsize=1)
def machine_identity() -> str:
    """This machine as a process table sees it: host name, boot and PID namespace. Two holders of the same
    identity see each other's PIDs, so one may tell that the other's process is gone."""

    def read(path: str, link: bool = False) -> str:
        try:
            return os.readlink(path) if link else open(path, encoding="ascii").read().strip()
        except OSError:
            return "?"

    return f"{socket.gethostname()}/{read('/proc/sys/kernel/random/boot_id')}/{read('/proc/self/ns/pid', link=True)}"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


@dataclass
class _HeldLease:
    bucket: str
    key: str
    etag: str
    pid: int  # the process that took it: only that process renews it and lets it go
    renewed_at: float  # time.monotonic() when the last request that wrote it successfully was sent
    lost: str = ""  # why the lease is no longer this run's (taken over, or fenced); empty while it is
    taken_over: bool = False  # a renewal was refused: the object is another run's now


@dataclass
class WriterLeases:
    """The writer leases one run holds, by table; the same duties as ``lock.WriterLocks`` for a bucket."""

    run_id: str
    store: ObjectStore
    timeout: float
    term: float = DEFAULT_LEASE_SECONDS
    _held: dict[str, _HeldLease] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _renewer: threading.Thread | None = None
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.term >= 3:  # renewed every quarter, each request bounded to an eighth: a shorter term leaves a request too little time
            raise ValueError(f"writer_lease_seconds={self.term:g} ({LEASE_SECONDS_ENV}): expected at least 3 seconds")

    @property
    def fence_seconds(self) -> float:
        """How long after its last successful renewal was sent a holder stops committing."""
        return self.term * FENCE_FRACTION

    def _client(self):
        return self.store.client(within=self.term * REQUEST_FRACTION)

    def holds(self, table: str) -> bool:
        return table in self._held

    def take(self, table: str, path: str) -> None:
        """Hold the lease at ``path`` (``s3://bucket/key``) for ``table``, waiting up to ``timeout`` seconds."""
        from botocore.exceptions import ClientError

        parsed = urlparse(path)
        bucket, key = parsed.netloc, parsed.path.lstrip("/")
        client = self._client()
        deadline = time.monotonic() + self.timeout
        waiting = False
        while True:
            body = self._holder_record()
            sent = time.monotonic()
            try:
                etag = client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*", ContentType="application/json")["ETag"]
                break
            except ClientError as error:
                if not _refused(error):
                    raise
            holder, holder_etag, stale = self._current(client, bucket, key)
            if holder_etag is None:
                continue  # let go between the two requests: try again at once
            if stale:
                sent = time.monotonic()
                try:
                    etag = client.put_object(Bucket=bucket, Key=key, Body=body, IfMatch=holder_etag, ContentType="application/json")["ETag"]
                    _log.warning(f"table {table}: took over the stale writer lease {path} of {_describe(holder)}")
                    break
                except ClientError as error:
                    if not _refused(error):
                        raise
                    continue  # another run took it over first, or the holder renewed it
            if not waiting and self.timeout > 0:
                waiting = True
                _log.warning(
                    f"table {table}: waiting for the writer lease {path} held by {_describe(holder)} "
                    f"(up to {self.timeout:.0f}s, {LOCK_TIMEOUT_ENV})"
                )
            if time.monotonic() >= deadline:
                raise WriterLockTimeout(
                    f"table {table}: another run is writing it (writer lease {path} held by {_describe(holder)}); waited "
                    f"{self.timeout:.0f}s ({LOCK_TIMEOUT_ENV}). Wait for that run to finish, or stop it: its lease "
                    f"lapses {self.term:.0f}s after its last renewal ({LEASE_SECONDS_ENV})."
                )
            time.sleep(0.5)
        with self._guard:
            self._held[table] = _HeldLease(bucket=bucket, key=key, etag=etag, pid=os.getpid(), renewed_at=sent)
        self._start_renewing()

    def confirm(self, table: str) -> None:
        """Raise :class:`WriterLeaseLost` if the table's lease was taken over since this run took it, or if its
        last successful renewal was sent more than :attr:`fence_seconds` ago (it may be taken over soon)."""
        held = self._held.get(table)
        if held is None:
            return
        if not held.lost:
            age = time.monotonic() - held.renewed_at
            if age > self.fence_seconds:
                held.lost = (
                    f"its last successful renewal was sent {age:.1f}s ago, past its fence of {self.fence_seconds:.1f}s "
                    f"(half its {self.term:g}s term, {LEASE_SECONDS_ENV}): the store did not answer its renewals, and "
                    "another run may take it over a term after the last one"
                )
                _log.error(f"table {table}: fenced the writer lease s3://{held.bucket}/{held.key}; {held.lost}")
        if held.lost:
            raise WriterLeaseLost(
                f"table {table}: this run's writer lease s3://{held.bucket}/{held.key} is no longer its own ({held.lost}); "
                "nothing more is committed. Run the date again once the other run is done."
            )

    def release(self) -> None:
        """Let go of every lease this process holds (a copy in a forked process lets go of nothing)."""
        from botocore.exceptions import ClientError

        self._stop.set()
        if self._renewer is not None and self._renewer.is_alive() and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=10)
        self._renewer = None
        with self._guard:
            held_leases, self._held = dict(self._held), {}
        for table, held in held_leases.items():
            if held.pid != os.getpid() or held.taken_over:
                continue
            try:  # on its own version only: a lease another run took over (or a fenced one since) stays that run's
                self._client().delete_object(Bucket=held.bucket, Key=held.key, IfMatch=held.etag)
            except ClientError as error:
                if not _refused(error) and _status(error) != 404:
                    _log.warning(f"table {table}: could not delete the writer lease s3://{held.bucket}/{held.key}: {error}")
            except Exception as error:  # noqa: BLE001 — the store unreachable: the lease lapses a term after its last renewal
                _log.warning(f"table {table}: could not delete the writer lease s3://{held.bucket}/{held.key}; it lapses on its own: {error}")

    # -- internals -----------------------------------------------------------------------------------------------
    def _holder_record(self) -> bytes:
        return json.dumps({
            "run_id": self.run_id, "host": socket.gethostname(), "pid": os.getpid(), "machine": machine_identity(),
            "renewed": datetime.now(timezone.utc).isoformat(timespec="seconds"), "term_seconds": self.term,
        }).encode("utf-8")  # fmt: skip

    def _current(self, client, bucket: str, key: str) -> tuple[dict, str | None, bool]:
        """The lease's holder, version (None: there is none now) and whether it is stale."""
        from botocore.exceptions import ClientError

        try:
            response = client.get_object(Bucket=bucket, Key=key)
        except ClientError as error:
            if _status(error) == 404:
                return {}, None, False
            raise
        try:
            holder = json.loads(response["Body"].read())
        except ValueError:
            holder = {}
        server_now = email.utils.parsedate_to_datetime(response["ResponseMetadata"]["HTTPHeaders"]["date"])
        age = (server_now - response["LastModified"]).total_seconds()
        term = float(holder.get("term_seconds") or self.term)
        gone_here = holder.get("machine") == machine_identity() and isinstance(holder.get("pid"), int) and _process_gone(holder["pid"])
        return holder, response["ETag"], age > term or gone_here

    def _start_renewing(self) -> None:
        if self._renewer is not None and self._renewer.is_alive():
            return
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_until_released, name="cdc-writer-lease", daemon=True)
        self._renewer.start()

    def _renew_until_released(self) -> None:
        from botocore.exceptions import ClientError

        pause = self.term * RENEW_FRACTION
        while not self._stop.wait(pause):
            pause = self.term * RENEW_FRACTION
            with self._guard:
                held_leases = [(table, held) for table, held in self._held.items() if held.pid == os.getpid() and not held.lost]
            for table, held in held_leases:
                sent = time.monotonic()
                try:
                    response = self._client().put_object(
                        Bucket=held.bucket, Key=held.key, Body=self._holder_record(), IfMatch=held.etag, ContentType="application/json"
                    )
                    held.etag, held.renewed_at = response["ETag"], sent
                except ClientError as error:
                    if _refused(error) or _status(error) == 404:
                        held.taken_over = True
                        held.lost = f"its renewal was refused at {datetime.now(timezone.utc):%H:%M:%S} UTC: another run took it over"
                        _log.error(f"table {table}: lost the writer lease s3://{held.bucket}/{held.key}; {held.lost}")
                    else:  # the store unreachable, slow or failing: try again soon, before the fence
                        pause = self.term * RETRY_FRACTION
                        _log.warning(f"table {table}: could not renew the writer lease s3://{held.bucket}/{held.key}: {error}")
                except Exception as error:  # noqa: BLE001 — a renewal thread that dies would let the lease lapse silently
                    pause = self.term * RETRY_FRACTION  # a timeout, a refused connection: botocore's own errors
                    _log.warning(f"table {table}: could not renew the writer lease s3://{held.bucket}/{held.key}: {error}")


def _status(error) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _refused(error) -> bool:
    """A conditional request the store refused: the object is not at the version the request named."""
    return _status(error) == 412 or error.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict")


def _describe(holder: dict) -> str:
    if not holder:
        return "another run"
    return f"run {holder.get('run_id', '?')} (host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, renewed {holder.get('renewed', '?')})"
