"""Image columns (issue 38): 10,000 rows of 200 KB images, llm_ops against the hand-written loop.

    python benchmarks/media.py                  # 10,000 rows (and 2,000 for the Binary column)
    python benchmarks/media.py --quick          # 300 rows
    python benchmarks/media.py --rows 1000 --binary-rows 0
    python benchmarks/media.py --rows 0 --binary-rows 0   # the PDF pages runs only

Data: one PNG of seeded RGB noise (258 x 258 pixels, about 200 KB: noise does not compress) is
encoded once with Pillow; each of the ``--rows`` files in a temporary folder is that PNG with
its row number appended after the IEND chunk. Pillow and the simulator ignore bytes after
IEND, but the sha256 differs, so every row is a distinct image (and a distinct request). The
table is a Parquet file with a ``photo`` path column and a short ``sku`` column. The folder is
removed when the script ends.

Sides, each in a fresh process against one ``LocalEndpoint()`` (no latency) that this script
starts, at the same concurrency:

* baseline: ``AsyncOpenAI`` + ``asyncio.Semaphore`` + ``asyncio.gather``, as
  ``benchmarks/baseline.py``, each row's file read, base64-encoded and sent as an
  ``image_url`` data URL in one chat request; no cache.
* llm_ops: ``llm_complete(..., images="photo")`` with a fresh cache file.
* llm_ops rerun: the same call on the same cache file; it must send nothing.
* the same three over a ``Binary`` column (the image bytes in the frame, built in the worker
  before the clock starts) for ``--binary-rows`` rows (default 2,000: 10,000 would hold 2 GB
  in the frame before anything is sent).

PDFs sent as pages (``Documents(send_as="pages")``), each in a fresh process too:

* pages: ``--pdf-rows`` distinct PDFs (default 64) of ``--pdf-pages`` pages (default 8), every
  page drawing one shared 256 x 256 noise JPEG (a PDF of 60 KB), each page rendered to a
  1,536-pixel PNG of about 300 KB: 512 page images, about 3 MB of base64 a request.
* pages, hostile: ``--hostile-rows`` distinct PDFs (default 4) shaped as issue 46's: 100 pages
  sharing one 512 x 512 noise JPEG (250 KB), whose pages would render to about 540 MB each
  (4 MB a page). Each row must come back ``rejected`` once its pages pass the 32 MB
  ``max_bytes``, and the peak RSS stay bounded.

Peak RSS is the worker's ``ru_maxrss``; client CPU its user + system time (all threads) during
the call, endpoint CPU that of the endpoint's process meanwhile: on a small machine both share
the cores. Requests and media parts are what the endpoint counted (``stats()``), reset before
each side. The cache size is that of the cache file and of any file or folder next to it
with its name as prefix (the journal); "image bytes in cache" searches them for a raw and a
base64 slice of the noise, which every image shares.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODEL = "sim"
PROMPT = "What is on the label of {sku}? Answer in one line."
RESULT_PREFIX = "RESULT "
SIDE = 258  # pixels: 258 x 258 x 3 bytes of noise is a PNG of about 200 KB
Result = dict[str, Any]


# --------------------------------------------------------------------------------------------
# Data


def noise_png(seed: int = 0) -> bytes:
    import io

    from PIL import Image

    noise = random.Random(seed).randbytes(SIDE * SIDE * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (SIDE, SIDE), noise).save(buffer, format="PNG")
    return buffer.getvalue()


def shared_image_pdf(pages: int, side: int, tag: int) -> bytes:
    """A PDF of ``pages`` US-letter pages, each drawing the same ``side`` x ``side`` noise
    JPEG (one image object, so the file stays small however many pages); ``tag`` (a comment
    on its second line) makes PDFs of one shape distinct."""
    import io

    from PIL import Image

    noise = Image.frombytes("RGB", (side, side), random.Random(side).randbytes(side * side * 3))
    buffer = io.BytesIO()
    noise.save(buffer, format="JPEG", quality=90)
    jpeg = buffer.getvalue()
    kids = " ".join(f"{5 + n} 0 R" for n in range(pages)).encode()
    content = b"q 612 0 0 792 0 0 cm /Im0 Do Q"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages,
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB "
        b"/BitsPerComponent 8 /Filter /DCTDecode /Length %d >>\nstream\n"
        % (side, side, len(jpeg))
        + jpeg
        + b"\nendstream",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        *[
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources "
            b"<< /XObject << /Im0 3 0 R >> >> /Contents 4 0 R >>"
        ]
        * pages,
    ]
    out = bytearray(b"%%PDF-1.4\n%%llm-ops-bench %08d\n" % tag)
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def write_pdfs(folder: Path, name: str, rows: int, pages: int, side: int) -> Path:
    """``rows`` distinct PDFs of ``pages`` pages in ``folder`` and the table naming them."""
    paths = []
    for row in range(rows):
        path = folder / f"{name}-{row:05d}.pdf"
        path.write_bytes(shared_image_pdf(pages, side, row))
        paths.append(str(path))
    table = folder / f"{name}.parquet"
    pl.DataFrame({"doc": [f"DOC-{row:05d}" for row in range(rows)], "pdf": paths}).write_parquet(
        table
    )
    return table


def write_images(folder: Path, rows: int) -> Path:
    """``rows`` distinct PNG files in ``folder`` and the Parquet table naming them."""
    png = noise_png()
    paths = []
    for row in range(rows):
        path = folder / f"photo-{row:06d}.png"
        path.write_bytes(png + b"llm-ops-bench row %08d" % row)  # after IEND: a new sha256
        paths.append(str(path))
    table = folder / "photos.parquet"
    skus = [f"SKU-{row:06d}" for row in range(rows)]
    pl.DataFrame({"sku": skus, "photo": paths}).write_parquet(table)
    return table


# --------------------------------------------------------------------------------------------
# The worker: one side in a fresh process


async def baseline_media(
    prompts: list[str], images: list[str] | list[bytes], *, base_url: str, concurrency: int
) -> list[str | None]:
    """The hand-written loop: one chat request per row, its image inlined as a data URL."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="x")
    semaphore = asyncio.Semaphore(concurrency)

    async def one(prompt: str, image: str | bytes) -> str | None:
        async with semaphore:
            try:
                data = Path(image).read_bytes() if isinstance(image, str) else image
                url = "data:image/png;base64," + base64.b64encode(data).decode()
                response = await client.chat.completions.create(
                    model=MODEL,
                    messages=[
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": prompt},
                                {"type": "image_url", "image_url": {"url": url}},
                            ],
                        }
                    ],
                )
                return response.choices[0].message.content
            except Exception:  # a failure becomes a failed row
                return None

    try:
        return await asyncio.gather(*(one(p, i) for p, i in zip(prompts, images, strict=True)))
    finally:
        await client.close()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_pages_worker(side: str, params: dict[str, Any]) -> Result:
    """A PDF table sent as page images: wall time, peak RSS and what became of the rows."""
    import llm_ops
    from llm_ops import Documents, llm_complete

    frame = pl.read_parquet(params["table"])
    rss_before = rss_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    out = llm_complete(
        frame,
        prompt="Summarize {doc}.",
        documents=Documents("pdf", send_as="pages", folders=[Path(params["table"]).parent]),
        model=MODEL,
        endpoint=params["base_url"],
        cache=params["cache"],
        concurrency=params["concurrency"],
        progress=False,
    )
    statuses = out["completion_status"].cast(pl.String).to_list()
    return {
        "side": side,
        "rows": frame.height,
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "ok": statuses.count("ok"),
        "rejected": statuses.count("rejected"),
        "llm_ops": str(Path(llm_ops.__file__ or "").parent),
    }


