"""Spark's code generation in the suite's JVMs: off by default (``INTERPRETED_EXPRESSIONS``, set by
tests/conftest.py for every JVM the suite starts), on where a test asks for it (:func:`generated_code`).

On the suite's tiny frames, generating and compiling Java for each query costs more than it saves:
tests/test_bad_values.py took 61-74 JVM CPU-seconds with it and 46 without (docs/testing.md). Spark tests its
interpreted and generated paths against each other; here tests/test_pipeline.py's range runs with generated
code, as the product does, and must equal the interpreted day-by-day chain, row for row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

# Spark confs, which each JVM's SparkConf reads from its system properties (-Dkey=value).
INTERPRETED_EXPRESSIONS = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
GENERATED_CODE = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}  # Spark's defaults


@contextmanager
def generated_code(session) -> Iterator[None]:
    """Whole-stage code generation and generated expressions on in ``session`` inside the block, as the
    product runs them; interpreted again after it."""
    for key, value in GENERATED_CODE.items():
        session.conf.set(key, value)
    plan = session.sql("EXPLAIN SELECT id + 1 FROM range(3)").first()[0]
    assert "*(1)" in plan, plan  # a whole-stage-codegen operator: generated code is on
    try:
        yield
    finally:
        for key, value in INTERPRETED_EXPRESSIONS.items():
            session.conf.set(key, value)
