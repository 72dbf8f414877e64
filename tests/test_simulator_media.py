"""The simulator reads OpenAI's image and file content parts (issue 38, item 7): each image or
PDF is named in the answer by the hash of its bytes, counted in usage as OpenAI bills it, and
refused where OpenAI refuses it. Every request goes over real HTTP to the session's simulator."""

from __future__ import annotations

import base64
import io
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
from media_files import image, pdf
from PIL import Image

from llm_ops._media_tokens import DOCUMENT_TOKENS_PER_PAGE, image_tokens
from llm_ops.testing import LocalEndpoint, expected_reply, media_tag

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(endpoint: LocalEndpoint, body: dict[str, Any] | bytes) -> tuple[int, dict[str, Any]]:
    """POST a chat completion body; its HTTP status and JSON answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{endpoint.base_url}/chat/completions",
        data=data,
        headers={"Content-Type": "application/json"},
    )
    try:
        with _NO_PROXY.open(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def ask(endpoint: LocalEndpoint, *parts: dict[str, Any], model: str = "sim") -> dict[str, Any]:
    """Ask with a user message of these content parts; the answer, which must be a 200."""
    status, answer = post(
        endpoint, {"model": model, "messages": [{"role": "user", "content": list(parts)}]}
    )
    assert status == 200, answer
    return answer


def refusal(endpoint: LocalEndpoint, *parts: dict[str, Any]) -> dict[str, Any]:
    """Ask with these parts; the error, which must be a 400 ``invalid_request_error``."""
    status, answer = post(
        endpoint, {"model": "sim", "messages": [{"role": "user", "content": list(parts)}]}
    )
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    error: dict[str, Any] = answer["error"]
    return error


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


def image_part(data: bytes, mime: str = "image/png", detail: str | None = None) -> dict[str, Any]:
    url: dict[str, Any] = {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}
    if detail is not None:
        url["detail"] = detail
    return {"type": "image_url", "image_url": url}


def file_part(data: bytes, filename: str = "doc.pdf") -> dict[str, Any]:
    data_url = f"data:application/pdf;base64,{base64.b64encode(data).decode()}"
    return {"type": "file", "file": {"filename": filename, "file_data": data_url}}


def content(answer: dict[str, Any]) -> str:
    reply: str = answer["choices"][0]["message"]["content"]
    return reply


@pytest.mark.parametrize("kind", ["PNG", "JPEG", "WEBP"])
def test_an_image_is_answered_with_the_tag_of_its_bytes(endpoint, kind):
    picture = image(kind)
    answer = ask(endpoint, text("What is this?"), image_part(picture, f"image/{kind.lower()}"))
    assert content(answer).endswith(f"What is this? [{media_tag(picture)}]")


def test_the_same_image_under_another_mime_type_answers_alike(endpoint):
    picture = image("PNG")
    as_png = ask(endpoint, text("Describe"), image_part(picture, "image/png"))
    as_jpeg = ask(endpoint, text("Describe"), image_part(picture, "image/jpeg"))
    assert content(as_png) == content(as_jpeg)


def test_the_same_pdf_under_another_filename_answers_alike(endpoint):
    document = pdf()
    first = ask(endpoint, text("Summarise"), file_part(document, "a.pdf"))
    second = ask(endpoint, text("Summarise"), file_part(document, "b.pdf"))
    assert content(first) == content(second)


def test_a_different_image_answers_differently(endpoint):
    first = ask(endpoint, text("Describe"), image_part(image(color=0)))
    second = ask(endpoint, text("Describe"), image_part(image(color=1)))
    assert content(first) != content(second)


def test_detail_does_not_change_the_answer(endpoint):
    picture = image()
    low = ask(endpoint, text("Describe"), image_part(picture, detail="low"))
    high = ask(endpoint, text("Describe"), image_part(picture, detail="high"))
    assert content(low) == content(high)


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4o-mini"])
def test_usage_counts_an_image_by_the_tile_rule(endpoint, model):
    # the same text and tag length, so the difference is the images' tokens alone
    big, small = image(size=(1500, 900)), image(size=(8, 8))
    answers = [ask(endpoint, text("Describe"), image_part(p), model=model) for p in (big, small)]
    tokens = [answer["usage"]["prompt_tokens"] for answer in answers]
    high = image_tokens(1500, 900, detail="auto", model=model)
    assert tokens[0] - tokens[1] == high - image_tokens(8, 8, detail="auto", model=model)


def test_usage_counts_a_low_detail_image_at_the_base(endpoint):
    picture = image(size=(1500, 900))
    low = ask(endpoint, text("Describe"), image_part(picture, detail="low"))
    high = ask(endpoint, text("Describe"), image_part(picture, detail="high"))
    expected = image_tokens(1500, 900, detail="high", model="sim") - image_tokens(
        1500, 900, detail="low", model="sim"
    )
    assert high["usage"]["prompt_tokens"] - low["usage"]["prompt_tokens"] == expected


def test_usage_counts_a_pdf_by_its_pages(endpoint):
    one = ask(endpoint, text("Summarise"), file_part(pdf(pages=1)))
    three = ask(endpoint, text("Summarise"), file_part(pdf(pages=3)))
    difference = three["usage"]["prompt_tokens"] - one["usage"]["prompt_tokens"]
    assert difference == 2 * DOCUMENT_TOKENS_PER_PAGE


def test_a_remote_image_is_tagged_by_its_url_and_counted_at_the_base(endpoint):
    url = "https://example.com/cat.png"
    remote = ask(endpoint, text("Describe"), {"type": "image_url", "image_url": {"url": url}})
    assert content(remote).endswith(f"Describe [{media_tag(url)}]")
    alone = ask(endpoint, text("Describe"))
    # the tag's text counts too, at the simulator's four characters a token
    tag_tokens = len(f"Describe [{media_tag(url)}]") // 4 - len("Describe") // 4
    base = image_tokens(0, 0, detail="low", model="sim")  # it cannot be fetched to measure
    assert remote["usage"]["prompt_tokens"] - alone["usage"]["prompt_tokens"] == base + tag_tokens


def test_every_tag_is_echoed_past_the_word_cut(endpoint):
    pictures = [image(color=1), image(color=2)]
    long_text = " ".join(f"w{n}" for n in range(20))
    answer = ask(endpoint, text(long_text), *(image_part(p) for p in pictures))
    tags = " ".join(f"[{media_tag(p)}]" for p in pictures)
    assert content(answer).endswith(f"w10 w11 {tags}")


def test_expected_reply_matches_the_server(endpoint):
    picture, document, url = image("JPEG"), pdf(pages=2), "https://example.com/a.png"
    answer = ask(
        endpoint,
        image_part(picture, "image/jpeg"),  # before the text: parts' text comes first anyway
        text("Compare these"),
        file_part(document),
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
    )
    expected = expected_reply("Compare these", model="sim", media=[picture, document, url])
    assert content(answer) == expected


def test_expected_reply_matches_the_server_with_a_system_message_and_max_tokens(endpoint):
    picture = image("WEBP")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [text("Name it"), image_part(picture, "image/webp")]},
    ]
    status, answer = post(endpoint, {"model": "sim", "messages": messages, "max_tokens": 4})
    assert status == 200
    expected = expected_reply(
        "Name it", model="sim", system="Be brief.", max_tokens=4, media=[picture]
    )
    assert content(answer) == expected


def test_text_parts_answer_as_the_same_text_sent_as_a_string(endpoint):
    parts = ask(endpoint, text("first line"), text("second line"))
    assert content(parts) == expected_reply("first line\nsecond line", model="sim")


def test_string_content_answers_are_unchanged(endpoint):
    status, answer = post(
        endpoint, {"model": "sim", "messages": [{"role": "user", "content": "Summarize: nice"}]}
    )
    assert status == 200
    assert content(answer) == expected_reply("Summarize: nice", model="sim")
    assert expected_reply("Summarize: nice dress", model="sim") == (
        "sim #c61cbfec: Summarize: nice dress"  # as it was before content parts
    )


def test_invalid_base64_is_refused(endpoint):
    broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!not base64"}}
    error = refusal(endpoint, text("Describe"), broken)
    assert error["message"].startswith("Invalid image")
    assert error["param"] == "messages[0].content[1].image_url.url"


def test_bytes_that_are_not_an_image_are_refused(endpoint):
    error = refusal(endpoint, text("Describe"), image_part(b"plain text, not pixels"))
    assert error["message"].startswith("Invalid image")


def test_an_image_over_the_limit_is_refused_naming_it(endpoint):
    picture = image()
    endpoint.configure(max_image_bytes=len(picture) - 1)
    error = refusal(endpoint, text("Describe"), image_part(picture))
    assert str(len(picture) - 1) in error["message"]


def test_a_file_that_is_not_a_pdf_is_refused(endpoint):
    error = refusal(endpoint, text("Summarise"), file_part(image()))
    assert error["message"].startswith("Invalid file")


def test_an_unknown_part_type_is_refused(endpoint):
    error = refusal(endpoint, text("Listen"), {"type": "input_audio", "input_audio": {}})
    assert error["param"] == "messages[0].content[1].type"


def test_a_refused_part_fails_its_batch_line(endpoint):
    endpoint.configure(batch_seconds=0.05, batch_validation_seconds=0.01)
    lines = [
        {
            "custom_id": name,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "sim", "messages": [{"role": "user", "content": [text("x"), part]}]},
        }
        for name, part in [("good", image_part(image())), ("bad", image_part(b"not an image"))]
    ]
    results = run_batch(endpoint, "\n".join(json.dumps(line) for line in lines).encode())
    assert results["good"]["status_code"] == 200
    assert results["bad"]["status_code"] == 400
    assert results["bad"]["body"]["error"]["message"].startswith("Invalid image")


def test_a_3_mb_body_is_accepted(endpoint):
    noise = Image.frombytes("RGB", (1000, 1000), os.urandom(3_000_000))
    buffer = io.BytesIO()
    noise.save(buffer, format="PNG")
    assert buffer.tell() > 3_000_000  # noise does not compress
    answer = ask(endpoint, text("Describe"), image_part(buffer.getvalue()))
    assert media_tag(buffer.getvalue()) in content(answer)


def test_a_body_over_max_request_bytes_is_413(endpoint):
    endpoint.configure(max_request_bytes=2_000)
    body = {"model": "sim", "messages": [{"role": "user", "content": "x" * 3_000}]}
    status, answer = post(endpoint, body)
    assert status == 413
    assert "2000 bytes" in answer["error"]["message"]


def test_a_3_mb_batch_file_is_uploaded(endpoint):
    sdk = openai.OpenAI(base_url=endpoint.base_url, api_key="unused")
    uploaded = sdk.files.create(file=("in.jsonl", b"{}\n" * 1_000_000), purpose="batch")
    assert uploaded.bytes == 3_000_000


def test_media_parts_are_counted_since_reset(endpoint):
    ask(endpoint, text("Compare"), image_part(image()), file_part(pdf()))
    ask(endpoint, text("No media"))
    assert endpoint.stats()["media_parts"] == 2
    endpoint.reset()
    assert endpoint.stats()["media_parts"] == 0


def run_batch(endpoint: LocalEndpoint, jsonl: bytes) -> dict[str, dict[str, Any]]:
    """Run one batch of these lines; each line's response by its custom_id."""
    sdk = openai.OpenAI(base_url=endpoint.base_url, api_key="unused")
    uploaded = sdk.files.create(file=("in.jsonl", jsonl), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 30
    while batch.status not in ("completed", "failed", "expired") and time.monotonic() < deadline:
        time.sleep(0.05)
        batch = sdk.batches.retrieve(batch.id)
    assert batch.status == "completed"
    results = {}
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            for line in sdk.files.content(file_id).text.splitlines():
                found = json.loads(line)
                results[found["custom_id"]] = found["response"]
    return results
