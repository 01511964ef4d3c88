"""Business dates written compactly (pure Python)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, timedelta


def date_runs(days: Iterable[str]) -> str:
    """Dates as runs of consecutive days, oldest first: ``2024-01-01..2024-01-03,2024-01-05``."""
    runs: list[list[str]] = []
    for day in sorted(set(days)):
        if runs and date.fromisoformat(runs[-1][1]) + timedelta(days=1) == date.fromisoformat(day):
            runs[-1][1] = day
        else:
            runs.append([day, day])
    return ",".join(first if first == last else f"{first}..{last}" for first, last in runs)
