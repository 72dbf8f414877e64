"""Image and PDF columns (issue 38): over HTTP to the simulator, with real files and a real
DuckDB cache file."""

from __future__ import annotations

import base64
import hashlib
import os

import duckdb
import polars as pl
import pytest

import llm_ops.polars  # noqa: F401  (the .llm namespace)
from llm_ops import (
    BatchMode,
    ConfigError,
    Documents,
    Images,
    Packing,
    SemanticCache,
    estimate,
    request_key,
)
from llm_ops._media_tokens import image_tokens
from llm_ops.testing import expected_reply
from tests.media_files import image, pdf

PNG, JPEG, WEBP = image("PNG", color=1), image("JPEG", color=2), image("WEBP", color=3)


def status(out: pl.DataFrame) -> list[str]:
    return out["completion_status"].cast(pl.String).to_list()


def requests_in(cache_file) -> list[str]:
    with duckdb.connect(str(cache_file), read_only=True) as con:
        return [row[0] for row in con.sql("SELECT request FROM llm_cache").fetchall()]


@pytest.fixture(autouse=True)
def _media_beside(tmp_path, monkeypatch):
    """Media paths are read inside the working directory by default: the tests' files are."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def photos(tmp_path):
    for name, data in (("a.png", PNG), ("b.jpg", JPEG), ("c.webp", WEBP)):
        (tmp_path / name).write_bytes(data)
    return tmp_path


def test_an_image_path_column_is_sent_with_each_rows_prompt(complete, endpoint, photos):
    df = pl.DataFrame(
        {"sku": ["A", "B", "C"], "photo": [str(photos / n) for n in ("a.png", "b.jpg", "c.webp")]}
    )
    out = df.pipe(complete, prompt="What is on the label? {sku}", images="photo")
    assert status(out) == ["ok", "ok", "ok"]
    assert endpoint.stats()["requests"] == 3


def test_each_row_gets_the_answer_to_its_own_image(complete, photos):
    df = pl.DataFrame({"sku": ["A", "B"], "photo": [str(photos / "b.jpg"), str(photos / "c.webp")]})
    out = df.pipe(complete, prompt="Label {sku}?", images="photo")
    assert out["completion"].to_list() == [
        expected_reply("Label A?", model="sim", media=[JPEG]),
        expected_reply("Label B?", model="sim", media=[WEBP]),
    ]


def test_a_binary_expression_is_sent_as_an_image(endpoint, cache):
    df = pl.DataFrame({"photo": [PNG, JPEG]})
    out = df.select(
        pl.col("photo").llm.complete(
            "What is on this label?", model="sim", endpoint=endpoint.base_url, cache=cache
        )
    )
    assert out["photo"].to_list() == [
        expected_reply("What is on this label?", model="sim", media=[data]) for data in (PNG, JPEG)
    ]


def test_a_rerun_is_answered_by_the_cache_and_sends_nothing(complete, endpoint, photos):
    df = pl.DataFrame({"photo": [str(photos / "a.png"), str(photos / "b.jpg")]})
    df.pipe(complete, prompt="Describe it", images="photo")
    endpoint.reset()
    assert status(df.pipe(complete, prompt="Describe it", images="photo")) == ["cached"] * 2
    assert endpoint.stats()["requests"] == 0


def test_the_same_bytes_from_a_path_bytes_or_a_data_url_are_one_request(complete, endpoint, photos):
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    (photos / "copy-under-another-name.bin").write_bytes(PNG)
    paths = pl.DataFrame(
        {"photo": [str(photos / "a.png"), data_url, str(photos / "copy-under-another-name.bin")]}
    )
    paths.pipe(complete, prompt="Describe it", images="photo")
    out = pl.DataFrame({"photo": [PNG]}).pipe(complete, prompt="Describe it", images="photo")
    assert status(out) == ["cached"]
    assert endpoint.stats()["requests"] == 1


def test_a_file_replaced_under_its_old_size_and_time_is_a_new_request(complete, endpoint, photos):
    df = pl.DataFrame({"photo": [str(photos / "a.png")]})
    df.pipe(complete, prompt="Describe it", images="photo")
    before = os.stat(photos / "a.png")
    (photos / "a.png").write_bytes(image("PNG", color=99))  # same size, as cp -p leaves it
    os.utime(photos / "a.png", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert status(df.pipe(complete, prompt="Describe it", images="photo")) == ["ok"]


def test_a_changed_file_is_a_new_request(complete, endpoint, photos):
    df = pl.DataFrame({"photo": [str(photos / "a.png")]})
    df.pipe(complete, prompt="Describe it", images="photo")
    (photos / "a.png").write_bytes(image("PNG", color=200))
    assert status(df.pipe(complete, prompt="Describe it", images="photo")) == ["ok"]
    assert endpoint.stats()["requests"] == 2


def test_the_cache_keeps_the_images_hash_never_its_bytes(complete, cache, photos):
    pl.DataFrame({"photo": [str(photos / "b.jpg")]}).pipe(complete, prompt="?", images="photo")
    (request,) = requests_in(cache)
    assert f"sha256:{hashlib.sha256(JPEG).hexdigest()}" in request
    assert base64.b64encode(JPEG).decode()[:40] not in request


def test_the_key_is_the_documented_request_with_the_image_by_its_hash(complete, endpoint, photos):
    _, report = pl.DataFrame({"photo": [PNG]}).pipe(
        complete, prompt="Describe it", images=Images("photo", detail="low"), return_report=True
    )
    part = {
        "type": "image_url",
        "image_url": {"url": f"sha256:{hashlib.sha256(PNG).hexdigest()}", "detail": "low"},
    }
    request = {
        "endpoint": endpoint.base_url,
        "model": "sim",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it"}, part]}],
    }
    with duckdb.connect(str(report.cache), read_only=True) as con:
        assert con.sql("SELECT key FROM llm_cache").fetchall() == [(request_key(request),)]


def test_a_prompt_with_rare_control_characters_keys_alike_in_sql_and_python(complete, endpoint):
    df = pl.DataFrame({"text": ["a\x1fb", "plain"], "photo": [PNG, PNG]})
    df.pipe(complete, prompt="{text}", images="photo")
    assert status(df.pipe(complete, prompt="{text}", images="photo")) == ["cached", "cached"]


def test_a_missing_file_is_its_rows_rejected_status_and_nothing_is_sent(complete, endpoint, photos):
    df = pl.DataFrame({"photo": [str(photos / "gone.png"), str(photos / "a.png")]})
    out = df.pipe(complete, prompt="Describe it", images="photo")
    assert status(out) == ["rejected", "ok"]
    assert out["completion_error"][0] == f"photo: no such file: {photos / 'gone.png'}; row not sent"
    assert endpoint.stats()["requests"] == 1


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"plain text, not an image", "not an image Pillow can read"),
        (pdf(), "a PDF, not an image: pass its column as documents="),
        (image("BMP"), "a BMP image; endpoints take PNG, JPEG, WebP or GIF"),
    ],
)
def test_bytes_that_are_no_image_the_endpoint_takes_are_rejected(complete, endpoint, value, says):
    out = pl.DataFrame({"photo": [value]}).pipe(complete, prompt="Describe it", images="photo")
    assert status(out) == ["rejected"]
    assert says in out["completion_error"][0]
    assert endpoint.stats()["requests"] == 0


def test_an_image_over_the_limit_is_rejected_before_sending(complete, endpoint):
    big = image("PNG", size=(400, 400))
    out = pl.DataFrame({"photo": [big]}).pipe(
        complete, prompt="Describe it", images=Images("photo", max_bytes=len(big) - 1)
    )
    assert "over the" in out["completion_error"][0]
    assert endpoint.stats()["requests"] == 0


def test_a_null_image_skips_its_row(complete, endpoint):
    out = pl.DataFrame({"photo": [None, PNG]}, schema={"photo": pl.Binary}).pipe(
        complete, prompt="Describe it", images="photo"
    )
    assert status(out) == ["skipped", "ok"]


def test_several_image_columns_go_in_one_request(complete, endpoint, cache):
    df = pl.DataFrame({"front": [PNG], "back": [JPEG]})
    assert status(df.pipe(complete, prompt="Compare", images=["front", "back"])) == ["ok"]
    (request,) = requests_in(cache)
    assert request.index(hashlib.sha256(PNG).hexdigest()) < request.index(
        hashlib.sha256(JPEG).hexdigest()
    )


def test_a_remote_image_url_is_passed_through_and_keyed_by_the_url(complete, endpoint, cache):
    url = "https://example.com/label.png"
    out = pl.DataFrame({"photo": [url]}).pipe(complete, prompt="Describe it", images="photo")
    assert status(out) == ["ok"]
    assert url in requests_in(cache)[0]


def test_a_pdf_column_is_sent_as_a_file_and_keyed_by_its_bytes(complete, endpoint, cache, tmp_path):
    contract = pdf(pages=2)  # made once: a PDF holds the time it was made
    (tmp_path / "contract.pdf").write_bytes(contract)
    out = pl.DataFrame({"contract": [str(tmp_path / "contract.pdf")]}).pipe(
        complete, prompt="Who signs?", documents="contract"
    )
    assert status(out) == ["ok"]
    assert f'"file_data":"sha256:{hashlib.sha256(contract).hexdigest()}"' in requests_in(cache)[0]


def test_a_pdf_can_be_sent_as_page_images(complete, endpoint, cache):
    out = pl.DataFrame({"contract": [pdf(pages=3)]}).pipe(
        complete, prompt="Who signs?", documents=Documents("contract", send_as="pages")
    )
    assert status(out) == ["ok"]
    assert requests_in(cache)[0].count("#page=") == 3
    assert endpoint.stats()["media_parts"] == 3


def test_a_documents_column_sends_its_photos_as_images_and_its_pdfs_as_files(complete, endpoint):
    receipt = pdf(pages=1)
    out = pl.DataFrame({"scan": [receipt, JPEG, b"a text file"]}).pipe(
        complete, prompt="Total?", documents="scan"
    )
    assert out["completion"].to_list()[:2] == [
        expected_reply("Total?", model="sim", media=[data]) for data in (receipt, JPEG)
    ]
    assert out["completion_error"][2] == (
        "scan: neither a PDF nor an image (PNG, JPEG, WebP or GIF); row not sent"
    )


def test_a_pdf_over_the_page_limit_is_rejected(complete, endpoint):
    out = pl.DataFrame({"contract": [pdf(pages=3)]}).pipe(
        complete, prompt="Who signs?", documents=Documents("contract", max_pages=2)
    )
    assert out["completion_error"][0] == "contract: 3 pages, over max_pages=2; row not sent"
    assert endpoint.stats()["requests"] == 0


def test_a_damaged_pdf_is_rejected(complete, endpoint):
    out = pl.DataFrame({"contract": [b"%PDF-1.4 and then nothing"]}).pipe(
        complete, prompt="Who signs?", documents="contract"
    )
    assert "a damaged PDF" in out["completion_error"][0]


def test_a_remote_pdf_is_rejected_with_what_to_do(complete, endpoint):
    out = pl.DataFrame({"contract": ["https://example.com/c.pdf"]}).pipe(
        complete, prompt="Who signs?", documents="contract"
    )
    assert "download it" in out["completion_error"][0]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"images": "nope"}, "media column 'nope' is not in the table"),
        ({"images": "n"}, "it must hold bytes"),
        ({"images": "photo", "packing": Packing(rows_per_request=4)}, "packing cannot carry"),
        ({"images": "photo", "semantic_cache": SemanticCache("sim-embed")}, "semantic cache"),
        ({"images": "photo", "documents": "photo"}, "named by both"),
    ],
)
def test_bad_media_options_are_config_errors_before_sending(complete, endpoint, options, says):
    with pytest.raises(ConfigError, match=says):
        pl.DataFrame({"photo": [PNG], "n": [1]}).pipe(complete, prompt="?", **options)
    assert endpoint.stats()["requests"] == 0


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: Images("photo", detail="huge"), "detail must be"),
        (lambda: Images([]), "images takes a column name"),
        (lambda: Documents("c", send_as="scan"), "send_as must be"),
        (lambda: Documents("c", max_pages=0), "max_pages must be a positive integer"),
    ],
)
def test_media_objects_check_their_fields(make, says):
    with pytest.raises(ConfigError, match=says):
        make()


def test_estimate_counts_image_tokens_by_the_tile_rule(endpoint, cache):
    big = image("PNG", size=(1024, 1024))
    plan = estimate(
        pl.DataFrame({"photo": [big, big, PNG]}),
        prompt="Describe it",
        images=Images("photo", detail="high"),
        model="gpt-4o",
        endpoint=endpoint.base_url,
        cache=cache,
    )
    tokens = image_tokens(1024, 1024, detail="high", model="gpt-4o")
    assert (plan.media_rows, plan.images) == (3, 2)
    assert plan.media_tokens == tokens + image_tokens(8, 8, detail="high", model="gpt-4o")
    assert "rows with media" in str(plan)
    assert endpoint.stats()["requests"] == 0


@pytest.mark.parametrize("kind", ["paths", "bytes"])
def test_a_table_job_on_parquet_sends_its_images_from_chunk_files(endpoint, cache, photos, kind):
    from llm_ops import Client
    from llm_ops.tables import Table

    values = [str(photos / "a.png"), str(photos / "b.jpg")] if kind == "paths" else [PNG, JPEG]
    pl.DataFrame({"sku": ["A", "B", "C"], "photo": [*values, values[0]]}).write_parquet(
        photos / "in.parquet"
    )
    with Client(endpoint=endpoint.base_url, cache=cache) as client:
        table = Table(
            client,
            photos / "in.parquet",
            photos / "out.parquet",
            prompt="Label?",
            model="sim",
            images="photo",
            chunk_size=1,
        )
        table.run()
    out = pl.read_parquet(photos / "out.parquet")
    assert out["completion"].to_list() == [
        expected_reply("Label?", model="sim", media=[data]) for data in (PNG, JPEG, PNG)
    ]
    assert endpoint.stats()["requests"] == 2


def test_a_binary_column_sends_each_distinct_image_once_and_reruns_from_the_cache(
    complete, endpoint
):
    df = pl.DataFrame({"photo": [PNG, JPEG, PNG]})
    df.pipe(complete, prompt="Describe it", images="photo")
    assert status(df.pipe(complete, prompt="Describe it", images="photo")) == ["cached"] * 3
    assert endpoint.stats()["requests"] == 2


def test_batch_mode_sends_images_and_the_cache_keeps_their_hashes(complete, endpoint, cache):
    out = pl.DataFrame({"photo": [PNG, JPEG]}).pipe(
        complete, prompt="Describe it", images="photo", batch=BatchMode(poll_seconds=0.05)
    )
    assert out["completion"].to_list() == [
        expected_reply("Describe it", model="sim", media=[data]) for data in (PNG, JPEG)
    ]
    assert all("sha256:" in r and "base64" not in r for r in requests_in(cache))


def test_a_file_changed_between_keying_and_sending_is_not_sent_under_the_old_key(photos):
    from llm_ops._media import Media, Unusable, describe, sent_parts

    media = Media(images=Images("photo"))
    keyed = describe(str(photos / "a.png"), document=False, media=media)
    (photos / "a.png").write_bytes(JPEG)
    with pytest.raises(Unusable, match="changed after the job keyed it"):
        sent_parts([keyed], media)


def test_a_presigned_urls_signature_never_reaches_the_cache(complete, endpoint, cache):
    url = "https://bucket.example.com/label.png?X-Amz-Signature=s3cr3t&X-Amz-Expires=60"
    out = pl.DataFrame({"photo": [url]}).pipe(complete, prompt="Describe it", images="photo")
    assert status(out) == ["ok"]
    (request,) = requests_in(cache)
    assert "s3cr3t" not in request and "https://bucket.example.com/label.png?sha256=" in request


def test_a_url_with_a_password_is_rejected_before_sending(complete, endpoint):
    out = pl.DataFrame({"photo": ["https://me:pw@example.com/a.png"]}).pipe(
        complete, prompt="Describe it", images="photo"
    )
    assert status(out) == ["rejected"]
    assert "pw" not in out["completion_error"][0]
    assert endpoint.stats()["requests"] == 0


def test_a_price_per_image_is_in_the_estimate_and_the_run_reports_cost(endpoint, cache):
    from llm_ops import Price, llm_complete

    df = pl.DataFrame({"front": [PNG, JPEG], "back": [WEBP, WEBP]})
    options = dict(
        prompt="Compare",
        images=["front", "back"],
        model="sim",
        endpoint=endpoint.base_url,
        cache=cache,
        pricing=Price(per_image=0.01),
    )
    assert estimate(df, **options).cost_min == 0.04
    _, report = llm_complete(df, return_report=True, **options)
    assert report.cost == 0.04


def test_a_price_per_image_is_in_a_batch_runs_cost_at_the_batch_price(complete):
    from llm_ops import Price

    _, report = pl.DataFrame({"photo": [PNG, JPEG]}).pipe(
        complete,
        prompt="Describe it",
        images="photo",
        pricing=Price(per_image=0.01),
        batch=BatchMode(poll_seconds=0.05),
        return_report=True,
    )
    assert report.cost == 0.01  # two images at half the live price


def test_a_request_larger_than_a_batch_file_is_rejected_not_uploaded(complete, endpoint):
    big = image("PNG", size=(200, 200))
    out = pl.DataFrame({"photo": [big, PNG]}).pipe(
        complete,
        prompt="Describe it",
        images="photo",
        batch=BatchMode(poll_seconds=0.05, bytes_per_batch=len(big)),
    )
    assert status(out) == ["rejected", "ok"]
    assert "over a batch file's" in out["completion_error"][0]


def test_estimate_counts_rows_whose_media_cannot_be_sent_apart_from_null_ones(endpoint, cache):
    df = pl.DataFrame({"photo": ["/no/such/file.png", None, "/no/such/file.png"]})
    plan = estimate(
        df, prompt="?", images="photo", model="sim", endpoint=endpoint.base_url, cache=cache
    )
    assert (plan.rejected_rows, plan.skipped_rows) == (2, 1)
    assert "rows rejected" in str(plan)


def test_an_expression_over_a_path_column_that_images_names_sends_the_image(
    endpoint, cache, photos
):
    df = pl.DataFrame({"photo": [str(photos / "b.jpg")]})
    out = df.select(
        pl.col("photo").llm.complete(
            "What is this?", images="photo", model="sim", endpoint=endpoint.base_url, cache=cache
        )
    )
    assert out["photo"].to_list() == [expected_reply("What is this?", model="sim", media=[JPEG])]
