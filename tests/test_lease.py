"""The writer lease of a warehouse in a bucket (resources/storage/lease.py), against a real S3 server (SeaweedFS
on loopback): conditional PUTs keep two holders apart, renewals keep a lease past its term, a lapsed or a dead
process's lease is taken over, and a holder whose lease was taken over commits nothing more."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from resources.storage import WarehouseStorage, WriterLeaseLost, WriterLockTimeout
from resources.storage.lease import WriterLeases, machine_identity
from resources.storage.object_store import ObjectStore

pytestmark = pytest.mark.lake


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One lake for the module's tests (each test uses a key of its own)."""
    from cdc_assets.engines import lake_server
    from tests.lake import start_lake

    state = tmp_path_factory.mktemp("lease-lake")
    handle = start_lake(state)
    try:
        yield ObjectStore(endpoint=f"http://127.0.0.1:{handle.s3_port}"), handle.records_bucket
    finally:
        lake_server.stop(handle.state_dir)


def _path(store) -> tuple[ObjectStore, str, str]:
    objects, bucket = store
    key = f"warehouse/t-{uuid.uuid4().hex[:8]}/_writer.lease"
    return objects, bucket, key


def _holder(objects: ObjectStore, bucket: str, key: str) -> dict:
    return json.loads(objects.client().get_object(Bucket=bucket, Key=key)["Body"].read())


def test_a_held_lease_keeps_a_second_writer_out_until_released_then_the_second_takes_it(store):
    objects, bucket, key = _path(store)
    first, second = WriterLeases("run-one", objects, timeout=5), WriterLeases("run-two", objects, timeout=1)
    first.take("t", f"s3://{bucket}/{key}")
    try:
        with pytest.raises(WriterLockTimeout, match="run run-one") as raised:
            second.take("t", f"s3://{bucket}/{key}")
        assert "CDC_WRITER_LOCK_TIMEOUT" in str(raised.value) and "CDC_WRITER_LEASE_SECONDS" in str(raised.value)
    finally:
        first.release()
    second.take("t", f"s3://{bucket}/{key}")
    assert _holder(objects, bucket, key)["run_id"] == "run-two"
    second.release()
    assert objects.client().list_objects_v2(Bucket=bucket, Prefix=key)["KeyCount"] == 0, "a released lease is deleted"


def test_renewals_keep_a_lease_past_its_term(store):
    objects, bucket, key = _path(store)
    holder = WriterLeases("long-run", objects, timeout=5, term=3)
    holder.take("t", f"s3://{bucket}/{key}")
    try:
        time.sleep(7)  # more than two terms: only renewals keep it
        with pytest.raises(WriterLockTimeout, match="long-run"):
            WriterLeases("other", objects, timeout=1, term=3).take("t", f"s3://{bucket}/{key}")
        holder.confirm("t")  # still its own
    finally:
        holder.release()


def test_a_lease_nobody_renews_lapses_after_its_term_by_the_stores_clock(store):
    objects, bucket, key = _path(store)
    # A holder on another machine that stopped (its host lost): only the term frees the table.
    stale = {"run_id": "lost-host-run", "host": "elsewhere", "pid": 1, "machine": "elsewhere/boot/pid:[1]", "term_seconds": 3}
    objects.client().put_object(Bucket=bucket, Key=key, Body=json.dumps(stale).encode())
    started = time.monotonic()
    taker = WriterLeases("taker", objects, timeout=30, term=3)
    taker.take("t", f"s3://{bucket}/{key}")
    waited = time.monotonic() - started
    try:
        assert 1.5 <= waited < 15, waited
        assert _holder(objects, bucket, key)["run_id"] == "taker"
    finally:
        taker.release()


def test_the_lease_of_a_process_gone_from_this_machine_is_taken_over_at_once(store):
    objects, bucket, key = _path(store)
    gone = subprocess.Popen(["true"])
    gone.wait()
    killed = {"run_id": "killed-run", "host": "here", "pid": gone.pid, "machine": machine_identity(), "term_seconds": 600}
    objects.client().put_object(Bucket=bucket, Key=key, Body=json.dumps(killed).encode())
    started = time.monotonic()
    taker = WriterLeases("after-kill", objects, timeout=30)
    taker.take("t", f"s3://{bucket}/{key}")
    try:
        assert time.monotonic() - started < 5
        assert _holder(objects, bucket, key)["run_id"] == "after-kill"
    finally:
        taker.release()


