"""Intake: reading a date's extract (a snapshot, a delta, a change set, Debezium events), validating and hashing it."""
