"""Azure OpenAI's routes: POST /openai/deployments/{deployment}/embeddings (what
`openai.AzureOpenAI`, LangChain's `AzureOpenAIEmbeddings` and litellm's `azure/` send),
answered as /v1/embeddings answers. The deployment names the model (a served name or an
alias); the body's `model` is ignored, as Azure ignores it. `api-version` is accepted with
any value and never required. Azure's "v1" API (POST /openai/v1/embeddings, GET
/openai/v1/models) is the OpenAI routes mounted again (web/app.py). Keys come as `api-key`
or `Authorization: Bearer` (web/credentials.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import Field, StrictStr
from starlette.responses import Response

from openai_compat.api.openai.embeddings import dimensions_of, serve_embeddings
from openai_compat.api.protocol import ERROR_RESPONSES, EmbeddingRequest, EmbeddingResponse
from openai_compat.api.request import body_openapi, path_openapi, read_body, ready_registry

router = APIRouter(tags=["azure-openai"])


class AzureEmbeddingRequest(EmbeddingRequest):
    model: StrictStr | None = Field(  # type: ignore[assignment]
        None, description="Ignored: the deployment in the path names the model, as in Azure."
    )


@router.post(
    "/openai/deployments/{deployment}/embeddings",
    response_model=EmbeddingResponse,
    responses=ERROR_RESPONSES,
    openapi_extra={
        **body_openapi(AzureEmbeddingRequest),
        **path_openapi("deployment", "The model's served name or one of its aliases."),
    },
)
async def deployment_embeddings(request: Request) -> Response:
    """OpenAI's embeddings on the model the deployment names."""
    ready_registry(request)
    body = await read_body(request, AzureEmbeddingRequest)
    body = body.model_copy(update={"model": request.path_params["deployment"]})
    return await serve_embeddings(request, body, dimensions_of(body))
