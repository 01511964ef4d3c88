"""Reading the warehouse as a consumer: the state as of a date, the SCD type 2 view and the changes
between two dates.

The state is read from current_table, whichever way the table stores it (a snapshot per date, or a
full copy and each date's changes); the other two are computed from the stored ``history_partition``.
Each shows the table's columns as configured now, whatever config a date was stored under: a column
added since reads as NULL on older dates, a renamed one carries its former name's values, a widened
one has its configured type (:mod:`cdc_assets.core.views.as_configured`; docs/consumers.md).
None is an asset. They only read: no lock is taken and nothing is written or repaired, and each
reads every Iceberg table it needs at one snapshot (the one committed when it starts), whatever is
committed meanwhile. ``cdc-current``, ``cdc-scd2`` and ``cdc-changes`` (``cdc_assets/cli/read.py``) run them
from the command line; the DuckDB queries read the tables with DuckDB's iceberg extension
(:mod:`cdc_assets.engines.duckdb_iceberg`).
"""

from __future__ import annotations

import uuid
from datetime import date, timedelta

import duckdb
from pyspark.sql import DataFrame, SparkSession

from cdc_assets.model.config import TableConfig, load_table_configs, table_configs_dir
from cdc_assets.core.views.as_configured import as_configured, configured_select_list, pipeline_columns, wide_columns
from cdc_assets.core.views.between import changes_from_history
from cdc_assets.core.capture.changes import OPERATION
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.core.hashing import KEY_HASH, NON_KEY_HASH
from cdc_assets.core.views.scd2 import Dialect, as_date, quote_identifier, scd2_sql
from cdc_assets.core.capture.state import untouched_operation
from cdc_assets.model.names import CURRENT, HISTORY
from cdc_assets.usecases.stored_schema import stored_configured_names, stored_former_names
from resources.storage.state import read_state
from cdc_assets.engines.duckdb_iceberg import load_extensions
from resources.storage import WarehouseStorage, warehouse_root
from resources.storage.lake import CATALOG_NAME
from resources.storage.merged import OPERATION_DATE, operation_as_of_sql

# What the views need of history besides the configured columns and business_date.
_HISTORY_COLUMNS = ((KEY_HASH, "string"), (NON_KEY_HASH, "string"), (OPERATION, "string"))


def table_config(table: TableConfig | str) -> TableConfig:
    """``table`` itself, or the config named ``table`` in the table config folder (``CDC_TABLE_CONFIGS``)."""
    if isinstance(table, TableConfig):
        return table
    configs = load_table_configs()
    for config in configs:
        if config.name == table:
            return config
    known = ", ".join(config.name for config in configs) or "none"
    raise ValueError(f"unknown table {table!r}: the table configs in {table_configs_dir()} define {known}")


def current_state(
    spark: SparkSession, table: TableConfig | str, as_of: str | date | None = None, warehouse: str | None = None
) -> DataFrame:
    """The table's state as of ``as_of`` (default: the newest stored date), row for row what a snapshot
    of that date holds, whichever way the table stores its state (``storage.current``). Columns: the
    configured columns as configured now (on a date stored before a change of the config, a column
    added since is NULL, a renamed one has its former name's values, a widened one the configured
    type), then current_table's own (``key_hash``, ``non_key_hash``, ``operation``, ``eff_start_date``,
    audit columns). Raises ValueError when the date's state is not stored."""
    config = table_config(table)
    storage = WarehouseStorage(warehouse_root(warehouse))
    day = current_as_of(config, as_of, warehouse)
    try:
        stored = read_state(storage, spark, config.name, CURRENT, day)
    except RuntimeError as error:  # MissingPartitionError, DroppedPartitionError
        raise ValueError(str(error)) from error
    # read_state gives the state as stored, which the CDC step compares against; consumers see it as configured.
    return as_configured(stored, config.columns)


