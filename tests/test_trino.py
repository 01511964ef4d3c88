"""Trino 476 reading the demo's warehouse (cdc_assets/cli/trino_server.py, `make trino-up`): the server from
`make trino-install`, on Java 24+, on loopback only, read-only over the embedded catalog and over a lake's
REST catalog (SeaweedFS, SigV4-signed, the objects through Trino's native S3).

The demo's two dates, run one date per run as a user's daily runs are, in this process's Spark; then, through
Trino's own CLI: the tables by name, the README's counts and labels, the stored rows equal to Spark's, time
travel to a business date by its tag, and every write refused. DuckDB reads the same: the state's query
`cdc-catalog sql-for` prints, and on the lake the catalog attached by name (read-only).
"""

from __future__ import annotations

import contextlib
import csv
import ipaddress
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
import duckdb
from pyspark.sql import functions as F

from cdc_assets.cli import trino_server
from cdc_assets.cli.generate import generate
from cdc_assets.engines import lake_server
from cdc_assets.model.config import TableConfig
from cdc_assets.engines.duckdb_iceberg import duckdb_connection
from cdc_assets.usecases.readers import (
    current_duckdb_sql,
    current_spark_sql,
    current_state,
    current_trino_sql,
    scd2_spark_sql,
    scd2_trino_sql,
    scd2_view,
)
from resources.storage import WarehouseStorage
from resources.storage.lake import CatalogSettingError, LakeCatalog
from tests.lake import lake_variables, pointed_at, start_lake, upload
from tests.pipeline import definitions_for, run_dates, write_table_config

pytestmark = pytest.mark.slow

DAY1, DAY2 = "2019-06-18", "2019-06-19"
INCREMENTAL = "synthetic_incremental"
ASSETS = ("hashed_incoming", "rejects", "hash_join_classification", "inserts", "deletes", "updates", "current_table", "history_partition")


def _rows(query: str, state_dir) -> list[list[str]]:
    """The query's rows as the CLI prints them (CSV, every value quoted)."""
    return [row for row in csv.reader(trino_server.sql(query, state_dir).stdout.splitlines()) if row]


def _counts(rows: list[list[str]]) -> dict[tuple[str, str], int]:
    return {(day, operation): int(count) for day, operation, count in rows}


@dataclass(frozen=True)
class Demo:
    """The demo's warehouse: its root and, on a lake, the variables that point the project at it."""

    root: str
    variables: dict[str, str] | None
    configs: dict[str, TableConfig]

    @contextlib.contextmanager
    def storage(self, monkeypatch) -> Iterator[WarehouseStorage]:
        """The warehouse's storage, with the project pointed at it inside the block."""
        with pointed_at(monkeypatch, self.variables):
            yield WarehouseStorage(self.root)


@pytest.fixture(scope="module", params=["embedded", pytest.param("lake", marks=pytest.mark.lake)])
def demo(request, spark, tmp_path_factory):
    """The demo's data (`make demo`'s generator arguments) stored by two runs, one per date, in a local
    warehouse (the embedded catalog) or in a lake of the module's own (SeaweedFS: S3 and its REST catalog)."""
    root = tmp_path_factory.mktemp(f"trino-{request.param}")
    extracts = root / "extracts"
    generate(10000, 10000, 5, 10, 0.2, 0.4, 0.4, extracts / "synthetic" / DAY1, extracts / "synthetic" / DAY2, seed=42)
    with contextlib.ExitStack() as stack:
        if request.param == "lake":
            handle = start_lake(root / "lake")
            stack.callback(lake_server.stop, handle.state_dir)
            variables: dict[str, str] | None = lake_variables(handle)
            upload(extracts, handle)
            warehouse = variables["CDC_WAREHOUSE"]
            source = "synthetic/{date}/"  # under CDC_DATA_ROOT, the lake's landing prefix
        else:
            variables, warehouse = None, str(root / "warehouse")
            source = f"{extracts / 'synthetic'}/{{date}}/"
        # The same extracts twice: stored per date (the default), and as one table with a tag per date whose
        # second date is a MERGE (merge-on-read), not a compaction's full copy: by default a date that changes
        # a quarter of the rows (this one changes 80%) is stored whole.
        merged = {"current": "incremental", "compact_after_share": 2.0}
        configs = {
            "synthetic": write_table_config(root / "configs", "synthetic", source),
            INCREMENTAL: write_table_config(root / "configs", INCREMENTAL, source, storage=merged),
        }
        with pytest.MonkeyPatch.context() as patch, pointed_at(patch, variables):
            patch.setenv("CDC_WAREHOUSE", warehouse)
            assert all(result.success for result in run_dates(definitions_for(*configs.values()), [DAY1, DAY2]))
        yield Demo(warehouse, variables, configs)


