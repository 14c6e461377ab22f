"""The frame: every option once (`settings.py` for the server, `model_config.py` for one
model) and where they come from (`config.py`: defaults < TOML < environment < flags). The
CLI (`openai_compat/cli.py`) is generated from it. On the ground floor: it imports nothing
else of the package."""