def current_as_of(config: TableConfig, as_of: str | date | None = None, warehouse: str | None = None) -> str:
    """The date of :func:`current_state` as ``YYYY-MM-DD``: ``as_of``, or the newest date with a stored state.

    Raises ValueError when the table has no stored state on that date (no Spark needed).
    """
    storage = WarehouseStorage(warehouse_root(warehouse))
    stored = storage.stored_dates(config.name, CURRENT)
    if not stored:
        raise ValueError(
            f"{config.name} has no stored current_table (looked in {storage.asset_path(config.name, CURRENT)}): "
            "materialize the table first"
        )
    day = stored[-1] if as_of is None else as_date(as_of).isoformat()
    try:
        storage.state_layout(config.name, CURRENT, day)
    except RuntimeError as error:
        raise ValueError(f"{error} (stored dates run from {stored[0]} to {stored[-1]})") from error
    return day


def current_duckdb_sql(config: TableConfig | str, warehouse: str | None = None, as_of: str | date | None = None) -> str:
    """A DuckDB query of :func:`current_state`: the state as of ``as_of`` (default: the newest stored date).

    The query reads current_table (its date's partition, or for ``storage: {current: incremental}`` its
    date's tag) with DuckDB's ``iceberg_scan`` of the table's metadata file as committed now: it reads that
    snapshot however long it runs and whatever is committed meanwhile; generate it again for a later
    state. Its columns are those of :func:`current_state`. Run it with e.g.
    ``duckdb.sql(current_duckdb_sql("orders"))``: this call loads the iceberg extension into DuckDB's
    default connection (offline, :func:`cdc_assets.engines.duckdb_iceberg.load_extensions`); on a connection of
    your own, open it with :func:`cdc_assets.engines.duckdb_iceberg.duckdb_connection`.
    """
    config = table_config(config)
    storage = WarehouseStorage(warehouse_root(warehouse))
    day = current_as_of(config, as_of, warehouse)
    stored = storage.stored_schema(config.name, CURRENT, day).names
    configured = configured_select_list(config.columns, stored, Dialect.duckdb)
    if storage.merged.holds(config.name, CURRENT):
        # The table at the date's tag, each row labelled as of the date (merged.py).
        _duckdb_reaches(storage)
        state = storage.merged.duckdb_sql(config.name, CURRENT, day, untouched_operation(config.load_type))
        own = [quote_identifier(name, Dialect.duckdb) for name in pipeline_columns(stored)]
        return f"SELECT {', '.join([*configured, *own])} FROM ({state}) AS state"
    own = [quote_identifier(name, Dialect.duckdb) for name in pipeline_columns(stored)]
    return f"SELECT {', '.join([*configured, *own])} FROM {_iceberg_scan(storage, config.name, CURRENT)} WHERE {BUSINESS_DATE} = DATE '{day}'"


def current_trino_sql(config: TableConfig | str, warehouse: str | None = None, as_of: str | date | None = None) -> str:
    """A Trino query of :func:`current_state` (the state as of ``as_of``, default the newest stored date, with
    its labels and the same columns) over the catalog ``lake`` as `make trino-up` serves it.

    A table stored per date reads its date's partition; ``storage: {current: incremental}`` reads the
    table at the date's tag (``FOR VERSION AS OF '<date>'``) and labels each row as of that date (an
    untouched key ``N``, or ``X`` for a delta), as :func:`current_state` does. Trino reads the catalog
    when the query runs: unlike the DuckDB query, it sees what was published since it was generated.
    """
    return _current_sql(config, Dialect.trino, warehouse, as_of)


def current_spark_sql(config: TableConfig | str, warehouse: str | None = None, as_of: str | date | None = None) -> str:
    """:func:`current_trino_sql` in Spark SQL, over the catalog ``lake`` as a session opened on the warehouse
    has it (``make sql``, the SQL server, :func:`resources.storage.lake.spark_catalog_conf`): the query of
    ``cdc.<table>_current`` for one date, without the metastore view."""
    return _current_sql(config, Dialect.spark, warehouse, as_of)


# How each dialect reads a table at a tag.
_AT_TAG = {Dialect.trino: "FOR VERSION AS OF", Dialect.spark: "VERSION AS OF"}


