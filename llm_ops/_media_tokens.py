"""What an image costs in prompt tokens, before it is sent: OpenAI's tile rule.

OpenAI bills an image by its size, not its bytes. At ``detail="low"`` an image costs a fixed
base. Otherwise it is fitted within 2048 x 2048, scaled down until its shorter side is at most
768 pixels, and cut into 512-pixel tiles, each costing the model's tile tokens on top of the
base (gpt-4o: 85 + 170 per tile; gpt-4o-mini bills the same image at about 33 times the tokens,
at its lower price). ``"auto"`` (the default) is counted as ``"high"``: an estimate should not
fall short. Models this module does not know are counted as gpt-4o: the figure is an estimate
for their price too, and :class:`~llm_ops.Price` takes ``per_image`` for providers that price
images per picture.

A PDF sent as a file part is billed by its pages (extracted text plus an image of each page);
:data:`DOCUMENT_TOKENS_PER_PAGE` is the estimate used for one page.

Written by hand: the rule is a dozen lines of arithmetic published by OpenAI, and no maintained
library computes it.
"""

from __future__ import annotations

import math
from typing import Literal

ImageDetail = Literal["low", "high", "auto"]

DOCUMENT_TOKENS_PER_PAGE = 1_000
"""About what one PDF page costs as a file part: an image of the page and its text."""

# model name prefix -> (base tokens, tokens per 512-pixel tile); the longest prefix wins
_TILE_TOKENS: dict[str, tuple[int, int]] = {
    "gpt-4o": (85, 170),
    "gpt-4.1": (85, 170),
    "gpt-4.5": (85, 170),
    "gpt-4o-mini": (2_833, 5_667),
    "o1": (75, 150),
    "o3": (75, 150),
    "computer-use": (65, 129),
}
_DEFAULT = (85, 170)


def tile_tokens(model: str) -> tuple[int, int]:
    """(base tokens, tokens per tile) of ``model``'s images."""
    known = [prefix for prefix in _TILE_TOKENS if model.startswith(prefix)]
    return _TILE_TOKENS[max(known, key=len)] if known else _DEFAULT


def image_tokens(width: int, height: int, *, detail: ImageDetail | None, model: str) -> int:
    """The prompt tokens of one ``width`` x ``height`` image for ``model``.

    Examples
    --------
    >>> image_tokens(1024, 1024, detail="high", model="gpt-4o")
    765
    >>> image_tokens(4096, 8192, detail="low", model="gpt-4o")
    85
    >>> image_tokens(100, 100, detail=None, model="gpt-4o")
    255
    """
    base, per_tile = tile_tokens(model)
    if detail == "low":
        return base
    w, h = float(max(width, 1)), float(max(height, 1))
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(w / 512) * math.ceil(h / 512)
    return base + per_tile * tiles
