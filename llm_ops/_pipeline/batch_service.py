"""A provider's batch API as the batch runner calls it: submit a part's lines, find a part's
batch again, poll it, read its results back, cancel it, in neutral terms.

:class:`~llm_ops._pipeline.batch.BatchRunner` keeps the bookkeeping every provider shares (the
parts recorded in the cache before and after each call, resuming, rounds, duplicate and stray
answers, the budget); a :class:`BatchService` is what differs: OpenAI's Files and Batches API
(:mod:`llm_ops._pipeline.batch_openai`), Anthropic's Message Batches
(:mod:`llm_ops._pipeline.batch_anthropic`), Gemini's ``batchGenerateContent``
(:mod:`llm_ops._pipeline.batch_gemini`). The runner picks one by the endpoint dialect's name.

Why here, in ``_pipeline``, and not a member of the :class:`~llm_ops._dialects.Dialect`: a
dialect is layer 0, imports no other part of llm-ops and holds no HTTP client; it spells
bodies and reads answers. A batch service makes HTTP calls (through the engine's connection,
its TLS, proxy and headers, on the engine's loop) and writes local files, so it lives where
the engine is at hand. What it sends and reads per request is still the dialect's: a line's
body is ``dialect.completion_body(canonical)``, an answer is read by
``dialect.read_completion`` and an error by ``dialect.read_error``.

The lines a part holds are kept where a rerun (or ``llm-ops batches collect``, in another
process) can read them back: OpenAI keeps the uploaded input file; Anthropic and Gemini keep no
input to read back, so the part's canonical requests go to a local JSONL file beside the
cache (:class:`LocalInputs`), written and synced before the batch is created, its path
recorded as the part's input file.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import AsyncGenerator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from yarl import URL

from .._config import BatchMode
from .._dialects import BatchResult, Dialect
from .._engine.boundary import TransportError, one_line, redact
from .._engine.engine import Engine
from .._wire import HttpAnswer
from ..exceptions import ConfigError, JobAbortedError, LlmOpsError

Line = dict[str, Any]  # one line of a part's input, as its service keeps it


@dataclass
class BatchView:
    """A provider batch as last asked, in our states: ``validating``, ``in_progress``,
    ``finalizing``, ``cancelling``, then one of ``completed``, ``expired``, ``cancelled``,
    ``failed``. ``completed`` and ``failed`` count the lines answered so far; the two file ids
    say where the results are, as the service reads them back (a file id, a URL, or none when
    the batch itself holds them); ``failure`` is, for a ``failed`` batch, the status its rows
    get and the provider's reason."""

    state: str
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    failure: tuple[Literal["failed", "rejected"], str] | None = None


@dataclass
class BatchPart:
    """One provider batch of a submission: its lines (as its service keeps them), as recorded
    in the cache (``llm_batches``); ``completed`` and ``failed`` are the provider's counts when
    it was last asked."""

    job_id: str
    part: int
    endpoint: str  # the endpoint's identity, for the keys of what it answers
    model: str
    requests: int
    state: str = "preparing"
    input_file_id: str | None = None
    batch_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int = 0
    failed: int = 0

    @property
    def label(self) -> str:
        return f"{self.job_id}/{self.part}"

    @property
    def name(self) -> str:
        """The part's name at the provider (a file's name, a batch's display name)."""
        return f"{self.job_id}-{self.part}"


class AnswerMayBeLost(LlmOpsError):
    """A create whose answer did not come (a timeout, a dropped connection, a 5xx): the
    provider may have made the batch all the same, so it is looked up before another create."""


