"""The benchmark tool's kit (the command is scripts/bench.py): systems under test
(systems.py), the load (load.py, stream.py), the in-process engine (inprocess.py), the lab's
runs (sweep.py, grid.py, repeats.py, ray_serve.py, model_pool.py, batch_impact.py and their
options in options.py), the scenarios (scenarios/), one output format (record.py) and the
doc's generated table and charts (table.py)."""
