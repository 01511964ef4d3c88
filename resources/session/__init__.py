"""Spark sessions without Dagster: building a run's own session, and choosing where a run's Spark runs."""
