"""Detached service processes on this machine: start one with its output in a log, wait for its port,
record its pid, tell whether it still runs, and stop its process group.

Every service of the project (the Spark Connect server, the standalone cluster's daemons, the SQL
server) runs this way: in a session of its own, so Ctrl-C of whoever started it does not reach it, with
its pid in a file beside its log, listening on 127.0.0.1 only. A later command finds it again through
the pid file (:func:`recorded_pid`) and stops it with its whole process group (:func:`stop_group`).

No Dagster or Spark import.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cdc_assets.model.file_modes import configured_umask

HOST = "127.0.0.1"

# Processes this Python process started, so that they are reaped (no zombie looks alive).
_CHILDREN: dict[int, subprocess.Popen] = {}


# -- ports -----------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:``port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As a server binds: connections of a server just stopped (TIME_WAIT) do not make the port taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def port_accepts(port: int, timeout: float = 1) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(port: int, timeout: float, check: Callable[[], None] | None = None, interval: float = 0.25) -> bool:
    """Wait until 127.0.0.1:``port`` accepts connections; False if it does not within ``timeout`` seconds.

    ``check`` runs between attempts and raises to give up early, e.g. when the process that is to listen
    has exited.
    """
    deadline = time.monotonic() + timeout
    while not port_accepts(port):
        if check is not None:
            check()
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


# -- starting and finding a process ----------------------------------------------------------------


def start_detached(
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str],
    cwd: str | Path | None = None,
    pass_fds: Sequence[int] = (),
    keep_previous_log: bool = True,
) -> int:
    """Start ``command`` in a session (and process group) of its own, its output in ``log_path``; its pid.

    Ctrl-C of the caller does not reach it, and it inherits no file descriptor but ``pass_fds`` (e.g. a
    lock it is to hold; never a lock its starter holds). ``keep_previous_log`` moves an existing log to
    ``<log>.1`` first, e.g. to read after a crash. It runs under ``CDC_UMASK`` (cdc_assets/model/file_modes.py),
    whoever starts it: a server a test or another tool starts writes what a command would.
    """
    umask = configured_umask()
    if keep_previous_log and log_path.exists():
        log_path.replace(log_path.with_name(f"{log_path.name}.1"))
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env), cwd=cwd,
            start_new_session=True, close_fds=True, pass_fds=tuple(pass_fds), umask=-1 if umask is None else umask,
        )  # fmt: skip
    _CHILDREN[process.pid] = process
    return process.pid


def write_number_file(path: Path, number: int) -> None:
    """A pid or port file: the number on one line."""
    path.write_text(f"{number}\n")


def read_number_file(path: Path) -> int | None:
    """The number in a pid or port file; None when the file is missing or holds no number."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def recorded_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and still what was started; else None.

    A pid can be reused: a live process whose command line is readable and does not contain ``marker``
    (e.g. the server's main class) is another one.
    """
    pid = read_number_file(pid_file)
    if pid is None or not process_alive(pid):
        return None
    cmdline = command_line(pid)
    if cmdline and marker not in cmdline:
        return None
    return pid


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not a server
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def command_line(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces; empty if it cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_java(pid: int) -> bool:
    """Whether ``pid`` runs a JVM (its executable is ``java``)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "java"
    except OSError:
        return os.path.basename(command_line(pid).split(" ", 1)[0]) == "java"


def descendants(root: int) -> list[int]:
    """The pids of ``root``'s children, their children, and so on, nearest first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        children = parents.get(queue.pop(0), [])
        found += children
        queue += children
    return found


# -- stopping --------------------------------------------------------------------------------------


def leads_group(pid: int) -> bool:
    """Whether ``pid`` leads a process group other than the caller's (as :func:`start_detached` starts one)."""
    try:
        return os.getpgid(pid) == pid != os.getpgrp()
    except ProcessLookupError:
        return False


def group_alive(pgid: int) -> bool:
    """Whether any live process (not a zombie) is left in process group ``pgid``, its leader gone or not.

    A worker the leader started can outlive it by a moment, holding what it inherited (a lock's file
    descriptor, say): a group is stopped when its last member is.
    """
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: any member, zombies included, counts
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if group == str(pgid) and state != "Z":
            return True
    return False


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group ``pid`` leads (a JVM and the workers it started), else to ``pid``.

    Never to the caller's own group; a process already gone is not an error.
    """
    try:
        if leads_group(pid):
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def wait_for_exit(pid: int, timeout: float, group: bool = False) -> bool:
    """Wait until ``pid`` is gone, and with ``group`` every process of the group it led; whether they went
    within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while process_alive(pid) or (group and group_alive(pid)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_group(pid: int, grace: float = 30, kill_wait: float = 10) -> bool:
    """SIGTERM to ``pid``'s process group, SIGKILL if any of it still runs after ``grace`` seconds; whether
    it is all gone (the leader and every process of its group: a worker holding an inherited lock too)."""
    return not stop_groups({str(pid): pid}, grace, kill_wait)


def stop_groups(pids: Mapping[str, int], grace: float = 30, kill_wait: float = 10) -> list[str]:
    """:func:`stop_group` for several processes at once, sharing one ``grace`` period.

    ``pids`` maps a name to each pid; returns the names of those that survived SIGKILL.
    """
    # Told before signalling: once the leader is gone, its pid no longer says it led a group.
    groups = {name: leads_group(pid) for name, pid in pids.items()}
    for pid in pids.values():
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    survivors = []
    for name, pid in pids.items():
        if not wait_for_exit(pid, max(0.0, deadline - time.monotonic()), group=groups[name]):
            try:
                if groups[name]:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if not wait_for_exit(pid, kill_wait, group=groups[name]):
                survivors.append(name)
    return survivors


def log_tail(path: str | Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log, for an error message; ``(no log)`` if it cannot be read."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
