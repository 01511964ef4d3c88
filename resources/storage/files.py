"""The few POSIX file operations the warehouse is built on: listing, deleting, syncing, an atomic swap.

All of it runs in the run's Python process, not in Spark, so the same code commits through a classic
session and through Spark Connect, where there is no JVM handle.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
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


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def exchange(first: str, second: str) -> bool:
    """Swap two paths atomically with Linux's renameat2(RENAME_EXCHANGE); False where it is unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), second)
