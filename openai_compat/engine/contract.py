"""The one interface the rest of the server talks to a model's engine through.

`Engine` is what models/, inference/, api/ and ray_serve/ may call: the native engine
(native.NativeEngine) implements it directly, infinity-emb's engine inside engine/infinity/
(engine.InfinityEngine), a Ray Serve deployment's model on the ingress in ray_serve/remote.py.
Nothing outside engine/ asks which engine it holds; engines are built and stopped by
engine/build.py.

The calls return what the inference floor reads: vectors as numpy rows (engine/usage.py's
TokenCountedArray where the engine counted the input's tokens), rerank results with `index`
and `relevance_score`, classify rows of {"label", "score"}; each with the tokens used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

# What a model is, to the server: its inputs, its outputs and how they are batched.
Kind = Literal["embedder", "sparse", "crossencoder", "classifier", "clip", "clap", "other"]


class Engine(Protocol):
    """One loaded model behind its batcher."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> Kind: ...

    @property
    def capabilities(self) -> set[str]:
        """Of "embed", "rerank", "classify", "image_embed", "audio_embed"."""
        ...

    @property
    def sampling_rate(self) -> int | None:
        """What a CLAP model's audio must be sampled at."""
        ...

    # ------------------------------------------------------------ lifecycle

    @property
    def is_running(self) -> bool:
        """False once the engine stopped or its batching machinery died."""
        ...

    async def astart(self) -> None: ...

    async def astop(self) -> None: ...

    # ------------------------------------------------------------ calls

    async def embed(
        self,
        sentences: Sequence[Any],
        task: str | None = None,
        prompt: str | None = None,
        outputs: frozenset[str] | None = None,
    ) -> tuple[list[Any], int]:
        """Vectors (or token vectors, or sparse vectors) and the tokens they took. `task`:
        "query" / "document" on a model with modes; `prompt`: a system prompt on a model
        with messages; `outputs`: what a model with several outputs (outputs()) is asked
        for, a bge_m3.M3Output per input."""
        ...

    async def image_embed(
        self, *, images: Sequence[Any], prompt: str | None = None
    ) -> tuple[list[Any], int]: ...

    async def audio_embed(self, *, audios: Sequence[Any]) -> tuple[list[Any], int]: ...

    async def rerank(self, *, query: str, docs: Sequence[str]) -> tuple[list[Any], int]: ...

    async def classify(self, *, sentences: Sequence[Any]) -> tuple[list[Any], int]: ...

    # ------------------------------------------------------------ what the model is

    @property
    def modes(self) -> bool:
        """Whether queries and documents are embedded apart (a MultiVectorEncoder)."""
        ...

    @property
    def modalities(self) -> frozenset[str]:
        """What the model's inputs may be: "text", "image", "audio"."""
        ...

    @property
    def messages(self) -> bool:
        """Whether inputs are rendered through the model's chat template (a VLM)."""
        ...

    def tokenizer(self) -> Any | None:
        """The fast (Rust) tokenizer the model tokenizes with, for counting; None if none."""
        ...

    def max_length(self) -> int | None:
        """The token limit the engine truncates each input at."""
        ...

    def prompts(self) -> tuple[dict[str, str], str | None]:
        """The prompts the model folder declares and its default prompt name."""
        ...

    def labels(self) -> dict[str, str]:
        """The model's label names by class index (its config's id2label)."""
        ...

    def sparse_size(self) -> int | None:
        """A sparse model's vector size (its vocabulary); None for any other."""
        ...

    def outputs(self) -> tuple[str, ...]:
        """What one forward of the model can give besides its vector (BGE-M3's dense, sparse
        and multivector: bge_m3.OUTPUTS); () for a model with one output."""
        ...

    def reports_tokens(self) -> bool:
        """Whether the engine's usage is each input's real token count (embed's vectors
        carrying their own count and norm); else the server counts."""
        ...

    def takes_token_ids(self) -> bool:
        """Whether embed takes usage.TokenIds inputs and embeds them exactly as given."""
        ...

    def image_tokens(self) -> int:
        """Tokens one image is to the model (a ViT's patches and class token)."""
        ...

    def precision(self) -> dict[str, Any] | None:
        """The dtype and device the model runs in, why, and the quality check's figures
        (engine/precision.py); None where the engine does not say."""
        ...

    def image_side(self) -> int | None:
        """The shortest side an image keeps for the model's processor (images are shrunk
        towards it as they are decoded); None where it is not known (decoded at full size)."""
        ...

    def pooling_mode(self) -> str | None:
        """The embedder's pooling ("mean", "cls", ...); None where it has no Pooling."""
        ...

    # ------------------------------------------------------------ helpers and state

    def late_runner(self) -> Any:
        """What gives late chunking its token vectors (`await token_vectors(texts)`,
        `close()`): engine/late.LateRunner on this model."""
        ...

    def logits_runner(self) -> Any | None:
        """What gives a classifier's raw logits (`await logits(inputs)`, `close()`); None
        for models without classes."""
        ...

    def wave_feeder(self, batch_size: int) -> Any | None:
        """A feeder that gathers embed calls into waves above the engine's queue (one that
        batches as soon as anything arrives); None where the engine forms its own batches."""
        ...

    def bound_output(self, width: int, most: int) -> None:
        """Refuse a multi-vector call whose tokens x `width` would pass `most` values."""
        ...

    def queue_length(self) -> int:
        """Inputs waiting in the engine's batching queue."""
        ...

    def batch_stats(self) -> dict[str, Any] | None:
        """What the engine's forward passes have done (scheduler.BatchStats.as_dict); None
        for engines that do not say."""
        ...

    def torch_modules(self) -> list[Any]:
        """The torch modules holding the model's weights in this process ([] for none)."""
        ...

    def contract_problems(self) -> list[str]:
        """What the engine's library no longer has that this server reads ([] when whole)."""
        ...
