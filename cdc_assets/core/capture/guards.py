"""Guards against inputs that are well-formed but implausible: an empty snapshot, a mass delete.

A truncated full extract looks exactly like a source that deleted most of its rows. Rather than wipe
the current state, the date fails with the numbers unless the run explicitly allows it.
"""

from __future__ import annotations

from cdc_assets.model.config import LoadType, TableConfig
from cdc_assets.core.capture.changes import DELETE, INSERT, NOT_SUPPLIED, UNCHANGED, UPDATE
from cdc_assets.core.errors import SummarizedError


class MassDeleteError(SummarizedError, RuntimeError):
    """A full load that would delete more of the current state than the table allows."""


def deletion_problem(config: TableConfig, business_date: str, counts: dict[str, int]) -> str | None:
    """Why the date's classification looks like a broken extract, or None when it is plausible.

    A change set deletes only what its records (delete flags, truncates) say, but a mass delete is
    as suspicious there: the same fraction applies.
    """
    if config.load_type is LoadType.delta:
        return None  # a delta leaves missing keys as X: nothing is deleted
    incoming = counts[INSERT] + counts[UPDATE] + counts[UNCHANGED]
    previous = counts[DELETE] + counts[UPDATE] + counts[UNCHANGED] + counts[NOT_SUPPLIED]
    if config.load_type is LoadType.changeset:
        if previous and counts[DELETE] > config.max_delete_fraction * previous:
            return (
                f"table {config.name}, {business_date}: the change set would delete {counts[DELETE]} of "
                f"{previous} current rows ({counts[DELETE] / previous:.1%}), more than max_delete_fraction "
                f"{config.max_delete_fraction:.0%}"
            )
        return None
    if incoming == 0:
        return (
            f"table {config.name}, {business_date}: the full extract is empty; it would delete all "
            f"{previous} current rows"
        )
    if previous and counts[DELETE] > config.max_delete_fraction * previous:
        return (
            f"table {config.name}, {business_date}: the full extract would delete {counts[DELETE]} of "
            f"{previous} current rows ({counts[DELETE] / previous:.1%}), more than max_delete_fraction "
            f"{config.max_delete_fraction:.0%}"
        )
    return None