def run_worker(side: str, params: dict[str, Any]) -> Result:
    import llm_ops
    from llm_ops import Images, llm_complete
    from llm_ops.testing import expected_reply

    if side.startswith("pages"):
        return run_pages_worker(side, params)

    frame = pl.read_parquet(params["table"]).head(params["rows"])
    binary = side.endswith("binary")
    if binary:
        frame = frame.with_columns(
            pl.Series("photo", [Path(p).read_bytes() for p in frame["photo"]], dtype=pl.Binary)
        )
    prompts = [PROMPT.format(sku=sku) for sku in frame["sku"]]
    rss_before = rss_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    if side.startswith("baseline"):
        answers = asyncio.run(
            baseline_media(
                prompts,
                frame["photo"].to_list(),
                base_url=params["base_url"],
                concurrency=params["concurrency"],
            )
        )
    else:
        out = llm_complete(
            frame,
            prompt=PROMPT,
            images=Images("photo", folders=[Path(params["table"]).parent]),
            model=MODEL,
            endpoint=params["base_url"],
            cache=params["cache"],
            concurrency=params["concurrency"],
            progress=False,
        )
        answers = out["completion"].to_list()
    result: Result = {
        "side": side,
        "rows": frame.height,
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "llm_ops": str(Path(llm_ops.__file__ or "").parent),
    }
    images = frame["photo"].to_list()
    result["correct"] = sum(
        answer == expected_reply(prompt, model=MODEL, media=[Path(image).read_bytes()])
        if isinstance(image, str)
        else answer == expected_reply(prompt, model=MODEL, media=[image])
        for prompt, image, answer in zip(prompts, images, answers, strict=True)
    )
    return result


