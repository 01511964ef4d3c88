"""What a step's body needs of its log: the two levels it writes at, and how long a stage took.

Dagster's step log (``context.log``) is one; a script or a test passes a ``logging.Logger``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class StepLog(Protocol):
    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...


@contextmanager
def timed(log: StepLog, table: str, stage: str, dates: str) -> Iterator[None]:
    """Log ``{table} {dates}: {stage} finished in N s`` when the block ends."""
    started = time.monotonic()
    yield
    log.info(f"{table} {dates}: {stage} finished in {time.monotonic() - started:.2f}s")


def span(days: list[str]) -> str:
    """A run's dates as the log names them: the date, or ``first..last``."""
    return days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"
