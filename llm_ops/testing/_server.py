"""A local OpenAI-compatible endpoint that simulates an LLM, for development, demos and tests.

It is not a model: every answer is a deterministic function of the request (see
:func:`expected_reply`), so a test can check that each row got the answer to its own prompt.

Per-request behaviour is set by directives inside the user message:

``[[sim:status=400]]``
    answer with this HTTP status and an OpenAI-shaped error body
``[[sim:latency=0.2]]``
    wait this many seconds before answering
``[[sim:fail_times=2]]`` (with optional ``[[sim:fail_status=503]]``, default 500)
    fail the first two requests carrying this exact prompt, then answer normally
``[[sim:finish_reason=content_filter]]``
    answer with this ``finish_reason`` (``none`` leaves it out); ``content_filter`` cuts the
    answer to its first word. With ``fail_times``, only the first times, instead of an error
``[[sim:error_in_200=1]]``
    answer HTTP 200 with both ``choices`` and an ``error`` object (with ``fail_times``, only
    the first times)
``[[sim:invalid=json]]`` / ``[[sim:invalid=schema]]`` / ``[[sim:invalid=enum]]``
    with a ``json_schema`` response format: answer prose, an object missing its fields, or
    choices outside a field's ``enum`` (as a model that ignores the schema would)
``[[sim:fail_for=sim-small]]``
    these models (comma-separated) refuse the prompt with HTTP 400; others answer it
``[[sim:unsure_for=sim-small]]``
    these models answer unsure: a ``confidence`` number field of a structured answer is 0.2
    (else 0.9), and a text answer starts with ``unsure:``
``[[sim:answer_tokens=64]]``
    with the continuous-batching model on, this answer is this many tokens long (at most the
    request's ``max_tokens``): it takes as many decode steps

Hostile answers, for testing that nothing an endpoint sends can crash or fool a client:

``[[sim:prompt_tokens=-1000000]]`` / ``[[sim:completion_tokens=1e30]]``
    report this JSON number in ``usage`` instead of the real count
``[[sim:retry_after=86400]]``
    answer 429 (or ``fail_status``) with this ``Retry-After`` (seconds or an HTTP date);
    with ``fail_times``, only the first times
``[[sim:redirect=302]]`` (with optional ``[[sim:location=...]]``)
    answer this 3xx status with a ``Location`` elsewhere, query string and all
``[[sim:body_bytes=50000000]]`` (with optional ``[[sim:chunked=1]]``)
    pad the answer's text so the body is about this many bytes; ``chunked`` sends it without a
    ``Content-Length``
``[[sim:gzip_bomb=2147483648]]``
    a small body with ``Content-Encoding: gzip`` that inflates to this many zero bytes

With ``SimulatorConfig.prefix_cache_tokens`` set, the simulator models a server's automatic
prefix cache (OpenAI's prompt caching, vLLM's ``--enable-prefix-caching``): a prompt that starts
like a recent one reports the shared part in ``usage.prompt_tokens_details.cached_tokens`` and,
with ``prefill_seconds_per_1k_tokens``, is answered sooner (see :class:`PrefixCache`).

The models of ``SimulatorConfig.reasoning_models`` (``sim-think`` by default) play a reasoning
model, as OpenAI's o-series and DeepSeek-R1 behind vLLM do: they refuse ``max_tokens`` with
OpenAI's HTTP 400 ``unsupported_parameter`` (asking for ``max_completion_tokens``, which caps
the answer as ``max_tokens`` does), report :data:`REASONING_TOKENS_PER_TOKEN` thinking tokens
per answer token in ``usage.completion_tokens_details.reasoning_tokens`` (counted in
``completion_tokens`` too) and return their thinking as the message's ``reasoning_content``
(see :func:`expected_reasoning`).

A user message's content may be OpenAI's list of parts: ``text``, ``image_url`` (a base64
data URL, or a remote URL it cannot fetch) and ``file`` (a PDF as a base64 data URL). Each image
or PDF is named in the answer by :func:`media_tag` of its bytes, so a test can tell which file
reached which row, and ``usage.prompt_tokens`` counts it as OpenAI bills it (an image by the tile
rule of :func:`~llm_ops._media_tokens.image_tokens`, a PDF by its pages). Invalid base64, bytes
that are not an image, an image over ``SimulatorConfig.max_image_bytes``, a file that is not a
PDF and an unknown part type are refused with HTTP 400, as OpenAI does.

Texts may carry latent facts, ``[score=<number>]`` and ``[entity=<int>]`` (see
:func:`facts_in`): a world with known truth for operators over sets of rows. A chat request
whose last user message holds them is answered by a judge from the facts: a ``json_schema``
with an ``answer`` boolean (a verdict), a ``better`` enum of two labels (a comparison), a
``ranking`` array of integers or a ``choice`` enum is judged (see :func:`structured_reply`),
and any other answer names the message's :func:`distinct_facts` (an aggregation, see
:func:`reply_for`). ``SimulatorConfig.judge_error`` and ``position_bias`` make the judge err,
deterministically per request; ``sim-embed`` places texts by their facts (:func:`embed`);
``SimulatorConfig.context_tokens`` refuses what a llama.cpp slot cannot hold, and ``GET /props``
reports it as llama.cpp does.

With ``SimulatorConfig.step_base`` set, the simulator models a server with continuous batching
(vLLM, TGI, llama.cpp, ``transformers serve``): at most ``slots`` requests decode together, a
token each per step, and the rest queue, so its throughput rises with the requests in flight
up to a knee and then only latency grows (see :class:`~llm_ops.testing._decode.DecodeBatch`).
:data:`PRESETS` holds three such servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import hashlib
import json
import math
import random
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, cast

from aiohttp import web

from .._pack import parse_pack_request
from ._anthropic import AnthropicApi
from ._batches import BatchesApi
from ._batches_anthropic import AnthropicBatchesApi
from ._batches_gemini import GeminiBatchesApi
from ._decode import DecodeBatch, Durations
from ._gemini import GeminiApi
from ._reading import (
    _FACT,
    JUDGMENTS,
    REASONING_TOKENS_PER_TOKEN,
    _content,
    _count_media,
    _digest,
    _error_body,
    _normalise,
    _Prompt,
    _reasoning_for,
    _Refused,
    _user_text,
    distinct_facts,
    embed,
    facts_in,
    media_tag,
)
from ._wire import Wire

_DIRECTIVE = re.compile(r"\[\[sim:(\w+)=([^\]]*)\]\]")
REPLY_WORDS = 12
GATHER_SECONDS = 30.0  # how long answers wait for `gather` requests in flight at most
PREFIX_BLOCK_TOKENS = 16
"""Tokens in one block of the modelled prefix cache (vLLM's default block size)."""
PREFIX_BLOCK_CHARS = 64
"""Characters of the prompt in one block: about four characters a token."""
MAX_TOKENS_REFUSED = (
    "Unsupported parameter: 'max_tokens' is not supported with this model. "
    "Use 'max_completion_tokens' instead."
)
"""OpenAI's message when a reasoning model is sent ``max_tokens``."""


FAULT_KINDS = ("500", "503", "429", "drop", "truncated_json", "html")


BASE_PATHS = {"openai": "/v1", "anthropic": "", "gemini": "/v1beta"}
"""The path of each dialect's base URL under the simulator's root, as its SDK takes it."""


@dataclass
class SimulatorConfig:
    """How the simulated endpoint behaves; every field can be changed while it runs.

    Attributes
    ----------
    latency
        Seconds every answer waits before it is sent (a refusal for the key or the quota too).
    latency_per_token
        Extra seconds per output token.
    slots
        Requests served at once; the rest wait in a FIFO queue. Without ``step_base`` a
        request holds its slot for its whole ``latency``; with it, ``slots`` is the most
        requests the batch decodes together. ``None`` (or 0): no limit.
    step_base, step_per_sequence, step_per_queued
        The continuous-batching model, on when ``step_base`` is set (``None``, the default,
        leaves it off). The server runs decode steps of ``step_base + step_per_sequence *
        active + step_per_queued * queued`` seconds, where ``active`` requests (at most
        ``slots``) are in the batch and ``queued`` wait for a slot. A step gives every active
        request one token; a request joins the batch at a step boundary and leaves it when it
        has all its tokens (``answer_tokens``), so throughput rises with the requests in flight
        until the slots are full, and beyond that only queueing delay grows. A
        ``step_per_queued`` above 0 makes throughput fall past the knee, as a real server's did
        (scheduling overhead that grows with its queue). ``latency`` and the prefill still
        apply, before a request joins the queue; an error answer does not decode. See
        :meth:`modelled_throughput` and :data:`PRESETS`.
    answer_tokens
        With the batching model, the completion tokens (decode steps) of an answer to a request
        without ``max_tokens``; a request's ``max_tokens`` is its answer's length, and
        ``[[sim:answer_tokens=N]]`` in a prompt sets its own (at most ``max_tokens``).
        ``usage.completion_tokens`` reports it, while the text stays the one
        :func:`expected_reply` gives, so tests can still check every answer.
    gather
        Answers wait until this many chat requests have been in flight at once (for at most
        30 s), so that a test can make sure two clients' requests overlap without waiting a
        guessed time; the first request (since :meth:`Simulator.reset`) is answered at once, as
        a client may send no more until it is (llm-ops does). 0 (the default): no waiting.
    hold
        Answer this many chat requests (counted since :meth:`Simulator.reset`), and hold the
        others until told: a later configure with a larger ``hold`` or none lets them go. A test
        then knows what is in flight, and for how long, without guessing a latency; the
        ``held`` counter says how many wait. ``None`` (the default): no holding.
    rpm, tpm
        Requests and tokens per minute. Over the limit the answer is 429 with ``Retry-After``
        and ``retry-after-ms``; ``x-ratelimit-*`` headers are sent on every answer.
    rate_window
        Seconds of budget the limits allow in one burst (OpenAI: 60).
    rate_limit_headers
        Send ``x-ratelimit-*`` headers (429s keep their ``Retry-After`` either way).
    fault_rate
        Share of attempts answered with a fault drawn from ``fault_kinds``: ``500``, ``503``,
        ``429`` (without headers), ``529`` (Anthropic's overloaded; not drawn unless named),
        ``drop`` (connection closed mid-response),
        ``truncated_json`` (200 with half a body) or ``html`` (200 with an HTML error page).
    hang_rate
        Share of attempts that never answer.
    seed
        Seed of the fault draws.
    insufficient_quota
        Answer every request with a 429 ``insufficient_quota`` error.
    quota_requests
        Run out of quota (as above) once this many requests were answered.
    max_embedding_inputs
        Inputs allowed in one ``/v1/embeddings`` request (OpenAI: 2048); more is a 400.
    max_embedding_chars
        An embedding input longer than this fails its whole request with HTTP 500, as
        llama.cpp does for an input larger than its batch size.
    ignore_dimensions
        Answer embeddings at the native width (256), whatever ``dimensions`` asks, as
        llama.cpp does.
    pack_drop_rate, pack_shuffle
        For multi-row requests: the share of packs answered with one item missing, and
        whether items come back in a shuffled order.
    api_key, api_key_header
        When ``api_key`` is set, requests without it get HTTP 401: in ``Authorization:
        Bearer <api_key>`` by default, or as the value of ``api_key_header`` (Azure OpenAI's
        ``api-key``, say).
    dialect
        The API the base URL printed on start (and :attr:`LocalEndpoint.base_url`) is for:
        ``"openai"`` (``http://host:port/v1``), ``"anthropic"`` (``http://host:port``, as
        Anthropic's SDK takes it) or ``"gemini"`` (``http://host:port/v1beta``). Every
        dialect's paths are served whatever it is: a request's path says its dialect.
    models
        The names ``/v1/models`` lists (clients such as llm_ops refuse a model the list lacks
        before sending; the simulator itself answers any name). Empty: ``/v1/models`` is a
        404, as on servers without it.
    batch_seconds, batch_validation_seconds, batch_expire_share, batch_expire_first
        The Batches API's clock: a batch validates for so long, then works through its lines
        for ``batch_seconds``; with ``batch_expire_share`` the first ``batch_expire_first``
        batches expire having answered that share of their lines (see
        :mod:`llm_ops.testing._batches`).
    prefix_cache_tokens
        Capacity, in tokens, of a modelled automatic prefix cache; 0 (the default) turns it
        off. The prompt (each message's role and content, in order) is cut into blocks of
        :data:`PREFIX_BLOCK_TOKENS` tokens (:data:`PREFIX_BLOCK_CHARS` characters); its
        leading blocks found in the cache are reported as
        ``usage.prompt_tokens_details.cached_tokens`` (always 0 when off), and an answered
        request's blocks then enter the cache, least recently used out first (see
        :class:`PrefixCache`). Batch lines use it too. Changing the config keeps what the
        cache holds (cut to the new capacity); :meth:`Simulator.reset` empties it.
    prefill_seconds_per_1k_tokens
        Extra seconds per 1,000 prompt tokens not served by the prefix cache (the prefill),
        so reusing a prefix shortens the wait.
    batch_fail, batch_fail_line
        A hostile Batches API: batches end ``failed`` after validating, with an ``errors``
        list holding this code (naming that 1-based line of the input file, if set).
    batch_duplicate_lines, batch_duplicate_differ
        Each completed batch's first so many answers appear twice in its output file, the
        second time with a different text (unless ``batch_duplicate_differ`` is off).
    batch_unknown_lines
        Answers each completed batch adds for ``custom_id``s it was never sent.
    batch_drop_lines
        Lines each completed batch leaves out of its output and error files (its last ones),
        while its status and counts say they were answered.
    batch_hostile_first
        The four above apply to the first so many batches; ``None``: to every batch.
    batch_list_status
        ``GET /v1/batches`` answers this HTTP status (say 500), with ``retry-after-ms: 10``.
    batch_create_stall
        ``"before"`` or ``"after"``: ``POST /v1/batches`` never answers, before or after it
        made the batch.
    reasoning_models
        The models that play a reasoning model (see the module's documentation): they refuse
        ``max_tokens``, report thinking tokens and return ``reasoning_content``.
    max_request_bytes
        The largest request body accepted (chat requests, batch file uploads, ...); a larger
        one is answered HTTP 413. Images and PDFs travel inside the JSON as base64, so a body
        is far larger than its text (aiohttp's own default, 1 MiB, would refuse one photo).
    max_image_bytes
        The largest image one ``image_url`` part may carry, decoded (OpenAI: 20 MB); a larger
        one is refused with HTTP 400 naming the limit.
    judge_error
        Probability that one judgment of the judge is wrong (a verdict flipped, a comparison or
        choice answering another label, adjacent ranks swapped, an aggregation leaving a fact
        out); see :func:`facts_in` and the module's documentation. Drawn from
        sha256(``seed``, the request), so the same request always gets the same answer.
    position_bias
        Probability that a comparison answers its first label whatever the facts.
    embed_noise
        Weight of the word-bag part in the embedding of a text with latent facts.
    context_tokens
        Tokens one request may use: its prompt (the simulator's estimate) and its
        ``max_tokens`` (16 when unset). Beyond it, HTTP 400 with llama.cpp's
        ``exceed_context_size_error`` body; ``GET /props`` reports it as llama.cpp's per-slot
        context (``default_generation_settings.n_ctx``). ``None`` (the default): no limit,
        and ``/props`` is a 404, as on OpenAI.
    """

    latency: float = 0.0
    latency_per_token: float = 0.0
    slots: int | None = None
    step_base: float | None = None
    step_per_sequence: float = 0.0
    step_per_queued: float = 0.0
    answer_tokens: int = 16
    gather: int = 0
    hold: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    rate_window: float = 60.0
    rate_limit_headers: bool = True
    fault_rate: float = 0.0
    fault_kinds: tuple[str, ...] = FAULT_KINDS
    hang_rate: float = 0.0
    seed: int = 0
    insufficient_quota: bool = False
    quota_requests: int | None = None
    max_embedding_inputs: int = 2048
    max_embedding_chars: int | None = None
    ignore_dimensions: bool = False
    pack_drop_rate: float = 0.0
    pack_shuffle: bool = False
    api_key: str | None = None
    api_key_header: str = "Authorization"
    models: tuple[str, ...] = ("sim", "sim-small", "sim-embed", "sim-think")
    batch_seconds: float = 1.0
    batch_validation_seconds: float = 0.1
    batch_expire_share: float | None = None
    batch_expire_first: int = 1
    prefix_cache_tokens: int = 0
    prefill_seconds_per_1k_tokens: float = 0.0
    batch_fail: str | None = None
    batch_fail_line: int | None = None
    batch_duplicate_lines: int = 0
    batch_duplicate_differ: bool = True
    batch_unknown_lines: int = 0
    batch_drop_lines: int = 0
    batch_hostile_first: int | None = None
    batch_list_status: int | None = None
    batch_create_stall: str | None = None
    reasoning_models: tuple[str, ...] = ("sim-think",)
    max_request_bytes: int = 64 * 2**20
    max_image_bytes: int = 20 * 2**20
    judge_error: float = 0.0
    position_bias: float = 0.0
    embed_noise: float = 0.3
    context_tokens: int | None = None
    dialect: str = "openai"

    def __post_init__(self) -> None:
        if self.dialect not in BASE_PATHS:
            raise ValueError(f"dialect must be one of {sorted(BASE_PATHS)}, got {self.dialect!r}")

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> SimulatorConfig:
        """The config whose :func:`dataclasses.asdict` was sent as JSON (lists for tuples)."""
        given: dict[str, Any] = dict(fields)
        for name in ("fault_kinds", "models", "reasoning_models"):
            if name in given:
                given[name] = tuple(given[name])
        return cls(**given)

    def modelled_throughput(self, in_flight: int, tokens: int | None = None) -> float | None:
        """Answers per second the batching model gives with ``in_flight`` requests always
        outstanding (a client that sends the next one as soon as one is answered), on a machine
        fast enough to keep up; ``None`` when the model is off.

        Up to ``slots`` in flight, each request also waits about one step to join the batch
        (it arrives during a step), so only ``tokens / (tokens + 1)`` of them are decoding.
        Beyond ``slots``, the batch stays full and the rest queue.

        Parameters
        ----------
        in_flight
            Requests outstanding.
        tokens
            Tokens per answer; ``answer_tokens`` by default.

        Examples
        --------
        >>> gpu = SimulatorConfig(**PRESETS["gpu"])
        >>> round(gpu.modelled_throughput(32)), round(gpu.modelled_throughput(1024))
        (289, 1046)
        """
        if self.step_base is None or in_flight <= 0:
            return None
        tokens = max(1, tokens or self.answer_tokens)
        slots = self.slots or in_flight
        active = in_flight * tokens / (tokens + 1) if in_flight <= slots else slots
        queued = in_flight - active
        step = self.step_base + self.step_per_sequence * active + self.step_per_queued * queued
        return active / (tokens * step)


PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "gpu": MappingProxyType(
            {"slots": 512, "step_base": 0.005, "step_per_sequence": 50e-6, "answer_tokens": 16}
        ),
        "llama.cpp": MappingProxyType(
            {"slots": 8, "step_base": 0.020, "step_per_sequence": 0.002, "answer_tokens": 16}
        ),
        "gpu-past-knee": MappingProxyType(
            {
                "slots": 512,
                "step_base": 0.005,
                "step_per_sequence": 50e-6,
                "step_per_queued": 12.5e-6,
                "answer_tokens": 16,
            }
        ),
    }
)
"""Servers with a knee, as :class:`SimulatorConfig` fields: ``LocalEndpoint(**PRESETS["gpu"])``.

``"gpu"``
    A GPU server with continuous batching (vLLM, TGI): 512 slots, steps of 5 ms + 50 µs per
    active request, 16-token answers. Throughput rises with the requests in flight, to about
    1,000 answers a second near 512 (a step of about 31 ms, an answer in about 0.5 s), and stays
    there beyond: more in flight only queue.
``"llama.cpp"``
    ``llama-server --parallel 8``: 8 slots, steps of 20 ms + 2 ms per active request, 16-token
    answers; about 14 answers a second from 8 in flight on, where more only add queueing delay.
``"gpu-past-knee"``
    The ``"gpu"`` server whose every step also costs 12.5 µs per queued request, so throughput
    peaks near 512 in flight and falls past it (0.83 of the peak at 1,024), as a real server's
    did (133 answers a second at 512 in flight, 110 at 1,024).

:meth:`SimulatorConfig.modelled_throughput` gives each one's curve.
"""


