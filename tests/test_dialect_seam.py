"""The dialect seam: another API plugs in from outside the package, the transport can be
injected, and the OpenAI dialect's spelling stays in its one module."""

from __future__ import annotations

import io
import itertools
import tokenize
from pathlib import Path

import polars as pl
import pytest
from dialect_echo import ECHO, ECHO_KEY, EchoServer, echoed

from llm_ops import Client, ConfigError, Endpoint, HttpAnswer, Sampling, llm_complete
from llm_ops._dialects.openai import OPENAI
from llm_ops._endpoint import DIALECTS, dialect_for

PROMPTS = pl.DataFrame({"text": ["one", "two", "three"]})


def _echo_endpoint(server: EchoServer, **options) -> Endpoint:
    return Endpoint(server.base_url, api_key=ECHO_KEY, provider=ECHO, **options)


def test_a_dialect_from_outside_the_package_answers_a_job():
    with EchoServer() as server:
        out = PROMPTS.pipe(
            llm_complete,
            prompt="say {text}",
            model="echo-1",
            endpoint=_echo_endpoint(server),
            cache=False,
        )
    assert out["completion"].to_list() == [echoed(f"say {t}") for t in PROMPTS["text"]]
    assert out["completion_status"].to_list() == ["ok"] * 3


def test_the_dialect_writes_the_request_body():
    with EchoServer() as server:
        PROMPTS.head(1).pipe(
            llm_complete,
            prompt="say {text}",
            model="echo-1",
            endpoint=_echo_endpoint(server),
            cache=False,
            sampling=Sampling(max_tokens=7),
        )
    assert server.requests == [{"who": "echo-1", "lines": ["say one"], "budget": 7}]


def test_the_dialect_classifies_errors_for_the_engines_retries():
    with EchoServer(refuse_first=1) as server:
        out = PROMPTS.head(1).pipe(
            llm_complete,
            prompt="{text}",
            model="echo-1",
            endpoint=_echo_endpoint(server),
            cache=False,
        )
    assert out["completion"].to_list() == ["ONE"] and len(server.requests) == 2


def test_the_dialect_keeps_keys_and_the_cache_answers_a_rerun(tmp_path):
    cache = tmp_path / "cache.duckdb"
    with EchoServer() as server:
        for _ in range(2):
            PROMPTS.pipe(
                llm_complete,
                prompt="{text}",
                model="echo-1",
                endpoint=_echo_endpoint(server),
                cache=cache,
            )
    assert len(server.requests) == len(PROMPTS)


def test_an_unknown_provider_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError, match="'openai'"):
        Endpoint("http://127.0.0.1:9/v1", provider="nosuch")


def test_a_provider_that_is_no_dialect_is_a_config_error():
    with pytest.raises(ConfigError, match="Dialect object"):
        Endpoint("http://127.0.0.1:9/v1", provider=42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "base_url", ["https://api.openai.com/v1", "http://127.0.0.1:8000/v1", None]
)
def test_the_dialect_is_openai_by_default_and_for_openais_host(base_url):
    assert dialect_for(None, base_url) is OPENAI
    assert DIALECTS["openai"] is OPENAI


class _Recorded:
    """A transport that sends nothing: it answers every request from memory, and keeps it."""

    def __init__(self, answer: bytes) -> None:
        self.answer = HttpAnswer(200, {}, answer)
        self.sent = []
        self.closed = False

    async def handle_async_request(self, request):
        self.sent.append(request)
        return self.answer

    async def aclose(self) -> None:
        self.closed = True


def test_an_injected_transport_sends_every_request_with_the_dialects_headers():
    answer = b'{"event": "text", "value": "hi"}\n{"event": "stop", "value": "end"}\n'
    transport = _Recorded(answer + b'{"event": "spent", "value": {"in": 1, "out": 1}}\n')
    endpoint = Endpoint(
        "http://127.0.0.1:9/api", api_key=ECHO_KEY, provider=ECHO, transport=transport
    )
    with Client(endpoint=endpoint, cache=False) as client:
        out = client.complete(PROMPTS.head(1), prompt="{text}", model="echo-1")
    assert out["completion"].to_list() == ["hi"]
    posted = [r for r in transport.sent if r.method == "POST"]
    assert [r.url for r in posted] == ["http://127.0.0.1:9/api/say"]
    assert posted[0].headers["X-Echo-Key"] == ECHO_KEY
    assert transport.closed


def test_a_transport_without_the_interface_is_a_config_error():
    with pytest.raises(ConfigError, match="handle_async_request"):
        Endpoint("http://127.0.0.1:9/v1", transport=object())  # type: ignore[arg-type]


