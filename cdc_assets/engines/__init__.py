"""The engines the project starts on this machine, and how: each long-lived process on 127.0.0.1, over
:mod:`.process`; no Dagster here.

- :mod:`.spark_home`, :mod:`.spark_conf`, :mod:`.iceberg_runtime`: the installed pyspark, the conf and the jars
  every Spark the project starts shares;
- :mod:`.connect_server`: the warm Spark Connect server (``make spark-server``, ``make ui``);
- :mod:`.cluster`: a Spark standalone master and its workers (``make cluster-up``);
- :mod:`.lake_server`: a local S3 lake, SeaweedFS's S3 and Iceberg REST catalog (``make lake-up``);
- :mod:`.duckdb_iceberg`: DuckDB with its Iceberg extension, offline.
"""
