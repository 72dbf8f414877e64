"""The flags of a job's settings (:data:`llm_ops.SETTINGS`): one table, written for the
command line, of each flag's help, what goes after it and, where it differs from the setting's
name, the flag's name.

What each setting holds comes from its option or its object (:mod:`._job_arguments`); this
table says what the flags mean to someone at a shell, so a default reads as what to type or
set there, never as a Python value. ``%`` is argparse's: write ``%%`` for a percent sign.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._cache import CACHE_ENV


@dataclass(frozen=True)
class OptionFlag:
    """How one option reads on the command line."""

    help: str
    metavar: str | None = None  # what goes after the flag, e.g. SECONDS; None for a choice
    flag: str | None = None  # the flag's name where it is not the option's, e.g. --output-column


OPTION_FLAGS: dict[str, OptionFlag] = {
    "output": OptionFlag(
        "name of the answer column; its status and error columns are named after it "
        "(default: completion)",
        "NAME",
        flag="--output-column",
    ),
    "system": OptionFlag("system message, a template like --prompt", "TEMPLATE"),
    "max_tokens": OptionFlag(
        "most tokens per answer; sent to the endpoint, part of the cache key", "TOKENS"
    ),
    "temperature": OptionFlag("sampling temperature; part of the cache key", "TEMPERATURE"),
    "top_p": OptionFlag("nucleus sampling; part of the cache key", "P"),
    "seed": OptionFlag("sampling seed; part of the cache key", "N"),
    "stop": OptionFlag(
        "a text that ends the answer; again for another; part of the cache key", "TEXT"
    ),
    "reasoning_effort": OptionFlag(
        "how long a reasoning model thinks before it answers; part of the cache key"
    ),
    "max_completion_tokens": OptionFlag(
        "most tokens per answer, a reasoning model's thinking included; part of the cache key",
        "TOKENS",
    ),
    "keep_reasoning": OptionFlag(
        "add <output>_reasoning: a reasoning model's thinking beside each answer; not sent, "
        "not part of the cache key"
    ),
    "images": OptionFlag(
        "a column of images (bytes, or paths and URLs) sent with each row's prompt; again for "
        "another; keyed by the images' bytes",
        "COLUMN",
    ),
    "image_detail": OptionFlag("with --images: how closely the model looks; part of the key"),
    "documents": OptionFlag(
        "a column of PDFs (bytes, paths, file: or data: URLs) sent with each row's prompt; "
        "again for another",
        "COLUMN",
    ),
    "documents_as": OptionFlag(
        "with --documents: 'file' (default: OpenAI file parts) or 'pages' (page images, for "
        "endpoints that take no files)"
    ),
    "max_pages": OptionFlag(
        "with --documents: the most pages a PDF may have; a longer one's row is rejected "
        "(default: 100)",
        "N",
    ),
    "max_pixels": OptionFlag(
        "with --images: the most pixels an image may have (from its header; a decompression "
        "bomb's row is rejected; default: 89478485, Pillow's limit)",
        "N",
    ),
    "media_folders": OptionFlag(
        "with --images or --documents: a folder whose files a path in the table may name "
        "(after symlinks); again for another; a path elsewhere is its row's rejected status "
        "(default: the input file's folder)",
        "FOLDER",
        flag="--media-folder",
    ),
    "base_url": OptionFlag("endpoint (default: $OPENAI_BASE_URL, then OpenAI's)", "URL"),
    "endpoint_name": OptionFlag(
        "the endpoint's name in cache keys instead of its URL, so one server reached under "
        "several URLs (a changing port, a load balancer) shares its answers",
        "NAME",
    ),
    "cache": OptionFlag(
        f"DuckDB cache file; a job on files always has one (default: ${CACHE_ENV} or "
        "~/.cache/llm-ops/cache.duckdb)",
        "FILE",
    ),
    "concurrency": OptionFlag(
        "most requests in flight, at most 4096 (default: found while the job runs, from how "
        "many the endpoint absorbs); a number given is where the job starts",
        "N",
    ),
    "rpm": OptionFlag(
        "requests per minute to stay under (the endpoint's x-ratelimit headers are followed too)",
        "N",
    ),
    "tpm": OptionFlag("tokens per minute to stay under", "N"),
    "max_attempts": OptionFlag("attempts per request, the first included (default: 5)", "N"),
    "timeout": OptionFlag("seconds per attempt (default: 60)", "SECONDS"),
    "max_retry_after": OptionFlag(
        "longest wait an endpoint may ask for (Retry-After) before the request fails instead "
        "of stalling the job (default: 120)",
        "SECONDS",
    ),
    "max_response_bytes": OptionFlag(
        "largest answer body, compressed and decompressed; a larger one fails its request "
        "(default: 8 MiB)",
        "BYTES",
    ),
    "max_cost": OptionFlag(
        "stop sending once the projected spend would pass this many dollars; rows not sent "
        "are skipped, everything answered is cached (needs a price: see --pricing)",
        "USD",
    ),
    "max_requests": OptionFlag("stop sending once this many HTTP requests would be passed", "N"),
    "max_tokens_total": OptionFlag(
        "stop sending once the job's tokens, in and out, would pass this", "TOKENS"
    ),
    "rows_per_request": OptionFlag(
        "pack up to N distinct prompts into one request whose answer lists each by id, for "
        "providers that price per request (default: 1, no packing)",
        "N",
    ),
    "pack_tokens": OptionFlag(
        "with --rows-per-request: about how many prompt tokens a packed request holds",
        "TOKENS",
    ),
    "send_order": OptionFlag(
        "order the requests go out in: 'prefix' (default) groups requests that share a "
        "system message and prompt start, for the server's prefix cache; 'input': the "
        "order of the rows. The answers are the same either way"
    ),
    "batch": OptionFlag(
        "send the requests through the provider's Batch API at its price (half the live one "
        "by default) and wait, up to 24 h, instead of sending them now"
    ),
    "on_expired": OptionFlag(
        "with --batch: what an expired batch's unanswered requests do, 'resubmit' "
        "(default: in a new batch) or 'live' (sent now)"
    ),
    "requests_per_batch": OptionFlag(
        "with --batch: requests per batch file (default: 50000, OpenAI's limit)", "N"
    ),
    "bytes_per_batch": OptionFlag(
        "with --batch: bytes per batch file (default: 200 MB, OpenAI's limit)", "BYTES"
    ),
    "batch_poll_seconds": OptionFlag(
        "with --batch: the first wait between polls; it grows to a minute (default: 5)",
        "SECONDS",
    ),
    "flush_every": OptionFlag(
        "merge the answers from the cache's journal into the cache file once this many wait "
        "(default: 8192)",
        "N",
    ),
    "flush_seconds": OptionFlag(
        "merge them at least this often (default: 2)",
        "SECONDS",
    ),
    "max_age": OptionFlag(
        "reuse cached answers at most this old (1d, 6h, 30m, 45s or seconds); an older one is "
        "sent again and the new answer kept beside it (default: any age)",
        "AGE",
    ),
    "merge_wait": OptionFlag(
        "at the end, how long to wait for a reader holding the cache file to let go of it "
        "(default: 30; 0: no wait); answers not merged stay in the journal, still cache hits, "
        "until 'llm-ops cache merge' or the next job",
        "SECONDS",
    ),
}
