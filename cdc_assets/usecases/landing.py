"""What has landed of a date's extract: its data files with their sizes and modification times, listed
without Spark (a sensor must not start a JVM to ask), in a local folder or in an S3 bucket.

A path is a file, a folder or a glob, as ``source.path`` names it for one date. A folder counts with the
data files directly in it. Files whose names start with ``_`` or ``.`` (``_SUCCESS``, ``.crc``, a ready
marker) are not data: Spark skips them, in a folder and where a glob names them alike, so the intake
never reads them. In a bucket, one listing of the path's fixed prefix gives every file with its size
and time (no request per file). No Dagster, no Spark.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from typing import NamedTuple

from resources.storage.object_store import ObjectStore, bucket_key, is_object_store

# Spark skips files whose names start with these (Hadoop's hidden files: _SUCCESS, .crc, a ready marker).
NOT_DATA_PREFIXES = ("_", ".")
_GLOB_CHARACTERS = "*?["


class LandedFile(NamedTuple):
    path: str
    size: int
    modified_ns: int


def landed(path: str) -> list[LandedFile]:
    """The data files ``path`` (a file, folder or glob) names now, sorted by path; empty if none."""
    found = _in_bucket(path) if is_object_store(path) else _local(path)
    return sorted(found)


def exists(path: str) -> bool:
    """Whether the file ``path`` (a ready marker) is there, in a local folder or a bucket."""
    if not is_object_store(path):
        return os.path.isfile(path)
    from pyarrow import fs

    return ObjectStore.from_environment().filesystem().get_file_info(bucket_key(path)).type == fs.FileType.File


def _is_data(name: str) -> bool:
    return not name.startswith(NOT_DATA_PREFIXES)


def _local(pattern: str) -> list[LandedFile]:
    candidates = []
    for match in glob.glob(pattern):
        if os.path.isfile(match):
            if _is_data(os.path.basename(match)):
                candidates.append(match)
        elif os.path.isdir(match):
            candidates += [os.path.join(match, name) for name in os.listdir(match) if _is_data(name)]
    found = []
    for candidate in candidates:
        try:
            stat = os.stat(candidate)
        except FileNotFoundError:  # removed since it was listed: left out, so the fingerprint differs next time
            continue
        if os.path.isfile(candidate):
            found.append(LandedFile(candidate, stat.st_size, stat.st_mtime_ns))
    return found


def _in_bucket(pattern: str) -> list[LandedFile]:
    """One recursive listing under the pattern's fixed prefix; each file matched as the pattern itself, or as
    a file directly in a folder the pattern names."""
    from pyarrow import fs

    scheme = pattern.split("://", 1)[0]
    key_pattern = bucket_key(pattern)  # bucket/key..., without a trailing /
    fixed = key_pattern
    for character in _GLOB_CHARACTERS:
        fixed = fixed.split(character, 1)[0]
    prefix = fixed if fixed == key_pattern else fixed.rsplit("/", 1)[0]
    filesystem = ObjectStore.from_environment().filesystem()
    try:
        infos = filesystem.get_file_info(fs.FileSelector(prefix, recursive=True, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        infos = []
    if fixed == key_pattern and not pattern.endswith("/"):
        single = filesystem.get_file_info(key_pattern)  # the pattern names one file, not a folder
        if single.type == fs.FileType.File:
            infos = [single]
    found = []
    for info in infos:
        if info.type != fs.FileType.File or not _is_data(info.base_name):
            continue
        folder = info.path.rsplit("/", 1)[0]
        if _glob_matches(info.path, key_pattern) or _glob_matches(folder, key_pattern):
            modified = int(info.mtime.timestamp() * 1e9) if info.mtime is not None else 0
            found.append(LandedFile(f"{scheme}://{info.path}", info.size or 0, modified))
    return found


def _glob_matches(key: str, pattern: str) -> bool:
    """As Hadoop's glob (and Python's): a wildcard stays within one path segment (fnmatch's ``*`` alone
    would also match ``a/b``)."""
    keys, patterns = key.split("/"), pattern.split("/")
    return len(keys) == len(patterns) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(keys, patterns))
