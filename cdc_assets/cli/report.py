"""Print a table's counts by operation, as the seed's ``df.groupBy(df.operation).count().show()`` does.

    python -m cdc_assets.cli.report synthetic [YYYY-MM-DD]

Reads the warehouse (``CDC_WAREHOUSE``) through its Iceberg tables, each at the snapshot committed when
it starts: for current_table the newest stored date (or the one given), for history_partition every date.
It takes no lock and writes nothing.
"""

from __future__ import annotations

import argparse
import sys

from cdc_assets.model.file_modes import apply_umask
from cdc_assets.core.columns import BUSINESS_DATE
from cdc_assets.model.names import CURRENT, HISTORY
from cdc_assets.engines.spark_conf import NO_UI
from resources.session.spark_session import build_spark_session
from resources.storage import WarehouseStorage, warehouse_root


def main(argv: list[str] | None = None) -> int:
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table")
    parser.add_argument("business_date", nargs="?", help="date of the current state to show (default: latest)")
    args = parser.parse_args(argv)
    storage = WarehouseStorage(warehouse_root())
    stored = storage.stored_dates(args.table, CURRENT)
    if not stored:
        print(f"{args.table} has no stored {CURRENT} in {storage.root}: materialize the table first", file=sys.stderr)
        return 2
    as_of = args.business_date or stored[-1]
    if as_of not in stored:
        print(f"{args.table} has no stored {CURRENT} for {as_of}: its stored dates run from {stored[0]} to {stored[-1]}", file=sys.stderr)
        return 2
    spark = build_spark_session(conf=NO_UI, app_name="cdc_report")  # local, on a cluster, or a Spark Connect server (SPARK_REMOTE)

    print(f"{CURRENT} of {args.table} as of {as_of}:")
    storage.read_one(spark, args.table, CURRENT, as_of).groupBy("operation").count().orderBy("operation").show()

    history = storage.read(spark, args.table, HISTORY, storage.stored_dates(args.table, HISTORY))
    print(f"{HISTORY} of {args.table}, every date:")
    history.groupBy(BUSINESS_DATE, "operation").count().orderBy(BUSINESS_DATE, "operation").show()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
