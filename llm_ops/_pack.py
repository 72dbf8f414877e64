"""Multi-row requests: several rows' prompts in one request, answers matched back by id.

A pack's user message lists its items as JSON objects ``{"id": "3", "request": "..."}`` and
asks for ``{"answers": [{"id": "3", "answer": "..."}, ...]}`` (also asked as structured output
of :data:`PACK_SCHEMA`, as the endpoint's dialect asks for it). Every id must come back exactly
once; otherwise the pack is split in halves and each half is retried, down to single rows,
which are sent as ordinary requests. So no row can receive another row's answer. Answers are
cached under each row's single-row key.
"""

from __future__ import annotations

import json
from typing import Any

PACK_HEADER = "Answer each request below on its own, as if it were the only one."
PACK_OUTPUT = "answers"  # the name of a pack's structured output
PACK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answers": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "answer": {"type": "string"}},
                "required": ["id", "answer"],
            },
        }
    },
    "required": ["answers"],
}


def pack_messages(system: str | None, prompts: list[str]) -> list[dict[str, str]]:
    """The chat messages of a pack: the shared system message, then the listed requests."""
    items = [{"id": str(number), "request": prompt} for number, prompt in enumerate(prompts, 1)]
    user = (
        f'{PACK_HEADER} Reply with JSON {{"answers": [{{"id": ..., "answer": ...}}]}}'
        f", one answer per id.\nREQUESTS:\n{json.dumps(items, ensure_ascii=False)}"
    )
    messages = [{"role": "user", "content": user}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def unpack(text: str, count: int) -> list[str] | None:
    """The answers in id order, or ``None`` unless ids 1..count each came back exactly once."""
    try:
        answers = json.loads(text)["answers"]
        by_id = [(str(item["id"]), item["answer"]) for item in answers]
    except (ValueError, KeyError, TypeError):
        return None
    ids = [answer_id for answer_id, _ in by_id]
    if sorted(ids) != sorted(str(n) for n in range(1, count + 1)) or len(set(ids)) != count:
        return None
    if not all(isinstance(answer, str) for _, answer in by_id):
        return None
    found = dict(by_id)
    return [found[str(n)] for n in range(1, count + 1)]


def parse_pack_request(text: str) -> list[str] | None:
    """The item prompts of a pack's user message (for the simulator), or ``None``."""
    if not text.startswith(PACK_HEADER) or "\nREQUESTS:\n" not in text:
        return None
    items = json.loads(text.split("\nREQUESTS:\n", 1)[1])
    return [str(item["request"]) for item in items]
