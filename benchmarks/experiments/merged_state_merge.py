"""The merged state's write costs (issue 34 point 3, branch issue34-merge): a whole state of ROWS rows, then a
MERGE of 1,000 changes (500 U, 300 I, 200 D), with wall times and bytes from the snapshot summaries.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/experiments/merged_state_merge.py 10000000

Standalone (not in the suite); the figures are in docs/design/iceberg-current-table.md.
"""
import shutil, time, sys
from datetime import date
from pyspark.sql import functions as F
from resources.session.spark_session import build_spark_session
from resources.storage import WarehouseStorage
from resources.storage.merged import MergedStates
rows = int(sys.argv[1])
shutil.rmtree("/tmp/merged-state-bench", ignore_errors=True)
spark = build_spark_session(master="local[2]", conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "spark.driver.memory": "4g"}, app_name="bench")
spark.sparkContext.setLogLevel("ERROR")
st = MergedStates(WarehouseStorage("/tmp/merged-state-bench").tables, buckets=16)
def state(n, day, offset=0):
    r = spark.range(n).withColumn("id", F.col("id") + offset)
    return r.select(F.col("id").cast("int").alias("id"), F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
                    F.rand(7).alias("amount"), F.md5(F.col("id").cast("string")).alias("key_hash"), F.md5(F.concat(F.lit("v"), F.col("id").cast("string"))).alias("non_key_hash"),
                    F.lit("I").alias("operation"), F.lit(date.fromisoformat(day)).alias("eff_start_date"))
t0 = time.time(); st.replace_state(state(rows, "2024-01-01"), "t", "current_table", "2024-01-01", {}); full = time.time() - t0
summ = lambda: st.tables.load("t","current_table").current_snapshot().summary.additional_properties
full_bytes = int(summ()["added-files-size"])
# 1,000 changes: 500 U of spread keys, 300 I, 200 D
upd = state(rows, "2024-01-02").filter(F.col("id") % (rows // 500) == 0).limit(500).withColumn("operation", F.lit("U")).withColumn("name", F.lit("changed"))
ins = state(300, "2024-01-02", offset=rows).withColumn("operation", F.lit("I"))
dele = state(rows, "2024-01-02").filter(F.col("id") % (rows // 200) == 7).limit(200).withColumn("operation", F.lit("D"))
changes = upd.unionByName(ins).unionByName(dele).cache(); changes.count()
t0 = time.time(); st.apply_changes(changes, "t", "current_table", "2024-01-02", {}); merge = time.time() - t0
s = summ()
t0 = time.time(); n = st.state(spark, "t", "current_table", "2024-01-02", "X").count(); read = time.time() - t0
print(f"rows={rows} full_write={full:.1f}s {full_bytes/2**20:.1f}MiB merge_1000={merge:.1f}s ({merge/full:.2f}x) added={int(s['added-files-size'])/2**20:.2f}MiB records={s['added-records']} pos_deletes={s.get('added-position-deletes')} state_rows={n} read={read:.1f}s rows_from_summary={st.rows('t','current_table','2024-01-02')}")
