"""Question 2 on Spark Connect, in one process: a conflicting overwrite of one date made deterministic
(read the base snapshot, let another write commit the date, then commit with validation from the base),
and what the Connect client sees of the ValidationException; plus snapshot properties through the
session conf on Connect.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.experiments.q2b_conflict_on_connect [--classic]

``--classic`` runs the same on a classic session, for comparison. One JVM: the project's Spark Connect
server (``cdc_assets.engines.connect_server``, 127.0.0.1, a free port), stopped at the end.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from benchmarks.experiments.lake_env import ICEBERG_JAR, SQLITE_JAR, describe_error
from resources.storage.lake import use_catalog

TABLE = "lake.exp.conflict"
D1 = "2024-01-01"


CONF = {
    "spark.jars": f"{ICEBERG_JAR},{SQLITE_JAR}",
    "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "1g",
}


def classic_session():
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]")
    for key, value in {**CONF, "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classic", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ice-q2b-"))
    server_dir = folder / "server"
    try:
        if args.classic:
            spark = classic_session()
        else:
            # The project's Connect server (127.0.0.1, a free port), with the Iceberg jars.
            from pyspark.sql import SparkSession

            from cdc_assets.engines.connect_server import start_server
            from cdc_assets.engines.process import free_port

            handle = start_server(port=free_port(), state_dir=server_dir, master="local[2]", conf=CONF)
            spark = SparkSession.builder.remote(handle.client_url).getOrCreate()
        print("session:", type(spark).__module__, flush=True)
        use_catalog(spark, str(folder))  # the project's way: session conf, Connect and classic alike
        spark.conf.set("spark.sql.catalog.lake.cache-enabled", "false")
        from pyspark.sql import functions as F

        spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.exp")
        spark.sql(
            f"CREATE TABLE {TABLE} (business_date DATE, id BIGINT, run STRING) USING iceberg "
            "PARTITIONED BY (business_date) TBLPROPERTIES ('format-version'='2')"
        )

        def write(run: str, base: int | None):
            df = spark.range(10).select(F.lit(D1).cast("date").alias("business_date"), F.col("id"), F.lit(run).alias("run"))
            writer = df.writeTo(TABLE).option("snapshot-property.cdc.run-id", run)
            if base is not None:
                writer = writer.option("isolation-level", "serializable").option("validate-from-snapshot-id", str(base))
            writer.overwrite(F.col("business_date") == F.lit(D1).cast("date"))

        write("seed", None)
        base = spark.sql(f"SELECT snapshot_id FROM {TABLE}.refs WHERE name = 'main'").collect()[0][0]
        write("other-run", None)  # commits D1 after this run read its base
        try:
            write("this-run", base)
            print("this-run: committed (no conflict seen)")
        except Exception as error:  # noqa: BLE001 - what the client sees is the finding
            described = describe_error(error)
            print("this-run raised:", type(error).__module__ + "." + type(error).__name__)
            print("  Java class named in the message:", described["java"] or "(none)")
            print("  message:", described["message"][:300])
            for attribute in ("getErrorClass", "getCondition", "getSqlState"):
                getter = getattr(error, attribute, None)
                if getter is not None:
                    try:
                        print(f"  {attribute}():", getter())
                    except Exception as inner:  # noqa: BLE001
                        print(f"  {attribute}(): raised {type(inner).__name__}")
        rows = spark.sql(f"SELECT run, count(*) FROM {TABLE} GROUP BY run").collect()
        print("table holds:", [tuple(row) for row in rows])
        # Snapshot properties of a SQL statement through the session conf, on this session.
        spark.conf.set("spark.sql.iceberg.snapshot-property.cdc.run-id", "sql-delete")
        spark.sql(f"DELETE FROM {TABLE} WHERE id = 0")
        spark.conf.unset("spark.sql.iceberg.snapshot-property.cdc.run-id")
        summaries = spark.sql(f"SELECT operation, summary['cdc.run-id'] FROM {TABLE}.snapshots ORDER BY committed_at").collect()
        print("snapshots (operation, cdc.run-id):", [tuple(row) for row in summaries])
        spark.stop()
    finally:
        if not args.classic and server_dir.exists():
            from cdc_assets.engines.connect_server import stop_server

            stop_server(server_dir)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
