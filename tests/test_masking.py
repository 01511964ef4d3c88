"""Which row values the project shows (cdc_assets/model/masking.py): keys and ``sensitive: true`` columns are
masked by default in previews, errors and logs, which Dagster keeps beyond an erase (issue 46, point 5).
No Spark: the masking functions, the config field and the preview's Markdown."""

from __future__ import annotations

import pytest
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from cdc_assets.model.config import TableConfig, TableConfigError, load_table_config
from cdc_assets.model.masking import MASKED, ShowValues, ValueMask, is_sensitive, shown_column_names, what_dagster_keeps
from resources.parquet_io_manager import describe_partition


def _config(**overrides) -> TableConfig:
    data = {
        "name": "people",
        "start_date": "2024-01-01",
        "load_type": "full",
        "source": {"path": "landing/{date}/", "format": "csv"},
        "keys": [{"name": "customer_id", "type": "string"}],
        "non_keys": [
            {"name": "email", "type": "string", "sensitive": True},
            {"name": "full_name", "type": "string", "sensitive": True, "renamed_from": "name"},
            {"name": "city", "type": "string"},
        ],
        "untracked_columns": [{"name": "note", "type": "string"}],
    }
    data.update(overrides)
    return TableConfig.model_validate(data)


def test_keys_and_sensitive_columns_are_masked_by_default_and_the_rest_shown(monkeypatch):
    monkeypatch.delenv("CDC_SHOW_VALUES", raising=False)
    config = _config()
    assert [is_sensitive(config, name) for name in ("customer_id", "email", "full_name", "name", "city", "note")] == [
        True, True, True, True, False, False,
    ]  # fmt: skip
    assert shown_column_names(config) == ["city", "note"]
    mask = ValueMask.for_table(config)
    assert mask.mode is ShowValues.masked
    names = ["customer_id", "email", "full_name", "city", "note", "key_hash", "operation", "eff_start_date", "unknown_column"]
    values = ["C-4242", "a@example.invalid", "Ann Example", "Paris", None, "0123abcd", "I", "2024-01-01", "anything"]
    assert mask.row(names, values) == [MASKED, MASKED, MASKED, "Paris", "", "0123abcd", "I", "2024-01-01", MASKED]
    assert mask.value("CITY", "Paris") == "Paris"  # any case, as Spark resolves names
    assert mask.key(["customer_id"], ["C-4242"]) == f"{{customer_id={MASKED}}}"
    # A reject's raw record holds every field; its reason quotes the value of the column that failed.
    assert mask.value("raw_record", "C-4242,a@example.invalid") == MASKED
    assert mask.value("reason", "column email: value 'a@x' is not a valid string") == f"column email: value {MASKED} is not a valid string"
    assert mask.value("reason", "column city: value 'P@r1s' is not a valid date") == "column city: value 'P@r1s' is not a valid date"
    assert mask.reason("column customer_id: value 'it''s' has logical type 'x', which a int column does not take") == (
        f"column customer_id: value {MASKED} has logical type 'x', which a int column does not take"
    )
    assert mask.reason("key column customer_id is NULL or empty") == "key column customer_id is NULL or empty"


def test_a_key_declared_not_sensitive_is_shown_and_the_other_modes_show_all_or_nothing(monkeypatch):
    config = _config(keys=[{"name": "order_id", "type": "int", "sensitive": False}])
    assert ValueMask.for_table(config, ShowValues.masked).key(["order_id"], [1002]) == "{order_id=1002}"

    monkeypatch.setenv("CDC_SHOW_VALUES", "all")
    everything = ValueMask.for_table(_config())
    assert everything.row(["customer_id", "email", "raw_record"], ["C-4242", "a@x", "C-4242,a@x"]) == ["C-4242", "a@x", "C-4242,a@x"]
    assert everything.reason("column email: value 'a@x' is not a valid string").endswith("'a@x' is not a valid string")

    monkeypatch.setenv("CDC_SHOW_VALUES", "none")
    nothing = ValueMask.for_table(_config())
    assert not nothing.shows_rows and nothing.value("city", "Paris") == MASKED

    monkeypatch.setenv("CDC_SHOW_VALUES", "some")
    with pytest.raises(ValueError, match="CDC_SHOW_VALUES='some': use one of masked, none, all"):
        ValueMask.for_table(_config())


def test_the_preview_masks_by_column_name_and_escapes_cells(monkeypatch):
    monkeypatch.delenv("CDC_SHOW_VALUES", raising=False)
    schema = StructType([StructField(name, StringType()) for name in ("customer_id", "email", "city")] + [StructField("amount", DoubleType())])
    mask = ValueMask.for_table(_config(non_keys=[{"name": "email", "type": "string", "sensitive": True}, {"name": "city", "type": "string"},
                                                 {"name": "amount", "type": "double"}]))
    rows = [("C-4242", "a@example.invalid", "Pa|ris", 12.5), ("C-7", None, "Lyon\nCentre", None)]
    preview = describe_partition(schema, "/w/people/current_table", 2, rows, mask)["preview"].value
    assert preview.splitlines() == [
        "| customer_id | email | city | amount |",
        "|---|---|---|---|",
        f"| {MASKED} | {MASKED} | Pa\\|ris | 12.5 |",
        f"| {MASKED} |  | Lyon Centre |  |",
    ]
    assert "C-4242" not in preview and "example.invalid" not in preview
    # Without the factory's metadata a preview knows no configured column: only the pipeline's own are shown.
    unknown = describe_partition(schema, "/w", 2, rows, ValueMask.for_columns((), ShowValues.masked))["preview"].value
    assert "Pa\\|ris" not in unknown and "12.5" not in unknown
    # none: the header only.
    header_only = describe_partition(schema, "/w", 2, rows, ValueMask.for_columns(("city",), ShowValues.none))["preview"].value
    assert header_only.count("\n") == 1


def test_sensitive_must_be_a_boolean_and_the_error_names_the_file_and_field(tmp_path):
    path = tmp_path / "people.yaml"
    path.write_text(
        "name: people\nstart_date: 2024-01-01\nload_type: full\nsource: {path: 'landing/{date}/', format: csv}\n"
        "keys: [{name: id, type: int}]\nnon_keys: [{name: email, type: string, sensitive: 'yes please'}]\n"
    )
    with pytest.raises(TableConfigError, match=r"(?s)people\.yaml.*field 'non_keys\.0\.sensitive'"):
        load_table_config(path)


def test_what_cdc_erase_says_dagster_keeps_follows_the_setting():
    assert "no key or sensitive value" in what_dagster_keeps(ShowValues.masked)
    assert "hold no row value" in what_dagster_keeps(ShowValues.none)
    assert "keys included" in what_dagster_keeps(ShowValues.all)
    assert "dagster asset wipe" in what_dagster_keeps(ShowValues.masked)