def _current_sql(config: TableConfig | str, dialect: Dialect, warehouse: str | None, as_of: str | date | None) -> str:
    config = table_config(config)
    storage = WarehouseStorage(warehouse_root(warehouse))
    day = current_as_of(config, as_of, warehouse)
    stored = storage.stored_schema(config.name, CURRENT, day).names
    configured = configured_select_list(config.columns, stored, dialect)
    own = [name for name in pipeline_columns(stored) if name != OPERATION_DATE]
    table = _lake_table(config.name, CURRENT, dialect)
    if storage.merged.holds(config.name, CURRENT):
        stored_operation = storage.merged.operation_column(config.name, CURRENT)
        operation = operation_as_of_sql(day, untouched_operation(config.load_type), dialect, stored_operation)
        labelled = [
            f"{operation} AS {quote_identifier(name, dialect)}" if name == OPERATION else quote_identifier(name, dialect)
            for name in own
        ]
        return f"SELECT {', '.join([*configured, *labelled])} FROM {table} {_AT_TAG[dialect]} '{day}'"
    columns = [*configured, *(quote_identifier(name, dialect) for name in own)]
    return f"SELECT {', '.join(columns)} FROM {table} WHERE {BUSINESS_DATE} = DATE '{day}'"


def scd2_trino_sql(config: TableConfig | str, warehouse: str | None = None, as_of: str | date | None = None) -> str:
    """The SCD type 2 query of :func:`scd2_view` for Trino, over ``lake.<table>.history_partition`` as
    `make trino-up` serves it: the configured columns as :func:`read_history` shows them, every stored
    date up to ``as_of`` (default: the newest stored date)."""
    return _scd2_sql(config, Dialect.trino, warehouse, as_of)


def scd2_spark_sql(config: TableConfig | str, warehouse: str | None = None, as_of: str | date | None = None) -> str:
    """:func:`scd2_trino_sql` in Spark SQL, over the catalog ``lake`` as a session opened on the warehouse has it."""
    return _scd2_sql(config, Dialect.spark, warehouse, as_of)


def _scd2_sql(config: TableConfig | str, dialect: Dialect, warehouse: str | None, as_of: str | date | None) -> str:
    config = table_config(config)
    storage = WarehouseStorage(warehouse_root(warehouse))
    day = scd2_as_of(config, as_of, warehouse)
    stored = stored_configured_names(storage, config, HISTORY, storage.stored_dates(config.name, HISTORY))
    own = ", ".join(quote_identifier(name, dialect) for name, _ in _HISTORY_COLUMNS)
    relation = (
        f"(SELECT {', '.join(configured_select_list(config.columns, stored, dialect))}, {own}, {BUSINESS_DATE} "
        f"FROM {_lake_table(config.name, HISTORY, dialect)} WHERE {BUSINESS_DATE} <= DATE '{day}') AS stored_history"
    )
    return scd2_sql([column.name for column in config.columns], relation, day, config.scd2.open_end, config.scd2.hard_deletes, dialect)


def _lake_table(table: str, asset: str, dialect: Dialect) -> str:
    """``lake."<table>"."<asset>"`` (Spark: with backquotes): the project's catalog name, which trino_server.py
    gives Trino's catalog too."""
    return ".".join([CATALOG_NAME, quote_identifier(table, dialect), quote_identifier(asset, dialect)])


def _iceberg_scan(storage: WarehouseStorage, table: str, asset: str) -> str:
    """``iceberg_scan('<metadata file>')`` of the asset's table as committed now: a metadata file is never
    rewritten, so the query reads this one snapshot. Loads the iceberg extension into DuckDB's default
    connection, which ``duckdb.sql`` runs the query on."""
    loaded = storage.tables.load(table, asset)
    if loaded is None or loaded.current_snapshot() is None:
        raise ValueError(f"{table} has no stored {asset} (looked in {storage.asset_path(table, asset)}): materialize the table first")
    _duckdb_reaches(storage)
    return f"iceberg_scan({_sql_string(loaded.metadata_location)})"


