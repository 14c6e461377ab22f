"""engine/limits.py: what a model's processor keeps of an image, read from the processor."""

from __future__ import annotations

import pytest

from openai_compat.engine.limits import image_side


def test_the_side_each_processor_family_keeps() -> None:
    from transformers import (
        CLIPImageProcessorPil,
        Qwen2VLImageProcessorPil,
        SiglipImageProcessorPil,
    )

    # ColPali's SigLIP: resized to 448 x 448 whatever the aspect
    assert image_side(SiglipImageProcessorPil(size={"height": 448, "width": 448})) == 448
    # CLIP (and LLaVA's tower): shortest side to 224, then a 224 crop
    clip = CLIPImageProcessorPil(
        size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}
    )
    assert image_side(clip) == 224
    # Qwen2-VL's family sizes by pixel count: at most 12544 pixels, a 112-pixel square's
    qwen = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112)
    assert image_side(qwen) == 112
    assert image_side(Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12545)) == 113


@pytest.mark.parametrize("processor", [object(), None])
def test_unknown_processors_shrink_nothing(processor: object) -> None:
    assert image_side(processor) is None


def test_a_processor_that_does_not_resize_keeps_every_pixel() -> None:
    from transformers import SiglipImageProcessorPil

    assert image_side(SiglipImageProcessorPil(do_resize=False)) is None
