"""The baseline: what a user writes by hand instead of ``llm_complete``.

One ``AsyncOpenAI`` client with the SDK's defaults (``max_retries=2``), an
``asyncio.Semaphore`` for concurrency and ``asyncio.gather`` over one coroutine per row.
An exception fails that row only. No dedupe, no cache, no rate limiting of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import polars as pl
from openai import AsyncOpenAI

SDK_DEFAULT_RETRIES = 2


async def complete_all(
    texts: Sequence[str],
    *,
    base_url: str,
    concurrency: int,
    model: str = "sim",
    timeout: float | None = None,
    max_retries: int = SDK_DEFAULT_RETRIES,
    max_tokens: int | None = None,
) -> tuple[list[str | None], list[str | None]]:
    """Send one chat completion per text; returns ``(answers, errors)``, row for row."""
    options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=max_retries, **options)
    semaphore = asyncio.Semaphore(concurrency)
    params: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}

    async def one(text: str) -> tuple[str | None, str | None]:
        async with semaphore:
            try:
                response = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": text}], **params
                )
                return response.choices[0].message.content, None
            except Exception as exc:  # a failure becomes a failed row
                return None, f"{type(exc).__name__}: {exc}"

    try:
        results = await asyncio.gather(*(one(text) for text in texts))
    finally:
        await client.close()
    return [answer for answer, _ in results], [error for _, error in results]


def baseline_complete(
    frame: pl.DataFrame,
    *,
    column: str = "text",
    base_url: str,
    concurrency: int,
    model: str = "sim",
    timeout: float | None = None,
    max_retries: int = SDK_DEFAULT_RETRIES,
) -> pl.DataFrame:
    """``frame`` plus ``completion`` and ``completion_error`` columns, as the hand-written loop."""
    answers, errors = asyncio.run(
        complete_all(
            frame[column].to_list(),
            base_url=base_url,
            concurrency=concurrency,
            model=model,
            timeout=timeout,
            max_retries=max_retries,
        )
    )
    return frame.with_columns(
        pl.Series("completion", answers, dtype=pl.String),
        pl.Series("completion_error", errors, dtype=pl.String),
    )
