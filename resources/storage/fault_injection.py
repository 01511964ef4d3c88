"""The one test seam in the warehouse: hold a commit at a named point so a fault test can kill -9 the run there.

A write calls :func:`pause_point`, which returns at once unless a test set, in the run's environment
(the run usually being a child process the test kills):

- ``CDC_PAUSE_BEFORE_COMMIT=<table>/<asset>``: before the asset's write starts (the outputs of the run's
  earlier steps are committed, it is not; its own step's other outputs, written side by side with it, go on);
- ``CDC_PAUSE_BEFORE_PUBLISH=<table>/<asset>``: before the run publishes the asset's staged snapshot (the
  outputs published before it are on main, it and those after it are still staged);
- ``CDC_PAUSE_MARKER=<file>``: the paused run writes its pid there, so the test knows it is paused;
- ``CDC_PAUSE_SECONDS`` (default 600): how long it waits;
- ``CDC_PAUSE_RELEASE=<file>``: it goes on as soon as that file exists, so a test can order two runs
  without guessing at timings.
"""

from __future__ import annotations

import os
import time

from cdc_assets.model import settings

BEFORE_COMMIT = settings.PAUSE_BEFORE_COMMIT.name
BEFORE_PUBLISH = settings.PAUSE_BEFORE_PUBLISH.name
MARKER_ENV = settings.PAUSE_MARKER.name
RELEASE_ENV = settings.PAUSE_RELEASE.name


def pause_point(point: str, table: str, asset: str) -> None:
    """Wait here if a test asked to pause ``table``/``asset`` at ``point`` (:data:`BEFORE_COMMIT`, :data:`BEFORE_PUBLISH`); otherwise return at once."""
    if os.environ.get(point) != f"{table}/{asset}":
        return
    marker = os.environ.get(MARKER_ENV)
    if marker:
        with open(marker, "w") as handle:
            handle.write(str(os.getpid()))
    release = os.environ.get(RELEASE_ENV)
    deadline = time.monotonic() + float(settings.PAUSE_SECONDS.value())
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        time.sleep(0.2)