class _Bucket:
    """A token bucket refilled continuously at ``limit`` per minute."""

    def __init__(self, limit: int, window: float):
        self.limit = limit
        self.capacity = max(1.0, limit * window / 60)
        self.level = self.capacity
        self.stamp = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.limit / 60)
        self.stamp = now

    def take(self, amount: float) -> float:
        """Take ``amount`` if available and return 0, else return seconds until it is."""
        self._refill()
        if amount <= self.level:
            self.level -= amount
            return 0.0
        return (amount - self.level) * 60 / self.limit

    def headers(self, kind: str) -> dict[str, str]:
        self._refill()
        reset = (self.capacity - self.level) * 60 / self.limit
        return {
            f"x-ratelimit-limit-{kind}": str(self.limit),
            f"x-ratelimit-remaining-{kind}": str(int(self.level)),
            f"x-ratelimit-reset-{kind}": f"{reset:.3f}s",
        }


class PrefixCache:
    """A modelled automatic prefix cache: an LRU of prompt blocks, each known by the hash of
    the whole prompt up to its end (so a block only matches after the same prefix).

    Only full blocks are cached, as on vLLM. A request's blocks enter last to first, so its
    leading blocks are the most recently used and the tail goes first when space runs out.
    """

    def __init__(self, capacity_tokens: int = 0):
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.resize(capacity_tokens)

    def resize(self, capacity_tokens: int) -> None:
        """Hold at most ``capacity_tokens`` (in whole blocks); 0 empties and turns it off."""
        self.capacity = max(0, capacity_tokens) // PREFIX_BLOCK_TOKENS
        self._evict()

    def clear(self) -> None:
        self._blocks.clear()

    @staticmethod
    def blocks(messages: list[dict[str, Any]], model: str) -> list[bytes]:
        """The chained hashes of the prompt's full blocks (the model's own cache: a prefix
        another model read does not count)."""
        text = "".join(f"{m.get('role', '')}\n{_content(m)}\n" for m in messages)
        digest = hashlib.sha256(model.encode()).digest()
        hashes = []
        for start in range(0, len(text) - PREFIX_BLOCK_CHARS + 1, PREFIX_BLOCK_CHARS):
            block = text[start : start + PREFIX_BLOCK_CHARS].encode()
            digest = hashlib.sha256(digest + block).digest()
            hashes.append(digest)
        return hashes

    def cached_tokens(self, hashes: list[bytes]) -> int:
        """Tokens of the leading blocks already cached (the cache is not changed)."""
        found = 0
        for digest in hashes:
            if digest not in self._blocks:
                break
            found += 1
        return found * PREFIX_BLOCK_TOKENS

    def insert(self, hashes: list[bytes]) -> None:
        """Add or refresh a request's blocks, evicting the least recently used beyond capacity."""
        if not self.capacity:
            return
        for digest in reversed(hashes):
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        self._evict()

    def _evict(self) -> None:
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


