"""The S3 object store a lake may live in: its endpoint and region, and how each client reaches it.

The same settings reach every client the project has: Spark's S3A file system (extracts, the erase
ledger's key hashes), Iceberg's S3FileIO (the tables' files), pyarrow (the project's own records and
the landing sensor, no JVM), pyiceberg and DuckDB (the readers). ``s3://`` names a bucket everywhere:
Spark reads it through S3A too (``fs.s3.impl``), so a path is the same in a config, a record and a log.

The credentials are never settings of the project: every client reads them from its own process's
environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), or from a
profile or an instance role, through the AWS SDKs' default chain. So no secret is ever put into a
Spark conf, a command line, a run config or a log. No Dagster here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from cdc_assets.model import settings

S3_ENDPOINT_ENV = settings.S3_ENDPOINT.name
REGION_ENV = settings.REGION.name
ACCESS_KEY_ENV = settings.ACCESS_KEY.name
SECRET_KEY_ENV = settings.SECRET_KEY.name
DEFAULT_REGION = settings.REGION.default
# The schemes that name an object in a bucket; s3a:// is Hadoop's name for the same thing.
OBJECT_SCHEMES = ("s3", "s3a")
# Each S3 request of the project's own boto3 client gives up within these (seconds), and is tried at most
# this many times in all: a request must return well inside the writer lease's term (lease.py), never hang.
CONNECT_TIMEOUT_SECONDS = 2.0
READ_TIMEOUT_SECONDS = 5.0
MAX_ATTEMPTS = 3  # in all, the first one included
_log = logging.getLogger(__name__)


class VersionedBucketError(RuntimeError):
    """A bucket keeps every version of what is deleted from it: a delete there erases nothing."""


def is_object_store(path: str) -> bool:
    """Whether ``path`` names an object in a bucket (``s3://bucket/key``) rather than a local file."""
    return urlparse(path).scheme.lower() in OBJECT_SCHEMES


def bucket_key(path: str) -> str:
    """``s3://bucket/key`` as pyarrow's S3 file system names it: ``bucket/key``."""
    parsed = urlparse(path)
    return f"{parsed.netloc}{parsed.path}".rstrip("/")


@dataclass(frozen=True)
class ObjectStore:
    """Where the S3 API is: ``endpoint`` (empty: AWS's own, by region) and ``region``.

    An endpoint of one's own (SeaweedFS, MinIO, Ceph) is addressed by path (``http://host:port/bucket/key``),
    since such servers rarely resolve a bucket as a host name.
    """

    endpoint: str = ""
    region: str = DEFAULT_REGION

    @classmethod
    def from_environment(cls) -> "ObjectStore":
        """The one reading of ``CDC_S3_ENDPOINT`` and ``AWS_REGION``, for code outside a Dagster run."""
        return cls(
            endpoint=settings.S3_ENDPOINT.value(),
            region=settings.REGION.value(),
        )

    def __post_init__(self) -> None:
        if self.endpoint and urlparse(self.endpoint).scheme not in ("http", "https"):
            raise ValueError(
                f"S3 endpoint {self.endpoint!r} ({S3_ENDPOINT_ENV}): expected an http:// or https:// URL, "
                "e.g. http://127.0.0.1:8333"
            )

    # -- pyarrow: the project's own records, the landing sensor ----------------------------------------------
    def filesystem(self):
        """pyarrow's S3 file system on this store (credentials from the environment's default chain)."""
        return _s3_filesystem(self.endpoint, self.region)

    # -- boto3: the conditional requests pyarrow lacks (the writer lease, lease.py) ----------------------------
    def client(self, within: float | None = None):
        """A boto3 S3 client on this store (credentials from the environment's default chain). Each request
        gives up after at most ``CONNECT_TIMEOUT_SECONDS`` to connect and ``READ_TIMEOUT_SECONDS`` between
        reads; ``within``: at most that long for each, tried once (a writer lease's renewals, which must fail
        inside the term and try again on their own schedule, lease.py)."""
        return _s3_client(self.endpoint, self.region, os.environ.get(ACCESS_KEY_ENV, ""), within)

    # -- Spark: S3A for extracts and the project's files, S3FileIO for Iceberg's ---------------------------
    def hadoop_conf(self) -> dict[str, str]:
        """Hadoop's S3A settings (without the ``spark.hadoop.`` prefix): ``s3://`` read through S3A, and an
        endpoint of one's own addressed by path."""
        # No credentials provider is named: S3A's default chain takes keys from the environment (or, where a
        # user put them there, from fs.s3a.access.key / secret.key), then from an instance role.
        conf = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem", "fs.s3a.endpoint.region": self.region}
        if self.endpoint:
            conf["fs.s3a.endpoint"] = self.endpoint
            conf["fs.s3a.path.style.access"] = "true"
            conf["fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https")).lower()
        return conf

    def spark_conf(self) -> dict[str, str]:
        """:meth:`hadoop_conf` as the conf a JVM starts with (``spark.hadoop.*``)."""
        return {f"spark.hadoop.{key}": value for key, value in self.hadoop_conf().items()}

    def iceberg_properties(self) -> dict[str, str]:
        """Iceberg's S3FileIO (Java) and pyiceberg's FileIO properties for this store."""
        properties = {"client.region": self.region, "s3.region": self.region}
        if self.endpoint:
            properties.update({"s3.endpoint": self.endpoint, "s3.path-style-access": "true"})
        return properties

    # -- DuckDB -------------------------------------------------------------------------------------------
    def duckdb_secret_sql(self) -> str:
        """The ``CREATE SECRET`` statement that lets DuckDB's httpfs read this store, with the keys of this
        process's environment (DuckDB's own credential chain lives in its ``aws`` extension, which cannot be
        installed offline). It holds a secret: run it, never print or log it."""
        options = [f"REGION '{self.region}'"]
        key, secret = os.environ.get(ACCESS_KEY_ENV, ""), os.environ.get(SECRET_KEY_ENV, "")
        if key and secret:
            options += [f"KEY_ID '{sql_text(key)}'", f"SECRET '{sql_text(secret)}'"]
            token = settings.SESSION_TOKEN.value()
            if token:
                options.append(f"SESSION_TOKEN '{sql_text(token)}'")
        if self.endpoint:
            parsed = urlparse(self.endpoint)
            options += [f"ENDPOINT '{parsed.netloc}'", "URL_STYLE 'path'", f"USE_SSL {str(parsed.scheme == 'https').lower()}"]
        return f"CREATE OR REPLACE SECRET cdc_lake (TYPE s3, {', '.join(options)})"


