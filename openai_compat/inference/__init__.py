"""A request's work between its dialect and the engine: embedding texts and media
(`embed.py`), inputs longer than the window (`long_inputs.py`), rerank and classify
(`scoring.py`)."""
