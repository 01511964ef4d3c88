"""The installed pyspark as Spark's home: the launchers the services start (``bin/spark-submit``,
``spark-class``, ``spark-sql``, ``beeline``) and the environment they run in.

pyspark's wheel ships the launchers and the jars, so nothing is downloaded. No Dagster import.
"""

from __future__ import annotations

import os

from cdc_assets.services.process import HOST

# A launcher given these would start a Spark Connect client instead of the JVM it is to run.
CONNECT_CLIENT_ENV = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")


def spark_home() -> str:
    """The installed pyspark package: it holds ``bin/spark-submit`` and ``jars/``."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def launcher(name: str) -> str:
    """The path of ``bin/<name>`` in :func:`spark_home`, e.g. ``spark-submit``."""
    return os.path.join(spark_home(), "bin", name)


def spark_env() -> dict[str, str]:
    """This process's environment for a launcher: no Connect client settings, ``SPARK_HOME`` at pyspark,
    and 127.0.0.1 as the address every Spark socket binds to (``SPARK_LOCAL_IP``)."""
    env = {key: value for key, value in os.environ.items() if key not in CONNECT_CLIENT_ENV}
    env["SPARK_HOME"] = spark_home()
    env["SPARK_LOCAL_IP"] = HOST
    return env
