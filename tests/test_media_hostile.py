"""A table from an untrusted source (issue 46): media values naming devices, FIFOs, files
outside the allowed folders, decompression bombs and PDFs whose pages render to hundreds of
MB make their own rows ``rejected``; the job goes on. Real files, a real FIFO, real /dev and
/proc files, over HTTP to the simulator."""

from __future__ import annotations

import asyncio
import io
import os
import random
import struct
import zlib

import polars as pl
import pytest
from PIL import Image

import llm_ops.polars  # noqa: F401  (the .llm namespace)
from llm_ops import ConfigError, Documents, Images, estimate, options_from_settings
from llm_ops._media import Media, Unusable, describe, sent_parts
from llm_ops._outcome import InFlight
from llm_ops.cli import main
from llm_ops.tables import input_folder
from tests.media_files import image

PNG = image("PNG", color=7)


def status(out: pl.DataFrame) -> list[str]:
    return out["completion_status"].cast(pl.String).to_list()


def errors(out: pl.DataFrame) -> list[str | None]:
    return out["completion_error"].to_list()


def bomb_png(side: int = 50_000) -> bytes:
    """A PNG whose header says ``side`` x ``side`` pixels (2.5 billion at 50,000), in a few
    hundred bytes: its one IDAT chunk holds a little of the first row. Never decoded here."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 1024))
        + chunk(b"IEND", b"")
    )


def noise_pdf(pages: int) -> bytes:
    """A small PDF (about 15 KB for 4 pages) whose every page is a 64 x 64 noise image: each
    renders to a 1536-pixel PNG of about 32 KB."""
    rng = random.Random(46)
    noise = Image.frombytes("RGB", (64, 64), rng.randbytes(64 * 64 * 3))
    buffer = io.BytesIO()
    noise.save(buffer, format="PDF", save_all=True, append_images=[noise] * (pages - 1))
    return buffer.getvalue()


@pytest.fixture(autouse=True)
def _inside(tmp_path, monkeypatch):
    """The working directory is the default allowed folder: the tests' own files are in it."""
    monkeypatch.chdir(tmp_path)


# -- not a regular file --------------------------------------------------------------------


def test_a_symlink_to_dev_zero_is_rejected_not_read(complete, endpoint, tmp_path):
    (tmp_path / "zero.png").symlink_to("/dev/zero")
    out = pl.DataFrame({"photo": ["zero.png", "ok.png"]}).pipe(
        complete, prompt="Describe", images=Images("photo", folders=["/dev", tmp_path])
    )
    (tmp_path / "ok.png").write_bytes(PNG)  # written after: the first row alone is bad
    assert status(out)[0] == "rejected"
    assert "a device, not a regular file: zero.png" in errors(out)[0]


def test_dev_urandom_is_rejected_by_its_folder_first(complete, endpoint):
    out = pl.DataFrame({"photo": ["/dev/urandom"]}).pipe(
        complete, prompt="Describe", images="photo"
    )
    assert status(out) == ["rejected"]
    assert "outside the folders media are read from" in errors(out)[0]
    assert endpoint.stats()["requests"] == 0


def test_a_fifo_is_rejected_without_waiting_for_a_writer(complete, endpoint, tmp_path):
    os.mkfifo(tmp_path / "pipe.png")
    out = pl.DataFrame({"photo": ["pipe.png"]}).pipe(complete, prompt="Describe", images="photo")
    assert status(out) == ["rejected"]
    assert "a FIFO, not a regular file" in errors(out)[0]


def test_a_file_that_says_it_is_empty_is_read_only_up_to_the_limit():
    # /proc files are regular files of size 0 that hold more: the size is never trusted
    media = Media(images=Images("photo", max_bytes=64, folders="/proc"))
    with pytest.raises(Unusable, match="over the 64 bytes limit"):
        describe("/proc/self/maps", document=False, media=media)


def test_a_file_swapped_for_a_fifo_after_keying_is_not_read_to_send(tmp_path):
    (tmp_path / "a.png").write_bytes(PNG)
    media = Media(images=Images("photo"))
    keyed = describe("a.png", document=False, media=media)
    (tmp_path / "a.png").unlink()
    os.mkfifo(tmp_path / "a.png")
    with pytest.raises(Unusable, match="could not be read again to send: a FIFO"):
        sent_parts([keyed], media)


