"""What a real run leaves on disk for other eyes (issue 46): no key or sensitive value in Dagster's instance
(point 5), and only owner-only files under the warehouse and DAGSTER_HOME (point 13).

One run as ``make demo`` makes it: ``DAGSTER_HOME`` by the Makefile's own recipe, then ``dagster asset
materialize`` of a date whose extract holds a distinctive key, name and email, and two bad records (one with a
sensitive value that does not cast), then ``cdc-erase`` of the key with ``DAGSTER_HOME`` set. Both commands
start under umask 022, a usual login's: what they write is the project's doing. Then every byte of every file
under ``DAGSTER_HOME`` (the SQLite run, event and schedule databases, the compute logs) is read.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"
DAY = "2024-01-01"
# Values no count, id, date or path could hold by chance.
KEY, NAME, EMAIL = "KQZX7731", "Wolfgang Xyloquist", "zq.erasable@example.invalid"
BAD_KEY, BAD_EMAIL, BAD_BIRTH_DATE = "KBAD9001", "bad.record@example.invalid", "BADDATE31337"
SECRETS = (KEY, NAME, EMAIL, BAD_KEY, BAD_EMAIL, BAD_BIRTH_DATE)
CITY = "Quuxville"  # not sensitive: a preview may show it, and shows that the scan reads the previews
EXTRACT = (
    "customer_id,name,email,birth_date,city,amount\n"
    f"{KEY},{NAME},{EMAIL},1970-01-01,{CITY},12.5\n"
    "K2,Ann Other,ann@example.invalid,1980-02-02,Lyon,3\n"
    f"{BAD_KEY},Bad Record,{BAD_EMAIL},1990-03-03,Paris,oops\n"  # amount does not cast: its value may be shown
    f"K4,Dee Fourth,dee@example.invalid,{BAD_BIRTH_DATE},Nice,4\n"  # a sensitive value that does not cast
)


def _config(landing: Path) -> dict:
    return {
        "name": "people",
        "start_date": DAY,
        "end_date": DAY,
        "load_type": "full",
        "source": {"path": f"{landing}/{{date}}/", "format": "csv"},
        "keys": [{"name": "customer_id", "type": "string"}],
        "non_keys": [
            {"name": "name", "type": "string", "sensitive": True},
            {"name": "email", "type": "string", "sensitive": True},
            {"name": "birth_date", "type": "date", "sensitive": True},
            {"name": "city", "type": "string"},
            {"name": "amount", "type": "double"},
        ],
    }


def _usual_umask() -> None:
    os.umask(0o022)


@pytest.fixture(scope="module")
def erased_run(tmp_path_factory):
    """The run and the erase (module docstring); their folders and the erase's output."""
    root = tmp_path_factory.mktemp("privacy")
    (root / "landing" / DAY).mkdir(parents=True)
    (root / "landing" / DAY / "part.csv").write_text(EXTRACT)
    (root / "configs").mkdir()
    (root / "configs" / "people.yaml").write_text(yaml.safe_dump(_config(root / "landing")))
    (root / "keys.csv").write_text(f"customer_id\n{KEY}\n")
    home, warehouse = root / "dagster_home", root / "warehouse"
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_REMOTE", "CDC_UMASK", "CDC_SHOW_VALUES")}
    env.update(
        PYTHONPATH=str(REPO), DAGSTER_HOME=str(home), CDC_TABLE_CONFIGS=str(root / "configs"), CDC_WAREHOUSE=str(warehouse),
        CDC_SPARK="local",
        CDC_SPARK_CONF='{"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.driver.memory": "1g"}',
    )
    commands = [
        ["make", "-s", f"DAGSTER_HOME={home}", f"{home}/dagster.yaml"],  # the Makefile's recipe, as `make demo` runs it
        [str(BIN / "dagster"), "asset", "materialize", "-m", "cdc_assets.defs.definitions", "--select", "group:people", "--partition", DAY],
        [str(BIN / "cdc-erase"), "people", "--keys", str(root / "keys.csv"), "--reason", "a test"],
    ]
    outputs = []
    for command in commands:
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900, preexec_fn=_usual_umask)
        assert done.returncode == 0, (command, done.stdout[-4000:], done.stderr[-6000:])
        outputs.append(done.stdout)
    return home, warehouse, outputs[-1]


def test_dagster_home_holds_no_key_nor_sensitive_value_after_a_run_and_an_erase(erased_run):
    home, _, erased = erased_run
    files = [path for path in home.rglob("*") if path.is_file()]
    names = {path.name for path in files}
    assert {"runs.db", "index.db"} <= names and any(path.suffix == ".err" for path in files), names  # event log, compute logs
    held = {secret: [str(path.relative_to(home)) for path in files if secret.encode() in path.read_bytes()] for secret in SECRETS}
    assert held == {secret: [] for secret in SECRETS}
    # The previews are there, with the values no one's: a non-sensitive column's and a reason's of one.
    event_log = b"".join(path.read_bytes() for path in files if path.suffix == ".db")
    assert CITY.encode() in event_log and b"value 'oops'" in event_log
    assert b"column birth_date: value (masked)" in event_log  # a sensitive value in a reject's reason
    # cdc-erase says what Dagster keeps.
    assert "cdc-erase: Dagster's event log keeps what runs recorded" in erased and "no key or sensitive value" in erased


def _loose(root: Path) -> list[str]:
    """Every folder under ``root`` (itself included) that is not 0700, and every file that is not 0600."""
    found = []
    for folder, folders, files in os.walk(root):
        for path, wanted in [(Path(folder), 0o700)] + [(Path(folder, name), 0o600) for name in files]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode != wanted and not path.is_symlink():
                found.append(f"{mode:04o} {path}")
    return found


def test_every_folder_the_run_made_is_0700_and_every_file_0600(erased_run):
    home, warehouse, _ = erased_run
    assert (warehouse / "lake_catalog.db").is_file()  # the embedded catalog
    assert list((warehouse / "people" / "_erasures").glob("*/request.json"))  # the ledger
    assert list((warehouse / "people" / "current_table" / "data").rglob("*.parquet"))  # what the JVM wrote
    assert list((home / "storage").rglob("*.err"))  # the compute logs
    assert _loose(warehouse) == [] and _loose(home) == []
