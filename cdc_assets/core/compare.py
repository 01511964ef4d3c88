"""Which columns differ between two versions of a row: the ``changed_columns`` of updates and change feeds."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pyspark.sql import Column
from pyspark.sql import functions as F

CHANGED_COLUMNS = "changed_columns"


def changed_columns(names: Iterable[str], before: Callable[[str], Column], after: Callable[[str], Column]) -> Column:
    """``array<string>``: the sorted ``names`` whose typed values differ between ``before`` and ``after``.

    NULL against a value is a change, NULL against NULL is not (null-safe equality). Values are
    compared as typed, not as hashed text, so 1.50 and 1.5 in a decimal column are equal. No name
    differs: an empty array.
    """
    differs = [F.when(~before(name).eqNullSafe(after(name)), F.lit(name)) for name in sorted(names)]
    if not differs:
        return F.array().cast("array<string>")
    return F.array_compact(F.array(*differs))


def no_changed_columns() -> Column:
    """The ``changed_columns`` of a row that is not an update: an empty ``array<string>``."""
    return F.array().cast("array<string>")
