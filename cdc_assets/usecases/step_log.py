"""What a step's body needs of its log: the two levels it writes at, and how long a stage took.

Dagster's step log (``context.log``) is one; a script or a test passes a ``logging.Logger``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol


class StepLog(Protocol):
    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...


@dataclass(frozen=True)
class StageClock:
    """Times a step's stages in its log: ``{table} {dates}: {stage} finished in N s``. Made once at the start
    of a step, so that the stages below name neither the table nor the dates."""

    log: StepLog
    table: str
    days: list[str]

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        self.log.info(f"{self.table} {span(self.days)}: {stage} finished in {time.monotonic() - started:.2f}s")


def span(days: list[str]) -> str:
    """A run's dates as the log names them: the date, or ``first..last``."""
    return days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"
