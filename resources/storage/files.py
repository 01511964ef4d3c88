"""The few file operations the project's own records (the erase ledger, retention records, schema records,
the runs log) need, on a local folder or in a bucket.

All of it runs in the run's Python process, not in Spark. The tables themselves are Iceberg's.

- :class:`LocalFiles`: POSIX; a file is written under a hidden name, synced and renamed in, and the
  folder synced, so a reader never sees half of it and a power loss loses no acknowledged record.
- :class:`ObjectFiles`: an S3 bucket through pyarrow; a PUT is atomic (a reader sees the old object or
  the new one, never half), and durable once acknowledged; there are no folders, so nothing to sync.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid

from resources.storage.object_store import ObjectStore, bucket_key, is_object_store


class LocalFiles:
    """Files under a local (or mounted POSIX) folder; paths are absolute local paths."""

    remote = False

    def list_names(self, path: str) -> list[str]:
        """The names in the folder ``path``; none when it does not exist (or is not a folder)."""
        return list_names(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def modified(self, path: str) -> float:
        """When the file was last modified, in seconds since the epoch."""
        return os.stat(path).st_mtime

    def read_bytes(self, path: str) -> bytes:
        """The file's bytes; ``FileNotFoundError`` when it is absent."""
        with open(path, "rb") as stream:
            return stream.read()

    def write_atomically(self, path: str, data: bytes) -> None:
        """Write ``path`` whole or not at all: under a hidden name, synced, renamed in, the folder synced."""
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        hidden = f"{folder}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
        with open(hidden, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.rename(hidden, path)  # replaces an older one at once (POSIX)
        fsync_folder(folder)

    def delete(self, path: str) -> None:
        delete(path)

    def files_under(self, folder: str) -> list[str]:
        """Every file under ``folder``, at any depth (none when it is absent)."""
        return sorted(os.path.join(current, name) for current, _, names in os.walk(folder) for name in names)

    def sha256(self, path: str) -> str:
        digest = hashlib.sha256()
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    def parquet_schema(self, path: str):
        """The Arrow schema of a Parquet file (its footer only)."""
        import pyarrow.parquet as pq

        return pq.read_schema(path)

    def sync_folder(self, path: str) -> None:
        fsync_folder(path)

    def sync_tree(self, path: str) -> None:
        fsync_tree(path)


class ObjectFiles:
    """Objects in S3 buckets, named ``s3://bucket/key``; a "folder" is a key prefix."""

    remote = True

    def __init__(self, store: ObjectStore):
        self.store = store
        self._fs = store.filesystem()

    def _info(self, path: str):
        return self._fs.get_file_info(bucket_key(path))

    def list_names(self, path: str) -> list[str]:
        from pyarrow import fs

        try:
            infos = self._fs.get_file_info(fs.FileSelector(bucket_key(path), allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(info.base_name for info in infos)

    def exists(self, path: str) -> bool:
        from pyarrow import fs

        return self._info(path).type != fs.FileType.NotFound

    def is_dir(self, path: str) -> bool:
        from pyarrow import fs

        return self._info(path).type == fs.FileType.Directory

    def is_file(self, path: str) -> bool:
        from pyarrow import fs

        return self._info(path).type == fs.FileType.File

    def size(self, path: str) -> int:
        info = self._info(path)
        if info.size is None:
            raise FileNotFoundError(path)
        return info.size

    def modified(self, path: str) -> float:
        info = self._info(path)
        if info.mtime is None:
            raise FileNotFoundError(path)
        return info.mtime.timestamp()

    def read_bytes(self, path: str) -> bytes:
        if not self.is_file(path):
            raise FileNotFoundError(path)
        with self._fs.open_input_stream(bucket_key(path)) as stream:
            return stream.read()

    def write_atomically(self, path: str, data: bytes) -> None:
        with self._fs.open_output_stream(bucket_key(path)) as stream:  # one PUT: whole or not at all
            stream.write(data)

    def delete(self, path: str) -> None:
        from pyarrow import fs

        info = self._info(path)
        if info.type == fs.FileType.Directory:
            self._fs.delete_dir(bucket_key(path))
        elif info.type == fs.FileType.File:
            self._fs.delete_file(bucket_key(path))

    def files_under(self, folder: str) -> list[str]:
        from pyarrow import fs

        scheme = folder.split("://", 1)[0]
        infos = self._fs.get_file_info(fs.FileSelector(bucket_key(folder), recursive=True, allow_not_found=True))
        return sorted(f"{scheme}://{info.path}" for info in infos if info.type == fs.FileType.File)

    def sha256(self, path: str) -> str:
        digest = hashlib.sha256()
        with self._fs.open_input_stream(bucket_key(path)) as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    def parquet_schema(self, path: str):
        """The Arrow schema of a Parquet file (its footer only: ranged reads)."""
        import pyarrow.parquet as pq

        return pq.read_schema(bucket_key(path), filesystem=self._fs)

    def sync_folder(self, path: str) -> None:
        """Nothing to do: an acknowledged PUT is durable, and a bucket has no folder entries."""

    def sync_tree(self, path: str) -> None:
        """Nothing to do: see :meth:`sync_folder`."""


Files = LocalFiles | ObjectFiles


def files_for(root: str, store: ObjectStore | None = None) -> Files:
    """The file operations for a warehouse at ``root``: a bucket's or a local folder's."""
    if is_object_store(root):
        return ObjectFiles(store or ObjectStore.from_environment())
    return LocalFiles()


def list_names(path: str) -> list[str]:
    """The names in the local folder ``path``; none when it does not exist (or is not a folder)."""
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def delete(path: str) -> None:
    """Remove a file, a symlink (not what it points to) or a folder with everything in it; nothing if absent."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def fsync_folder(path: str) -> None:
    """Make the folder's entries (a rename into it, a new file) survive a power loss."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(folder: str) -> None:
    """fsync every file under ``folder`` and the folders themselves: Spark's local writes are not synced."""
    for current, _, files in os.walk(folder):
        for name in files:
            descriptor = os.open(os.path.join(current, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        fsync_folder(current)
