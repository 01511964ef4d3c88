"""The Dagster definitions: every table's assets, checks, jobs, schedules and sensors, wired from its config."""