def _draws(seed: int, digest: str, model: str, schema: Any = None) -> random.Random:
    """The judge's randomness for one request: the same request (messages, model, schema)
    always draws the same, distinct ones independently."""
    key = json.dumps([seed, digest, model, schema], sort_keys=True)
    return random.Random(hashlib.sha256(key.encode()).digest())


def _aggregation(facts: list[str], draws: random.Random, judge_error: float) -> list[str]:
    """The facts an aggregation names: all, or all but one with probability ``judge_error``."""
    if facts and draws.random() < judge_error:
        facts = facts[:]
        facts.pop(draws.randrange(len(facts)))
    return facts


def reply_for(
    messages: list[dict[str, Any]],
    *,
    model: str,
    max_tokens: int | None = None,
    judge_error: float = 0.0,
    seed: int = 0,
) -> tuple[str, str, int]:
    """The simulator's answer: ``(text, finish_reason, completion_tokens)``.

    The text names the model, carries a digest of all the messages and echoes the first
    words of the last user message; one word is one token. A message given as content parts
    is read as its text parts joined by newlines, then `` [tag]`` (:func:`media_tag`) for each
    image or file part, in order; the answer echoes the first words of that text and then
    every tag, even those the cut to :data:`REPLY_WORDS` words would drop, so it always names
    the media it was asked about.

    A last user message with latent facts is aggregated instead: the answer names its
    :func:`distinct_facts`, all of them (not cut to :data:`REPLY_WORDS`), leaving one out
    with probability ``judge_error`` (drawn from ``seed`` and the request).

    Raises
    ------
    ValueError
        For content parts the simulator refuses (an unknown type, an invalid image or PDF).

    Examples
    --------
    >>> message = {"role": "user", "content": "Sum up: [score=0.9] ok, [entity=2]"}
    >>> reply_for([message], model="sim")
    ('sim #0662b1f1: [score=0.9] [entity=2]', 'stop', 4)
    """
    return _reply_for(
        _normalise(messages), model=model, max_tokens=max_tokens, judge_error=judge_error, seed=seed
    )


