"""Table config loading: valid files load, and every error names the file and the field."""

from __future__ import annotations

import copy
from datetime import date
from pathlib import Path

import pytest
import yaml

from cdc_assets.model.config import (
    DEFAULT_TABLE_CONFIGS,
    TABLE_CONFIGS_ENV,
    BadRecordPolicy,
    DuplicateKeyPolicy,
    LoadType,
    SourceFormat,
    TableConfigError,
    load_table_config,
    load_table_configs,
)

VALID = {
    "name": "orders",
    "description": "Orders extract",
    "start_date": "2024-01-01",
    "load_type": "delta",
    "source": {"path": "data/orders/{date}/", "format": "csv", "options": {"header": True, "sep": ";"}},
    "keys": [{"name": "order_id", "type": "bigint"}, {"name": "line", "type": "int"}],
    "non_keys": [
        {"name": "amount", "type": "Decimal(12, 2)"},
        {"name": "placed_at", "type": "timestamp"},
        {"name": "Shipped", "type": "BOOLEAN"},
    ],
    "untracked_columns": [{"name": "loaded_by", "type": "string"}],
    "bad_records": "fail",
    "duplicate_keys": "quarantine",
    "max_delete_fraction": 0.25,
    "allow_extra_columns": True,
    "owners": ["team:orders"],
}


def write_config(folder: Path, data: dict, file_name: str = "orders.yaml") -> Path:
    path = folder / file_name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def variant(**changes) -> dict:
    data = copy.deepcopy(VALID)
    for dotted, value in changes.items():
        target = data
        *parents, last = dotted.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if last.isdigit():
            target[int(last)] = value
        else:
            target[last] = value
    return data


def test_valid_config_loads(tmp_path):
    config = load_table_config(write_config(tmp_path, VALID))
    assert config.name == "orders"
    assert config.start_date == date(2024, 1, 1)
    assert config.load_type is LoadType.delta
    assert config.source.format is SourceFormat.csv
    assert config.source.options == {"header": True, "sep": ";"}
    assert config.key_names == ["order_id", "line"]
    # Types are normalised; names keep their case.
    assert [(c.name, c.type) for c in config.columns] == [
        ("order_id", "bigint"),
        ("line", "int"),
        ("amount", "decimal(12,2)"),
        ("placed_at", "timestamp"),
        ("Shipped", "boolean"),
        ("loaded_by", "string"),
    ]
    assert config.bad_records is BadRecordPolicy.fail
    assert config.duplicate_keys is DuplicateKeyPolicy.quarantine
    assert config.max_delete_fraction == 0.25
    assert config.allow_extra_columns is True


def test_defaults(tmp_path):
    minimal = {
        "name": "t1",
        "start_date": "2024-01-01",
        "load_type": "full",
        "source": {"path": "/abs/t1/{date}.csv"},
        "keys": [{"name": "id", "type": "int"}],
    }
    config = load_table_config(write_config(tmp_path, minimal))
    assert config.source.format is SourceFormat.csv
    assert config.non_keys == [] and config.untracked_columns == []
    assert config.bad_records is BadRecordPolicy.quarantine
    assert config.duplicate_keys is DuplicateKeyPolicy.fail
    assert config.max_delete_fraction == 0.5
    assert config.allow_extra_columns is False
    # An absolute path is used as is.
    assert config.source.path_for("2024-01-02") == "/abs/t1/2024-01-02.csv"


def test_end_date_is_the_last_partition(tmp_path):
    from cdc_assets.defs.factory import build_table_definitions

    ended = build_table_definitions(load_table_config(write_config(tmp_path, variant(end_date="2024-01-03"))))
    assert ended.partitions_def.get_partition_keys() == ["2024-01-01", "2024-01-02", "2024-01-03"]
    # Without one, the partitions run to yesterday (UTC).
    open_ended = build_table_definitions(load_table_config(write_config(tmp_path, VALID)))
    assert open_ended.config.end_date is None
    assert len(open_ended.partitions_def.get_partition_keys()) > 3


