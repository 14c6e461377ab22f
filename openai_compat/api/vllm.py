"""vLLM's tokenize API: POST /tokenize (prompt -> tokens) and /detokenize (tokens -> prompt)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr


class VllmTokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt: StrictStr
    model: StrictStr | None = None
    add_special_tokens: StrictBool = True


class VllmDetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[StrictInt]
    model: StrictStr | None = None