# -- each dialect's spelling stays in its module --------------------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "llm_ops"
DIALECT_HOMES = ("_dialects", "testing")  # the dialects, and the OpenAI-compatible simulator
SPELLED_ANYWHERE = (
    "chat/completions",
    "finish_reason",
    "x-ratelimit",
    # Anthropic's Messages API: only _dialects.anthropic and the simulator spell it
    "v1/messages",
    "anthropic-version",
    "anthropic-ratelimit",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
KEPT = {
    # The cache's column keeps OpenAI's name: users query it, and renaming it would break
    # their SQL (the module's docstring says so too); the row written to it names it.
    ("_cache/_migrations.py", "finish_reason"),
    ("_pipeline/persist.py", "finish_reason"),
    # OpenTelemetry's GenAI conventions name the attribute gen_ai.response.finish_reasons
    ("_telemetry.py", "finish_reason"),
}


def _spellings(source: str, *, builds_arguments: bool = False) -> set[str]:
    """The OpenAI dialect's words ``source`` spells in its code: any of
    :data:`SPELLED_ANYWHERE` in a name, a string (docstrings too) or a comment, and
    ``"choices"`` as a string of its own. argparse's ``choices=`` is a keyword, no string,
    but a dict of its options spells it as one: in a module that ``builds_arguments`` (the
    command line's, or one using argparse), that string is argparse's."""
    found = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT):
            found |= {word for word in SPELLED_ANYWHERE if word in token.string}
        quoted = token.string.strip("'\"") if token.type == tokenize.STRING else None
        if quoted == "choices" and not builds_arguments:
            found.add("choices")
    return found


def _modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in DIALECT_HOMES
    ]


def test_no_module_outside_the_dialects_spells_a_dialect():
    spelled = set()
    for path in _modules():
        relative = path.relative_to(PACKAGE)
        source = path.read_text()
        builds_arguments = relative.parts[0] == "cli" or "argparse" in source
        words = _spellings(source, builds_arguments=builds_arguments)
        spelled |= {(relative.as_posix(), word) for word in words}
    assert spelled - KEPT == set()


def test_the_spelling_check_finds_each_word():
    source = (
        'PATH = "chat/completions"  # x-ratelimit\n'
        'def f(body):\n    return body["choices"][0].finish_reason\n'
    )
    assert _spellings(source) == {"chat/completions", "x-ratelimit", "choices", "finish_reason"}


def test_the_spelling_check_lets_argparse_choices_be():
    assert _spellings('parser.add_argument("--x", choices=["a"])\n') == set()
    assert _spellings('options = {"choices": ["a"]}\n', builds_arguments=True) == set()


def test_the_dialect_writes_structured_output_its_own_way():
    with EchoServer() as server:
        PROMPTS.head(1).pipe(
            llm_complete,
            prompt="{text}",
            model="echo-1",
            endpoint=_echo_endpoint(server),
            cache=False,
            schema={"title": "Word", "type": "object", "properties": {"word": {"type": "string"}}},
        )
    assert server.requests[0]["shape"] == {"called": "Word", "fields": ["word"]}


# -- and the Gemini dialect's in its own ------------------------------------------------------

GEMINI_SPELLED = ("generateContent", "generationConfig", "systemInstruction", "usageMetadata")
GEMINI_HOMES = ("_dialects/gemini.py", "testing/")


def test_no_module_but_the_gemini_dialect_and_the_simulator_spells_gemini():
    spelled = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(GEMINI_HOMES):
            continue
        source = path.read_text()
        spelled |= {(relative, word) for word in GEMINI_SPELLED if word in source}
    assert spelled == set()


# -- and each provider's batch lines in its dialect -------------------------------------------

BATCH_LINE_WORDS = {
    # a service: its dialect's module, and the words of a line (sent or read) only it spells
    "_pipeline/batch_anthropic.py": (
        "_dialects/anthropic.py",
        ("custom_id", "params", "result", "canceled", "overloaded_error"),
    ),
    "_pipeline/batch_gemini.py": ("_dialects/gemini.py", ("key", "request")),
}


def _strings(source: str) -> set[str]:
    """The string literals of ``source``'s code (docstrings and comments aside)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    return {
        token.string.strip("'\"")
        for before, token in itertools.pairwise(tokens)
        if token.type == tokenize.STRING
        and before.type not in (tokenize.INDENT, tokenize.NEWLINE, tokenize.NL, tokenize.DEDENT)
    }


@pytest.mark.parametrize("service", sorted(BATCH_LINE_WORDS))
def test_a_batch_service_leaves_its_lines_to_its_dialect(service):
    dialect, words = BATCH_LINE_WORDS[service]
    assert _strings((PACKAGE / service).read_text()) & set(words) == set()
    assert set(words) <= _strings((PACKAGE / dialect).read_text())
