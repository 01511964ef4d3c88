"""The layers below the Dagster definitions: ``storage/`` (the warehouse, no Dagster), the Spark sessions
(``spark_session.py``, no Dagster) and the Dagster resources over them (``spark.py``, ``parquet_io_manager.py``,
``alerts.py``). Import each from its module: this package imports nothing, so that a command that reads the
warehouse does not load Dagster."""
