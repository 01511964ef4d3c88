"""Standalone experiments behind docs/design/iceberg-commits.md (issue 34): not part of the suite."""