def test_a_file_grown_after_keying_is_read_only_to_its_keyed_size(tmp_path):
    (tmp_path / "a.png").write_bytes(PNG)
    media = Media(images=Images("photo"))
    keyed = describe("a.png", document=False, media=media)
    with open(tmp_path / "a.png", "ab") as grown:
        grown.write(b"\x00" * 10_000)
    with pytest.raises(Unusable, match="changed after the job keyed it"):
        sent_parts([keyed], media)


# -- the allowed folders -------------------------------------------------------------------


@pytest.fixture
def elsewhere(tmp_path_factory):
    folder = tmp_path_factory.mktemp("elsewhere")
    (folder / "secret.png").write_bytes(PNG)
    return folder


@pytest.mark.parametrize(
    "value",
    [
        lambda outside: str(outside / "secret.png"),
        lambda outside: (outside / "secret.png").as_uri(),
        lambda outside: os.path.relpath(outside / "secret.png"),  # ../../elsewhere/secret.png
    ],
    ids=["absolute", "file-url", "dot-dot"],
)
def test_a_path_outside_the_working_directory_is_rejected(complete, endpoint, elsewhere, value):
    out = pl.DataFrame({"photo": [value(elsewhere)]}).pipe(
        complete, prompt="Describe", images="photo"
    )
    assert status(out) == ["rejected"]
    assert "add its folder to folders= of Images or Documents" in errors(out)[0]
    assert endpoint.stats()["requests"] == 0


def test_a_symlink_inside_to_a_file_outside_is_rejected(complete, elsewhere, tmp_path):
    (tmp_path / "innocent.png").symlink_to(elsewhere / "secret.png")
    out = pl.DataFrame({"photo": ["innocent.png"]}).pipe(
        complete, prompt="Describe", images="photo"
    )
    assert status(out) == ["rejected"]
    assert f"innocent.png (which is {elsewhere / 'secret.png'}) is outside" in errors(out)[0]


def test_folders_widen_where_images_and_documents_are_read(complete, endpoint, elsewhere):
    out = pl.DataFrame({"photo": [str(elsewhere / "secret.png")]}).pipe(
        complete, prompt="Describe", images=Images("photo", folders=[elsewhere])
    )
    assert status(out) == ["ok"]


def test_media_folders_is_the_folders_of_both_images_and_documents():
    options = options_from_settings(
        {"images": ["photo"], "documents": ["scan"], "media_folders": ["/srv/media"]}
    )
    assert options["images"].folders == options["documents"].folders == ("/srv/media",)
    with pytest.raises(ConfigError, match="media_folders applies only with images or documents"):
        options_from_settings({"media_folders": ["/srv/media"]})


def test_the_cli_reads_media_beside_its_input_unless_told(endpoint, cache, tmp_path, elsewhere):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "mine.png").write_bytes(PNG)
    table = tmp_path / "tables" / "in.parquet"
    photos = [str(tmp_path / "tables" / "mine.png"), str(elsewhere / "secret.png")]
    pl.DataFrame({"photo": photos}).write_parquet(table)
    job = [str(table), "--prompt", "Describe", "--model", "sim", "--images", "photo"]
    job += ["--base-url", endpoint.base_url, "--cache", str(cache), "--no-progress"]
    assert main(["run", *job, "--output", str(tmp_path / "out.parquet")]) == 0
    assert status(pl.read_parquet(tmp_path / "out.parquet")) == ["ok", "rejected"]
    widened = [*job, "--media-folder", str(elsewhere), "--media-folder", str(tmp_path)]
    assert main(["run", *widened, "--output", str(tmp_path / "wide.parquet")]) == 0
    assert status(pl.read_parquet(tmp_path / "wide.parquet")) == ["cached", "cached"]  # one PNG


def test_the_input_folder_of_a_glob_is_where_it_starts(tmp_path):
    assert input_folder(tmp_path / "data" / "*.parquet") == tmp_path / "data"
    assert input_folder(tmp_path / "one.parquet") == tmp_path


# -- decompression bombs -------------------------------------------------------------------


def test_a_decompression_bomb_is_its_rows_rejected_status(complete, endpoint, tmp_path):
    (tmp_path / "bomb.png").write_bytes(bomb_png())
    assert len(bomb_png()) < 1_000
    (tmp_path / "ok.png").write_bytes(PNG)
    photos = ["ok.png", "ok.png", "bomb.png", "ok.png"]
    out = pl.DataFrame({"photo": photos, "n": range(4)}).pipe(
        complete, prompt="Describe {n}", images="photo"
    )
    assert status(out) == ["ok", "ok", "rejected", "ok"]
    assert "50,000 x 50,000 pixels, over max_pixels=89,478,485" in errors(out)[2]


