"""Run FlagEmbedding's BGEM3FlagModel (the reference) on a folder and texts; print its outputs
as JSON. Run by tests/test_bge_m3.py with the Python of an environment that has FlagEmbedding
(requirements/flagembedding.txt), never imported by the suite itself.

    python flagembedding_m3.py FOLDER TEXTS_JSON PAIRS_JSON [WEIGHTS_JSON]

WEIGHTS_JSON: other weights for compute_score's hybrid (its `weighted` in the output)."""

import json
import sys

from FlagEmbedding import BGEM3FlagModel

folder, texts, pairs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
model = BGEM3FlagModel(folder, use_fp16=False, devices="cpu")
out = model.encode(texts, return_dense=True, return_sparse=True, return_colbert_vecs=True)
scores = model.compute_score([tuple(p) for p in pairs], weights_for_different_modes=[0.4, 0.2, 0.4])
weighted = None
if len(sys.argv) > 4:
    other = json.loads(sys.argv[4])
    weighted = model.compute_score([tuple(p) for p in pairs], weights_for_different_modes=other)
print(
    json.dumps(
        {
            "dense": out["dense_vecs"].tolist(),
            "sparse": [{str(k): float(v) for k, v in w.items()} for w in out["lexical_weights"]],
            "colbert": [v.tolist() for v in out["colbert_vecs"]],
            "scores": {k: [float(x) for x in v] for k, v in scores.items()},
            "weighted": [float(x) for x in weighted["colbert+sparse+dense"]] if weighted else None,
        }
    )
)
