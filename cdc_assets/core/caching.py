"""The storage level of every DataFrame the pipeline reads more than once (the intake's validated rows,
the classification, a change set's resolved records).

``DISK_ONLY``, not ``MEMORY_AND_DISK``. PySpark's ``MEMORY_AND_DISK`` is the serialized level: each task
unrolls its whole cached block in the heap before storing it, and in local mode that heap is also the
driver's. At 10M rows a day and the default 4g, the intake's cache ran the JVM out of heap
(``OutOfMemoryError`` after 227 s, benchmarks/README.md); with ``DISK_ONLY`` the same day 1 finished
in 732 s with a peak RSS of 4.1 GiB, as fast as ``MEMORY_AND_DISK`` with 8g (723 s, 8.6 GiB), and
its day 2 in 864 s at 4.5 GiB (8g and ``MEMORY_AND_DISK``: 930 s, 9.6 GiB). The
blocks go to Spark's local dirs, and the operating system's page cache keeps recently written ones in
memory anyway, outside the JVM's heap.
"""

import uuid

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

CACHE_LEVEL = StorageLevel.DISK_ONLY

# Every DataFrame this process cached and has not released through release_persisted. Each step
# unpersists its own caches when it is done with them, but a step that fails half-way may not, and
# on a shared Spark Connect server a cache outlives the run's session: the server's cache manager is
# shared by all sessions. The run's end releases whatever is left (resources/spark.py).
_PERSISTED: list[DataFrame] = []


def persist(frame: DataFrame) -> DataFrame:
    """``frame`` cached at :data:`CACHE_LEVEL`, remembered until :func:`release_persisted`.

    Only queries built on the returned DataFrame read the cache: it is never another query's. Spark
    serves any query whose plan equals a cached one from the cache, and a read of the same files with
    the same options is the same plan even after the files were replaced. On a shared Connect server
    the cache is the server's, for every session, and a run killed there (kill -9) leaves its caches
    behind: nothing ever releases them until the server stops. The re-run of the date, after the
    extract was replaced, would read the dead run's rows. So each cached plan carries a token of its
    own: a condition that is true for every row (the optimizer drops it before execution) but that
    makes the plan unequal to any other.
    """
    owned = frame.filter(F.lit(uuid.uuid4().hex).isNotNull())
    cached = owned.persist(CACHE_LEVEL)
    _PERSISTED.append(cached)
    return cached


def release_persisted() -> int:
    """Unpersist every DataFrame :func:`persist` cached in this process since the last call; how many."""
    released = 0
    while _PERSISTED:
        _PERSISTED.pop().unpersist()
        released += 1
    return released
