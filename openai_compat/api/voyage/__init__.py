"""Voyage AI's API under /voyage/v1 (its /v1/rerank answers in another shape than Cohere's
on the same path): embeddings, contextualized chunk embeddings, rerank, multimodal embeddings,
as the voyageai SDK sends and reads them; errors as `{"detail": ...}`."""
