"""The CDC core: plain PySpark DataFrame functions, no Dagster. Hashing, validation, classification,
and building current state and history; usable and testable on their own."""
