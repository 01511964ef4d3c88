"""What a runs-log row says of a failure: the type and key-free summary of a SummarizedError (a duplicate
key, a tie, a bad record, a source that does not match its config...), else the error's type alone, never
an exception's message, which may hold row values (issue 33, point 2). The run that fails on a duplicate
key end to end, runs log and alert, is in tests/test_alerts.py."""

from __future__ import annotations

import pickle
from datetime import datetime, timezone

import pytest

from cdc_assets.core.errors import SummarizedError, error_summary, summarized_error_names
from cdc_assets.core.intake.incoming import BadRecordsError, DuplicateKeysError
from cdc_assets.core.intake.columns import SourceError
from cdc_assets.defs.runs_log import FAILED, runs_log_rows
from tests.pipeline import write_table_config

SECRET = "customer-4242424"


@pytest.fixture()
def config(tmp_path):
    return write_table_config(tmp_path, "shop", str(tmp_path / "landing/{date}.csv"))


def _logged(config, error: BaseException) -> str:
    rows = runs_log_rows(config, "run-1", datetime.now(timezone.utc), ["2024-01-01"], FAILED, "intake", error=error)
    (row,) = rows.to_pylist()
    return row["error"]


def test_an_error_of_unknown_content_is_logged_by_its_type_only(config):
    logged = _logged(config, ValueError(f"cannot cast {SECRET!r} to int"))
    assert logged == "ValueError (its message, which may hold row values, is in the run's own log only)"


def test_a_summarized_error_is_logged_by_its_summary_without_its_detail(config):
    error = DuplicateKeysError("table shop, 2024-01-01: 1 key(s) occur more than once, e.g. key_hash 0123abcd x2.", f"{{id={SECRET!r}}} x2")
    assert str(error).splitlines() == [error.summary, error.detail] and SECRET in str(error)
    assert _logged(config, error) == "DuplicateKeysError: table shop, 2024-01-01: 1 key(s) occur more than once, e.g. key_hash 0123abcd x2."
    # Raised from what it explains, it is still what the row says; wrapped in an unknown error, too.
    try:
        try:
            raise KeyError(SECRET)
        except KeyError as cause:
            raise SourceError("table shop: input x: no input") from cause
    except SourceError as raised:
        assert _logged(config, raised) == "SourceError: table shop: input x: no input"
        wrapper = RuntimeError(f"while reading {SECRET}")
        wrapper.__cause__ = raised
        assert error_summary(wrapper) == "SourceError: table shop: input x: no input"


def test_a_message_given_as_one_text_is_split_at_its_first_line_and_survives_pickling():
    error = BadRecordsError(f"table shop, 2024-01-01: 1 bad record(s).\n  f.csv record 2: bad (raw: {SECRET})")
    assert error.summary == "table shop, 2024-01-01: 1 bad record(s)." and SECRET in error.detail
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.summary, again.detail, str(again)) == (BadRecordsError, error.summary, error.detail, str(error))


def test_the_errors_that_say_what_failed_without_row_values():
    assert {"BadRecordsError", "DuplicateKeysError", "SourceError", "SchemaChangeError", "MassDeleteError",
            "MissingPartitionError", "DroppedPartitionError", "WriterLockTimeout"} <= summarized_error_names()
    assert issubclass(DuplicateKeysError, (SummarizedError, ValueError)) and issubclass(SourceError, RuntimeError)
