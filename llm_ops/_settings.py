"""Every setting of a job, declared once: what it is called, which option or field it is, what
it means, and how a command line and a flow spell it.

Everything else is made from :data:`DECLARED`: :data:`llm_ops.SETTINGS` (setting -> option and
field), the flags of ``llm-ops run`` and ``estimate``, the parameters of the Prefect flow, and
the tables of ``docs/reference/options.md`` (``python -m llm_ops._options_page``).
Rename a setting here and it is renamed in all of them.

A help text is written once, for a shell, a Prefect form and the docs alike: a sentence without
a trailing full stop, ``code`` in backticks (dropped on a command line), no Python values
(``True``, ``None``) and no default that an option's class already holds (each place shows the
class's own). What a flag's value looks like is its ``metavar``; a link for the docs, ``see``.

This module holds only names and words, so it sits under every module that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One setting, or one option or field of the options page that is no flat setting.

    Parameters
    ----------
    name
        The flat setting (``temperature``), as :data:`llm_ops.SETTINGS` and Python's error
        messages name it; an entry that is no flat setting (``flat=False``) is named
        ``option.field`` or after its option.
    option
        The keyword option of ``llm_complete`` it is, or belongs to (``sampling``).
    field
        The field of that option's object (``temperature``); ``None``: the option itself.
    help
        What it means, written once for a shell, a Prefect form and the docs.
    metavar
        What goes after its flag (``SECONDS``); ``None`` for a choice or a switch.
    alias
        Its name on the command line and in the flow where ``name`` is taken there:
        ``output`` is the file a job writes, so the answer column is ``output_column``.
    flag
        Its flag where it is not ``--`` and its alias or name (``--media-folder``, given once
        per folder).
    repeated
        A flag given again for another value; a list in the flow.
    kind
        What it holds on a command line and in a flow (``str``, ``list[str]``), where its
        option's type says more than a flag can hold (``pricing``: ``Price`` objects in
        Python, ``MODEL=IN,OUT`` items there).
    default
        The default in words where no class holds it (``$OPENAI_BASE_URL, then OpenAI's``);
        else the field's default in its class is shown.
    at_least, above, at_most
        Bounds a flow's form checks as the value is typed (the option's class checks all).
    see
        A page of the docs, relative to ``docs/reference/``, saying more.
    cli, flow
        Whether ``llm-ops run``'s flags and the flow's parameters include it.
    given
        How the command line and the flow give it where not as a flag or parameter of its own
        (the API key: ``--api-key-env``, ``api_key_secret``), for the docs.
    flat
        A flat setting (the command line's and the flow's vocabulary); else an option or a
        field of Python's only, on the options page.
    via
        For a field with no flat setting of its own: the setting that gives it
        (``Cache.path``: ``cache``).
    """

    name: str
    option: str
    field: str | None = None
    help: str = ""
    metavar: str | None = None
    alias: str | None = None
    flag: str | None = None
    repeated: bool = False
    kind: object = None
    default: str | None = None
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    see: str | None = None
    cli: bool = True
    flow: bool = True
    given: str | None = None
    flat: bool = True
    via: str | None = None

    @property
    def parameter(self) -> str:
        """Its name on the command line (with ``--``) and in the flow."""
        return self.alias or self.name

    @property
    def flag_name(self) -> str:
        """Its flag: ``--temperature``, ``--output-column``, ``--media-folder``."""
        return self.flag or "--" + self.parameter.replace("_", "-")


def _python(
    name: str,
    option: str | None = None,
    field: str | None = None,
    *,
    help: str,
    default: str | None = None,
    see: str | None = None,
    via: str | None = None,
) -> Setting:
    """An option or field of Python's only: on the options page, no flat setting."""
    return Setting(
        name, option or name, field, help=help, default=default, see=see, via=via,
        flat=False, cli=False, flow=False,
    )  # fmt: skip


# The declarations, as tables: one call per setting, its help wrapped as it reads.
# fmt: off
_LEVERS = "../levers.md"
_PRICES = f"{_LEVERS}#cost-estimate-first-cap-the-spend-see-the-savings"

