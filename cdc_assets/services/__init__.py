"""The project's long-lived processes on this machine, each on 127.0.0.1 and each over :mod:`.process`:

- :mod:`.connect_server`: the warm Spark Connect server (``make spark-server``, ``make ui``);
- :mod:`.cluster`: a Spark standalone master and its workers (``make cluster-up``);
- :mod:`.sql_server`: the SQL catalog's holder, spark-sql or the Thrift server (``make sql``, ``make sql-server``);
- :mod:`.dev_ui`: ``dagster dev`` with the Connect server kept warm for its runs (``make ui``).
"""
