"""Servers that tests start as whole process trees (dagster dev, make ui): a log's tail, and a
stop that leaves nothing behind, found by process group and by the test's unique DAGSTER_HOME."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil


def tail(path: Path, lines: int = 80) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def our_processes(root: psutil.Process | None, dagster_home: str) -> list[psutil.Process]:
    """Processes this test started: descendants of dagster dev, plus anything with our unique DAGSTER_HOME."""
    found: dict[int, psutil.Process] = {}
    if root is not None:
        try:
            for proc in [root, *root.children(recursive=True)]:
                found[proc.pid] = proc
        except psutil.NoSuchProcess:
            pass
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me or proc.pid in found:
            continue
        try:
            if proc.environ().get("DAGSTER_HOME") == dagster_home:
                found[proc.pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return list(found.values())


def stop_process_tree(process: subprocess.Popen, dagster_home: str, known: dict[int, psutil.Process]) -> None:
    try:
        root = psutil.Process(process.pid)
    except psutil.NoSuchProcess:
        root = None
    for proc in our_processes(root, dagster_home):
        known.setdefault(proc.pid, proc)
    try:
        pgid = os.getpgid(process.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    # Anything that left the group (run workers, code servers, JVMs): terminate, then kill.
    for proc in our_processes(None, dagster_home):
        known.setdefault(proc.pid, proc)
    survivors = [proc for proc in known.values() if proc.is_running() and proc.pid != os.getpid()]
    for proc in survivors:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(survivors, timeout=10)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
