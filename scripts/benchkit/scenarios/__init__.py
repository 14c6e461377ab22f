"""The benchmark tool's scenarios (scripts/bench.py): each module, or each lab.Lab, has a NAME,
a DESCRIPTION, the FIGURES it publishes (benchkit/record.Figure), add_arguments(parser) and
measure(args) -> (parameters, rounds of figures)."""
