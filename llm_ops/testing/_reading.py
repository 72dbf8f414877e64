"""What the simulator reads from a request, whatever its dialect: the prompt with its media
parts read and tagged (:func:`media_tag`), the digest answers are drawn from, the latent facts
its judge answers from (:func:`facts_in`), its embeddings (:func:`embed`) and a reasoning
model's thinking.

The dialects' modules (:mod:`llm_ops.testing._anthropic`, :mod:`llm_ops.testing._gemini`)
read their requests with these as :mod:`llm_ops.testing._server` does, so they sit below all
of them: imports run from the server and the dialects down to here, never back up.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .._media_tokens import DOCUMENT_TOKENS_PER_PAGE, ImageDetail, image_tokens
from ..exceptions import LlmOpsError

REASONING_TOKENS_PER_TOKEN = 3
"""Thinking tokens a simulated reasoning model reports per token of its answer."""


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content)


def media_tag(data: bytes | str) -> str:
    """The name the simulator gives an image or PDF in its answers: ``media:`` and 12 hex
    digits of the SHA-256 of its bytes, or ``url:`` and those of a remote URL (which it
    cannot fetch), so a test can tell which file reached which row.

    Examples
    --------
    >>> media_tag(b"%PDF-1.4")
    'media:e16fa5d9b519'
    >>> media_tag("https://example.com/cat.png")
    'url:89f18b17905c'
    """
    if isinstance(data, str):
        return "url:" + hashlib.sha256(data.encode()).hexdigest()[:12]
    return "media:" + hashlib.sha256(data).hexdigest()[:12]


class _Refused(LlmOpsError, ValueError):
    """A request OpenAI refuses with HTTP 400 ``invalid_request_error`` (a ValueError too, for
    callers of :func:`reply_for` who give it parts it refuses)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code

    def body(self) -> dict[str, Any]:
        body = _error_body(str(self), "invalid_request_error", self.code)
        body["error"]["param"] = self.param
        return body


@dataclass(frozen=True)
class _Media:
    """One image or file part of a request, read: what it is called and what it costs."""

    tag: str
    size: tuple[int, int] | None = None  # an image's pixels; None: a remote URL, or a PDF
    detail: ImageDetail | None = None
    pages: int = 0  # a PDF's; 0 for an image

    def tokens(self, model: str) -> int:
        """Its prompt tokens, as OpenAI bills them."""
        if self.pages:
            return self.pages * DOCUMENT_TOKENS_PER_PAGE
        if self.size is None:  # a remote URL: no network to fetch and measure it with
            return image_tokens(0, 0, detail="low", model=model)
        return image_tokens(*self.size, detail=self.detail, model=model)


@dataclass
class _Prompt:
    """A request's messages with every list content made a string (see :func:`_normalise`)."""

    messages: list[dict[str, Any]]
    media: list[_Media] = field(default_factory=list)
    echoed_tags: int = 0  # the media parts of the last user message: its answer names them all


def _normalise(messages: list[dict[str, Any]], *, max_image_bytes: int | None = None) -> _Prompt:
    """The messages with each list content (OpenAI's content parts) made one string: its text
    parts joined by newlines, then `` [tag]`` (:func:`media_tag`) for each image or file part
    in order. Answers and digests are made from this form, so they depend on the bytes of an
    image, not on how it was encoded, named or typed. String contents are kept as they are, so
    their answers stay what they always were.

    Raises
    ------
    _Refused
        For a part OpenAI would refuse: of an unknown type, an image that is not valid base64,
        not an image or over ``max_image_bytes``, a file that is not a PDF.
    """
    if not any(isinstance(message.get("content"), list) for message in messages):
        return _Prompt(messages)
    prompt = _Prompt([])
    for i, message in enumerate(messages):
        content = message.get("content")
        tags: list[str] = []
        if isinstance(content, list):
            texts: list[str] = []
            for j, part in enumerate(content):
                read = _read_part(part, f"messages[{i}].content[{j}]", max_image_bytes)
                if isinstance(read, str):
                    texts.append(read)
                else:
                    prompt.media.append(read)
                    tags.append(read.tag)
            text = "\n".join(texts) + "".join(f" [{tag}]" for tag in tags)
            message = {**message, "content": text}
        prompt.messages.append(message)
        if message.get("role") == "user":  # the message _user_text echoes is the last one
            prompt.echoed_tags = len(tags)
    return prompt


def _read_part(part: Any, where: str, max_image_bytes: int | None) -> str | _Media:
    """A text part's text, or an image or file part read and checked."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise _Refused(f"Invalid '{where}.text': expected a string.", f"{where}.text")
        return text
    if kind == "image_url":
        return _read_image(part.get("image_url"), f"{where}.image_url", max_image_bytes)
    if kind == "file":
        return _read_file(part.get("file"), f"{where}.file")
    raise _Refused(
        f"Invalid value: {kind!r}. Supported values are: 'text', 'image_url' and 'file'.",
        f"{where}.type",
        "invalid_value",
    )


def _read_image(spec: Any, where: str, max_image_bytes: int | None) -> _Media:
    spec = {"url": spec} if isinstance(spec, str) else spec  # the older shorthand
    url = spec.get("url") if isinstance(spec, dict) else None
    detail = spec.get("detail") if isinstance(spec, dict) else None
    if detail not in (None, "low", "high", "auto"):
        raise _Refused(
            f"Invalid value: {detail!r}. Supported values are: 'low', 'high' and 'auto'.",
            f"{where}.detail",
            "invalid_value",
        )
    if not isinstance(url, str):
        raise _Refused("Invalid image: 'url' must be a string.", f"{where}.url", "invalid_image")
    if url.startswith(("http://", "https://")):
        return _Media(media_tag(url), detail=detail)
    data = _data_url(url, f"{where}.url", "invalid_image_url", "Invalid image")
    if max_image_bytes is not None and len(data) > max_image_bytes:
        raise _Refused(
            f"Invalid image: {len(data)} bytes, over the limit of {max_image_bytes} bytes "
            f"({max_image_bytes / 2**20:g} MiB) per image.",
            f"{where}.url",
            "image_too_large",
        )
    size = _image_size(data)
    if size is None:
        raise _Refused(
            "Invalid image: the bytes are not an image format that can be read.",
            f"{where}.url",
            "invalid_image_format",
        )
    return _Media(media_tag(data), size=size, detail=detail)


def _read_file(spec: Any, where: str) -> _Media:
    file_data = spec.get("file_data") if isinstance(spec, dict) else None
    if not isinstance(file_data, str):
        # the simulator keeps no uploaded files for chat, so a 'file_id' has nothing to name
        raise _Refused(
            "Invalid file: the simulator reads 'file_data' (a base64 data URL) only.",
            f"{where}.file_data",
            "invalid_file",
        )
    data = _data_url(file_data, f"{where}.file_data", "invalid_file", "Invalid file")
    pages = _pdf_pages(data) if data.startswith(b"%PDF-") else None
    if pages is None:
        raise _Refused(
            "Invalid file: only PDF files are supported, and these bytes are not a readable PDF.",
            f"{where}.file_data",
            "invalid_file_format",
        )
    return _Media(media_tag(data), pages=max(pages, 1))


def _data_url(url: str, where: str, code: str, what: str) -> bytes:
    """The bytes of a ``data:<type>;base64,<data>`` URL (the type is not checked: OpenAI reads
    the bytes, whatever the URL says they are)."""
    head, comma, payload = url.partition(",")
    if not (head.startswith("data:") and head.endswith(";base64") and comma):
        raise _Refused(
            f"{what}: expected a URL or a base64 data URL ('data:<type>;base64,...').",
            where,
            code,
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _Refused(f"{what}: the data URL is not valid base64.", where, code) from None


def _image_size(data: bytes) -> tuple[int, int] | None:
    """An image's width and height, read by Pillow; ``None`` if it cannot read them."""
    from PIL import Image  # here: llm_ops imports without the media extra

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception:  # Pillow raises many kinds for bytes it cannot read (OSError, SyntaxError)
        return None


def _pdf_pages(data: bytes) -> int | None:
    """A PDF's page count, read by pypdfium2; ``None`` if it cannot read it."""
    import pypdfium2  # here: llm_ops imports without the extra

    try:
        document = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError:
        return None
    try:
        return len(document)
    finally:
        document.close()


def _count_media(messages: Any) -> int:
    """The image and file parts in a request's messages, read or not."""
    if not isinstance(messages, list):
        return 0
    return sum(
        1
        for message in messages
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") in ("image_url", "file")
    )


def _user_text(messages: list[dict[str, Any]]) -> str:
    """The last user message's text, media tags and all (of the normalised messages)."""
    for message in reversed(_normalise(messages).messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _digest(messages: list[dict[str, Any]]) -> str:
    """The digest of the normalised messages: of the media's bytes, not of their base64."""
    normalised = _normalise(messages).messages
    return hashlib.sha256(json.dumps(normalised, sort_keys=True).encode()).hexdigest()


_FACT = re.compile(r"\[(?:score=([-+]?\d+(?:\.\d+)?)|entity=([-+]?\d+))\]")
"""A latent fact: ``[score=<number>]`` (how good an item is) or ``[entity=<int>]`` (which
real-world thing a text is about)."""
JUDGMENTS = ("verdict", "comparison", "ranking", "choice", "aggregation")
"""The judge's kinds of judgment, as ``stats()["judged"]`` counts them."""


def facts_in(text: str) -> dict[str, list[Any]]:
    """The latent facts of a text, by kind and in order of appearance: what the simulator's
    judge answers from. The k-th fact of a kind is item k of a comparison, ranking or choice.

    Examples
    --------
    >>> facts_in("a coat [entity=3] rated [score=0.9], a hat [score=0.25]")
    {'score': [0.9, 0.25], 'entity': [3]}
    >>> facts_in("no facts here")
    {'score': [], 'entity': []}
    """
    found: dict[str, list[Any]] = {"score": [], "entity": []}
    for score, entity in _FACT.findall(text):
        if score:
            found["score"].append(float(score))
        else:
            found["entity"].append(int(entity))
    return found


def latent_score(text: str) -> float | None:
    """The text's first ``[score=...]`` fact, ``None`` without one.

    Examples
    --------
    >>> latent_score("a fine coat [score=0.8]"), latent_score("a coat")
    (0.8, None)
    """
    scores = facts_in(text)["score"]
    return scores[0] if scores else None


def latent_entity(text: str) -> int | None:
    """The text's first ``[entity=...]`` fact, ``None`` without one.

    Examples
    --------
    >>> latent_entity("Acme Inc. [entity=7]"), latent_entity("Acme Inc.")
    (7, None)
    """
    entities = facts_in(text)["entity"]
    return entities[0] if entities else None


def distinct_facts(text: str) -> list[str]:
    """The text's distinct facts as written, in order of first appearance: what the judge's
    aggregation of the text names (so a fold is right when its answer names each of these).

    Examples
    --------
    >>> distinct_facts("[entity=3] red [score=0.5] and [entity=3] blue")
    ['[entity=3]', '[score=0.5]']
    """
    return list(dict.fromkeys(match.group(0) for match in _FACT.finditer(text)))


def _without_facts(text: str) -> str:
    return _FACT.sub(" ", text)


def embed(text: str, dimensions: int = 256, *, noise: float = 0.3) -> list[float]:
    """The simulator's embedding (``sim-embed``): a normalised hashed bag of words, so texts
    sharing words have similar vectors (cosine similarity is about the share of words in
    common) and texts that share none are near orthogonal. Each word adds a sign at eight
    hashed positions, so two different words rarely look alike even in few dimensions.

    A text with latent facts (:func:`facts_in`) is embedded by its first one, plus ``noise``
    times the bag of its other words (``SimulatorConfig.embed_noise``): with
    ``[entity=k]``, the hashed vector of the single token ``entity-k``, so texts about one
    entity lie near each other; else with ``[score=s]``, ``s`` times the embedding of
    ``best``, so the cosine to ``embed("best")`` follows the scores (more exactly the
    smaller ``noise``).

    Examples
    --------
    >>> def cosine(a, b):
    ...     return round(sum(x * y for x, y in zip(a, b)), 2)
    >>> cosine(embed("Acme [entity=1]"), embed("ACME Inc. [entity=1]")) > 0.9
    True
    >>> cosine(embed("Acme [entity=1]"), embed("Acme [entity=2]")) < 0.3
    True
    """
    facts = facts_in(text)
    if not facts["entity"] and not facts["score"]:
        return _normalised(_bag(re.findall(r"\w+", text.lower()), dimensions))
    if facts["entity"]:
        anchor = _normalised(_bag([f"entity-{facts['entity'][0]}"], dimensions))
    else:
        anchor = [facts["score"][0] * v for v in embed("best", dimensions)]
    words = re.findall(r"\w+", _without_facts(text).lower())
    rest = _normalised(_bag(words, dimensions)) if words else [0.0] * dimensions
    return _normalised([a + noise * r for a, r in zip(anchor, rest, strict=True)])


def _bag(words: list[str], dimensions: int) -> list[float]:
    vector = [0.0] * dimensions
    for word in words:
        digest = hashlib.sha256(word.encode()).digest()
        for i in range(0, 32, 4):
            position = int.from_bytes(digest[i : i + 4], "big")
            vector[position % dimensions] += 1.0 if position & 1 << 31 else -1.0
    return vector


def _normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0:
        vector, norm = [0.0] * len(vector), 1.0
        vector[0] = 1.0
    return [v / norm for v in vector]


def expected_reasoning(prompt: str, *, model: str, system: str | None = None) -> str:
    """The thinking a simulated reasoning model returns as ``reasoning_content`` for this
    prompt: never part of its answer."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": prompt})
    return _reasoning_for(messages, model)


def _reasoning_for(messages: list[dict[str, Any]], model: str) -> str:
    return f"{model} thinks over #{_digest(messages)[:8]} before it answers"


def _error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
