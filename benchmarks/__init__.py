"""The project's benchmarks: `python -m benchmarks SCENARIO` (benchmarks/README.md)."""