def _duckdb_reaches(storage: WarehouseStorage) -> None:
    """DuckDB's default connection with the iceberg extension loaded and, for a lake in a bucket, the
    object store's keys as a DuckDB secret of that connection (created in it, never printed)."""
    connection = load_extensions(duckdb.default_connection())
    if not storage.lake.embedded:
        connection.execute(storage.lake.store.duckdb_secret_sql())


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def scd2_view(
    spark: SparkSession, table: TableConfig | str, as_of: str | date | None = None, warehouse: str | None = None
) -> DataFrame:
    """The table's SCD type 2 view as of ``as_of``: one row per version of each key.

    Columns: the configured columns, ``valid_from``, ``valid_to``, ``is_current``, and with
    ``scd2.hard_deletes: new_record`` ``is_deleted`` (see :func:`cdc_assets.core.views.scd2.scd2_sql` and the
    table config's ``scd2`` block). Computed from every stored ``history_partition`` date up to
    ``as_of`` (default: the newest stored date) with one scan and one window sorted by key, so its cost
    grows with the stored history. ``warehouse`` defaults to ``CDC_WAREHOUSE``.

    Untracked columns are as of the start of each version: a change to them alone is an N, which
    history does not hold, so an open version can have older untracked values than ``current_table``.
    """
    config = table_config(table)
    day = scd2_as_of(config, as_of, warehouse)
    history = read_history(spark, config, day, warehouse)
    # A name of its own per call: on Spark Connect the returned DataFrame resolves the view each time
    # it runs, so a later call for the same table must not replace the view under it.
    view = f"cdc_scd2_history_{config.name}_{uuid.uuid4().hex[:12]}"
    history.createOrReplaceTempView(view)
    # The view lives in the session the history was read in: the storage reads a warehouse through a
    # session of its own when ``spark`` opened another warehouse's catalog (LakeTables.session_for).
    return history.sparkSession.sql(
        scd2_sql(
            [column.name for column in config.columns],
            quote_identifier(view, Dialect.spark),
            day,
            config.scd2.open_end,
            config.scd2.hard_deletes,
            Dialect.spark,
        )
    )


def scd2_duckdb_sql(config: TableConfig | str, warehouse: str | None = None, as_of: str | date | None = None) -> str:
    """The SCD type 2 query of :func:`scd2_view` for DuckDB, reading the table's stored history.

    It reads history_partition with DuckDB's ``iceberg_scan`` of the table's metadata file as committed
    now (that one snapshot, whatever is committed meanwhile) and shows the configured columns as
    :func:`read_history` does (dates written before a column was added read it as NULL, a renamed
    column its former name's values). ``as_of`` defaults to the newest stored date. Run it with e.g.
    ``duckdb.sql(scd2_duckdb_sql("orders"))``: this call loads the iceberg extension into DuckDB's
    default connection (offline, :func:`cdc_assets.engines.duckdb_iceberg.load_extensions`); on a connection of
    your own, open it with :func:`cdc_assets.engines.duckdb_iceberg.duckdb_connection`.
    """
    config = table_config(config)
    storage = WarehouseStorage(warehouse_root(warehouse))
    day = scd2_as_of(config, as_of, warehouse)
    scan = _iceberg_scan(storage, config.name, HISTORY)
    # Only names the table has: DuckDB fails on a column it does not have (a date lacking one reads NULL).
    stored = stored_configured_names(storage, config, HISTORY, storage.stored_dates(config.name, HISTORY))
    own = ", ".join(quote_identifier(name, Dialect.duckdb) for name, _ in _HISTORY_COLUMNS)
    relation = (
        f"(SELECT {', '.join(configured_select_list(config.columns, stored, Dialect.duckdb))}, {own}, {BUSINESS_DATE} "
        f"FROM {scan} WHERE {BUSINESS_DATE} <= DATE '{day}') AS stored_history"
    )
    return scd2_sql(
        [column.name for column in config.columns],
        relation,
        day,
        config.scd2.open_end,
        config.scd2.hard_deletes,
        Dialect.duckdb,
    )


def changes_between(
    spark: SparkSession, table: TableConfig | str, from_date: str | date, to_date: str | date, warehouse: str | None = None
) -> DataFrame:
    """The table's net changes from ``from_date`` to ``to_date``, from its stored ``history_partition``.

    See :func:`cdc_assets.core.views.between.changes_from_history` for the rows. Reads every stored history
    date up to ``to_date`` (history survives ``retention.current_days``), so its cost grows with the
    stored history, like :func:`scd2_view`'s. Raises ValueError when ``from_date`` is not before
    ``to_date``, or when the history of either date, or of a date before ``to_date``, is not stored.
    """
    config = table_config(table)
    start, end = changes_dates(config, from_date, to_date, warehouse)
    return changes_from_history(read_history(spark, config, end.isoformat(), warehouse), config, start, end)


