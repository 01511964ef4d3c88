"""The ``scd2:`` block of a table config and the column names the consumer views reserve."""

from __future__ import annotations

from datetime import date

import pytest
import yaml

from cdc_assets.model.config import HardDeletes, TableConfigError, load_table_config

BASE = {
    "name": "orders",
    "start_date": "2024-01-01",
    "load_type": "delta",
    "source": {"path": "data/orders/{date}.csv"},
    "keys": [{"name": "order_id", "type": "int"}],
    "non_keys": [{"name": "amount", "type": "decimal(10,2)"}],
}


def write(tmp_path, text: str):
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False) + text)
    return path


def test_without_a_block_open_versions_end_null_and_deletes_invalidate(tmp_path):
    config = load_table_config(write(tmp_path, ""))
    assert config.scd2.open_end is None
    assert config.scd2.hard_deletes is HardDeletes.invalidate


@pytest.mark.parametrize(
    ("block", "open_end", "hard_deletes"),
    [
        ("scd2:\n  open_end: 9999-12-31\n  hard_deletes: new_record\n", date(9999, 12, 31), HardDeletes.new_record),
        ("scd2:\n  open_end: null\n", None, HardDeletes.invalidate),
        ("scd2: {open_end: '2999-01-01', hard_deletes: invalidate}\n", date(2999, 1, 1), HardDeletes.invalidate),
    ],
)
def test_scd2_block_loads(tmp_path, block, open_end, hard_deletes):
    config = load_table_config(write(tmp_path, block))
    assert config.scd2.open_end == open_end
    assert config.scd2.hard_deletes is hard_deletes


@pytest.mark.parametrize(
    ("block", "field", "says"),
    [
        ("scd2:\n  hard_deletes: ignore\n", "scd2.hard_deletes", "'invalidate' or 'new_record'"),
        ("scd2:\n  open_end: 9999-13-31\n", "scd2.open_end", "date"),
        ("scd2:\n  valid_to_value: 9999-12-31\n", "scd2.valid_to_value", "Extra inputs"),
        ("scd2: new_record\n", "scd2", "valid dictionary"),
    ],
)
def test_invalid_scd2_block_names_file_and_field(tmp_path, block, field, says):
    path = write(tmp_path, block)
    with pytest.raises(TableConfigError) as raised:
        load_table_config(path)
    message = str(raised.value)
    assert str(path) in message
    assert f"field '{field}'" in message, message
    assert says in message, message


@pytest.mark.parametrize(
    "name",
    ["process_id", "processed_at", "changed_columns", "valid_from", "valid_to", "is_current", "Is_Deleted",
     "_change_type", "_from_date", "_to_date"],
)
def test_columns_of_the_outputs_and_views_are_reserved(tmp_path, name):
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump({**BASE, "untracked_columns": [{"name": name, "type": "string"}]}))
    with pytest.raises(TableConfigError, match="reserved") as raised:
        load_table_config(path)
    assert str(path) in str(raised.value)
    assert "field 'untracked_columns.0.name'" in str(raised.value)