def test_estimate_counts_a_bomb_as_a_row_that_cannot_be_sent(endpoint, cache, tmp_path):
    (tmp_path / "bomb.png").write_bytes(bomb_png())
    (tmp_path / "ok.png").write_bytes(PNG)
    frame = pl.DataFrame({"photo": ["ok.png", "bomb.png"]})
    plan = estimate(
        frame, prompt="Describe", images="photo", model="gpt-4o", endpoint=endpoint.base_url,
        cache=cache,
    )  # fmt: skip
    assert (plan.requests, plan.rejected_rows) == (1, 1)


def test_max_pixels_lowers_the_bound(complete, tmp_path):
    (tmp_path / "big.png").write_bytes(image("PNG", size=(100, 100)))
    out = pl.DataFrame({"photo": ["big.png"]}).pipe(
        complete, prompt="Describe", images=Images("photo", max_pixels=5_000)
    )
    assert status(out) == ["rejected"]
    assert "100 x 100 pixels, over max_pixels=5,000" in errors(out)[0]


def test_a_bomb_among_a_documents_columns_scans_is_rejected(complete, tmp_path):
    out = pl.DataFrame({"scan": [bomb_png()]}).pipe(complete, prompt="Read", documents="scan")
    assert status(out) == ["rejected"]
    assert "over max_pixels" in errors(out)[0]


# -- rendered pages ------------------------------------------------------------------------


def test_pages_rendering_past_max_bytes_reject_their_row(complete, endpoint):
    small = noise_pdf(pages=4)  # ~15 KB, its pages render to ~130 KB
    documents = Documents("contract", send_as="pages", max_bytes=60_000)
    out = pl.DataFrame({"contract": [small]}).pipe(complete, prompt="Read", documents=documents)
    assert len(small) < 60_000
    assert status(out) == ["rejected"]
    assert "its pages rendered as images hold over 60,000 bytes" in errors(out)[0]
    assert endpoint.stats()["requests"] == 0


def test_a_budget_of_media_in_flight_makes_the_next_request_wait_for_room():
    async def scenario() -> list[str]:
        budget, said = InFlight(limit=10), []

        async def request(name: str, size: int, release: asyncio.Event) -> None:
            async with budget.holding(size):
                said.append(f"{name} holds {budget.held}")
                await release.wait()

        first, second = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(request("a", 6, first))]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(request("b", 6, second)))
        await asyncio.sleep(0)
        said.append(f"waiting, {budget.held} held")
        first.set()
        second.set()
        await asyncio.gather(*tasks)
        return [*said, f"{budget.held} held at the end"]

    assert asyncio.run(scenario()) == [
        "a holds 6",
        "waiting, 6 held",
        "b holds 6",
        "0 held at the end",
    ]


def test_a_request_larger_than_the_whole_budget_is_sent_alone():
    async def scenario() -> int:
        budget = InFlight(limit=10)
        async with budget.holding(50):
            return budget.held

    assert asyncio.run(scenario()) == 10


def test_a_pdf_sent_as_pages_holds_what_its_pages_may_render_to_at_most_max_bytes():
    from llm_ops._media import PAGE_BYTES, sent_bytes

    pages = Media(documents=Documents("contract", send_as="pages", max_bytes=30 * 2**20))
    files = Media(documents=Documents("contract"))
    one_page, many = ({"kind": "document", "bytes": 900, "pages": n} for n in (1, 100))
    assert sent_bytes([one_page], pages) == (PAGE_BYTES + 2) // 3 * 4
    assert sent_bytes([many], pages) == 40 * 2**20  # 30 MiB as base64
    assert sent_bytes([many], files) == 1_200


def test_a_request_gives_back_what_its_media_did_not_take_once_read():
    from llm_ops._outcome import Request

    url = "data:image/png;base64," + "A" * 78  # 100 characters
    sent = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    budget = InFlight(limit=10_000)
    request = Request("k", [], "", load=lambda: sent, media_bytes=5_000, in_flight=budget)

    async def scenario() -> list[int]:
        async with request.holding():
            before = budget.held
            await request.sent_messages()
            return [before, budget.held]

    assert [*asyncio.run(scenario()), budget.held] == [5_000, 100, 0]