# The options of llm_complete, in the order of the options page's first table.
_OPTIONS = (
    _python("prompt", help="template with `{column}` references; `{{`/`}}` are literal braces",
        default="required"),
    _python("model",
        help="model name as the endpoint knows it; a list of names, or a [`Cascade`](#cascade), "
        "for a cascade", default="required"),
    Setting("output", "output", alias="output_column", metavar="NAME", default="completion",
        help="name of the answer column; its `_status` and `_error` columns are named after it"),
    Setting("keep_reasoning", "keep_reasoning",
        help="add `<output>_reasoning`: the thinking a reasoning model returns beside each "
        "answer (`reasoning_content`, or `reasoning`), null where none came; not sent, not part "
        "of the cache key (the cache keeps the thinking whenever it comes, so a cached answer "
        "brings it back)", see="../endpoints.md#reasoning-models"),
    Setting("system", "system", metavar="TEMPLATE",
        help="system message, a template as the prompt is"),
    Setting("schema", "schema", cli=False, flow=False,
        help="a pydantic model or a JSON schema the answer must follow: structured output",
        see="../guides/frames.md#structured-output"),
    Setting("repair", "repair", cli=False, flow=False,
        given="no flag: the command line and the flow take no `schema`",
        help="with `schema`: an invalid structured answer is asked again once, with its "
        "validation error (the attempt counts as a retry); per call, so one `Client` may repair "
        "in one call and not the next; without `schema`, a `ConfigError`"),
    Setting("images", "images", metavar="COLUMN", repeated=True, kind=list[str],
        help="a column of images (bytes, or paths and URLs) sent after each row's prompt text; "
        "again for another; an [`Images`](#images) in Python", see="../guides/media.md"),
    Setting("documents", "documents", metavar="COLUMN", repeated=True, kind=list[str],
        help="a column of PDFs (bytes, or paths, `file:` and `data:` URLs) sent after the "
        "images; again for another; a [`Documents`](#documents) in Python"),
    _python("sampling",
        help="a [`Sampling`](#sampling): sent to the endpoint and part of the cache key",
        default="unset"),
    _python("endpoint",
        help="a URL, or an [`Endpoint`](#endpoint) with its key, headers, TLS, proxy and name",
        default="`OPENAI_BASE_URL`, else OpenAI"),
    Setting("cache", "cache", metavar="FILE", kind=str,
        default="`LLM_OPS_CACHE`, else `~/.cache/llm-ops/cache.duckdb`",
        help="DuckDB cache file (a job on files always has one); in Python a [`Cache`](#cache) "
        "too, or off"),
    Setting("concurrency", "concurrency", metavar="N", at_least=1,
        default="found while the job runs",
        help="most requests in flight, at most 4096; unset, the job finds how many the endpoint "
        "absorbs, and a number given is where it starts", see="../concurrency.md"),
    _python("retries",
        help="a [`Retries`](#retries): attempts, timeout, the longest `Retry-After`",
        default="`Retries()`"),
    _python("rate_limit", help="a [`RateLimit`](#ratelimit): requests and tokens per minute",
        default="unset"),
    Setting("batch", "batch", kind=bool,
        help="send the requests through the provider's Batch API at its price (half the live one "
        "by default) and wait, up to 24 h, instead of sending them now; a "
        "[`BatchMode`](#batchmode) in Python", see="../batch.md"),
    _python("budget",
        help="a [`Budget`](#budget): when sending stops; a budget spans every model of a cascade",
        default="unset", see=_PRICES),
    _python("packing",
        help="a [`Packing`](#packing): several rows per request", default="one row per request",
        see=f"{_LEVERS}#multi-row-requests"),
    Setting("send_order", "send_order", default="prefix",
        help="order the requests go out in: `prefix` groups requests that share a system message "
        "and prompt start, for the server's prefix cache; `input`: the order of the rows. The "
        "answers are the same either way", see=f"{_LEVERS}#send-order"),
    Setting("pricing", "pricing", metavar="MODEL=IN,OUT", repeated=True, kind=list[str],
        default="the built-in price of a known model",
        help="$ per 1M input and output tokens of a model, e.g. `gpt-4o-mini=0.15,0.60` (a third "
        "number: $ per request); once per model of a cascade; `IN,OUT` for every model; `free` "
        'for models you host. In Python a `Price`, a dict of model to `Price`, or `"free"`',
        see=_PRICES),
    Setting("semantic_cache", "semantic_cache", metavar="EMBEDDING_MODEL", kind=str, default="off",
        help="reuse answers of similar cached requests, compared with this embedding model (rows "
        "get status `similar`); a [`SemanticCache`](#semanticcache) in Python",
        see=f"{_LEVERS}#semantic-cache-reuse-the-answer-of-a-near-identical-prompt"),
    Setting("on_error", "on_error", cli=False, default='`"null"`',
        given="`on_error` (`--on-error` of `llm-ops run`)",
        help="`null`: failed rows get a null answer; `raise`: fail once every answer is cached "
        "(and, for a job on files, the output written)"),
    Setting("progress", "progress", cli=False, flow=False, default="on in a terminal",
        given="`--no-progress`; a flow reports in its artifacts and logs",
        help="on or off, or a callable receiving a `Progress` snapshot twice a second"),
    _python("return_report", help="return `(frame, RunReport)`", default="`False`"),
)

