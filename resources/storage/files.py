"""The few POSIX file operations the project's own records (the erase ledger, retention records) need.

All of it runs in the run's Python process, not in Spark. The tables themselves are Iceberg's.
"""

from __future__ import annotations

import os
import shutil


def list_names(path: str) -> list[str]:
    """The names in the folder ``path``; none when it does not exist (or is not a folder)."""
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