class BatchService(Protocol):
    """One provider's batch API, as :class:`~llm_ops._pipeline.batch.BatchRunner` calls it.
    Every coroutine runs on the engine's loop (the runner awaits it through
    :meth:`~llm_ops._engine.engine.Engine.hosted`)."""

    requests_per_batch: int
    """The most requests the provider takes in one batch."""
    bytes_per_batch: int
    """The most bytes of lines the provider takes in one batch."""
    what: str
    """The API's name, as error messages name it (``"the Batch API"``)."""

    def line(self, key: str, canonical: Mapping[str, Any]) -> Line:
        """The line a part keeps for the request keyed ``key``, asking what ``canonical`` (the
        canonical request, less its endpoint) asks."""
        ...

    def read_line(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """A kept line read back: its key and its canonical request (less its endpoint)."""
        ...

    def sent_bytes(self, line: Mapping[str, Any], kept: bytes) -> int:
        """The bytes ``line`` (kept as ``kept``) adds to what its batch sends the provider,
        which its limit bounds."""
        ...

    async def upload(self, part: BatchPart, content: bytes) -> str:
        """Keep the part's lines (``content``, JSONL) where they can be read back; their id."""
        ...

    async def create(self, part: BatchPart) -> str:
        """Create the part's batch from its kept lines; its id. :class:`AnswerMayBeLost`
        when the provider may have made it without saying so."""
        ...

    async def find(self, part: BatchPart, taken: frozenset[str]) -> str | None:
        """The provider's batch made for ``part``, if it can be told (by its metadata, its
        name, or its size and time, none of ``taken``: the batches other parts recorded),
        else ``None``."""
        ...

    async def poll(self, batch_id: str) -> BatchView:
        """How the batch does, in our states."""
        ...

    def results(self, part: BatchPart) -> AsyncGenerator[list[BatchResult], None]:
        """The results of an ended batch, a page at a time, in any order; a line that names
        no request of ours is a result without a key."""
        ...

    def input_lines(self, input_file_id: str) -> AsyncGenerator[list[str], None]:
        """The part's kept lines, a page at a time, in their order."""
        ...

    async def cancel(self, batch_id: str) -> BatchView:
        """Ask the provider to cancel the batch; how it does then."""
        ...

    async def discard(self, part: BatchPart) -> None:
        """Let go of what a collected part kept for reading back (its local input file)."""
        ...

    def errors(self) -> Any:
        """A context manager turning the API's errors into one :class:`JobAbortedError`."""
        ...


def part_limits(settings: BatchMode, service: BatchService) -> tuple[int, int]:
    """The requests and the bytes one part (one batch) holds at most: ``BatchMode``'s, or
    the provider's own limits (the service's) where it sets none.

    Raises
    ------
    ConfigError
        For a setting above the provider's limit, naming that limit: a batch so large would
        be refused by the provider, or would have been cut smaller without a word.
    """
    limits = []
    for name, asked, most in (
        ("requests_per_batch", settings.requests_per_batch, service.requests_per_batch),
        ("bytes_per_batch", settings.bytes_per_batch, service.bytes_per_batch),
    ):
        if asked is not None and asked > most:
            raise ConfigError(
                f"BatchMode({name}={asked!r}) is above {service.what}'s limit of {most:,} a "
                f"batch: give at most {most}, or leave it unset for the provider's limit"
            )
        limits.append(most if asked is None else asked)
    return limits[0], limits[1]


ENVELOPE_BYTES = 4096
"""What a batch sends besides its requests (the JSON around them, a display name), at most."""


def wire_bytes(request: Mapping[str, Any]) -> int:
    """The bytes a request adds to a JSON body listing requests (its comma included)."""
    return len(json.dumps(request, ensure_ascii=False).encode()) + 1


class LocalInputs:
    """The lines of parts whose provider keeps no input file to read back: one JSONL file a
    part in a folder beside the cache file, synced to disk before the batch is created (a
    rerun after a crash, or ``llm-ops batches collect``, reads them back)."""

    def __init__(self, cache_path: Path):
        self.folder = cache_path.with_name(cache_path.name + ".batches")

    def keep(self, name: str, content: bytes) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{name}.jsonl"
        with open(path, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        return str(path)

    @staticmethod
    def read(input_file_id: str) -> bytes:
        try:
            return Path(input_file_id).read_bytes()
        except OSError as exc:
            raise JobAbortedError(
                f"the batch's requests were kept in {input_file_id}, which cannot be read "
                f"({exc.strerror}): collect it where it was submitted, beside its cache"
            ) from exc

    def discard(self, input_file_id: str | None) -> None:
        """Remove a part's kept lines (only a file of this folder: the id is read from the
        cache, and nothing else is ever removed)."""
        if input_file_id is None:
            return
        path = Path(input_file_id)
        if path.parent.resolve() == self.folder.resolve() and path.suffix == ".jsonl":
            path.unlink(missing_ok=True)

    @staticmethod
    async def pages(input_file_id: str, size: int) -> AsyncGenerator[list[str], None]:
        lines = [line for line in LocalInputs.read(input_file_id).decode().splitlines() if line]
        for start in range(0, len(lines), size):
            yield lines[start : start + size]


class KeptRequests:
    """What the services of providers that keep no input file to read back share: their
    parts' requests kept beside the cache (:class:`LocalInputs`), each line the canonical
    request under its key, read back from there, and their calls made through the engine."""

    what = "the provider's batch API"

    def __init__(self, engine: Engine, dialect: Dialect, inputs: LocalInputs):
        self.engine = engine
        self.dialect = dialect
        self.inputs = inputs
        self.http = HttpCalls(engine, self.what)

    def line(self, key: str, canonical: Mapping[str, Any]) -> Line:
        return kept_line(key, canonical)

    def read_line(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        return read_kept_line(line)

    def _request(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """The request a kept line sends, as the provider's batch spells it."""
        raise NotImplementedError

    def sent_bytes(self, line: Mapping[str, Any], kept: bytes) -> int:
        return wire_bytes(self._request(line))

    async def upload(self, part: BatchPart, content: bytes) -> str:
        return await asyncio.to_thread(self.inputs.keep, part.name, content)

    def input_lines(self, input_file_id: str) -> AsyncGenerator[list[str], None]:
        return LocalInputs.pages(input_file_id, 1024)

    async def discard(self, part: BatchPart) -> None:
        await asyncio.to_thread(self.inputs.discard, part.input_file_id)

    def errors(self) -> Any:
        return self.http.errors()


class Refused(LlmOpsError):
    """A provider's batch API answered with an error status (internal: it becomes one
    :class:`JobAbortedError` at :func:`http_errors`)."""

    def __init__(self, answer: HttpAnswer, what: str):
        self.status = answer.status
        super().__init__(f"HTTP {answer.status}: {answer.body[:500].decode(errors='replace')}")
        self.what = what


def checked(answer: HttpAnswer, what: str) -> Any:
    """The JSON of a successful answer; :class:`Refused` for an error status (a 5xx or 429
    is :class:`AnswerMayBeLost` to a create, whose caller says so)."""
    if answer.status >= 400:
        raise Refused(answer, what)
    try:
        return json.loads(answer.body)
    except ValueError as exc:
        raise JobAbortedError(f"{what} answered what is not JSON: {answer.body[:200]!r}") from exc


def may_be_lost(exc: BaseException) -> bool:
    """Whether a create that raised ``exc`` may have been done all the same."""
    if isinstance(exc, Refused):
        return exc.status >= 500 or exc.status in (408, 429)
    return isinstance(exc, TransportError)


@contextmanager
def http_errors(what: str, secrets: tuple[str | None, ...]) -> Iterator[None]:
    """Errors of a batch API spoken over the engine's HTTP, as one :class:`JobAbortedError`
    whose message hides the key: what is recorded and cached so far stays."""
    try:
        yield
    except (Refused, TransportError, AnswerMayBeLost) as exc:
        detail = one_line(redact(str(exc), *secrets))
        status = getattr(exc, "status", None)
        if status in (401, 403):
            hint = f"check the API key and its access to {what}"
        elif status in (400, 413, 422):
            hint = "it refused the batch as sent: fix the request (the row's options) and rerun"
        elif status == 404:
            hint = f"the endpoint may have no {what}: use batch=False"
        else:
            hint = "rerun to pick the recorded batches up where they stopped"
        raise JobAbortedError(f"{what} failed ({detail}); {hint}") from exc


ATTEMPTS = 4  # of a control-plane call that may be sent again (not a create)
CONTROL_MAX_BYTES = 2**24  # a batch object, a listing


def kept_line(key: str, canonical: Mapping[str, Any]) -> Line:
    """The line a part keeps locally for a provider that keeps no input: the key and the
    canonical request, so the request is rebuilt from it whatever the dialect."""
    return {"key": key, "request": dict(canonical)}


def read_kept_line(line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    return str(line["key"]), dict(line["request"])


class HttpCalls:
    """A batch API's calls over the engine's HTTP (aiohttp, with the dialect's headers, the
    endpoint's TLS and proxy): paths under the endpoint's base URL only, since the key goes
    with every call."""

    def __init__(self, engine: Engine, what: str):
        self.engine = engine
        self.what = what

    async def call(
        self, method: str, path: str, body: bytes | None = None, *, again: bool = True
    ) -> Any:
        """A call's JSON; one that may be sent again is, up to :data:`ATTEMPTS` times, after
        a failure that may pass (a 5xx, a 429, no answer)."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return checked(await self.send(method, path, body, CONTROL_MAX_BYTES), self.what)
            except (Refused, TransportError) as exc:
                if not again or not may_be_lost(exc) or attempt == ATTEMPTS:
                    raise
            await asyncio.sleep(random.uniform(0.05, 0.1) * 2**attempt)
        raise AssertionError("unreachable")

    async def create(self, path: str, body: bytes) -> Any:
        """A create's JSON, sent once: :class:`AnswerMayBeLost` when it may have been done."""
        try:
            return await self.call("POST", path, body, again=False)
        except (Refused, TransportError) as exc:
            if may_be_lost(exc):
                raise AnswerMayBeLost(str(exc)) from exc
            raise

    async def send(self, method: str, path: str, body: bytes | None, max_bytes: int) -> HttpAnswer:
        return await self.send_to(method, self.engine.url(path), body, max_bytes)

    async def send_to(
        self,
        method: str,
        url: URL,
        body: bytes | None,
        max_bytes: int,
        headers: Mapping[str, str] | None = None,
    ) -> HttpAnswer:
        """One call to ``url``, which must be on the endpoint's host (the key goes with it),
        with ``headers`` besides the client's."""
        if url.origin() != URL(self.engine.base_url).origin():
            raise JobAbortedError(
                f"{self.what} named {url.origin()} to send to, not the endpoint's host: the "
                "API key is not sent there"
            )
        return await self.engine.http.request(
            method, url, body, self.engine.limits.timeout, max_bytes, headers=headers
        )

    async def read(self, path: str | URL, max_bytes: int) -> bytes:
        """A large answer's body (a results file), read whole within ``max_bytes``."""
        url = path if isinstance(path, URL) else self.engine.url(path)
        answer = await self.send_to("GET", url, None, max_bytes)
        if answer.status >= 400:
            raise Refused(answer, self.what)
        return answer.body

    def errors(self) -> Any:
        return http_errors(self.what, self.engine.secrets)
