"""Errors that say what failed without row values, for the records that outlive a run.

The runs log and the alerts keep an error's text beyond the run, where an erase does not reach
(docs/erasure.md, "What holds key values"). So they never show an exception's message as such: only
the ``summary`` of a :class:`SummarizedError`, which by contract holds no row values (counts, a
``key_hash``, dates, column and table names, paths). Its ``detail`` (the keys, the records) goes on the
message's later lines, for the run's own log. Of any other error they show the type alone.
"""

from __future__ import annotations

# What stands for the message of an error that is not a SummarizedError.
MESSAGE_WITHHELD = "(its message, which may hold row values, is in the run's own log only)"


class SummarizedError(Exception):
    """An error whose message is a one-line ``summary`` without row values, then its ``detail``, if any.

    A message given as one text is split at its first line break: its first line is the summary.
    """

    def __init__(self, summary: str, detail: str = ""):
        summary, _, rest = summary.partition("\n")
        detail = "\n".join(part for part in (rest, detail) if part)
        super().__init__(f"{summary}\n{detail}" if detail else summary)
        self.summary, self.detail = summary, detail

    def __reduce__(self):  # pickles as (summary, detail), which __init__ takes back unchanged
        return type(self), (self.summary, self.detail)


def summarized_error_names() -> frozenset[str]:
    """The class names of every :class:`SummarizedError` defined so far: what an error recorded only by
    name and message (Dagster's record of a failed step) is told apart by."""
    names, pending = set(), [SummarizedError]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending += cls.__subclasses__()
    return frozenset(names)


def error_summary(error: BaseException) -> str:
    """What the runs log and an alert say of ``error``: the type and summary of the first
    :class:`SummarizedError` among it and its causes, else the type of ``error`` alone."""
    found: BaseException | None = error
    while found is not None and not isinstance(found, SummarizedError):
        found = found.__cause__
    if isinstance(found, SummarizedError):
        return f"{type(found).__name__}: {found.summary}"
    return f"{type(error).__name__} {MESSAGE_WITHHELD}"