def test_relative_source_path_resolves_against_data_root(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_DATA_ROOT", str(tmp_path))
    config = load_table_config(write_config(tmp_path, VALID))
    assert config.source.path_for("2024-03-04") == str(tmp_path.resolve() / "data/orders/2024-03-04/")


INVALID = {
    "unknown top-level field": (variant(colour="blue"), "colour"),
    "bad type name": (variant(non_keys__0__type="strng"), "non_keys.0.type"),
    "decimal precision too large": (variant(non_keys__0__type="decimal(40,2)"), "non_keys.0.type"),
    "decimal scale above precision": (variant(non_keys__0__type="decimal(2,3)"), "non_keys.0.type"),
    "column listed twice": (
        variant(non_keys=[{"name": "amount", "type": "double"}, {"name": "amount", "type": "double"}]),
        "non_keys",
    ),
    "column listed twice, different case": (
        variant(non_keys=[{"name": "amount", "type": "double"}, {"name": "AMOUNT", "type": "double"}]),
        "non_keys",
    ),
    "key also a non-key": (variant(non_keys=[{"name": "order_id", "type": "bigint"}]), "non_keys"),
    "key also untracked": (variant(untracked_columns=[{"name": "line", "type": "int"}]), "untracked_columns"),
    "table name with capital and dash": (variant(name="Bad-Name"), "name"),
    "table name escaping": (variant(name="../escape"), "name"),
    "table name absolute": (variant(name="/abs"), "name"),
    "bad start_date": (variant(start_date="2024-13-45"), "start_date"),
    "start_date not a date": (variant(start_date="yesterday"), "start_date"),
    "end_date before start_date": (variant(end_date="2023-12-31"), "end_date"),
    "end_date not a date": (variant(end_date="never"), "end_date"),
    "unknown source format": (variant(source__format="xlsx"), "source.format"),
    "path without {date}": (variant(source__path="data/orders/latest.csv"), "source.path"),
    "path with another placeholder": (variant(source__path="data/{table}/{date}/"), "source.path"),
    "reserved column name": (variant(non_keys=[{"name": "key_hash", "type": "string"}]), "non_keys.0.name"),
    "reserved column name, other case": (
        variant(untracked_columns=[{"name": "Eff_Start_Date", "type": "date"}]),
        "untracked_columns.0.name",
    ),
    "pipeline working column name": (variant(non_keys=[{"name": "_source_file", "type": "string"}]), "non_keys.0.name"),
    "pipeline working column prefix": (variant(keys=[{"name": "__cdc_typed_0", "type": "string"}]), "keys.0.name"),
    "spark file metadata column": (variant(untracked_columns=[{"name": "_METADATA", "type": "string"}]), "untracked_columns.0.name"),
    "late_changes column in a changeset table": (
        variant(
            load_type="changeset",
            changes={"operation_column": "op", "sequence_columns": ["placed_at"]},
            non_keys__2={"name": "Reason", "type": "string"},
        ),
        "non_keys.2.name",
    ),
    "hashed_incoming column": (variant(non_keys__0={"name": "unavailable_columns", "type": "string"}), "non_keys.0.name"),
    "later stage working column": (variant(untracked_columns=[{"name": "_in_hash", "type": "string"}]), "untracked_columns.0.name"),
    "pipeline working column prefix, other case": (variant(non_keys__0={"name": "__CDC_flag", "type": "string"}), "non_keys.0.name"),
    "renamed from a reserved name": (
        variant(non_keys__0={"name": "amount", "type": "double", "renamed_from": "key_hash"}),
        "non_keys.0.renamed_from",
    ),
    "changeset flag column with a reserved name": (
        variant(load_type="changeset", changes={"operation_column": "__cdc_tombstone", "sequence_columns": ["placed_at"]}),
        "changes.operation_column",
    ),
    "unknown encoding": (variant(source__encoding="klingon-8"), "source.encoding"),
    "multi-byte encoding other than UTF-8": (variant(source__encoding="shift_jis"), "source.encoding"),
    "encoding that is not ASCII as is": (variant(source__encoding="utf-16"), "source.encoding"),
    "encoding as a reader option": (variant(source__options={"header": True, "encoding": "latin1"}), "source.options.encoding"),
    "reader option the encoding cannot encode": (variant(source__encoding="latin-1", source__options={"sep": "€"}), "source.options.sep"),
    "encoding of a parquet source": (variant(source__format="parquet", source__encoding="latin-1"), "source.encoding"),
    "column name not an identifier": (variant(non_keys=[{"name": "amount usd", "type": "double"}]), "non_keys.0.name"),
    # re.match with "$" let a trailing newline through (issue 46): every name is matched whole.
    "table name with a trailing newline": (variant(name="orders\n"), "name"),
    "column name with a trailing newline": (variant(non_keys=[{"name": "amount\n", "type": "double"}]), "non_keys.0.name"),
    "max_delete_fraction above 1": (variant(max_delete_fraction=1.5), "max_delete_fraction"),
    "max_delete_fraction negative": (variant(max_delete_fraction=-0.1), "max_delete_fraction"),
    "bad_records maybe": (variant(bad_records="maybe"), "bad_records"),
    "duplicate_keys unknown": (variant(duplicate_keys="keep_first"), "duplicate_keys"),
    "load_type unknown": (variant(load_type="incremental"), "load_type"),
    "no keys": (variant(keys=[]), "keys"),
    "unknown column field": (variant(keys__0={"name": "order_id", "type": "bigint", "nullable": False}), "keys.0.nullable"),
    "unknown source field": (variant(source__compression="gzip"), "source.compression"),
}


@pytest.mark.parametrize("case", list(INVALID), ids=list(INVALID))
def test_invalid_config_names_file_and_field(tmp_path, case):
    data, field = INVALID[case]
    path = write_config(tmp_path, data)
    with pytest.raises(TableConfigError) as raised:
        load_table_config(path)
    message = str(raised.value)
    assert str(path) in message
    assert field in message, message


def test_late_changes_columns_are_reserved_in_changeset_tables_only(tmp_path):
    """``reason`` is a common column name; only a change set's late_changes puts one beside the table's own."""
    config = load_table_config(write_config(tmp_path, variant(non_keys__2={"name": "reason", "type": "string"})))
    assert "reason" in [column.name for column in config.columns]


def test_source_encoding_defaults_to_utf8_and_takes_single_byte_encodings(tmp_path):
    assert load_table_config(write_config(tmp_path, VALID)).source.encoding == "UTF-8"
    for name in ("latin-1", "ISO-8859-15", "windows-1252", "cp1250"):
        assert load_table_config(write_config(tmp_path, variant(source__encoding=name))).source.encoding == name


def test_duplicate_column_message_names_the_column(tmp_path):
    path = write_config(tmp_path, variant(non_keys=[{"name": "order_id", "type": "bigint"}]))
    with pytest.raises(TableConfigError, match=r"'order_id'.*both keys and non_keys"):
        load_table_config(path)


def test_unquoted_invalid_date_in_yaml_names_file_and_field(tmp_path):
    # YAML itself turns an unquoted 2024-13-45 into a date and fails; that must still be a config error.
    text = yaml.safe_dump(variant(start_date="PLACEHOLDER"), sort_keys=False).replace("PLACEHOLDER", "2024-13-45")
    path = tmp_path / "orders.yaml"
    path.write_text(text)
    assert "start_date: 2024-13-45" in text
    with pytest.raises(TableConfigError) as raised:
        load_table_config(path)
    assert str(path) in str(raised.value)
    assert "start_date" in str(raised.value)


def test_unquoted_valid_date_in_yaml_loads(tmp_path):
    text = yaml.safe_dump(variant(start_date="PLACEHOLDER"), sort_keys=False).replace("PLACEHOLDER", "2024-02-29")
    path = tmp_path / "orders.yaml"
    path.write_text(text)
    assert load_table_config(path).start_date == date(2024, 2, 29)


def test_invalid_yaml_and_non_mapping_name_the_file(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(TableConfigError, match="not valid YAML") as raised:
        load_table_config(broken)
    assert str(broken) in str(raised.value)

    listed = tmp_path / "listed.yaml"
    listed.write_text("- name: orders\n")
    with pytest.raises(TableConfigError, match="mapping") as raised:
        load_table_config(listed)
    assert str(listed) in str(raised.value)


def test_folder_with_two_files_defining_the_same_table(tmp_path):
    first = write_config(tmp_path, VALID, "a_orders.yaml")
    second = write_config(tmp_path, VALID, "b_orders.yml")
    with pytest.raises(TableConfigError) as raised:
        load_table_configs(tmp_path)
    message = str(raised.value)
    assert str(first) in message and str(second) in message
    assert "orders" in message


def test_folder_loads_sorted_by_name(tmp_path):
    write_config(tmp_path, variant(name="zeta"), "1.yaml")
    write_config(tmp_path, variant(name="alpha"), "2.yml")
    (tmp_path / "notes.txt").write_text("not a config")
    assert [config.name for config in load_table_configs(tmp_path)] == ["alpha", "zeta"]


def test_folder_with_one_bad_file_fails_naming_it(tmp_path):
    write_config(tmp_path, VALID, "good.yaml")
    bad = write_config(tmp_path, variant(name="other", bad_records="maybe"), "bad.yaml")
    with pytest.raises(TableConfigError) as raised:
        load_table_configs(tmp_path)
    assert str(bad) in str(raised.value) and "bad_records" in str(raised.value)


def test_missing_folder(tmp_path):
    with pytest.raises(TableConfigError, match=TABLE_CONFIGS_ENV):
        load_table_configs(tmp_path / "nope")


def test_shipped_table_configs_load(monkeypatch):
    configs = {config.name: config for config in load_table_configs(DEFAULT_TABLE_CONFIGS)}
    assert "synthetic" in configs
    synthetic = configs["synthetic"]
    assert synthetic.load_type is LoadType.full
    assert synthetic.key_names == [f"key_{i}" for i in range(1, 6)]
    assert [c.name for c in synthetic.non_keys] == [f"nonkey_{j}" for j in range(1, 11)]
    assert "{date}" in synthetic.source.path
    # The default folder (no CDC_TABLE_CONFIGS) is the shipped one.
    monkeypatch.delenv(TABLE_CONFIGS_ENV, raising=False)
    assert "synthetic" in {config.name for config in load_table_configs()}


def test_every_name_the_pipeline_uses_for_itself_is_reserved():
    """The reserved names are one list (cdc_assets/model/config.py); this keeps it in step with the code that
    uses them: every named column constant, and every single-underscore name the core gives a column."""
    import ast

    from cdc_assets.model.config import CHANGESET_COLUMNS, reserved_name_problem
    from cdc_assets.core import compare, hashing
    from cdc_assets.core.views import between
    from cdc_assets.core.capture import changes
    from cdc_assets.core.capture import changeset
    from cdc_assets.core.views import scd2
    from cdc_assets.core.intake import source
    from cdc_assets.core.columns import BUSINESS_DATE

    named = [
        BUSINESS_DATE, hashing.KEY_HASH, hashing.NON_KEY_HASH, changes.OPERATION, changes.EFF_START_DATE,
        changes.PROCESS_ID, changes.PROCESSED_AT, compare.CHANGED_COLUMNS, source.SOURCE_FILE, source.RAW_RECORD,
        source.REJECT_REASON, source.RECORD_ID, source._CORRUPT, source.FLAG, source.TOMBSTONE, source.READER_PROBLEM,
        source.RAW_LINE, source.UNAVAILABLE, source.UNAVAILABLE_COLUMNS, source.CHANGE_FLAG, source.CHANGE_SEQUENCE,
        source.sequence_text_column(0), changeset.REASON, changeset.APPLIED_SEQUENCE, scd2.VALID_FROM, scd2.VALID_TO,
        scd2.IS_CURRENT, scd2.IS_DELETED, between.CHANGE_TYPE, between.FROM_DATE, between.TO_DATE, "_metadata",
    ]
    core = Path(source.__file__).parents[1]  # cdc_assets/core, every stage
    literals = {
        node.value
        for path in core.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value[:1] == "_"
        and node.value[1:2].isalpha() and node.value.replace("_", "").isalnum() and node.value.islower()
    } - {"_c"}  # Spark's name for a header field without one (core/intake/source.py), not one the pipeline gives
    assert len(literals) > 20  # the scan finds the core's working names
    unreserved = sorted(
        name for name in [*named, *literals] if reserved_name_problem(name) is None and name not in CHANGESET_COLUMNS
    )
    assert unreserved == []
    assert reserved_name_problem("_in_amount") and reserved_name_problem("_Held_3") and reserved_name_problem("_before_x")
    assert reserved_name_problem("amount") is None and reserved_name_problem("deleted") is None
