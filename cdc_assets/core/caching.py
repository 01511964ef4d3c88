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

CACHE_LEVEL = StorageLevel.DISK_ONLY