@pytest.fixture(scope="module")
def trino(demo, tmp_path_factory):
    """A server over the demo's catalog; its state folder. Stopped at the end, however the tests end."""
    state_dir = tmp_path_factory.mktemp("trino-state")
    with pytest.MonkeyPatch.context() as patch, pointed_at(patch, demo.variables):
        # The suite's JIT setting (tests/conftest.py) without its collector: Trino's jvm.config names G1, and two
        # collectors stop the JVM.
        patch.setenv("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
        trino_server.start(state_dir, LakeCatalog.from_environment(demo.root))
        files = "\n".join(path.read_text() for path in (state_dir / "etc").rglob("*.properties"))
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in files  # a lake's keys are ${ENV:...} references
        try:
            yield state_dir
        finally:
            trino_server.stop(state_dir)


def test_trino_reads_every_output_by_name_with_the_readmes_counts_and_sparks_rows(spark, demo, trino, monkeypatch):
    tables = {row[0] for row in _rows("SHOW TABLES FROM lake.synthetic", trino)}
    assert set(ASSETS) <= tables, tables

    current = _counts(_rows("SELECT CAST(business_date AS varchar), operation, count(*) FROM synthetic.current_table GROUP BY 1, 2", trino))
    history = _counts(_rows("SELECT CAST(business_date AS varchar), operation, count(*) FROM synthetic.history_partition GROUP BY 1, 2", trino))
    # The README's figures for the demo.
    assert current == {(DAY1, "I"): 10000, (DAY2, "I"): 2000, (DAY2, "N"): 4000, (DAY2, "U"): 4000}
    assert history == {(DAY1, "I"): 10000, (DAY2, "D"): 2000, (DAY2, "I"): 2000, (DAY2, "U"): 4000}

    # A date's stored rows, value for value, as Spark reads them: keys, values, hashes, labels and audit columns
    # (the timestamp as epoch seconds, which neither engine's session zone changes).
    with demo.storage(monkeypatch) as storage:
        by_spark = storage.read_one(spark, "synthetic", "current_table", DAY2)
    texts = [field.name for field in by_spark.schema.fields if field.dataType.simpleString() == "string"]
    doubles = [field.name for field in by_spark.schema.fields if field.dataType.simpleString() == "double"]
    assert len(texts) == 9 and len(doubles) == 10, by_spark.schema  # 5 keys, 2 hashes, operation, process_id; 10 values
    listed = ", ".join([*texts, *doubles, "CAST(eff_start_date AS varchar)", "CAST(floor(to_unixtime(processed_at)) AS bigint)"])
    by_trino = _rows(f"SELECT {listed} FROM synthetic.current_table WHERE business_date = DATE '{DAY2}' ORDER BY key_hash", trino)
    read_back = [[*row[: len(texts)], *map(float, row[len(texts) : -2]), row[-2], int(row[-1])] for row in by_trino]
    selected = by_spark.select(*texts, *doubles, F.col("eff_start_date").cast("string"), F.unix_timestamp("processed_at")).orderBy("key_hash")
    assert len(read_back) == 10000 and read_back == [list(row) for row in selected.collect()]

@pytest.mark.parametrize("table", ["synthetic", INCREMENTAL])
def test_the_query_sql_for_prints_gives_sparks_state_of_a_date_with_its_labels_in_trino(spark, demo, trino, monkeypatch, table):
    config = demo.configs[table]
    with demo.storage(monkeypatch):
        query = current_trino_sql(config, demo.root, DAY2)
        by_spark = current_state(spark, config, DAY2, demo.root).select("key_hash", "non_key_hash", "operation")
        expected = sorted(tuple(row) for row in by_spark.collect())
    by_trino = sorted(tuple(row) for row in _rows(f"SELECT key_hash, non_key_hash, operation FROM ({query})", trino))
    assert len(by_trino) == 10000 and by_trino == expected
    # The README's labels, also where the stored operation is each key's last change (one table, a tag a date).
    assert Counter(operation for _, _, operation in by_trino) == {"I": 2000, "N": 4000, "U": 4000}
    assert ("FOR VERSION AS OF" in query) == (table == INCREMENTAL), query
    # DuckDB and Spark SQL, by the queries `sql-for --engine duckdb|spark` prints: the same rows and labels.
    with demo.storage(monkeypatch) as storage:
        by_duckdb = sorted(duckdb.sql(f"SELECT key_hash, non_key_hash, operation FROM ({current_duckdb_sql(config, demo.root, DAY2)})").fetchall())
        spark_sql = f"SELECT key_hash, non_key_hash, operation FROM ({current_spark_sql(config, demo.root, DAY2)})"
        by_spark_sql = sorted(tuple(row) for row in storage.tables.session_for(spark).sql(spark_sql).collect())
    assert by_duckdb == expected and by_spark_sql == expected


def test_the_merged_state_of_the_second_date_is_a_merge_on_read_commit_whose_raw_rows_carry_each_keys_last_change(
    demo, trino, monkeypatch
):
    """What the labelled queries above read: the tag of DAY2 is the MERGE's commit, position deletes not
    compacted away, and its stored ``last_operation`` is each key's last change (the 4,000 keys DAY2 left
    alone keep DAY1's I), which only ``operation_date`` turns into DAY2's labels: no ``operation`` column
    in the raw table passes for them."""
    with demo.storage(monkeypatch) as storage:
        summary = storage.merged.summary(INCREMENTAL, "current_table", DAY2)
    assert summary["cdc.stored-as"] == "changes" and int(summary["total-position-deletes"]) > 0, summary
    raw = _rows(
        f"SELECT last_operation, CAST(operation_date AS varchar), count(*) FROM {INCREMENTAL}.current_table "
        f"FOR VERSION AS OF '{DAY2}' GROUP BY 1, 2",
        trino,
    )
    assert {(operation, day): int(count) for operation, day, count in raw} == {("I", DAY1): 4000, ("I", DAY2): 2000, ("U", DAY2): 4000}
    columns = {row[0] for row in _rows(f"SHOW COLUMNS FROM {INCREMENTAL}.current_table", trino)}
    assert "operation" not in columns and {"last_operation", "operation_date"} <= columns


def test_duckdb_attaches_the_lakes_catalog_read_only_and_reads_every_output_by_name(demo, monkeypatch):
    with demo.storage(monkeypatch) as storage, duckdb_connection() as duck:
        if storage.lake.embedded:  # a JDBC catalog on SQLite is none DuckDB attaches: the error says what to use
            with pytest.raises(CatalogSettingError, match="iceberg_scan"):
                storage.lake.duckdb_attach_sql()
            return
        for statement in storage.lake.duckdb_attach_sql("lake"):
            duck.execute(statement)
        counts = duck.sql("SELECT CAST(business_date AS varchar), operation, count(*) FROM lake.synthetic.history_partition GROUP BY ALL").fetchall()
        assert _counts(counts) == {(DAY1, "I"): 10000, (DAY2, "D"): 2000, (DAY2, "I"): 2000, (DAY2, "U"): 4000}
        # Time travel by the date's tag, which DuckDB takes as its snapshot id.
        first = storage.tables.date_tags("synthetic", "current_table")[DAY1]
        assert duck.sql(f"SELECT count(*) FROM lake.synthetic.current_table AT (VERSION => {first})").fetchall() == [(10000,)]
        # DDL shows the read-only attach (DuckDB 1.4 neither inserts into nor deletes from a partitioned table at all).
        for statement in ("CREATE TABLE lake.synthetic.made_by_duckdb (x INTEGER)", "DROP TABLE lake.synthetic.rejects"):
            with pytest.raises(duckdb.InvalidInputException, match="read-only"):
                duck.execute(statement)
        assert duck.sql("SELECT count(*) FROM lake.synthetic.rejects").fetchall() == [(0,)]
        assert "made_by_duckdb" not in {name for _, _, name, *_ in duck.sql("SHOW ALL TABLES").fetchall()}


def test_the_scd2_query_sql_for_prints_gives_sparks_versions_in_trino(spark, demo, trino, monkeypatch):
    config = demo.configs["synthetic"]
    with demo.storage(monkeypatch):
        query = scd2_trino_sql(config, demo.root, DAY2)
        versions = scd2_view(spark, config, DAY2, demo.root).select("key_1", "key_2", "key_3", "key_4", "key_5", "valid_from", "valid_to", "is_current")
        expected = sorted((*row[:5], str(row[5]), str(row[6]) if row[6] else "", str(row[7]).lower()) for row in versions.collect())
    listed = "key_1, key_2, key_3, key_4, key_5, CAST(valid_from AS varchar), CAST(valid_to AS varchar), is_current"
    by_trino = sorted(tuple(row) for row in _rows(f"SELECT {listed} FROM ({query})", trino))
    # 10,000 first versions, 4,000 of them closed by an update and 2,000 by a delete, 6,000 new ones.
    assert len(by_trino) == 16000 and by_trino == expected
    with demo.storage(monkeypatch) as storage:  # the query `sql-for --engine spark` prints, in Spark SQL
        spark_sql = f"SELECT {listed.replace('varchar', 'string')} FROM ({scd2_spark_sql(config, demo.root, DAY2)})"
        by_spark_sql = sorted((*row[:7], str(row[7]).lower()) for row in storage.tables.session_for(spark).sql(spark_sql).collect())
    assert by_spark_sql == [(*row[:6], row[6] or None, row[7]) for row in expected]


def test_trino_travels_to_a_business_date_by_its_tag(trino):
    # One run per date: the tag of DAY1 names the version before DAY2 was written.
    assert _rows(f"SELECT count(*) FROM synthetic.current_table FOR VERSION AS OF '{DAY1}'", trino) == [["10000"]]
    assert _rows(f"SELECT count(*) FROM synthetic.current_table FOR VERSION AS OF '{DAY2}'", trino) == [["20000"]]
    assert _rows(f"SELECT count(DISTINCT business_date) FROM synthetic.history_partition FOR VERSION AS OF '{DAY1}'", trino) == [["1"]]


@pytest.mark.parametrize(
    "statement",
    [
        f"DELETE FROM synthetic.current_table WHERE business_date = DATE '{DAY2}'",
        "INSERT INTO synthetic.history_partition SELECT * FROM synthetic.history_partition",
        "DROP TABLE synthetic.rejects",
        "CREATE TABLE synthetic.made_by_trino (x integer)",
    ],
)
def test_trino_refuses_every_write(trino, statement):
    with pytest.raises(trino_server.TrinoQueryError, match="Access Denied"):
        trino_server.sql(statement, trino)
    assert _rows("SELECT count(*) FROM synthetic.current_table", trino) == [["20000"]]


def test_trino_listens_on_loopback_only(trino):
    pid = trino_server.recorded_pid(trino / trino_server.PID_FILE, trino_server.MAIN_CLASS)
    assert pid is not None
    root = psutil.Process(pid)
    listening = [conn.laddr for process in [root, *root.children(recursive=True)]
                 for conn in process.net_connections(kind="inet") if conn.status == psutil.CONN_LISTEN]  # fmt: skip
    # Java's sockets are IPv6 ones: 127.0.0.1 shows as ::ffff:127.0.0.1.
    assert listening and all(_loopback(address.ip) for address in listening), listening


def _loopback(text: str) -> bool:
    address = ipaddress.ip_address(text)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback
