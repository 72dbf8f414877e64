"""What is keyed: exactly what changes an answer, and nothing else.

* :class:`RequestSpec`: endpoint identity, model, templates, the output-affecting parameters
  (the set :class:`~llm_ops.Sampling` fields, the output schema's format) and the media columns.
* :class:`EmbeddingSpec`: the same for an embedding request.

The option objects a user writes (:class:`~llm_ops.Endpoint`, :class:`~llm_ops.Sampling`, ...)
are in :mod:`llm_ops._config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._checks import positive_int
from ._dialects import CANONICAL
from ._key import (
    build_embedding_request,
    build_request,
    embedding_key_sql,
    key_sql,
    messages_for,
    request_key,
)
from ._media import Media, keyed_parts
from ._schema import OutputSchema
from ._template import Template


@dataclass(frozen=True)
class RequestSpec:
    """Everything that changes the answer, and nothing else: what a request key hashes, with
    the texts rendered from each row."""

    endpoint: str  # ResolvedEndpoint.identity
    model: str
    prompt: Template
    system: Template | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # set ones only
    schema: OutputSchema | None = None
    media: Media | None = None  # image and PDF columns, keyed by their bytes' sha256

    @classmethod
    def build(
        cls,
        *,
        endpoint: str,
        model: str,
        prompt: Template,
        system: Template | None = None,
        params: Mapping[str, Any] | None = None,
        schema: OutputSchema | None = None,
        media: Media | None = None,
    ) -> RequestSpec:
        """The spec of these parts, with the sampling parameters that are set (``params``: a
        :class:`~llm_ops.Sampling`'s :attr:`~llm_ops.Sampling.params`)."""
        params = dict(params or {})
        if schema is not None:
            # in the canonical request's spelling, which keys hash
            params.update(CANONICAL.structured_output(schema.name, schema.json_schema))
        return cls(
            endpoint=endpoint,
            model=model,
            prompt=prompt,
            system=system,
            params=params,
            schema=schema,
            media=media,
        )

    def with_model(self, model: str) -> RequestSpec:
        return dataclasses.replace(self, model=model)

    def request(
        self, system: str | None, prompt: str, media: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        """The request of one row, with its media's descriptors (see :mod:`llm_ops._media`);
        its canonical JSON is what is hashed."""
        parts = keyed_parts(media, self.media) if media and self.media else ()
        return build_request(
            endpoint=self.endpoint,
            model=self.model,
            messages=messages_for(system, prompt, parts),
            params=self.params,
        )

    def key(self, system: str | None, prompt: str, media: Sequence[Mapping[str, Any]] = ()) -> str:
        return request_key(self.request(system, prompt, media))

    def key_sql(self) -> tuple[str, list[str]]:
        """The DuckDB expression computing keys over columns ``system`` and ``prompt`` (and
        ``media_key``, with media)."""
        return key_sql(
            endpoint=self.endpoint,
            model=self.model,
            params=self.params,
            with_system=self.system is not None,
            with_media=self.media is not None,
        )


@dataclass(frozen=True)
class EmbeddingSpec:
    """What an embedding request key hashes besides the text: endpoint identity, model and the
    vector size asked for."""

    endpoint: str  # ResolvedEndpoint.identity
    model: str
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None:
            positive_int("dimensions", self.dimensions)

    @property
    def params(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions} if self.dimensions is not None else {}

    def request(self, text: str) -> dict[str, Any]:
        return build_embedding_request(
            endpoint=self.endpoint, model=self.model, text=text, params=self.params
        )

    def key(self, system: str | None, text: str) -> str:
        return request_key(self.request(text))

    def key_sql(self) -> tuple[str, list[str]]:
        return embedding_key_sql(endpoint=self.endpoint, model=self.model, params=self.params)
