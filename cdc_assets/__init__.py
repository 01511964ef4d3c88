"""Hash-based change data capture on PySpark, as a Dagster asset graph."""
