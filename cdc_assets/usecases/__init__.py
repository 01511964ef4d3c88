"""Use cases: what a command, a job or a test does with the warehouse, without Dagster (readers, erasure, schema changes, the catalog's objects)."""