def read_history(spark: SparkSession, config: TableConfig, last_date: str, warehouse: str | None = None) -> DataFrame:
    """Every stored ``history_partition`` date up to ``last_date``, as the consumer views read it.

    Columns: the configured columns as configured now, ``key_hash``, ``non_key_hash``, ``operation`` and
    ``business_date``. A date stored before a change of the config shows it as configured now: a
    column added since reads as NULL there, a renamed column has the values of its former name
    (``renamed_from``), a widened column the configured type. Stored columns the config no longer
    has are not read. The same reading as DuckDB's (:func:`scd2_duckdb_sql`) and the SQL catalog's.
    """
    storage = WarehouseStorage(warehouse_root(warehouse))
    dates = [stored for stored in storage.stored_dates(config.name, HISTORY) if stored <= last_date]
    # Read as they are, the files' schema would be one file's (Spark's mergeSchema=false), which drops
    # a column the first dates lack, and merging fails on a widened type. The schema comes from the
    # config instead, with the former names some date stores: Parquet reads a column a file lacks as
    # NULL and a narrower stored type as the wider one asked for.
    wide = wide_columns(config.columns, stored_former_names(storage, config, HISTORY, dates))
    schema = ", ".join(f"{quote_identifier(name, Dialect.spark)} {data_type}" for name, data_type in [*wide, *_HISTORY_COLUMNS])
    history = storage.read(spark, config.name, HISTORY, dates, schema=schema)
    return as_configured(history, config.columns, keep=[*(name for name, _ in _HISTORY_COLUMNS), BUSINESS_DATE])


def scd2_as_of(config: TableConfig, as_of: str | date | None = None, warehouse: str | None = None) -> str:
    """The SCD type 2 view's date as ``YYYY-MM-DD``: ``as_of``, or the newest stored history date.

    Raises ValueError when the table has no stored history on or before it (no Spark needed).
    """
    storage = WarehouseStorage(warehouse_root(warehouse))
    stored = storage.stored_dates(config.name, HISTORY)
    if not stored:
        raise ValueError(
            f"{config.name} has no stored history_partition (looked in {storage.asset_path(config.name, HISTORY)}): "
            "materialize the table first"
        )
    if as_of is None:
        return stored[-1]
    day = as_date(as_of).isoformat()
    if day < stored[0]:
        raise ValueError(
            f"{config.name} has no history_partition on or before {day}: its stored dates run from {stored[0]} to {stored[-1]}"
        )
    return day


def changes_dates(
    config: TableConfig, from_date: str | date, to_date: str | date, warehouse: str | None = None
) -> tuple[date, date]:
    """The two dates of :func:`changes_between`, checked: ``from_date`` before ``to_date``, a stored
    ``history_partition`` for each, and none missing between the first stored date and ``to_date``.
    Raises ValueError naming the date otherwise (no Spark needed)."""
    start, end = as_date(from_date), as_date(to_date)
    if start >= end:
        raise ValueError(f"the from date {start} must be before the to date {end}")
    storage = WarehouseStorage(warehouse_root(warehouse))
    stored = storage.stored_dates(config.name, HISTORY)
    for day in (start, end):
        if day.isoformat() in stored:
            continue
        if day < config.start_date:
            reason = f"the date is before the table's start_date {config.start_date}"
        else:
            reason = f"stored dates run from {stored[0]} to {stored[-1]}" if stored else "no date is stored"
        raise ValueError(f"{config.name} has no {HISTORY} for {day}: {reason}")
    # A date missing in between would hide its changes.
    day = date.fromisoformat(stored[0])
    present = set(stored)
    while day < end:
        if day.isoformat() not in present:
            raise ValueError(
                f"{config.name} has no {HISTORY} for {day}, between its first stored date {stored[0]} "
                f"and {end}: materialize it first"
            )
        day += timedelta(days=1)
    return start, end
