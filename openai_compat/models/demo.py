"""Demo models made offline (`openai-compat demo-models DIR`): the packaged all-MiniLM-L6-v2
weights fine-tuned for a few dozen steps (~20 s each on 2 cores) into a query/passage
cross-encoder and a sentiment classifier (real meaning), three tiny visual models with random
weights (demo_vision.py: the plumbing of visual retrieval, not meaning), and a config serving
them beside the packaged embedder, so the rerank, classify, model-pool, prompt, vision and
tutorial pages of the docs run on a machine with no model hub. The tests build the same models
(tests/fixtures).

They generalise to unseen sentences of the kinds they were shown, and no further: a demo, not
a model to put in front of users.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

RERANK_TRAIN = [
    (
        "how do I bake bread at home",
        "Mix flour, water, yeast and salt, let the dough rise, then bake it in a hot oven.",
        "The central bank raised interest rates by half a point.",
    ),
    (
        "what is the capital of france",
        "Paris is the capital and largest city of France.",
        "Penguins live mostly in the southern hemisphere.",
    ),
    (
        "symptoms of the flu",
        "Influenza causes fever, cough, sore throat, muscle aches and tiredness.",
        "The guitar has six strings tuned in fourths.",
    ),
    (
        "how to change a car tire",
        "Loosen the lug nuts, jack up the car, swap the wheel and tighten the nuts again.",
        "Photosynthesis turns light into chemical energy in plants.",
    ),
    (
        "who wrote romeo and juliet",
        "Romeo and Juliet is a tragedy written by William Shakespeare.",
        "Basketball was invented in 1891 in Massachusetts.",
    ),
    (
        "best way to learn python programming",
        "Write small Python programs every day and read the official tutorial.",
        "The Nile flows north into the Mediterranean Sea.",
    ),
    (
        "why is the sky blue",
        "Air molecules scatter blue sunlight more than red light, so the sky looks blue.",
        "A balanced diet includes vegetables, grains and protein.",
    ),
    (
        "how many legs does a spider have",
        "Spiders are arachnids with eight legs.",
        "The stock exchange closed higher on Friday.",
    ),
    (
        "how to grow tomatoes",
        "Plant tomatoes in full sun, water them deeply and stake the vines.",
        "Jupiter is the largest planet in the solar system.",
    ),
    (
        "what causes earthquakes",
        "Earthquakes happen when tectonic plates slip suddenly along faults.",
        "Chess is played on a board of sixty-four squares.",
    ),
    (
        "how to make a cup of tea",
        "Boil water, pour it over a tea bag and let it steep for three minutes.",
        "The Roman Empire fell in the fifth century.",
    ),
    (
        "what do cats eat",
        "Cats are carnivores and eat meat or cat food rich in protein.",
        "Mount Everest is the highest mountain on Earth.",
    ),
]

SENTIMENT_TRAIN = [
    ("I absolutely loved this movie, it was wonderful.", 1),
    ("What a fantastic experience, I am very happy.", 1),
    ("The food was delicious and the staff were friendly.", 1),
    ("This is the best purchase I have ever made.", 1),
    ("Great service, I would gladly come back.", 1),
    ("Brilliant performance, truly delightful.", 1),
    ("I am thrilled with the excellent results.", 1),
    ("Such a lovely and pleasant day.", 1),
    ("Amazing quality, highly recommended.", 1),
    ("The book was inspiring and beautifully written.", 1),
    ("I hated this movie, it was terrible.", 0),
    ("What an awful experience, I am very upset.", 0),
    ("The food was disgusting and the staff were rude.", 0),
    ("This is the worst purchase I have ever made.", 0),
    ("Horrible service, I will never come back.", 0),
    ("Dreadful performance, truly boring.", 0),
    ("I am furious about the poor results.", 0),
    ("Such a miserable and depressing day.", 0),
    ("Cheap junk, it broke immediately.", 0),
    ("The book was dull and badly written.", 0),
]


def _seed(seed: int = 0) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _finetune(
    base: str,
    out: Path,
    pairs: tuple[list[str], ...],
    labels: list[Any],
    num_labels: int,
    steps: int,
    lr: float,
) -> Path:
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer, BertForSequenceClassification

    _seed()
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(base)
    id2label = {0: "LABEL_0"} if num_labels == 1 else {0: "negative", 1: "positive"}
    model = BertForSequenceClassification.from_pretrained(
        base, num_labels=num_labels, id2label=id2label, label2id={v: k for k, v in id2label.items()}
    )
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    enc = tok(*pairs, padding=True, truncation=True, max_length=128, return_tensors="pt")
    target = torch.tensor(labels, dtype=torch.float32 if num_labels == 1 else torch.long)
    # each step is a full forward and backward pass over every example (seconds on a CPU)
    for _ in tqdm(range(steps), desc=f"training {out.name}", unit="step", file=sys.stderr):
        opt.zero_grad()
        logits = model(**enc).logits
        if num_labels == 1:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.squeeze(-1), target)
        else:
            loss = torch.nn.functional.cross_entropy(logits, target)
        loss.backward()
        opt.step()
    model.eval()
    model.config.architectures = ["BertForSequenceClassification"]
    model.save_pretrained(out)
    tok.model_max_length = 512
    tok.save_pretrained(out)
    return out


def build_reranker(base: str, out: Path) -> Path:
    """A cross-encoder (1 label): relevant passage -> high score, unrelated -> low."""
    queries, passages, labels = [], [], []
    for i, (q, pos, neg) in enumerate(RERANK_TRAIN):
        other = RERANK_TRAIN[(i + 5) % len(RERANK_TRAIN)][1]  # relevant elsewhere, not here
        for p, y in ((pos, 1.0), (neg, 0.0), (other, 0.0)):
            queries.append(q)
            passages.append(p)
            labels.append(y)
    return _finetune(base, out, (queries, passages), labels, num_labels=1, steps=30, lr=1e-4)


def build_classifier(base: str, out: Path) -> Path:
    """A sentiment classifier (2 labels: negative, positive)."""
    texts = [t for t, _ in SENTIMENT_TRAIN]
    labels = [y for _, y in SENTIMENT_TRAIN]
    return _finetune(base, out, (texts,), labels, num_labels=2, steps=30, lr=1e-4)


CONFIG = """\
# Offline demo (openai-compat demo-models): the packaged all-MiniLM-L6-v2, the same with
# query/passage prompts, and a reranker and a sentiment classifier fine-tuned from it, in the
# tutorial's order of positions (1 text, 2 reranker, 3 classifier; there is no offline CLIP
# for position 0). At most two models are loaded at once: the lazy ones load on first use.
max_loaded_models = 2
admin_key = "change-me"