def compact_deleted_objects(store: ObjectStore, locations: Iterable[str]) -> int:
    """After files were deleted at ``locations`` (``s3://`` paths; local ones are skipped), have the store
    remove their bytes from its disks where it can be asked to; the bytes it compacted (0: nothing to ask).

    First, a bucket with versioning enabled or suspended (``GetBucketVersioning``) keeps every deleted
    object as a noncurrent version: the delete erased nothing, so this raises :class:`VersionedBucketError`
    naming the bucket (an erase stays unfinished rather than be recorded complete). A store that does not
    implement the call (SeaweedFS answers it) is taken as unversioned. Then, on the SeaweedFS lake of this
    machine (``CDC_LAKE_SERVER_DIR``), a vacuum of its volumes (``lake_server.vacuum``); other stores reclaim
    deleted objects' space on their own schedule (docs/object-storage.md)."""
    from botocore.exceptions import ClientError

    buckets = sorted({urlparse(path).netloc for path in locations if is_object_store(path)})
    if not buckets:
        return 0
    client = store.client()
    for bucket in buckets:
        try:
            versioning = client.get_bucket_versioning(Bucket=bucket).get("Status", "")
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code not in ("NotImplemented", "MethodNotAllowed", "501"):
                raise
            _log.warning(f"bucket {bucket}: the store does not say whether it keeps versions ({code}): taken as unversioned")
            versioning = ""
        if versioning in ("Enabled", "Suspended"):
            raise VersionedBucketError(
                f"bucket {bucket} has versioning {versioning.lower()}: the deleted files stay in it as noncurrent versions, "
                "so nothing deleted from it is erased. Delete their noncurrent versions (a lifecycle rule "
                "NoncurrentVersionExpiration, or DeleteObject with each VersionId), or keep the warehouse in a bucket "
                "that never had versioning; then run the erase again to complete it."
            )
    lake = settings.LAKE_SERVER_DIR.value()
    if not lake:
        return 0
    from cdc_assets.engines import lake_server

    compacted = lake_server.vacuum(Path(lake))
    _log.info(f"the lake in {lake} compacted {compacted} deleted bytes out of its volumes")
    return compacted


def sql_text(value: str) -> str:
    """``value`` as the body of a single-quoted SQL string literal."""
    return value.replace("'", "''")


@lru_cache(maxsize=8)
def _s3_filesystem(endpoint: str, region: str):
    from pyarrow import fs

    if not endpoint:
        return fs.S3FileSystem(region=region)
    parsed = urlparse(endpoint)
    return fs.S3FileSystem(endpoint_override=parsed.netloc, scheme=parsed.scheme, region=region, force_virtual_addressing=False)


@lru_cache(maxsize=16)
def _s3_client(endpoint: str, region: str, access_key: str, within: float | None = None):
    """One client per store, key pair and bound (``access_key`` is in the cache's key so new keys get a new client)."""
    import boto3
    from botocore.config import Config

    addressing = {"s3": {"addressing_style": "path"}} if endpoint else {}
    connect, read, attempts = CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS, MAX_ATTEMPTS
    if within is not None:
        connect, read, attempts = min(connect, within), min(read, within), 1
    config = Config(
        connect_timeout=connect, read_timeout=read, retries={"total_max_attempts": attempts, "mode": "standard"}, **addressing,
    )  # fmt: skip
    return boto3.client("s3", endpoint_url=endpoint or None, region_name=region, config=config)