_ENDPOINT = (
    Setting("base_url", "endpoint", "base_url", metavar="URL",
        default="`$OPENAI_BASE_URL`, then OpenAI's",
        help="the API's URL; credentials in it are refused, query parameters are sent, never "
        "kept", see="../endpoints.md"),
    Setting("api_key", "endpoint", "api_key", cli=False, flow=False, default="`$OPENAI_API_KEY`",
        given="`--api-key-env NAME`; the flow: `api_key_secret`",
        help="a loopback endpoint needs no key, nor one whose headers carry the credentials"),
    Setting("headers", "endpoint", "headers", metavar="NAME=VALUE", cli=False, kind=dict[str, str],
        given="`headers` (`--header`, `--header-env`); the flow: `headers`, `header_secrets`",
        help='sent with every request, e.g. `{"X-Tenant": "acme"}`; never part of a cache key; '
        "values of credential-named headers never shown"),
    Setting("verify", "endpoint", "verify", metavar="CA_BUNDLE|false", cli=False, kind=bool | str,
        given="`verify` (`--verify`)",
        help="check the server's certificate against this CA bundle instead of the system's; "
        "`false` checks nothing (in Python, an `ssl.SSLContext` too)"),
    Setting("cert", "endpoint", "cert", metavar="PEM", kind=str, cli=False,
        given="`cert` (`--cert`, `--cert-key`); the flow: `cert`, `cert_key`",
        help="client certificate (PEM) for mutual TLS"),
    Setting("proxy", "endpoint", "proxy", metavar="URL", cli=False,
        default="`$HTTPS_PROXY`, `$HTTP_PROXY` or `$ALL_PROXY`, unless `$NO_PROXY` names the "
        "host", given="`proxy` (`--proxy`)",
        help="an `http://` or `https://` proxy (a flow refuses credentials in it: set "
        "`HTTPS_PROXY` where it runs)", see="../endpoints.md#proxies"),
    Setting("provider", "endpoint", "provider", metavar="NAME", kind=str,
        default="the one its host is known for, else `openai`",
        help="the API's dialect: `openai` (OpenAI and the servers and gateways that speak its "
        "API), `anthropic` or `gemini`; a host of theirs names it without this",
        see="../endpoints.md"),
    Setting("endpoint_name", "endpoint", "name", metavar="NAME", default="the URL",
        help="the endpoint's name in cache keys instead of its URL, so one server reached under "
        "several URLs (a changing port, a load balancer) shares its answers",
        see="../cache.md#endpoint-identity"),
    Setting("max_response_bytes", "endpoint", "max_response_bytes", metavar="BYTES", at_least=1,
        help="largest answer body, compressed and decompressed; a larger one fails its request "
        "(embeddings may hold 128 KiB more per input)"),
    Setting("prompt_cache", "endpoint", "prompt_cache", metavar="true|false", kind=bool | str,
        help="mark the prefix every request shares (the system prompt) for the provider's prompt "
        "cache where its API asks for a mark (Anthropic's): the first request writes it, later "
        "ones read it at a tenth of the input price; never part of the cache key",
        see="../endpoints.md#prompt-caching"),
)

_CACHE = (
    _python("cache.path", "cache", "path", via="cache",
        default="`LLM_OPS_CACHE`, else `~/.cache/llm-ops/cache.duckdb`",
        help="the DuckDB file, made with its folder when missing"),
    Setting("flush_every", "cache", "flush_every", metavar="N", at_least=1,
        help="merge the answers from the cache's journal into the cache file once this many wait"),
    Setting("flush_seconds", "cache", "flush_seconds", metavar="SECONDS", above=0,
        help="merge them at least this often"),
    Setting("merge_wait", "cache", "merge_wait", metavar="SECONDS", at_least=0,
        help="at the end, how long to wait for a reader holding the cache file to let go of it "
        "(0: no wait); answers not merged stay in the journal, still cache hits, until `llm-ops "
        "cache merge` or the next job", see="../cache.md#a-reader-at-the-end-of-a-job"),
    Setting("max_age", "cache", "max_age", metavar="AGE", default="any age",
        help="reuse cached answers at most this old (`1d`, `6h`, `30m`, `45s` or seconds); an "
        "older one is sent again; the new answer replaces it and the old one moves to "
        "`llm_cache_history`", see="../cache.md#freshness-a-maximum-age-for-reused-answers"),
)

