"""The intake's own columns and its whole-input error: what every reader of an extract (``source.py`` for
CSV, JSON and Parquet, ``debezium.py`` for Debezium events) and the steps after it name. No Spark here."""

from __future__ import annotations

from cdc_assets.model.config import INTERNAL_PREFIX, TableConfig
from cdc_assets.core.errors import SummarizedError

SOURCE_FILE = "_source_file"
RAW_RECORD = "_raw_record"
REJECT_REASON = "_reject_reason"
RECORD_ID = "_record_id"  # increases in file order within each file; ranks give record numbers


class SourceError(SummarizedError, RuntimeError):
    """The day's input cannot be used as a whole: missing, or its columns do not match the config.

    What a file's header says goes in the detail only: a file landed without a header has a record there.
    """


def no_input_error(config: TableConfig, path: str) -> SourceError:
    """The error for an extract that is missing, or holds only empty files: never read as an empty one."""
    return SourceError(
        f"table {config.name}: no input at {path}. A missing extract is never treated as an empty one; "
        "land the file or fix source.path."
    )


# A changeset's working columns (see core/capture/changeset.py): the record's flag as found in the source,
# and, for Debezium, each sequence field's text, tombstone lines, and a reason the reader gave up.
FLAG = f"{INTERNAL_PREFIX}flag"
TOMBSTONE = f"{INTERNAL_PREFIX}tombstone"
READER_PROBLEM = f"{INTERNAL_PREFIX}bad"
RAW_LINE = f"{INTERNAL_PREFIX}raw_line"
# Debezium: the columns an event left out as unchanged (the connector's placeholder), NULL if none.
# Carried into hashed_incoming as UNAVAILABLE_COLUMNS, where the CDC step fills them in.
UNAVAILABLE = f"{INTERNAL_PREFIX}unavailable"
UNAVAILABLE_COLUMNS = "unavailable_columns"
CHANGE_FLAG, CHANGE_SEQUENCE = "change_flag", "change_sequence"
TRUNCATE = "T"


SEQUENCE_PREFIX = f"{INTERNAL_PREFIX}sequence_"


def sequence_text_column(index: int) -> str:
    return f"{SEQUENCE_PREFIX}{index}"
