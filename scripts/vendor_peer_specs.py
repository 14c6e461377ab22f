"""Cut the peers' published OpenAPI documents down to the operations our dialects serve, for
the contract tests (tests/contracts/). Each output keeps the peer's own text for those paths
and every component they reach through $ref, unchanged, plus where it came from.

    python scripts/vendor_peer_specs.py [--from ../shared/peer-specs]

The sources (public, copied unchanged): see SOURCES; tests/contracts/README.md has the
provenance and licences.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "contracts"

# peer -> (file, repository, path in it, commit, licence, {path: [methods]})
SOURCES: dict[str, tuple[str, str, str, str, str, dict[str, list[str]]]] = {
    "openai": (
        "openai-openapi.json",
        "openai/openai-openapi",
        "openapi.json",
        "f85dbe223d40e1a31cba812ab2d755c7e98a92a3",
        "MIT",
        {
            "/embeddings": ["post"],
            "/models": ["get"],
            "/models/{model}": ["get"],
            "/files": ["get", "post"],
            "/files/{file_id}": ["get", "delete"],
            "/files/{file_id}/content": ["get"],
            "/batches": ["get", "post"],
            "/batches/{batch_id}": ["get"],
            "/batches/{batch_id}/cancel": ["post"],
        },
    ),
    "tei": (
        "tei-openapi.json",
        "huggingface/text-embeddings-inference",
        "docs/openapi.json",
        "0d124dc9773be6ac5a9a57d8439aba9bbbf33273",
        "Apache-2.0",
        {
            "/decode": ["post"],
            "/embed": ["post"],
            "/embed_sparse": ["post"],
            "/health": ["get"],
            "/info": ["get"],
            "/predict": ["post"],
            "/rerank": ["post"],
            "/tokenize": ["post"],
        },
    ),
    "cohere": (
        "cohere-openapi.yaml",
        "cohere-ai/cohere-developer-experience",
        "cohere-openapi.yaml",
        "e814c8a1822f3b144b3708fdff14c3df0281e961",
        "the repository's terms (no licence file was found in its root)",
        {
            "/v1/embed": ["post"],
            "/v2/embed": ["post"],
            "/v1/rerank": ["post"],
            "/v2/rerank": ["post"],
        },
    ),
    "infinity": (
        "infinity-openapi.json",
        "michaelfeil/infinity",
        "docs/assets/openapi.json",
        "fcb951cb679d0de185bf254600d9b7d2cd3a263a",
        "MIT",
        {
            "/health": ["get"],
            "/models": ["get"],
            "/embeddings": ["post"],
            "/rerank": ["post"],
            "/classify": ["post"],
            "/embeddings_image": ["post"],
            "/embeddings_audio": ["post"],
        },
    ),
}


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/"):
            found.add(ref)
        for value in node.values():
            found |= _refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _refs(value)
    return found


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def cut(doc: dict[str, Any], operations: dict[str, list[str]]) -> dict[str, Any]:
    paths = {
        path: {m: doc["paths"][path][m] for m in methods if m in doc["paths"][path]}
        for path, methods in operations.items()
    }
    components: dict[str, dict[str, Any]] = {}
    todo, seen = _refs(paths), set()
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, _, kind, name = ref.split("/", 3)
        node = _resolve(doc, ref)
        components.setdefault(kind, {})[name] = node
        todo |= _refs(node) - seen
    return {
        "openapi": doc["openapi"],
        "info": doc.get("info", {}),
        "paths": paths,
        "components": {k: dict(sorted(v.items())) for k, v in sorted(components.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from", dest="source", type=Path, default=ROOT.parent / "shared" / "peer-specs"
    )
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for peer, (name, repo, path, commit, licence, operations) in SOURCES.items():
        text = (args.source / name).read_text()
        doc = yaml.safe_load(text) if name.endswith(".yaml") else json.loads(text)
        out = cut(doc, operations)
        out["x-vendored-from"] = {
            "repository": f"https://github.com/{repo}",
            "path": path,
            "commit": commit,
            "licence": licence,
            "note": "only the operations our dialect serves and the components they reference",
        }
        target = OUT / f"{peer}.json"
        target.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
        print(
            f"{target.relative_to(ROOT)}: {len(out['paths'])} paths, "
            f"{sum(len(v) for v in out['components'].values())} components"
        )


if __name__ == "__main__":
    main()
