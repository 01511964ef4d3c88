"""The project's code reaches Spark through its public API only: the DataFrame API, SQL and spark-submit.

Spark Connect has no JVM in the client's process, so code that reaches into a classic session's JVM
through py4j (``spark._jvm``, ``spark._jsparkSession``, a DataFrame's ``_jdf``, ...) works on one kind
of session only. A grep over the sources, so that such a use fails a test the day it is written.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("cdc_assets", "resources", "benchmarks")
# py4j by name, and pyspark's private handles on the JVM's objects.
JVM_HANDLE = re.compile(r"\b(py4j|_jvm|_jsparkSession|_jsc|_jdf|_jconf|_jcol|_gateway)\b", re.IGNORECASE)


def test_no_py4j_in_the_sources():
    sources = sorted(path for folder in SOURCES for path in (REPO / folder).rglob("*.py"))
    assert len(sources) > 20 and REPO / "cdc_assets" / "cli" / "sql_server.py" in sources  # the scan sees the code
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if JVM_HANDLE.search(line)
    ]
    assert not found, "py4j or a JVM handle in the sources:\n" + "\n".join(found)
