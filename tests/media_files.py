"""Small real image and PDF files for the media tests, made on the spot with Pillow."""

from __future__ import annotations

import io

from PIL import Image


def image(kind: str = "PNG", size: tuple[int, int] = (8, 8), color: int = 0) -> bytes:
    """An image file's bytes: ``kind`` is a Pillow format (PNG, JPEG, WEBP, GIF); ``color``
    (0 to 255) makes images of one size differ."""
    buffer = io.BytesIO()
    Image.new("RGB", size, (color, 255 - color, 128)).save(buffer, format=kind)
    return buffer.getvalue()


def pdf(pages: int = 1, color: int = 0) -> bytes:
    """A PDF file's bytes with ``pages`` pages (each a small image)."""
    buffer = io.BytesIO()
    first, *rest = [Image.new("RGB", (60, 80), (color, n * 20 % 256, 90)) for n in range(pages)]
    first.save(buffer, format="PDF", save_all=True, append_images=rest)
    return buffer.getvalue()
