"""Stopping a detached service: stopped means its whole process group is gone, not just its leader.

A server's workers inherit what the server holds (the SQL server's catalog lock is an inherited file
descriptor): while one of them lives, the next opener of the catalog is refused. Real processes here.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time

from cdc_assets.engines.process import group_alive, process_alive, start_detached, stop_group

# The leader exits on SIGTERM at once; the worker it started ignores SIGTERM and keeps the lock it inherited
# until it is killed.
LEADER = """
import fcntl, os, signal, subprocess, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
worker = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"], pass_fds=(fd,))
open(sys.argv[2], "w").write(str(worker.pid))
time.sleep(120)
"""


def test_stop_group_returns_only_when_no_process_of_the_group_holds_what_it_inherited(tmp_path):
    lock, worker_file = tmp_path / "held.lock", tmp_path / "worker.pid"
    leader = start_detached([sys.executable, "-c", LEADER, str(lock), str(worker_file)], tmp_path / "leader.log", dict(os.environ))
    deadline = time.monotonic() + 30
    while not worker_file.exists() or not worker_file.read_text():
        assert time.monotonic() < deadline and process_alive(leader), (tmp_path / "leader.log").read_text()
        time.sleep(0.05)
    worker = int(worker_file.read_text())
    assert group_alive(leader)

    assert stop_group(leader, grace=1, kill_wait=10)

    assert not process_alive(leader) and not process_alive(worker) and not group_alive(leader)
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if the worker still held it
    finally:
        os.close(fd)


def test_a_group_with_no_process_left_is_not_alive(tmp_path):
    leader = start_detached([sys.executable, "-c", "pass"], tmp_path / "leader.log", dict(os.environ))
    deadline = time.monotonic() + 30
    while process_alive(leader):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not group_alive(leader)
    assert stop_group(leader, grace=1)