def test_a_holder_whose_lease_was_taken_over_commits_nothing_more_and_leaves_the_new_holders_lease(store, tmp_path):
    objects, bucket, key = _path(store)
    holder = WriterLeases("paused-run", objects, timeout=5, term=3)
    holder.take("t", f"s3://{bucket}/{key}")
    # Another run's takeover (as after a pause longer than the term): the object is no longer the holder's version.
    objects.client().put_object(Bucket=bucket, Key=key, Body=json.dumps({"run_id": "new-holder"}).encode())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            holder.confirm("t")
        except WriterLeaseLost as lost:
            assert "paused-run" not in str(lost) and f"s3://{bucket}/{key}" in str(lost) and "Run the date again" in str(lost)
            break
        time.sleep(0.2)
    else:
        pytest.fail("the refused renewal did not mark the lease lost")
    holder.release()
    assert _holder(objects, bucket, key)["run_id"] == "new-holder"


def test_a_warehouse_in_a_bucket_takes_the_lease_not_a_local_lock_file(store, monkeypatch, tmp_path):
    objects, bucket, _ = _path(store)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    root = f"s3://{bucket}/warehouse-{uuid.uuid4().hex[:6]}"
    from resources.storage.lake import LakeCatalog

    lake = LakeCatalog(root=root, uri="http://127.0.0.1:1", warehouse="s3://unused", store=objects)
    first = WarehouseStorage(root, run_id="first", lake=lake, lock_timeout=1)
    second = WarehouseStorage(root, run_id="second", lake=lake, lock_timeout=1)
    first._locks.take("t", first.layout.lock_path("t"))  # the lease alone (hold_writer_lock also reads the catalog)
    try:
        assert first.layout.lock_path("t") == f"{root}/t/_writer.lease"
        with pytest.raises(WriterLockTimeout, match="first"):
            second._locks.take("t", second.layout.lock_path("t"))
        assert not (tmp_path / "tmp").exists() or not any((tmp_path / "tmp").rglob("*.lock")), "no local lock file"
    finally:
        first.release()


class _CuttableProxy:
    """A loopback TCP proxy to the store that can be cut: from :meth:`cut` on it forwards nothing more and
    answers nothing, on the connections it has and on new ones (as a store that went unreachable, or hangs)."""

    def __init__(self, target_port: int):
        import socket
        import threading

        self._target = target_port
        self._cut = threading.Event()
        self._unanswered: list = []  # connections accepted after the cut: held open, never answered
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self._cut.is_set():
                self._unanswered.append(client)
                continue
            upstream = socket.create_connection(("127.0.0.1", self._target))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source, sink) -> None:
        try:
            while chunk := source.recv(65536):
                if self._cut.is_set():
                    return  # swallowed: the other side waits for an answer that never comes
                sink.sendall(chunk)
        except OSError:
            return

    def close(self) -> None:
        self._server.close()
        for connection in self._unanswered:
            connection.close()


def test_a_holder_cut_off_from_the_store_fences_itself_before_another_run_can_take_the_lease(store):
    objects, bucket, key = _path(store)
    path = f"s3://{bucket}/{key}"
    proxy = _CuttableProxy(int(objects.endpoint.rsplit(":", 1)[1]))
    through_proxy = ObjectStore(endpoint=f"http://127.0.0.1:{proxy.port}")
    holder = WriterLeases("cut-off-run", through_proxy, timeout=5, term=3)
    client = holder._client()
    assert client.meta.config.connect_timeout <= 3 / 8 and client.meta.config.read_timeout <= 3 / 8
    assert client.meta.config.retries["total_max_attempts"] == 1, "a renewal is tried once: the renewer tries again"
    holder.take("t", path)
    try:
        time.sleep(1.5)
        holder.confirm("t")  # renewed through the proxy: still its own
        proxy.cut()
        cut_at = time.monotonic()
        # Another run, which reaches the store, takes the lease once it lapses (a term after the last renewal).
        taker = WriterLeases("taker-run", objects, timeout=30, term=3)
        taken: dict[str, float] = {}

        def take_over() -> None:
            taker.take("t", path)
            taken["at"] = time.monotonic()

        import threading

        taking = threading.Thread(target=take_over, daemon=True)
        taking.start()
        commits, refusal = [], None
        while time.monotonic() - cut_at < 10:
            try:
                holder.confirm("t")
                commits.append(time.monotonic())  # what the run would commit now
            except WriterLeaseLost as lost:
                refusal = (time.monotonic(), str(lost))
                break
            time.sleep(0.05)
        taking.join(timeout=30)
        assert refusal is not None, "the cut-off holder went on committing"
        refused_at, message = refusal
        assert path in message and "fence" in message and "CDC_WRITER_LEASE_SECONDS" in message
        assert refused_at - cut_at <= holder.fence_seconds + 0.5, "fenced within half a term of its last renewal"
        assert "at" in taken and _holder(objects, bucket, key)["run_id"] == "taker-run"
        assert not commits or max(commits) < taken["at"] - 1, "no commit after the fence, none near the takeover"
        with pytest.raises(WriterLeaseLost, match="fence"):  # and it stays fenced
            holder.confirm("t")
        taker.release()
    finally:
        holder.release()
        proxy.close()
