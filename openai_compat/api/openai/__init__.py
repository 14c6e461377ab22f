"""OpenAI's API: embeddings (dense and sparse), classify and the model list."""
