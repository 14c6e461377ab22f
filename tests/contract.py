"""Validate live answers against a peer's published OpenAPI document (tests/contracts/).

`Contract("tei").check("/embed", "post", response)` validates the body of an httpx response
against the schema the peer documents for that path, method and status: `$ref`s resolve
inside the peer's document; OpenAPI 3.0's `nullable` means null is allowed (OAS30Validator),
3.1 documents use JSON Schema 2020-12 (OAS31Validator). A status the peer does not list is
checked against its error schema (`error_schema`), since every error of a dialect uses one.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from openapi_schema_validator import OAS30Validator, OAS31Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4, DRAFT202012

from tests.utils import ROOT

CONTRACTS = ROOT / "tests" / "contracts"


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


class Contract:
    def __init__(
        self,
        peer: str,
        error_schema: str | None = None,
        not_required: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        """`not_required`: schema -> keys its `required` lists that the peer's running server
        does not send (each use says why)."""
        self.peer = peer
        self.doc: dict[str, Any] = json.loads((CONTRACTS / f"{peer}.json").read_text())
        for name, keys in (not_required or {}).items():
            schema = self.doc["components"]["schemas"][name]
            schema["required"] = [k for k in schema["required"] if k not in keys]
        self.uri = f"urn:contract:{peer}"
        v30 = self.doc["openapi"].startswith("3.0")
        self.validator = OAS30Validator if v30 else OAS31Validator
        spec = DRAFT4 if v30 else DRAFT202012
        self.registry: Registry[Any] = Registry().with_resource(
            self.uri, Resource.from_contents(self.doc, default_specification=spec)
        )
        self.error_schema = error_schema

    def _ref(self, pointer: str) -> dict[str, Any]:
        return {"$ref": f"{self.uri}#/{pointer}"}

    def schema_for(self, path: str, method: str, status: int) -> dict[str, Any]:
        responses = self.doc["paths"][path][method]["responses"]
        key = next(
            (k for k in (str(status), f"{str(status)[0]}XX", "default") if k in responses), None
        )
        if key is None:
            if status >= 400 and self.error_schema:
                return self._ref(_pointer("components", "schemas", self.error_schema))
            raise AssertionError(
                f"{self.peer} documents no {status} for {method.upper()} {path} "
                f"(it lists {sorted(responses)})"
            )
        response = responses[key]
        base = ("paths", path, method, "responses", key)
        if "$ref" in response:  # a shared response object
            name = response["$ref"].rsplit("/", 1)[1]
            response = self.doc["components"]["responses"][name]
            base = ("components", "responses", name)
        content = response.get("content", {})
        media = next((m for m in content if "json" in m), None)
        if media is None:
            if status >= 400 and self.error_schema:
                return self._ref(_pointer("components", "schemas", self.error_schema))
            return {}  # the peer documents no body
        return self._ref(_pointer(*base, "content", media, "schema"))

    def check(self, path: str, method: str, response: httpx.Response) -> Any:
        """The body, after validating it against the peer's schema for its status."""
        body = response.json()
        schema = self.schema_for(path, method, response.status_code)
        validator = self.validator(schema, registry=self.registry)
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        if errors:
            where = ", ".join(
                f"{'/'.join(map(str, e.absolute_path)) or '(body)'}: {e.message[:300]}"
                for e in errors[:5]
            )
            raise AssertionError(
                f"{self.peer} {method.upper()} {path} {response.status_code} breaks the "
                f"peer's schema: {where}"
            )
        return body

    def post(self, client: httpx.Client, path: str, body: Any) -> tuple[int, Any]:
        """POST `body` to `path`: the status and the body, validated against the peer's schema."""
        response = client.post(path, json=body)
        return response.status_code, self.check(path, "post", response)