_RETRIES = (
    Setting("max_attempts", "retries", "max_attempts", metavar="N", at_least=1,
        help="attempts per request, the first included"),
    Setting("timeout", "retries", "timeout", metavar="SECONDS", above=0,
        help="seconds per attempt"),
    Setting("max_retry_after", "retries", "max_retry_after", metavar="SECONDS", at_least=0,
        help="longest wait an endpoint may ask for (`Retry-After`) before the request fails "
        "instead of stalling the job", see="../statuses.md#when-the-endpoint-misbehaves"),
)

_RATE_LIMIT = (
    Setting("rpm", "rate_limit", "rpm", metavar="N", above=0,
        help="requests per minute to stay under (the endpoint's rate-limit headers are "
        "followed too, once an answer has named them)"),
    Setting("tpm", "rate_limit", "tpm", metavar="N", above=0,
        help="tokens per minute to stay under"),
)

_SAMPLING = (
    Setting("max_tokens", "sampling", "max_tokens", metavar="TOKENS", at_least=1,
        help="most tokens per answer; part of the cache key"),
    Setting("temperature", "sampling", "temperature", metavar="TEMPERATURE", at_least=0, at_most=2,
        help="sampling temperature, 0 to 2; part of the cache key"),
    Setting("top_p", "sampling", "top_p", metavar="P", at_least=0, at_most=1,
        help="nucleus sampling, 0 to 1; part of the cache key"),
    Setting("seed", "sampling", "seed", metavar="N",
        help="sampling seed, where the server offers one; part of the cache key"),
    Setting("stop", "sampling", "stop", metavar="TEXT", repeated=True,
        help="a text that ends the answer; again for another; part of the cache key"),
    Setting("reasoning_effort", "sampling", "reasoning_effort",
        help="how long a reasoning model thinks before it answers; part of the cache key",
        see="../endpoints.md#reasoning-models"),
    Setting("max_completion_tokens", "sampling", "max_completion_tokens", metavar="TOKENS",
        at_least=1,
        help="most tokens per answer, a reasoning model's thinking included; part of the cache "
        "key"),
)

_PACKING = (
    Setting("rows_per_request", "packing", "rows_per_request", metavar="N", at_least=1,
        help="pack up to N distinct prompts into one request whose answer lists each by id, for "
        "providers that price per request", see=f"{_LEVERS}#multi-row-requests"),
    Setting("pack_tokens", "packing", "pack_tokens", metavar="TOKENS", at_least=1,
        help="with several rows per request: about how many prompt tokens a packed request holds"),
)

_BUDGET = (
    Setting("max_cost", "budget", "max_cost", metavar="USD", at_least=0,
        help="stop sending once the projected spend would pass this many dollars; rows not sent "
        "are skipped, everything answered is cached (needs a price for every model)"),
    Setting("max_requests", "budget", "max_requests", metavar="N", at_least=1,
        help="stop sending once this many HTTP requests would be passed"),
    Setting("max_tokens_total", "budget", "max_tokens_total", metavar="TOKENS", at_least=1,
        help="stop sending once the job's tokens, in and out, would pass this"),
)

_BATCH = (
    Setting("requests_per_batch", "batch", "requests_per_batch", metavar="N", at_least=1,
        help="in batch mode: requests per batch at most (default: the provider's limit)"),
    Setting("bytes_per_batch", "batch", "bytes_per_batch", metavar="BYTES", at_least=1,
        help="in batch mode: bytes per batch at most (default: the provider's limit)"),
    Setting("batch_poll_seconds", "batch", "poll_seconds", metavar="SECONDS", above=0,
        help="in batch mode: the first wait between polls; it grows to a minute"),
    Setting("on_expired", "batch", "on_expired",
        help="in batch mode: what the unanswered part of an expired or cancelled batch does, "
        "`resubmit` (in a new batch) or `live` (sent now)"),
)