def _reply_for(
    prompt: _Prompt,
    *,
    model: str,
    max_tokens: int | None,
    judge_error: float = 0.0,
    seed: int = 0,
) -> tuple[str, str, int]:
    text = _user_text(prompt.messages)
    digest = _digest(prompt.messages)
    facts = distinct_facts(text)
    if facts:
        echoed = _aggregation(facts, _draws(seed, digest, model), judge_error)
    else:
        said = text.split()
        # the tags end the text: those the cut drops come after it, so none goes unanswered
        echoed = said[:REPLY_WORDS] + said[max(REPLY_WORDS, len(said) - prompt.echoed_tags) :]
    words = [f"{model}", f"#{digest[:8]}:", *echoed]
    if max_tokens is not None and len(words) > max_tokens:
        return " ".join(words[:max_tokens]), "length", max_tokens
    return " ".join(words), "stop", len(words)


def structured_reply(
    messages: list[dict[str, Any]],
    schema: dict[str, Any],
    *,
    broken: str | None = None,
    unsure: bool = False,
    model: str = "",
    judge_error: float = 0.0,
    position_bias: float = 0.0,
    seed: int = 0,
) -> str:
    """The simulator's JSON answer for a ``json_schema`` response format.

    Strings are the first three words of the last user message, numbers and choices come from
    a digest of the messages, arrays hold two items; a number field named ``confidence`` is
    0.9, or 0.2 when ``unsure``. ``broken="json"`` answers prose instead of JSON,
    ``broken="schema"`` an empty object, ``broken="enum"`` a choice no ``enum`` lists.

    When the last user message holds latent facts (:func:`facts_in`), the judge answers: a
    property ``answer`` (boolean), ``better`` (an enum of two labels), ``ranking`` (an array
    of integers) or ``choice`` (an enum) is judged from the facts, and string fields hold the
    message's :func:`distinct_facts`. ``judge_error`` and ``position_bias`` are the
    probabilities of a wrong judgment and of a comparison answering its first label, drawn
    from ``seed``, the messages, ``model`` and ``schema``.

    Examples
    --------
    >>> better = {"type": "object", "properties": {"better": {"enum": ["A", "B"]}}}
    >>> pair = [{"role": "user", "content": "A: [score=0.2] B: [score=0.7]"}]
    >>> structured_reply(pair, better)
    '{"better": "B"}'
    """
    return _structured_reply(
        messages,
        schema,
        broken=broken,
        unsure=unsure,
        model=model,
        judge_error=judge_error,
        position_bias=position_bias,
        seed=seed,
    )[0]


def _structured_reply(
    messages: list[dict[str, Any]],
    schema: dict[str, Any],
    *,
    broken: str | None = None,
    unsure: bool = False,
    model: str = "",
    judge_error: float = 0.0,
    position_bias: float = 0.0,
    seed: int = 0,
) -> tuple[str, str | None]:
    """The JSON answer and the kind of judgment it is (``None``: not judged)."""
    if broken == "json":
        return "Sure! Here is the JSON you asked for.", None
    if broken == "schema":
        return "{}", None
    said = _user_text(messages)
    digest = _digest(messages)
    number = int(digest[:8], 16)
    facts = distinct_facts(said) if broken is None else []
    asked = _judgment_asked(schema)
    draws = _draws(seed, digest, model, schema)
    kind: str | None = None
    judged: tuple[Any] | None = None
    text = " ".join(said.split()[:3]) or "text"
    if facts and asked is None:  # any other schema: its strings aggregate the facts
        kind, text = "aggregation", " ".join(_aggregation(facts, draws, judge_error))
    elif facts and asked is not None:
        judged = _judge(*asked, facts_in(said), draws, judge_error, position_bias)
        if judged is not None:  # else the facts it needs are missing: answered as before
            kind, text = asked[0], " ".join(facts)
    answer = _instance(schema, schema, text, number, broken == "enum")
    if asked is not None and judged is not None and isinstance(answer, dict):
        answer[_JUDGED_PROPERTY[asked[0]]] = judged[0]
    if (
        isinstance(answer, dict)
        and schema.get("properties", {}).get("confidence", {}).get("type") == "number"
    ):
        answer["confidence"] = 0.2 if unsure else 0.9
    return json.dumps(answer), kind