[[models]]
name = "all-MiniLM-L6-v2"
model = "builtin:all-MiniLM-L6-v2"

[[models]]
name = "minilm-prompted"
model = "builtin:all-MiniLM-L6-v2"
prompts = {query = "query: ", passage = "passage: "}
default_prompt = "passage"
load = "lazy"

[[models]]
name = "demo-reranker"
model = "./reranker"
load = "lazy"
keep_alive = "10m"

[[models]]
name = "demo-classifier"
model = "./classifier"
load = "lazy"

# Visual retrieval, offline: three tiny models with RANDOM weights, built from configs in
# seconds. They show the plumbing (page images in as PNG or JPEG data URIs or URLs, token
# vectors, MaxSim and rerank scores out), not meaning: their rankings are noise. For real
# pages serve a real model (docs/vision.md): vidore/colpali-v1.3-hf and the like.
[[models]]
name = "demo-pages"
model = "./pages"
load = "lazy"

[[models]]
name = "demo-vl-embedder"
model = "./vl-embedder"
load = "lazy"

[[models]]
name = "demo-vl-reranker"
model = "./vl-reranker"
load = "lazy"

# BGE-M3's three outputs, offline (docs/bge-m3.md): a tiny BGE-M3 with RANDOM weights and its
# two heads; output_types on /v1/embeddings, score_mode on /v1/rerank. For meaning, serve
# BAAI/bge-m3 (configs/bge-m3.toml).
[[models]]
name = "demo-bge-m3"
model = "./bge-m3"
load = "lazy"
"""


def write_config(folder: Path) -> Path:
    """The demo's config beside its models (paths relative to it)."""
    path = folder / "demo.toml"
    path.write_text(CONFIG)
    return path


def build(folder: Path, base: str | None = None) -> Path:
    """Both demo models in `folder` (each made once; kept if there) and their config."""
    if base is None:
        from openai_compat.frame.settings import builtin_model_path

        base = builtin_model_path("all-MiniLM-L6-v2")
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # "newly initialized ... TRAIN this model": we do
    folder.mkdir(parents=True, exist_ok=True)
    for name, make in (("reranker", build_reranker), ("classifier", build_classifier)):
        if not (folder / name / "config.json").is_file():
            make(base, folder / name)
    from openai_compat.models import demo_vision

    demo_vision.build(folder)
    if not (folder / "bge-m3" / "colbert_linear.pt").is_file():  # written last
        from openai_compat.models.demo_m3 import build_bge_m3

        build_bge_m3(folder / "bge-m3")
    return write_config(folder)
