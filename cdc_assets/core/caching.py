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

from pyspark import StorageLevel
from pyspark.sql import DataFrame

CACHE_LEVEL = StorageLevel.DISK_ONLY

# Every DataFrame this process cached and has not released through release_persisted. Each step
# unpersists its own caches when it is done with them, but a step that fails half-way may not, and
# on a shared Spark Connect server a cache outlives the run's session: the server's cache manager is
# shared by all sessions. The run's end releases whatever is left (resources/spark.py).
_PERSISTED: list[DataFrame] = []


def persist(frame: DataFrame) -> DataFrame:
    """``frame`` cached at :data:`CACHE_LEVEL`, remembered until :func:`release_persisted`."""
    cached = frame.persist(CACHE_LEVEL)
    _PERSISTED.append(cached)
    return cached


def release_persisted() -> int:
    """Unpersist every DataFrame :func:`persist` cached in this process since the last call; how many."""
    released = 0
    while _PERSISTED:
        _PERSISTED.pop().unpersist()
        released += 1
    return released
