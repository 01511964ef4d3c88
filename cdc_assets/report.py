"""Print a table's counts by operation, as the seed's ``df.groupBy(df.operation).count().show()`` does.

    python -m cdc_assets.report synthetic [YYYY-MM-DD]

Reads the warehouse (``CDC_WAREHOUSE``) directly; for current_table it reports the latest date (or the
one given), for history_partition every date.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

from cdc_assets.core.columns import BUSINESS_DATE
from resources.spark import NO_UI, build_spark_session
from resources.storage import warehouse_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table")
    parser.add_argument("business_date", nargs="?", help="date of the current state to show (default: latest)")
    args = parser.parse_args(argv)
    spark = build_spark_session(conf=NO_UI, app_name="cdc_report")  # local, on a cluster, or a Spark Connect server (SPARK_REMOTE)
    root = f"{warehouse_root()}/{args.table}"

    current = spark.read.parquet(f"{root}/current_table")
    as_of = args.business_date or current.agg(F.max(BUSINESS_DATE)).first()[0].isoformat()
    print(f"current_table of {args.table} as of {as_of}:")
    current.filter(F.col(BUSINESS_DATE) == as_of).groupBy("operation").count().orderBy("operation").show()

    history = spark.read.parquet(f"{root}/history_partition")
    print(f"history_partition of {args.table}, every date:")
    history.groupBy(BUSINESS_DATE, "operation").count().orderBy(BUSINESS_DATE, "operation").show()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
