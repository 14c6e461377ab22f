"""The engine's own refusals, which the layers above map to API errors (inference/embed.py's
engine_errors): a model stopped under a call, a call whose output would pass the server's
bound, inputs the model's own preparation refused."""

from __future__ import annotations


class EngineStopped(RuntimeError):
    """The model was unloaded or the server is stopping while work was queued."""


class OutputTooLarge(ValueError):
    """A call's token vectors would pass the server's bound (max_multivector_values)."""

    def __init__(self, values: int, most: int) -> None:
        super().__init__(
            f"These inputs would make {values} vector values (one vector per token), more than "
            f"the {most} one request may have (max_multivector_values); send fewer or shorter "
            "inputs."
        )
        self.values, self.most = values, most


class InputRefused(ValueError):
    """The model's own preparation (its tokenizer, its processor) refused a call's inputs: a
    client's input, never a server fault (a VLM's processor finding its image tokens cut by
    the window, say)."""
