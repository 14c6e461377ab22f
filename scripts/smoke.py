#!/usr/bin/env python3
"""Check a deployed openai-compat server feature by feature with the real SDKs.

    python scripts/smoke.py --base-url https://host[:port] [--api-key KEY]

Models are picked from /v1/models by capability (override with --embed-model and friends).
Prints a pass/fail table; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import base64
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    seconds: float


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


class Smoke:
    def __init__(self, base_url: str, api_key: str | None, timeout: float) -> None:
        self.base = base_url.rstrip("/")
        self.key = api_key or "unused"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base, headers=headers, timeout=timeout)
        self.checks: list[Check] = []
        self.models: dict[str, list[str]] = {}

    def run(self, name: str, fn: Callable[[], str]) -> None:
        start = time.perf_counter()
        try:
            detail, ok = fn(), True
        except Exception as exc:  # a smoke test reports every failure and carries on
            detail, ok = f"{type(exc).__name__}: {exc}"[:160], False
        self.checks.append(Check(name, ok, detail, time.perf_counter() - start))

    def pick(self, capability: str, override: str | None) -> str | None:
        if override:
            return override
        return next((m for m, caps in self.models.items() if capability in caps), None)

    # -------------------------------------------------------------- checks

    def health(self) -> str:
        r = self.http.get("/health")
        assert r.status_code == 200, r.text
        ready = self.http.get("/ready")
        assert ready.status_code == 200, ready.text
        return f"health 200, ready with {len(ready.json()['models'])} model(s)"

    def list_models(self) -> str:
        import openai

        client = openai.OpenAI(base_url=self.base + "/v1", api_key=self.key, max_retries=0)
        for m in client.models.list():
            self.models[m.id] = list((m.model_extra or {}).get("capabilities", []))
        assert self.models, "no models served"
        return ", ".join(f"{k} [{','.join(v)}]" for k, v in self.models.items())

    def embeddings(self, model: str) -> str:
        import openai

        client = openai.OpenAI(base_url=self.base + "/v1", api_key=self.key, max_retries=0)
        texts = ["A man is eating food.", "A man is eating a piece of bread.", "Stocks fell."]
        b64 = client.embeddings.create(model=model, input=texts)  # SDK default: base64
        fl = client.embeddings.create(model=model, input=texts, encoding_format="float")
        for a, b in zip(b64.data, fl.data, strict=True):
            assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding, strict=True)) < 1e-6
        near, far = (
            _cos(fl.data[0].embedding, fl.data[1].embedding),
            _cos(fl.data[0].embedding, fl.data[2].embedding),
        )
        assert near > far, f"similar sentences should be closer ({near:.3f} <= {far:.3f})"
        assert fl.usage.prompt_tokens > 0
        return f"{len(fl.data[0].embedding)} dims, cos {near:.3f} > {far:.3f}, usage ok"

    def raw_base64(self, model: str) -> str:
        body = {"model": model, "input": "hello", "encoding_format": "base64"}
        r = self.http.post("/v1/embeddings", json=body)
        raw = base64.b64decode(r.json()["data"][0]["embedding"])
        assert len(raw) % 4 == 0 and raw, "base64 is not float32 bytes"
        return f"{len(raw) // 4} float32 values"

    def dimensions(self, model: str) -> str:
        import openai

        client = openai.OpenAI(base_url=self.base + "/v1", api_key=self.key, max_retries=0)
        v = client.embeddings.create(model=model, input="hi", dimensions=8).data[0].embedding
        assert len(v) == 8 and abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4
        return "8 dims, unit norm"

    def token_ids(self, model: str) -> str:
        r = self.http.post("/v1/embeddings", json={"model": model, "input": [[40, 1093, 433]]})
        assert r.status_code == 200, r.text
        return "cl100k token ids accepted"

    def errors(self, model: str) -> str:
        import openai

        client = openai.OpenAI(base_url=self.base + "/v1", api_key=self.key, max_retries=0)
        try:
            client.embeddings.create(model="no-such-model-xyz", input="x")
            raise AssertionError("unknown model was accepted")
        except openai.NotFoundError:
            pass
        try:
            client.embeddings.create(model=model, input=[])
            raise AssertionError("empty input was accepted")
        except openai.BadRequestError:
            pass
        return "404 unknown model, 400 empty input"

    def rerank(self, model: str) -> str:
        import cohere

        docs = ["The weather is sunny.", "Boil the pasta in salted water.", "Taxes rose."]
        v2 = cohere.ClientV2(base_url=self.base, api_key=self.key)
        r2 = v2.rerank(model=model, query="how do I cook pasta", documents=docs, top_n=2)
        assert r2.results[0].index == 1, [r.index for r in r2.results]
        v1 = cohere.Client(base_url=self.base, api_key=self.key)
        r1 = v1.rerank(
            model=model, query="how do I cook pasta", documents=docs, return_documents=True
        )
        assert r1.results[0].document is not None and len(r1.results) == 3
        return f"v1+v2 ok, best score {r2.results[0].relevance_score:.3f}"

    def classify(self, model: str) -> str:
        r = self.http.post("/v1/classify", json={"model": model, "input": ["I love it."]})
        assert r.status_code == 200, r.text
        item = r.json()["data"][0]
        return f"label {item['label']} ({item['score']:.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="server root, without /v1")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--embed-model")
    parser.add_argument("--rerank-model")
    parser.add_argument("--classify-model")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)

    s = Smoke(args.base_url, args.api_key, args.timeout)
    s.run("health & ready", s.health)
    s.run("models list", s.list_models)
    embed = s.pick("embed", args.embed_model)
    if embed:
        s.run(f"embeddings ({embed})", lambda: s.embeddings(embed))
        s.run("base64 bytes", lambda: s.raw_base64(embed))
        s.run("dimensions", lambda: s.dimensions(embed))
        s.run("token-id input", lambda: s.token_ids(embed))
        s.run("error envelope", lambda: s.errors(embed))
    rerank = args.rerank_model or next(
        (m for m, c in s.models.items() if "rerank" in c and "embed" not in c), embed
    )
    if rerank:
        s.run(f"rerank ({rerank})", lambda: s.rerank(rerank))
    classify = s.pick("classify", args.classify_model)
    if classify:
        s.run(f"classify ({classify})", lambda: s.classify(classify))

    width = max(len(c.name) for c in s.checks)
    for c in s.checks:
        status = "PASS" if c.ok else "FAIL"
        print(f"{status}  {c.name:<{width}}  {c.seconds * 1000:7.0f} ms  {c.detail}")
    failed = sum(not c.ok for c in s.checks)
    print(f"{len(s.checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
