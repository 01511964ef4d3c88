"""``cdc-erase`` on an incremental state with retention (issue 46, points 2 and 4).

A full-load table stored as one merged ``current_table`` (a tag per date) keeps its newest two states
(``retention.current_days: 2``). The erased key is live on the first two dates and deleted on the
third, so no tag that is left shows it: its rows stay only in two data files that later dates read
with position deletes masking them. The erase must find those physical copies (not through a state
with the deletes applied) and rewrite them, mark the ledger complete only when ``--verify`` passes,
and tell the Dagster instance of the dates it can still re-check without failing on the dates
retention dropped.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterEventType, DagsterInstance, EventRecordsFilter

from cdc_assets.cli.erase import main as erase_main
from cdc_assets.model.names import CURRENT
from resources.storage import WarehouseStorage
from tests.pipeline import definitions_for, run_dates, write_table_config

pytestmark = pytest.mark.slow

TABLE = "members"
KEY, NAME, EMAIL = "987654", "Zelda Erasmus", "zelda@example.org"  # looked for byte by byte afterwards
DAYS = ["2024-03-01", "2024-03-02", "2024-03-03", "2024-03-04"]
OTHERS = ["1001,Ada Lovelace,ada@example.org,10", "1003,Grace Hopper,grace@example.org,30"]
EXTRACTS = {
    DAYS[0]: [*OTHERS, f"{KEY},{NAME},{EMAIL},50"],
    DAYS[1]: [*OTHERS, f"{KEY},{NAME},{EMAIL},60"],  # an update: a MERGE masks the first row with a position delete
    DAYS[2]: OTHERS,  # absent from a full load: deleted, its second row masked too
    DAYS[3]: [*OTHERS, "1005,Alan Turing,alan@example.org,70"],
}


def _live_data_files(storage: WarehouseStorage, asset: str) -> list[str]:
    """Every data file a snapshot the table's metadata keeps (its tags' and main's) lists, as Iceberg names it."""
    loaded = storage.tables.load(TABLE, asset)
    return sorted({task.file.file_path for snapshot in loaded.snapshots()
                   for task in loaded.scan(snapshot_id=snapshot.snapshot_id).plan_files()})


def _values_in(path: str) -> set[str]:
    """Every string value of a data file, read from its columns (deletes not applied)."""
    read = pq.read_table(path.removeprefix("file:"))
    return {str(value) for name in read.column_names for value in read.column(name).to_pylist() if value is not None}


def _files_holding(root: Path, text: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / TABLE).rglob("*")
                  if p.is_file() and "_erasures" not in p.parts and text.encode() in p.read_bytes())


@pytest.fixture(scope="module")
def erased(spark, tmp_path_factory):
    """The table run over four dates with a Dagster instance in DAGSTER_HOME, then ``cdc-erase`` of the key
    through the command line: (warehouse, storage, keys file, the erase's exit code and output)."""
    root = tmp_path_factory.mktemp("erase_incremental")
    warehouse, home, landing = root / "warehouse", root / "dagster_home", root / "landing"
    for folder in (warehouse, home, landing):
        folder.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDC_WAREHOUSE", str(warehouse))
        patch.setenv("DAGSTER_HOME", str(home))
        patch.setenv("CDC_TABLE_CONFIGS", str(root / "configs"))
        config = write_table_config(
            root / "configs", TABLE, str(landing / "{date}.csv"), start_date=DAYS[0],
            keys=[{"name": "member_id", "type": "int"}],
            non_keys=[{"name": "name", "type": "string"}, {"name": "email", "type": "string"}, {"name": "points", "type": "int"}],
            storage={"current": "incremental", "compact_after_dates": 30, "compact_after_share": 10.0},
            retention={"current_days": 2},
        )
        for day, lines in EXTRACTS.items():
            (landing / f"{day}.csv").write_text("\n".join(["member_id,name,email,points", *lines]) + "\n")
        instance = DagsterInstance.get()
        assert all(result.success for result in run_dates(definitions_for(config), DAYS, instance))
        storage = WarehouseStorage(str(warehouse))
        assert storage.stored_dates(TABLE, CURRENT) == DAYS[2:]  # retention dropped the tags the key was live on
        masked = [path for path in _live_data_files(storage, CURRENT) if NAME in _values_in(path)]
        assert len(masked) == 2, "the key's two rows must sit in live files, masked, for their removal to mean anything"
        keys = root / "erase.csv"
        keys.write_text(f"member_id\n{KEY}\n")
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                code, failure = erase_main([TABLE, "--keys", str(keys), "--reason", "GDPR-46"]), None
        except Exception as error:  # noqa: BLE001 - today's main crashed here: the test says so below
            code, failure = None, error
        print(output.getvalue())
        yield warehouse, storage, keys, instance, code, failure, output.getvalue()


def test_the_erase_rewrites_the_masked_copies_and_the_ledger_agrees_with_verify(erased, capsys):
    warehouse, storage, keys, *_ = erased
    for asset in storage.stored_assets(TABLE):
        holding = [path for path in _live_data_files(storage, asset) if {KEY, NAME, EMAIL} & _values_in(path)]
        assert holding == [], f"{asset}: {holding}"
    for text in (NAME, EMAIL):
        assert _files_holding(warehouse, text) == [], text
    (request,) = storage.erasure_requests(TABLE)
    assert request["status"] == "complete"
    assert request["stored_copies_removed"].get(CURRENT) == 2  # the two masked rows, which no state showed
    assert erase_main([TABLE, "--verify", "--keys", str(keys)]) == 0
    assert "0 stored files hold the keys" in capsys.readouterr().out


def test_the_erase_tells_dagster_of_the_stored_dates_and_names_those_it_could_not_check(erased):
    _, storage, _, instance, code, failure, output = erased
    assert failure is None, f"cdc-erase crashed after the erase: {failure!r}"
    assert code == 0
    records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ASSET_CHECK_EVALUATION), ascending=True)
    runs = {run.run_id for run in instance.get_runs()}
    reported: dict[str, set[str]] = {}
    for record in records:
        if record.run_id not in runs:  # reported by the erase, not by a run
            check = record.event_log_entry.dagster_event.event_specific_data
            reported.setdefault(check.partition, set()).add(check.asset_key.path[-1])
    # The intake checks of every date the erase touched are evaluated again (their staging outputs are
    # stored); the CDC checks of none, since each reads a state retention dropped (the date's or the day before's).
    assert set(reported) == set(DAYS[:3]) and all(assets == {"hashed_incoming"} for assets in reported.values()), reported
    assert f"{DAYS[0]}: the CDC checks not evaluated again: current_table {DAYS[0]} dropped by retention" in output
    assert f"{DAYS[2]}: the CDC checks not evaluated again: current_table {DAYS[1]} dropped by retention" in output
    assert "not erased (outside the warehouse)" in output and "Dagster's event log" in output