def _resolved(node: Any, root: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its ``$ref`` followed and a nullable ``anyOf`` unwrapped."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = root
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    if not isinstance(node, dict):
        return {}
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        usable = [o for o in options if o.get("type") != "null"] or options
        return _resolved(usable[0], root)
    return node


_JUDGED_PROPERTY = {
    "verdict": "answer",
    "comparison": "better",
    "ranking": "ranking",
    "choice": "choice",
}
"""The property of a ``json_schema`` whose presence asks the judge for each judgment."""


def _judgment_asked(schema: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The judgment a schema asks for, with its property's node; ``None``: no judgment."""
    root = _resolved(schema, schema)
    properties = root.get("properties") or {}
    for kind, name in _JUDGED_PROPERTY.items():
        node = _resolved(properties.get(name), schema)
        labels = node.get("enum")
        integers = _resolved(node.get("items"), schema).get("type") == "integer"
        if (
            (kind == "verdict" and node.get("type") == "boolean")
            or (kind == "comparison" and isinstance(labels, list) and len(labels) >= 2)
            or (kind == "choice" and isinstance(labels, list) and labels)
            or (kind == "ranking" and node.get("type") == "array" and integers)
        ):
            return kind, node
    return None


def _judge(
    kind: str,
    node: dict[str, Any],
    facts: dict[str, list[Any]],
    draws: random.Random,
    judge_error: float,
    position_bias: float,
) -> tuple[Any] | None:
    """The judged property's value (in a 1-tuple), from the facts; ``None`` when the
    facts this judgment needs are missing."""
    scores, entities = facts["score"], facts["entity"]
    if kind == "verdict" and (len(entities) >= 2 or scores):
        verdict = entities[0] == entities[1] if len(entities) >= 2 else scores[0] >= 0.5
        return (verdict != (draws.random() < judge_error),)
    if kind == "comparison" and len(scores) >= 2:
        first, second = node["enum"][0], node["enum"][1]
        if draws.random() < position_bias:
            return (first,)
        right, wrong = (first, second) if scores[0] >= scores[1] else (second, first)
        return (wrong if draws.random() < judge_error else right,)
    if kind == "ranking" and scores:
        order = sorted(range(1, len(scores) + 1), key=lambda item: -scores[item - 1])
        for i in range(len(order) - 1):  # one pass of noisy adjacent swaps
            if draws.random() < judge_error:
                order[i], order[i + 1] = order[i + 1], order[i]
        return (order,)
    if kind == "choice" and len(entities) >= 2:
        labels = node["enum"]
        options = [label for label in labels if label != "none"]
        query, candidates = entities[0], entities[1 : 1 + len(options)]
        matching = [label for label, e in zip(options, candidates, strict=False) if e == query]
        right = matching[0] if matching else ("none" if "none" in labels else labels[0])
        others = [label for label in labels if label != right]
        if others and draws.random() < judge_error:
            right = others[draws.randrange(len(others))]
        return (right,)
    return None


def _instance(
    node: dict[str, Any], root: dict[str, Any], text: str, number: int, off_enum: bool = False
) -> Any:
    while "$ref" in node:
        target: Any = root
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        usable = [o for o in options if o.get("type") != "null"] or options
        return _instance(usable[0], root, text, number, off_enum)
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if "enum" in node:
        return "none of these" if off_enum else node["enum"][number % len(node["enum"])]
    if kind == "object":
        return {
            name: _instance(sub, root, text, number, off_enum)
            for name, sub in (node.get("properties") or {}).items()
        }
    if kind == "array":
        return [
            _instance(node.get("items", {}), root, text, number + i, off_enum) for i in range(2)
        ]
    if kind == "integer":
        return number % 100
    if kind == "number":
        return (number % 1000) / 10
    if kind == "boolean":
        return number % 2 == 0
    if kind == "null":
        return None
    return text


def expected_reply(
    prompt: str,
    *,
    model: str,
    system: str | None = None,
    max_tokens: int | None = None,
    media: Sequence[bytes | str] = (),
) -> str:
    """The text the simulator answers to ``prompt`` (and ``system``), for assertions.

    Parameters
    ----------
    prompt
        The user message's text (its text parts joined by newlines, when sent as parts).
    model, system, max_tokens
        As sent.
    media
        The message's image and file parts, in order: each one's bytes (an image's or a
        PDF's), or the URL of a remote image. Their ``detail``, file names and MIME types do
        not change the answer.

    Examples
    --------
    >>> expected_reply("Summarize: nice dress", model="sim")
    'sim #c61cbfec: Summarize: nice dress'
    >>> expected_reply("Describe:", model="sim", media=[b"%PDF-1.4"])
    'sim #8de4e0f0: Describe: [media:e16fa5d9b519]'
    """
    content = prompt + "".join(f" [{media_tag(item)}]" for item in media)
    messages = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    reply = _reply_for(
        _Prompt(messages, echoed_tags=len(media)), model=model, max_tokens=max_tokens
    )
    return reply[0]


def _estimate_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content", ""))) for m in messages) // 4 + 4 * len(messages)


def _error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    return web.json_response(_error_body(message, kind, code), status=status)


def _too_large(limit: int) -> web.Response:
    return _error(
        413,
        f"Request body too large: the limit is {limit} bytes (SimulatorConfig.max_request_bytes).",
        "invalid_request_error",
        "request_too_large",
    )


class Simulator:
    """The request handlers and the counters they keep."""

    def __init__(self, config: SimulatorConfig):
        self.prefix_cache = PrefixCache()
        self._app_max_size = config.max_request_bytes  # the limit app() gave aiohttp
        self.decoder = DecodeBatch(lambda: self.config)
        self._hold_changed = asyncio.Event()
        self.held = 0  # chat requests waiting for the hold to lift (a reset keeps them)
        self.anthropic = AnthropicApi(self)  # Anthropic's Messages API, over the same replies
        self.gemini = GeminiApi(self)  # Gemini's generateContent, over the same replies
        self.configure(config)
        self.reset()

    def configure(self, config: SimulatorConfig) -> None:
        self.config = config
        self._random = random.Random(config.seed)
        self._slots = asyncio.Semaphore(config.slots) if config.slots else None
        self._requests_bucket = _Bucket(config.rpm, config.rate_window) if config.rpm else None
        self._tokens_bucket = _Bucket(config.tpm, config.rate_window) if config.tpm else None
        self.prefix_cache.resize(config.prefix_cache_tokens)
        self._recheck_holds()

    def _recheck_holds(self) -> None:
        """Wake every held request to look at ``hold`` again."""
        self._hold_changed.set()
        self._hold_changed = asyncio.Event()

    async def _wait_while_held(self) -> None:
        self.held += 1
        try:
            while self.config.hold is not None and self.let_through >= self.config.hold:
                await self._hold_changed.wait()
        finally:
            self.held -= 1
        self.let_through += 1

    def reset(self) -> None:
        """Zero the counters and empty the prefix cache."""
        self.batch_api = BatchesApi(self._answer_line, lambda: self.config)
        self.anthropic.reset()
        self.anthropic_batch_api = AnthropicBatchesApi(
            self._answer_line, lambda: self.config, self.anthropic
        )
        self.gemini_batch_api = GeminiBatchesApi(
            self._answer_line, lambda: self.config, self.gemini
        )
        self.requests = 0
        self.by_status: Counter[int] = Counter()
        self.by_model: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.prompts: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()
        self.answered_total = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._gathered = asyncio.Event()
        self.let_through = 0  # chat requests past the hold
        self._recheck_holds()
        self.header_names: set[str] = set()
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.prefix_cache.clear()
        self.embedding_requests = 0
        self.embedding_inputs = 0
        self.media_parts = 0
        self.judged: Counter[str] = Counter({kind: 0 for kind in JUDGMENTS})
        self.cancelled = 0
        # the TCP connections requests came on (by the client's address and port): a client
        # with one keep-alive pool opens no more than it has requests in flight at once
        self.peers: set[Any] = set()
        self.answer_seconds = Durations()
        self.decoder.reset()

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "by_model": dict(self.by_model),
            "faults": dict(self.faults),
            "distinct_prompts": len(self.prompts),
            "max_prompt_repeats": max(self.prompts.values(), default=0),
            "answered": self.answered_total,
            "distinct_answered": len(self.answered),
            "max_in_flight": self.max_in_flight,
            "held": self.held,
            "cancelled": self.cancelled,
            "connections": len(self.peers),
            "answer_seconds": self.answer_seconds.summary(),
            **self.decoder.stats(),
            "header_names": sorted(self.header_names),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "embedding_requests": self.embedding_requests,
            "embedding_inputs": self.embedding_inputs,
            "media_parts": self.media_parts,
            "judged": dict(self.judged),
            **_summed(
                self.batch_api.stats(),
                self.anthropic_batch_api.stats(),
                self.gemini_batch_api.stats(),
            ),
            **self.anthropic.stats(),
            "config": asdict(self.config),
        }

    def app(self) -> web.Application:
        # at least aiohttp's default, for the /_sim/ calls: _limit_body applies the config's
        self._app_max_size = max(self.config.max_request_bytes, 2**20)
        app = web.Application(
            client_max_size=self._app_max_size,
            middlewares=[self._count_connections, self._limit_body],
        )
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/messages", self.anthropic.messages)
        app.router.add_get("/props", self.props)
        app.router.add_get("/_sim/stats", self.get_stats)
        app.router.add_post("/_sim/reset", self.post_reset)
        app.router.add_post("/_sim/config", self.post_config)
        for method, path, name in BatchesApi.ROUTES:
            app.router.add_route(method, path, functools.partial(self._batches, name=name))
        for api, routes in (
            ("anthropic_batch_api", AnthropicBatchesApi.ROUTES),
            ("gemini_batch_api", GeminiBatchesApi.ROUTES),
        ):
            for method, path, name in routes:
                app.router.add_route(
                    method, path, functools.partial(self._dialect_batches, api=api, name=name)
                )
        for method, path, handler in self.gemini.routes():
            app.router.add_route(method, path, handler)
        app.on_cleanup.append(self._close)
        return app

    @web.middleware
    async def _count_connections(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Count the distinct TCP connections the API's requests came on (``connections``:
        those since the last reset); the simulator's own ``/_sim/`` calls are not counted."""
        if request.transport is not None and not request.path.startswith("/_sim/"):
            self.peers.add(request.transport.get_extra_info("peername"))
        return await handler(request)

    @web.middleware
    async def _limit_body(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Refuse a body over ``max_request_bytes`` with a JSON 413, as the config says now:
        the application's own limit is fixed when it is made, and :meth:`configure` may have
        changed it since. The simulator's own ``/_sim/`` calls are exempt, so that a small
        limit cannot lock out the ``configure`` that would lift it."""
        if request.path.startswith("/_sim/"):
            return await handler(request)
        limit = self.config.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            return _too_large(limit)
        if limit != self._app_max_size:
            request = request.clone(client_max_size=limit)
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:  # a chunked body: no length to check up front
            return _too_large(limit)

    async def _close(self, app: web.Application) -> None:
        self.decoder.close()

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def post_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response(self.stats())

    async def post_config(self, request: web.Request) -> web.Response:
        self.configure(SimulatorConfig.from_json(await request.json()))
        return web.json_response(asdict(self.config))

    async def embeddings(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return _error(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )
        try:
            body = json.loads(await request.read())
            inputs = body["input"]
            inputs = [inputs] if isinstance(inputs, str) else list(inputs)
            dimensions = int(body.get("dimensions") or 256)
            if self.config.ignore_dimensions:
                dimensions = 256
        except (ValueError, KeyError, TypeError):
            return _error(
                400, "body must be JSON with 'model' and 'input'", "invalid_request_error"
            )
        self.embedding_requests += 1
        self.embedding_inputs += len(inputs)
        if len(inputs) > self.config.max_embedding_inputs:
            return _error(
                400,
                f"at most {self.config.max_embedding_inputs} inputs per request",
                "invalid_request_error",
            )
        longest = max((len(str(text)) for text in inputs), default=0)
        limit = self.config.max_embedding_chars
        if limit is not None and longest > limit:
            return _error(
                500,
                f"input ({longest} tokens) is too large to process. increase the "
                "physical batch size",
                "server_error",
            )
        tokens = sum(len(str(text).split()) for text in inputs)
        return web.json_response(
            {
                "object": "list",
                "model": body.get("model"),
                "data": [
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": embed(str(t), dimensions, noise=self.config.embed_noise),
                    }
                    for i, t in enumerate(inputs)
                ],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def props(self, request: web.Request) -> web.Response:
        """llama.cpp's ``GET /props`` (the fields a client reads), when the config sets a
        context; a 404 otherwise, as on servers without it (OpenAI's)."""
        if not self._authorised(request):
            return _error(401, "Invalid API Key", "authentication_error")
        context = self.config.context_tokens
        if context is None:
            return _error(404, "File Not Found", "not_found_error")
        return web.json_response(
            {
                "default_generation_settings": {
                    "params": {"n_predict": -1, "max_tokens": -1},
                    "n_ctx": context,
                },
                "total_slots": self.config.slots or 1,
                "model_alias": self.config.models[0] if self.config.models else "sim",
                "model_path": "llm-ops-simulator",
                "modalities": {"vision": False, "video": False, "audio": False},
                "build_info": "llm-ops-simulator",
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        if "anthropic-version" in request.headers:  # the same path, in Anthropic's shape
            return await self.anthropic.models(request)
        if not self.config.models:
            return _error(404, "Not found", "invalid_request_error")
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "owned_by": "llm-ops"}
                    for name in self.config.models
                ],
            }
        )

    async def chat_completions(
        self, request: web.Request, wire: Wire | None = None
    ) -> web.StreamResponse:
        """A chat request, in OpenAI's dialect, or in another's ``wire`` translates."""
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            # the first is answered at once: a client may wait for it before sending more
            if self.config.gather and self.requests > 1:
                if self.max_in_flight >= self.config.gather:
                    self._gathered.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._gathered.wait(), GATHER_SECONDS)
            await self._wait_while_held()
            response = await self._answer(request, wire)
            if wire is not None:
                response = wire.written(response)
        except asyncio.CancelledError:  # the client gave up (a timeout, say) and hung up
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        self.by_status[response.status] += 1
        return response

    def _pack_reply(self, messages: list[dict[str, Any]], items: list[str], model: str) -> str:
        """Each item answered as its own single-row request would be."""
        system = [m for m in messages[:1] if m.get("role") == "system"]
        answers = [
            {
                "id": str(n),
                "answer": reply_for(
                    [*system, {"role": "user", "content": item}],
                    model=model,
                    judge_error=self.config.judge_error,
                    seed=self.config.seed,
                )[0],
            }
            for n, item in enumerate(items, 1)
        ]
        if self.config.pack_shuffle:
            self._random.shuffle(answers)
        if answers and self._random.random() < self.config.pack_drop_rate:
            self.faults["pack_item_dropped"] += 1
            answers.pop(self._random.randrange(len(answers)))
        return json.dumps({"answers": answers})

    def _rate_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if not self.config.rate_limit_headers:
            return headers
        if self._requests_bucket:
            headers.update(self._requests_bucket.headers("requests"))
        if self._tokens_bucket:
            headers.update(self._tokens_bucket.headers("tokens"))
        return headers

    def _admit(self, tokens: int) -> web.Response | None:
        """A 429 with ``Retry-After`` when a budget is spent, else ``None`` (budget taken)."""
        waits = []
        if self._requests_bucket:
            waits.append(self._requests_bucket.take(1))
        if self._tokens_bucket:
            waits.append(self._tokens_bucket.take(tokens))
        wait = max(waits, default=0.0)
        if wait <= 0:
            return None
        if self._requests_bucket and waits[0] == 0:  # give back what was taken
            self._requests_bucket.level += 1
        if self._tokens_bucket and waits[-1] == 0:
            self._tokens_bucket.level += tokens
        self.faults["rate_limited"] += 1
        response = _error(
            429, f"Rate limit reached; try again in {wait:.3f}s.", "requests", "rate_limit_exceeded"
        )
        response.headers.update(self._rate_headers())
        response.headers["retry-after"] = str(max(1, math.ceil(wait)))
        response.headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
        return response

    async def _fault(self, request: web.Request) -> web.StreamResponse | None:
        draw = self._random.random()
        if draw < self.config.hang_rate:
            self.faults["hang"] += 1
            await asyncio.sleep(3600)
        if draw >= self.config.hang_rate + self.config.fault_rate or not self.config.fault_kinds:
            return None
        kind = self._random.choice(self.config.fault_kinds)
        self.faults[kind] += 1
        if kind in ("500", "503", "529"):  # 529: Anthropic's overloaded
            return _error(int(kind), f"simulated fault {kind}", "server_error")
        if kind == "429":
            return _error(429, "simulated overload", "server_error")
        if kind == "truncated_json":
            return web.Response(
                body=b'{"id": "chatcmpl-sim", "choices": [{"ind',
                status=200,
                content_type="application/json",
            )
        if kind == "html":
            return web.Response(
                text="<html><body><h1>502 Bad Gateway</h1></body></html>",
                status=200,
                content_type="text/html",
            )
        # drop: promise a body, send part of it, close the connection
        response = web.StreamResponse(status=200, headers={"Content-Length": "4096"})
        response.content_type = "application/json"
        await response.prepare(request)
        await response.write(b'{"id": "chatcmpl-sim", ')
        if request.transport is not None:
            request.transport.close()
        return response

    async def _answer(self, request: web.Request, wire: Wire | None) -> web.StreamResponse:
        started = time.perf_counter()
        refused = self._refuse(request, wire)
        if refused is not None:
            if self.config.latency > 0:  # a slow server is as slow to refuse
                await asyncio.sleep(self.config.latency)
            return refused
        if wire is not None:
            body = wire.read(await request.read())
            if isinstance(body, web.Response):  # what that API refuses
                return body
        else:
            try:
                body = json.loads(await request.read())
            except ValueError:
                body = None
        reply = self._reply(body)
        if reply.status == 400 and reply.bad_body:
            return web.json_response(reply.body, status=400)
        admitted = self._admit(reply.prompt_tokens + reply.budget_tokens)
        if admitted is not None:
            return admitted
        fault = await self._fault(request)
        if fault is not None:
            return fault
        if self.config.step_base is not None:
            if reply.latency > 0:
                await asyncio.sleep(reply.latency)
            if reply.status == 200:
                await self.decoder.decode(reply.completion_tokens)
        elif self._slots is not None:
            async with self.decoder.holding(self._slots):
                await asyncio.sleep(reply.latency)
        elif reply.latency > 0:
            await asyncio.sleep(reply.latency)
        self._settle(reply)
        if reply.status == 200:
            self.answer_seconds.record(time.perf_counter() - started)
        if reply.chunked:
            return await _send_chunked(request, json.dumps(reply.body).encode())
        if reply.raw is not None:
            response = web.Response(body=reply.raw, status=reply.status, headers=reply.headers)
            response.content_type = "application/json"
        else:
            response = web.json_response(reply.body, status=reply.status, headers=reply.headers)
        if reply.status == 200:
            response.headers.update(self._rate_headers())
        return response

    def _authorised(self, request: web.Request) -> bool:
        key, header = self.config.api_key, self.config.api_key_header
        if key is None:
            return True
        expected = f"Bearer {key}" if header.lower() == "authorization" else key
        return request.headers.get(header) == expected

    def _refuse(self, request: web.Request, wire: Wire | None = None) -> web.Response | None:
        """401 without the configured key (or ``wire``'s refusal of it); 429
        ``insufficient_quota`` once it is spent."""
        self.header_names.update(request.headers.keys())
        refused = wire.refuse_key() if wire is not None else None
        if refused is not None:
            return refused
        if wire is None and not self._authorised(request):
            return _error(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )
        quota = self.config.quota_requests
        if self.config.insufficient_quota or (quota is not None and self.answered_total >= quota):
            return _error(
                429, "You exceeded your current quota.", "insufficient_quota", "insufficient_quota"
            )
        return None

    def _reply(self, body: Any) -> _Reply:
        """What a chat completion request is answered, before rate limits, faults and latency
        (shared by live requests and the lines of a batch)."""
        try:
            model = body["model"]
            self.media_parts += _count_media(body["messages"])
            prompt = _normalise(body["messages"], max_image_bytes=self.config.max_image_bytes)
            messages = prompt.messages  # from here on, media are their tags
            text = _user_text(messages)
        except _Refused as refused:
            return _Reply(400, refused.body(), bad_body=True)
        except (KeyError, TypeError, AttributeError):
            return _Reply(
                400,
                _error_body(
                    "body must be JSON with 'model' and 'messages'", "invalid_request_error"
                ),
                bad_body=True,
            )
        reasoning = model in self.config.reasoning_models
        if reasoning and "max_tokens" in body:
            return _Reply(
                400,
                {
                    "error": {
                        "message": MAX_TOKENS_REFUSED,
                        "type": "invalid_request_error",
                        "param": "max_tokens",
                        "code": "unsupported_parameter",
                    }
                },
                bad_body=True,
            )
        self.by_model[model] += 1
        digest = _digest(messages)
        self.prompts[digest] += 1
        directives = dict(_DIRECTIVE.findall(text))
        unsure = model in directives.get("unsure_for", "").split(",")
        reply, finish_reason, completion_tokens = _reply_for(
            prompt,
            model=model,
            max_tokens=body.get("max_completion_tokens" if reasoning else "max_tokens"),
            judge_error=self.config.judge_error,
            seed=self.config.seed,
        )
        judged = ["aggregation"] if _FACT.search(text) else []
        if unsure:
            reply, completion_tokens = f"unsure: {reply}", completion_tokens + 1
        response_format = body.get("response_format") or {}
        packed = parse_pack_request(text)
        if packed is not None:
            reply = self._pack_reply(messages, packed, model)
            completion_tokens = len(reply.split())
            judged = ["aggregation" for item in packed if _FACT.search(item)]
        elif response_format.get("type") == "json_schema":
            reply, kind = _structured_reply(
                messages,
                response_format["json_schema"]["schema"],
                broken=directives.get("invalid"),
                unsure=unsure,
                model=model,
                judge_error=self.config.judge_error,
                position_bias=self.config.position_bias,
                seed=self.config.seed,
            )
            completion_tokens = len(reply.split())
            judged = [kind] if kind is not None else []
        if self.config.step_base is not None:
            completion_tokens = self._answer_tokens(body, directives)
        reasoning_tokens = REASONING_TOKENS_PER_TOKEN * completion_tokens if reasoning else 0
        completion_tokens += reasoning_tokens  # billed as output, as OpenAI counts them
        prompt_tokens = _estimate_tokens(messages) + sum(m.tokens(model) for m in prompt.media)
        over = self._over_context(prompt_tokens, body)
        if over is not None:
            return over
        blocks = PrefixCache.blocks(messages, model) if self.prefix_cache.capacity else []
        cached_tokens = min(prompt_tokens, self.prefix_cache.cached_tokens(blocks))
        latency = float(directives.get("latency", self.config.latency))
        latency += self.config.latency_per_token * completion_tokens
        latency += (
            self.config.prefill_seconds_per_1k_tokens * (prompt_tokens - cached_tokens) / 1000
        )
        answer = _Reply(
            200,
            {},
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            blocks=blocks,
            budget_tokens=body.get("max_tokens") or completion_tokens,
            latency=latency,
            judged=judged,
        )
        if "status" in directives:
            status = int(directives["status"])
            return answer.failing(status, f"simulated error {status}", "invalid_request_error")
        if model in directives.get("fail_for", "").split(","):
            return answer.failing(
                400, f"simulated: {model} cannot answer this prompt", "invalid_request_error"
            )
        times = directives.get("fail_times")
        early = times is None or self.prompts[digest] <= int(times)
        if "redirect" in directives:
            answer.failing(int(directives["redirect"]), "moved", "redirect")
            answer.headers["Location"] = directives.get(
                "location", "https://elsewhere.example:8443/v1/chat/completions?token=sk-secret"
            )
            return answer
        if "retry_after" in directives and early:
            status = int(directives.get("fail_status", 429))
            answer.failing(status, "simulated: come back later", "rate_limit_exceeded")
            answer.headers["Retry-After"] = directives["retry_after"]
            return answer
        odd_answer = "finish_reason" in directives or "error_in_200" in directives
        if times is not None and early and not odd_answer:
            status = int(directives.get("fail_status", 500))
            return answer.failing(status, f"simulated transient error {status}", "server_error")
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": reply},
            "finish_reason": finish_reason,
        }
        if reasoning:
            choice["message"]["reasoning_content"] = _reasoning_for(messages, model)
        if early and "finish_reason" in directives:
            choice["finish_reason"] = directives["finish_reason"]
            if directives["finish_reason"] == "none":
                del choice["finish_reason"]
            elif directives["finish_reason"] == "content_filter":
                choice["message"]["content"] = reply.split(" ", 1)[0]
        answer.body = {
            "id": f"chatcmpl-sim-{self.requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached_tokens},
            },
        }
        if reasoning:
            answer.body["usage"]["completion_tokens_details"] = {
                "reasoning_tokens": reasoning_tokens
            }
        if early and "error_in_200" in directives:
            answer.body["error"] = {
                "message": "simulated: the generation failed midway",
                "type": "server_error",
            }
        for name in ("prompt_tokens", "completion_tokens"):
            if name in directives:
                answer.body["usage"][name] = json.loads(directives[name])
        if "body_bytes" in directives:
            choice["message"]["content"] += "x" * int(directives["body_bytes"])
            answer.chunked = "chunked" in directives
        if "gzip_bomb" in directives:
            answer.raw = _gzip_bomb(int(directives["gzip_bomb"]))
            answer.headers["Content-Encoding"] = "gzip"
        answer.digest, answer.completion_tokens = digest, completion_tokens
        return answer

    def _over_context(self, prompt_tokens: int, body: dict[str, Any]) -> _Reply | None:
        """llama.cpp's 400 for a request its context cannot hold: here its prompt and its
        ``max_tokens`` (16 when unset) over ``context_tokens``."""
        context = self.config.context_tokens
        cap = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        wanted = prompt_tokens + (cap if isinstance(cap, int) and cap > 0 else 16)
        if context is None or wanted <= context:
            return None
        message = (
            f"request ({wanted} tokens) exceeds the available context size "
            f"({context} tokens), try increasing it"
        )
        error = {
            "code": 400,
            "message": message,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt_tokens,
            "n_ctx": context,
        }
        return _Reply(400, {"error": error}, bad_body=True)

    def _answer_tokens(self, body: dict[str, Any], directives: dict[str, str]) -> int:
        """The tokens of an answer under the batching model: the decode steps it needs."""
        cap = body.get("max_tokens") or body.get("max_completion_tokens")
        cap = cap if isinstance(cap, int) and cap > 0 else None
        if "answer_tokens" in directives:
            wanted = max(1, int(directives["answer_tokens"]))
            return min(wanted, cap) if cap else wanted
        return cap or max(1, self.config.answer_tokens)

    async def _batches(self, request: web.Request, *, name: str) -> web.StreamResponse:
        """The Files and Batches API (see :mod:`llm_ops.testing._batches`), behind the key."""
        refused = self._refuse(request)
        if refused is not None:
            if self.config.latency > 0:  # a slow server is as slow to refuse
                await asyncio.sleep(self.config.latency)
            return refused
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]] = getattr(
            self.batch_api, name
        )
        return await handler(request)

    async def _dialect_batches(
        self, request: web.Request, *, api: str, name: str
    ) -> web.StreamResponse:
        """Anthropic's Message Batches API or Gemini's batch mode (see
        :mod:`llm_ops.testing._batches_anthropic`, :mod:`llm_ops.testing._batches_gemini`),
        behind the key as that provider checks it."""
        self.header_names.update(request.headers.keys())
        batches: AnthropicBatchesApi | GeminiBatchesApi = getattr(self, api)
        refused = batches.refused(request)
        if refused is not None:
            return refused
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]] = getattr(batches, name)
        return await handler(request)

    def _answer_line(self, body: Any) -> tuple[int, dict[str, Any]]:
        reply = self._reply(body)
        self._settle(reply)
        return reply.status, reply.body

    def _settle(self, reply: _Reply) -> None:
        """Count an answer that was given."""
        if reply.status != 200:
            return
        self.answered[reply.digest] += 1
        self.answered_total += 1
        self.prompt_tokens += reply.prompt_tokens
        self.cached_tokens += reply.cached_tokens
        self.completion_tokens += reply.completion_tokens
        self.judged.update(reply.judged)
        self.prefix_cache.insert(reply.blocks)


