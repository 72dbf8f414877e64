"""Send order: the distinct cache misses in the order that lets the server reuse the most work.

Servers cache what they computed for a prompt's leading tokens (vLLM and SGLang automatic prefix
caching, llama.cpp ``cache_prompt``, OpenAI prompt caching) and evict the least recently used
first, so a prefix is reused only while it is still cached. Sorted by system message (none
first), then by prompt text, requests walk the prefix tree of the job's prompts depth first:
those sharing a system message and the leading part of the prompt (the template's words and
its leading columns) come one after another.

Sent that way to a server answering many at once, though, a prefix's followers arrive while
its first request is still being computed, so they miss too: on the simulator's prefix cache,
plain sorted order at concurrency 64 cached half the tokens that unsorted order did. So the
sorted misses are cut into :data:`LANES` runs of consecutive requests, and the runs are taken
in turn, one request each: every run is a depth-first walk whose next request goes out about
one round of the in-flight requests later, when its predecessor's prefix is cached, and the
server holds one prefix per run. Measured in ``benchmarks/run.py`` (scenario "send order").

Only *when* a request is sent changes, never *what* is sent: every request, its key and its
answer are those of the input order, answers are joined back to their rows by key, and each
answer is written to the cache as it arrives, so the order is no part of what a crash keeps.
Sorting 1M distinct prompts of 600 characters takes about 3 s on 2 cores.

Grouping lengths as well (by length within each group of prompts sharing the same leading
64-character blocks and no more, which keeps every reusable block) was measured on the sample
reviews: it evened the lengths of 64 consecutive requests (largest/mean 1.13 instead of 1.22)
for 0.1 to 0.3 points fewer prefix-cache hits and about 4 s more per 1M prompts. Servers with
continuous batching (vLLM, SGLang, llama.cpp) do not pad, so it is left out.
"""

from __future__ import annotations

from typing import Literal, get_args

import polars as pl

from ._in_place import in_place

SendOrder = Literal["prefix", "input"]
SEND_ORDERS: tuple[str, ...] = get_args(SendOrder)
LANES = 64
"""Runs of the sorted misses sent in turn, where the concurrency is not known: about the
requests in flight (a live dispatch passes its concurrency)."""


@in_place
def send_order(misses: pl.DataFrame, order: SendOrder, *, lanes: int = LANES) -> pl.DataFrame:
    """``misses`` (``REQUESTS``: key, system, prompt, rows) in the order to send them.

    ``"prefix"``: by system message (none first), then prompt text, byte-wise, cut into
    ``lanes`` runs of consecutive requests that are taken in turn, one request each (one run:
    sorted order); ``"input"``: as given, which is the order of each request's first row.
    """
    if order == "input" or misses.height < 2:
        return misses
    ordered = misses.sort("system", "prompt", nulls_last=False, maintain_order=True)
    lanes = max(1, min(lanes, ordered.height))
    if lanes == 1:
        return ordered
    per_lane = -(-ordered.height // lanes)
    position = pl.int_range(pl.len(), dtype=pl.Int64)
    return ordered.sort(position % per_lane, position // per_lane)