# --------------------------------------------------------------------------------------------
# The orchestrator


def spawn(side: str, params: dict[str, Any]) -> Result:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", side, json.dumps(params)]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, env=env, timeout=3600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker {side} exited {done.returncode}:\n{done.stderr[-4000:]}")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: Result = json.loads(line.removeprefix(RESULT_PREFIX))
            if not Path(result["llm_ops"]).is_relative_to(REPO):
                raise RuntimeError(f"the worker imported {result['llm_ops']}, not {REPO}")
            return result
    raise RuntimeError(f"worker {side} printed no result:\n{done.stdout[-2000:]}")


def cache_files(cache: Path) -> list[Path]:
    """The cache file and whatever lies next to it under its name (a WAL, a journal folder)."""
    found = []
    for path in cache.parent.glob(cache.name + "*"):
        found += [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    return found


def cache_bytes(cache: Path) -> int:
    return sum(path.stat().st_size for path in cache_files(cache))


def image_bytes_in(cache: Path, png: bytes) -> bool:
    """Whether the cache's files hold a 48-byte slice of the noise, raw or as base64."""
    raw = png[len(png) // 2 : len(png) // 2 + 48]
    encoded = base64.b64encode(png)
    b64 = encoded[len(encoded) // 2 : len(encoded) // 2 + 64]
    for path in cache_files(cache):
        data = path.read_bytes()
        if raw in data or b64 in data:
            return True
    return False


def fmt(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def ratio(a: float, b: float) -> str:
    return "n/a" if not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}x"


HEADERS = (
    "side",
    "rows",
    "wall s",
    "rows/s",
    "RSS before MB",
    "peak RSS MB",
    "client CPU s",
    "endpoint CPU s",
    "requests sent",
    "media parts received",
    "cache file MB",
    "cache KB/row",
    "image bytes in cache",
    "correct rows",
)
LABELS = {
    "baseline": "baseline (AsyncOpenAI loop), paths",
    "llm_ops": "llm_ops, paths, fresh cache",
    "rerun": "llm_ops rerun, paths, same cache",
    "baseline binary": "baseline (AsyncOpenAI loop), Binary column",
    "llm_ops binary": "llm_ops, Binary column, fresh cache",
    "rerun binary": "llm_ops rerun, Binary column, same cache",
}


def row_of(label: str, r: Result) -> list[str]:
    cached = "cache_mb" in r
    return [
        label,
        fmt(r["rows"]),
        fmt(r["wall"], 2),
        fmt(r["rows"] / max(r["wall"], 1e-9)),
        fmt(r["rss_before_mb"]),
        fmt(r["peak_rss_mb"]),
        fmt(r["cpu"], 1),
        fmt(r["endpoint_cpu"], 1),
        fmt(r["requests"]),
        fmt(r["media_parts"]),
        fmt(r["cache_mb"], 2) if cached else "(no cache)",
        fmt(r["cache_kb_per_row"], 2) if cached else "",
        ("yes" if r["image_bytes_in_cache"] else "no") if cached else "",
        fmt(r["correct"]),
    ]


def ratio_row(label: str, a: Result, b: Result) -> list[str]:
    return [
        f"**ratio {label}**",
        "",
        ratio(a["wall"], b["wall"]),
        ratio(a["rows"] / a["wall"], b["rows"] / b["wall"]),
        "",
        ratio(a["peak_rss_mb"], b["peak_rss_mb"]),
        ratio(a["cpu"], b["cpu"]),
        ratio(a["endpoint_cpu"], b["endpoint_cpu"]),
        ratio(a["requests"], b["requests"]),
        ratio(a["media_parts"], b["media_parts"]),
        "",
        "",
        "",
        "",
    ]


def table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join(" --- " for _ in HEADERS) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


PAGES_HEADERS = (
    "side",
    "PDFs",
    "pages each",
    "PDF KB",
    "wall s",
    "pages/s",
    "RSS before MB",
    "peak RSS MB",
    "client CPU s",
    "requests sent",
    "page images received",
    "rows ok",
    "rows rejected",
)


def pages_table(rows: list[list[str]]) -> str:
    lines = [
        "| " + " | ".join(PAGES_HEADERS) + " |",
        "|" + "|".join(" --- " for _ in PAGES_HEADERS) + "|",
    ]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def run_pages(args: argparse.Namespace, endpoint: Any, scratch: Path) -> str:
    """The PDF runs: a table of PDFs sent as pages, and issue 46's hostile PDFs."""
    from run import endpoint_cpu_seconds

    plans = [
        ("pages", args.pdf_rows, args.pdf_pages, 256),
        ("pages, hostile", args.hostile_rows, 100, 512),
    ]
    body = []
    for side, rows, pages, image_side in plans:
        if not rows:
            continue
        name = side.replace(", ", "-")
        table_file = write_pdfs(scratch, name, rows, pages, image_side)
        endpoint.reset()
        endpoint_cpu = endpoint_cpu_seconds(endpoint)
        params = {
            "table": str(table_file),
            "base_url": endpoint.base_url,
            "concurrency": args.concurrency,
            "cache": str(scratch / f"{name}.duckdb"),
        }
        result = spawn(side, params)
        result["endpoint_cpu"] = endpoint_cpu_seconds(endpoint) - endpoint_cpu
        stats = endpoint.stats()
        sent_pages = stats["media_parts"]
        print(f"{side}: {result['wall']:.1f} s", file=sys.stderr, flush=True)
        body.append(
            [
                side,
                fmt(rows),
                fmt(pages),
                fmt(len(shared_image_pdf(pages, image_side, 0)) / 1000),
                fmt(result["wall"], 2),
                fmt(sent_pages / max(result["wall"], 1e-9), 1),
                fmt(result["rss_before_mb"]),
                fmt(result["peak_rss_mb"]),
                fmt(result["cpu"], 1),
                fmt(stats["requests"]),
                fmt(sent_pages),
                fmt(result["ok"]),
                fmt(result["rejected"]),
            ]
        )
    if not body:
        return ""
    return (
        f'PDFs sent as page images (`Documents(send_as="pages")`, defaults: 32 MB of '
        f"rendered pages a request, 256 MiB of media in flight), concurrency {args.concurrency}."
        "\n\n" + pages_table(body)
    )


def run_all(args: argparse.Namespace) -> str:
    # here, not at the top: run.py imports llm_ops, which the baseline's workers must not carry
    from run import endpoint_cpu_seconds

    from llm_ops.testing import LocalEndpoint

    png = noise_png()
    with tempfile.TemporaryDirectory(prefix="llm-ops-media-") as folder:
        scratch = Path(folder)
        started = time.perf_counter()
        table_file = write_images(scratch, max(args.rows, args.binary_rows))
        print(
            f"wrote {max(args.rows, args.binary_rows):,} images of {len(png):,} bytes (+ a "
            f"trailer) in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        results: dict[str, Result] = {}
        with LocalEndpoint() as endpoint:
            pages = run_pages(args, endpoint, scratch)
            plans = []
            if args.rows:
                plans = [("baseline", args.rows, None), ("llm_ops", args.rows, "paths.duckdb")]
                plans.append(("rerun", args.rows, "paths.duckdb"))
            if args.binary_rows:
                plans += [
                    ("baseline binary", args.binary_rows, None),
                    ("llm_ops binary", args.binary_rows, "binary.duckdb"),
                    ("rerun binary", args.binary_rows, "binary.duckdb"),
                ]
            for side, rows, cache in plans:
                endpoint.reset()
                endpoint_cpu = endpoint_cpu_seconds(endpoint)
                params = {
                    "table": str(table_file),
                    "rows": rows,
                    "base_url": endpoint.base_url,
                    "concurrency": args.concurrency,
                    "cache": str(scratch / cache) if cache else False,
                }
                result = spawn(side, params)
                result["endpoint_cpu"] = endpoint_cpu_seconds(endpoint) - endpoint_cpu
                stats = endpoint.stats()
                result["requests"] = stats["requests"]
                result["media_parts"] = stats["media_parts"]
                if cache:
                    size = cache_bytes(scratch / cache)
                    result["cache_mb"] = size / 2**20
                    result["cache_kb_per_row"] = size / 1024 / rows
                    result["image_bytes_in_cache"] = image_bytes_in(scratch / cache, png)
                results[side] = result
                print(f"{side}: {result['wall']:.1f} s", file=sys.stderr, flush=True)
    if not results:
        return pages
    body = [row_of(LABELS[side], r) for side, r in results.items()]
    if args.rows:
        body.append(ratio_row("llm_ops / baseline, paths", results["llm_ops"], results["baseline"]))
        body.append(ratio_row("rerun / baseline, paths", results["rerun"], results["baseline"]))
    if args.binary_rows:
        body.append(
            ratio_row(
                "llm_ops / baseline, Binary",
                results["llm_ops binary"],
                results["baseline binary"],
            )
        )
    return (
        f"{args.rows:,} rows of distinct {len(png) / 1000:.0f} KB PNG images (path column"
        + (f"; {args.binary_rows:,} rows as a Binary column" if args.binary_rows else "")
        + f"), local simulator with no latency, concurrency {args.concurrency}, "
        f"{os.cpu_count()} cores.\n\n" + table(body) + ("\n\n" + pages if pages else "")
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=None, help="rows of the path column")
    parser.add_argument(
        "--binary-rows", type=int, default=None, help="rows of the Binary column (0: skip)"
    )
    parser.add_argument("--quick", action="store_true", help="300 rows (and 300 Binary)")
    parser.add_argument("--pdf-rows", type=int, default=None, help="PDFs sent as pages (0: skip)")
    parser.add_argument("--pdf-pages", type=int, default=8, help="pages of each of those PDFs")
    parser.add_argument(
        "--hostile-rows", type=int, default=None, help="100-page hostile PDFs (0: skip)"
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--worker", nargs=2, metavar=("SIDE", "JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rows is None:
        args.rows = 300 if args.quick else 10_000
    if args.binary_rows is None:
        args.binary_rows = min(args.rows, 300 if args.quick else 2_000)
    if args.pdf_rows is None:
        args.pdf_rows = 8 if args.quick else 64
    if args.hostile_rows is None:
        args.hostile_rows = 1 if args.quick else 4
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        side, params = args.worker
        print(RESULT_PREFIX + json.dumps(run_worker(side, json.loads(params))), flush=True)
        return 0
    print(run_all(args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
