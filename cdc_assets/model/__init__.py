"""The model: what a table is (its config, its asset and column names, the project's settings). No Spark, no Dagster."""