@dataclass
class _Reply:
    """A chat completion answer: its HTTP status and body, and what it costs."""

    status: int
    body: dict[str, Any]
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, served by the prefix cache
    blocks: list[bytes] = field(default_factory=list)  # the prompt's prefix-cache blocks
    completion_tokens: int = 0
    budget_tokens: int = 0  # what the rate limit charges: prompt + max_tokens (or the answer)
    latency: float = 0.0
    digest: str = ""
    bad_body: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # a body to send as it is, instead of ``body`` as JSON
    chunked: bool = False  # send ``body`` without a Content-Length
    judged: list[str] = field(default_factory=list)  # the judgments it makes (JUDGMENTS)

    def failing(self, status: int, message: str, kind: str) -> _Reply:
        self.status, self.body = status, _error_body(message, kind)
        return self


@functools.cache
def _gzip_bomb(size: int) -> bytes:
    """Gzip members of 1 MiB of zeros each (about 1 KB apiece), inflating to ``size`` bytes:
    a bomb made in microseconds, where compressing gigabytes would take seconds."""
    member = gzip.compress(bytes(min(size, 2**20)), compresslevel=9)
    return member * max(1, size // 2**20)


async def _send_chunked(request: web.Request, body: bytes) -> web.StreamResponse:
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    response.enable_chunked_encoding()
    await response.prepare(request)
    for start in range(0, len(body), 2**16):
        await response.write(body[start : start + 2**16])
    await response.write_eof()
    return response


async def serve(config: SimulatorConfig, *, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve until cancelled; prints ``listening on <base_url>`` once the socket is bound."""
    runner = web.AppRunner(Simulator(config).app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    server = cast(asyncio.Server, site._server)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://{host}:{bound}{BASE_PATHS[config.dialect]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _summed(*counts: dict[str, Any]) -> dict[str, Any]:
    """The batch APIs' counters, added up: ``batches`` counts every dialect's."""
    total: dict[str, Any] = {}
    for each in counts:
        for name, value in each.items():
            total[name] = total.get(name, 0) + value
    return total