_IMAGES = (
    _python("images.columns", "images", "columns", via="images", default="required",
        help="the image column(s), sent in this order after the prompt's text; each image is "
        "keyed by the sha256 of its bytes (a remote one by its URL)"),
    Setting("image_detail", "images", "detail", default="the endpoint's",
        help="with images: how closely the model looks, and what an image costs; part of the "
        "cache key"),
    _python("images.max_bytes", "images", "max_bytes",
        help="the largest image sent (OpenAI's limit); a larger one makes its row `rejected`, "
        "unsent; a file is read only up to this, whatever size it claims"),
    Setting("max_pixels", "images", "max_pixels", metavar="N", at_least=1,
        help="with images: the most pixels an image may have (width x height, from its header, "
        "never decoded); a larger one (a decompression bomb) makes its row `rejected`"),
    Setting("media_folders", "images", "folders", metavar="FOLDER", flag="--media-folder",
        repeated=True, kind=list[str],
        default="the working directory; for a job on files, the input's folder",
        help="with images or documents: a folder whose files a path in the table may name, after "
        "symlinks; again for another; a path elsewhere makes its row `rejected`",
        see="../guides/media.md#a-table-from-an-untrusted-source"),
)

_DOCUMENTS = (
    _python("documents.columns", "documents", "columns", via="documents", default="required",
        help="the PDF column(s), sent after the images, in this order; keyed by the sha256 of "
        "their bytes"),
    Setting("documents_as", "documents", "send_as",
        help="with documents: `file` (an OpenAI file part) or `pages` (each page rendered to a "
        "PNG image, for endpoints that take images but no files); part of the cache key"),
    Setting("max_pages", "documents", "max_pages", metavar="N", at_least=1,
        help="with documents: the most pages a PDF may have; a longer one makes its row "
        "`rejected`, unsent"),
    _python("documents.max_bytes", "documents", "max_bytes",
        help="the largest PDF sent (OpenAI's limit per file part); as pages, the most its "
        "rendered pages may hold too"),
    _python("documents.folders", "documents", "folders", via="media_folders",
        default="the working directory", help="as the images' folders"),
)

_CASCADE = (
    _python("model.models", "model", "models", via="model", default="required",
        help="model names, the cheapest first, each once"),
    Setting("escalate", "model", "escalate", metavar="SQL", kind=str, default="failures only",
        help="with a cascade: which answered rows go on to the next model besides failed ones, a "
        "SQL condition over the columns such as `completion LIKE 'unsure:%'` (in Python also "
        "`confidence_below(x)` or a Polars expression)",
        see=f"{_LEVERS}#cascades-a-cheap-model-first-a-strong-one-for-the-hard-rows"),
)

_SEMANTIC_CACHE = (
    _python("semantic_cache.model", "semantic_cache", "model", via="semantic_cache",
        default="required", help="the embedding model, on the same endpoint"),
    Setting("semantic_cache_threshold", "semantic_cache", "threshold", metavar="COSINE", above=0,
        at_most=1,
        help="with the semantic cache: the cosine similarity from which an answer is reused"),
    _python("semantic_cache.dimensions", "semantic_cache", "dimensions", help="the vectors' size"),
    _python("semantic_cache.inputs_per_request", "semantic_cache", "inputs_per_request",
        help="texts per embeddings request"),
)
# fmt: on

DECLARED: tuple[Setting, ...] = (
    *_OPTIONS,
    *_ENDPOINT,
    *_CACHE,
    *_RETRIES,
    *_RATE_LIMIT,
    *_SAMPLING,
    *_PACKING,
    *_BUDGET,
    *_BATCH,
    *_IMAGES,
    *_DOCUMENTS,
    *_CASCADE,
    *_SEMANTIC_CACHE,
)
"""Every setting, and every option and field of the options page, each once."""

SECTIONS: tuple[tuple[str, str], ...] = (
    ("endpoint", "Endpoint"),
    ("cache", "Cache"),
    ("retries", "Retries"),
    ("rate_limit", "RateLimit"),
    ("sampling", "Sampling"),
    ("packing", "Packing"),
    ("budget", "Budget"),
    ("batch", "BatchMode"),
    ("images", "Images"),
    ("documents", "Documents"),
    ("model", "Cascade"),
    ("semantic_cache", "SemanticCache"),
)
"""The options that are objects of fields, and their classes, in the options page's order."""


def settings_map(declared: tuple[Setting, ...] | list[Setting]) -> dict[str, tuple[str, str]]:
    """The flat settings of ``declared`` that are a field of an option's object: setting ->
    (option, field), as :data:`llm_ops.SETTINGS`."""
    return {
        setting.name: (setting.option, setting.field)
        for setting in declared
        if setting.flat and setting.field is not None
    }
