"""The parts of scripts/bench.py (the command stays scripts/bench.py): systems under test,
the load, the in-process ceiling, the report, the sweep and the batch-impact run."""
