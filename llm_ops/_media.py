"""Image and PDF columns: what each value is, how it is keyed, and what is sent.

A media value is a ``Binary`` column's bytes, or a ``String`` column's local path, ``file://``
URL, ``data:`` URL or (images only) ``http(s)://`` URL. Each distinct value is read once when a
job is planned (:func:`describe_values`): its format is told from its bytes (never from a file
name), its size and (for a PDF) its page count are checked against the limits, its pixel size
is read for the estimate, and its sha256 is taken. What comes out is a *descriptor* (a small
JSON object) that says where to find the bytes again and what they are; a bad value comes out
as the reason its row is ``rejected``, before anything is sent.

* The request key holds :func:`keyed_parts`: the sha256 of the bytes (see :mod:`llm_ops._key`),
  so the cache stores that reference and never the bytes.
* What is sent is :func:`sent_parts`: the bytes read again (a path whose bytes changed since
  they were keyed is refused rather than sent under the old key), as ``data:`` URLs in OpenAI
  ``image_url`` and ``file`` content parts; a remote image URL is passed through as it is.
* A ``Binary`` column is hashed a slice of rows at a time (:func:`describe_binary`), and its
  descriptors name the row that holds the bytes; :func:`attach_bytes` gathers them, without a
  copy, beside the requests to send only (a table job's chunk files carry them, to stand
  alone). A path keeps only the path; a ``data:`` URL keeps its base64 text.
* The bytes are read and encoded just before a request is sent, in a thread
  (:attr:`~llm_ops._outcome.Request.load`), so only the requests in flight hold them.

Pillow reads image headers and pypdfium2 counts (and renders) PDF pages: the ``media`` extra.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import io
import os
import stat
import struct
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import orjson
import polars as pl

from ._dialects import CANONICAL
from ._key import canonical_json
from ._media_tokens import DOCUMENT_TOKENS_PER_PAGE, ImageDetail, image_tokens
from .exceptions import ConfigError, LlmOpsError

SendAs = Literal["file", "pages"]
IMAGE_TYPES: Mapping[str, str] = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
}
"""The image formats OpenAI-compatible endpoints take, and their MIME types."""
PDF = "application/pdf"
MAX_IMAGE_BYTES = 20 * 2**20  # OpenAI's limit per image
MAX_DOCUMENT_BYTES = 32 * 2**20  # OpenAI's limit per file part
PAGE_PIXELS = 1536  # the longest side of a page rendered as an image
# The most a rendered page's PNG can hold: every pixel's 4 bytes (RGBA), and room for PNG's
# row filters and zlib's stored blocks on incompressible pages.
PAGE_BYTES = PAGE_PIXELS * PAGE_PIXELS * 4 + 2**16
MAX_PIXELS = 89_478_485  # Pillow's own warning limit (Image.MAX_IMAGE_PIXELS)
REMOTE_SIZE = (1024, 1024)  # what a remote image is counted as: it is never fetched here


def _columns(name: str, columns: object) -> tuple[str, ...]:
    names = [columns] if isinstance(columns, str) else columns
    if (
        not isinstance(names, Sequence)
        or not names
        or not all(isinstance(column, str) and column for column in names)
    ):
        raise ConfigError(f"{name} takes a column name or a list of them, got {columns!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{name} names each column once, got {list(names)!r}")
    return tuple(names)


def _limit(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


Folders = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def _folders(name: str, folders: object) -> tuple[str, ...] | None:
    """``folders=`` as a tuple of texts (``None``: the working directory when read)."""
    if folders is None:
        return None
    given = [folders] if isinstance(folders, str | os.PathLike) else folders
    if (
        not isinstance(given, Sequence)
        or not given
        or not all(isinstance(f, str | os.PathLike) and os.fspath(f) for f in given)
    ):
        raise ConfigError(f"{name} folders takes a folder or a list of them, got {folders!r}")
    return tuple(os.fspath(folder) for folder in given)


def allowed_folders(folders: tuple[str, ...] | None) -> tuple[Path, ...]:
    """The folders a media path may be read from, resolved (symlinks and all) now: ``None``
    is the working directory."""
    return tuple(Path(f).expanduser().resolve() for f in folders or (os.getcwd(),))


@dataclass(frozen=True)
class Images:
    """Image columns sent with each row's prompt: ``images=`` of a completion call (a column
    name or a list of them stands for ``Images(columns)``).

    A ``Binary`` column holds image bytes; a ``String`` column a local path, a ``file://``
    URL, a ``data:`` URL or an ``http(s)://`` URL (passed through, and keyed by the URL).
    PNG, JPEG, WebP and GIF are sent, told apart by their bytes.

    Parameters
    ----------
    columns
        The image column(s), sent in this order after the prompt's text.
    detail
        OpenAI's ``"low"``, ``"high"`` or ``"auto"``: how closely the model looks, and what
        an image costs; part of the cache key. Unset, the endpoint's default.
    max_bytes
        The largest image sent; a larger one makes its row ``rejected`` (OpenAI: 20 MB).
        A file is read only up to this many bytes, whatever size it claims.
    max_pixels
        The most pixels (width x height, read from the image's header, never decoded) an
        image may have; a larger one, a decompression bomb say, makes its row ``rejected``
        (default: Pillow's own limit, about 89.5 million).
    folders
        The folders a path or ``file://`` value may be read from, after symlinks are
        resolved; one outside them makes its row ``rejected``. A folder or a list of them;
        unset, the working directory. A table from an untrusted source chooses which files
        are read and sent: see the media guide's section on safety.

    Examples
    --------
    >>> from llm_ops import Images
    >>> Images("photo", detail="low", folders="photos")
    Images(columns=('photo',), detail='low', max_bytes=20971520, max_pixels=89478485, folders=('photos',))
    """  # noqa: E501

    columns: str | Sequence[str]
    detail: ImageDetail | None = None
    max_bytes: int = MAX_IMAGE_BYTES
    max_pixels: int = MAX_PIXELS
    folders: Folders | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", _columns("images", self.columns))
        if self.detail is not None and self.detail not in get_args(ImageDetail):
            raise ConfigError(f"detail must be 'low', 'high' or 'auto', got {self.detail!r}")
        _limit("images max_bytes", self.max_bytes)
        _limit("max_pixels", self.max_pixels)
        object.__setattr__(self, "folders", _folders("images", self.folders))


@dataclass(frozen=True)
class Documents:
    """PDF columns sent with each row's prompt: ``documents=`` of a completion call (a column
    name or a list of them stands for ``Documents(columns)``).

    A ``Binary`` column holds PDF bytes; a ``String`` column a local path, a ``file://`` URL
    or a ``data:`` URL. llm-ops fetches nothing but the endpoint, so a remote PDF must be
    downloaded first. An image among them (a photographed receipt beside scanned PDFs) is
    sent as an image.

    Parameters
    ----------
    columns
        The PDF column(s), sent after the images, in this order.
    send_as
        ``"file"``: each PDF as an OpenAI ``file`` content part (the model reads its text and
        its pages). ``"pages"``: its pages rendered to PNG images (by pypdfium2), for endpoints
        that take images but no files.
    max_pages
        The most pages a PDF may have; a longer one makes its row ``rejected``.
    max_bytes
        The largest PDF sent; a larger one makes its row ``rejected`` (OpenAI: 32 MB). A
        file is read only up to this many bytes, whatever size it claims. With
        ``send_as="pages"``, the most its rendered pages may hold: a PDF whose pages render
        to more makes its row ``rejected``.
    folders
        The folders a path or ``file://`` value may be read from, after symlinks are
        resolved; one outside them makes its row ``rejected``. A folder or a list of them;
        unset, the working directory.

    Examples
    --------
    >>> from llm_ops import Documents
    >>> Documents("contract", send_as="pages", max_pages=20)
    Documents(columns=('contract',), send_as='pages', max_pages=20, max_bytes=33554432, folders=None)
    """  # noqa: E501

    columns: str | Sequence[str]
    send_as: SendAs = "file"
    max_pages: int = 100
    max_bytes: int = MAX_DOCUMENT_BYTES
    folders: Folders | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", _columns("documents", self.columns))
        if self.send_as not in get_args(SendAs):
            raise ConfigError(f"send_as must be 'file' or 'pages', got {self.send_as!r}")
        _limit("max_pages", self.max_pages)
        _limit("documents max_bytes", self.max_bytes)
        object.__setattr__(self, "folders", _folders("documents", self.folders))


ImagesOption = str | Sequence[str] | Images
DocumentsOption = str | Sequence[str] | Documents


@dataclass(frozen=True)
class Media:
    """A job's media columns: what its requests carry besides text (part of the key)."""

    images: Images | None = None
    documents: Documents | None = None

    @classmethod
    def of(cls, images: object, documents: object) -> Media | None:
        """The media of ``images=`` and ``documents=``, or ``None`` without either."""
        if images is None and documents is None:
            return None
        if images is not None and not isinstance(images, Images):
            images = Images(images)  # type: ignore[arg-type]  # Images checks what it is
        if documents is not None and not isinstance(documents, Documents):
            documents = Documents(documents)  # type: ignore[arg-type]
        media = cls(images, documents)
        both = set(media.image_columns) & set(media.document_columns)
        if both:
            raise ConfigError(f"column(s) {sorted(both)} are named by both images= and documents=")
        _require_libraries(media)
        return media

    @property
    def image_columns(self) -> tuple[str, ...]:
        return tuple(self.images.columns) if self.images else ()

    @property
    def document_columns(self) -> tuple[str, ...]:
        return tuple(self.documents.columns) if self.documents else ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Every media column, in the order its parts are sent."""
        return (*self.image_columns, *self.document_columns)

    def check(self, schema: Mapping[str, pl.DataType]) -> None:
        """Each media column is in the input, and holds bytes or text."""
        for column in self.columns:
            if column not in schema:
                raise ConfigError(
                    f"media column {column!r} is not in the table; available columns: "
                    f"{', '.join(schema)}"
                )
            if schema[column] not in (pl.Binary(), pl.String()):
                raise ConfigError(
                    f"media column {column!r} is {schema[column]}: it must hold bytes (Binary) "
                    "or paths and URLs (String)"
                )


def _require_libraries(media: Media) -> None:
    missing = []
    for module, needed in (("PIL", media.images), ("pypdfium2", media.documents)):
        if needed is None:
            continue
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigError(
            f"image and PDF columns need {' and '.join(missing)}: pip install 'llm-ops[media]'"
        )


# -- reading a value --------------------------------------------------------------------------


class Unusable(LlmOpsError):
    """A media value that cannot be sent; its message is the row's error. Caught where a row
    is planned or sent: it never leaves llm-ops."""


def describe(
    value: str, *, document: bool, media: Media, folders: tuple[Path, ...] | None = None
) -> dict[str, Any]:
    """:func:`read_value`, remembered for a local file while its inode says it is unchanged:
    a table job keys its rows when it plans and again when it writes, and a rerun keys them
    all again, so a file is read and hashed once per process, not three times. ``folders``:
    where a path may be read from (see :func:`allowed_folders`); by default its option's.

    The inode's change time is part of what is compared, not only the size and modification
    time: tools that keep a file's modification time (``cp -p``, ``rsync -t``, ``tar x``) can
    replace its bytes under the same size and time, and a remembered hash would then be the
    old file's, answered from the cache with the old image's answer. No tool sets ``ctime``.
    """
    if folders is None:  # resolved once per job by describe_values, else here
        folders = allowed_folders(_folders_of(media, document))
    if "://" not in value[:12] and not value.startswith("data:"):
        try:
            found = os.stat(os.path.expanduser(value))
        except OSError:
            pass  # read_value says why
        else:
            inode = (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)
            return dict(_described_file(value, inode, document, media, folders))
    return read_value(value, document=document, media=media, folders=folders)


@functools.lru_cache(maxsize=2**17)  # a descriptor is a few hundred bytes
def _described_file(
    value: str,
    inode: tuple[int, int, int, int],
    document: bool,
    media: Media,
    folders: tuple[Path, ...],
) -> Mapping[str, Any]:
    return read_value(value, document=document, media=media, folders=folders)


def _folders_of(media: Media, document: bool) -> tuple[str, ...] | None:
    option = media.documents if document else media.images
    return None if option is None else option.folders  # type: ignore[return-value]


def read_value(
    value: str, *, document: bool, media: Media, folders: tuple[Path, ...] | None = None
) -> dict[str, Any]:
    """The descriptor of a text value (a path or a URL), or :class:`Unusable` saying why it
    cannot be sent. A path is read only inside ``folders`` (default: those of the value's
    option, see :func:`allowed_folders`), only if it is a regular file, and only up to the
    size limit.

    A descriptor holds ``kind`` (``"image"`` or ``"document"``), ``sha256``, ``mime``,
    ``bytes``, ``width``/``height`` (images) or ``pages`` (documents), and where its bytes are:
    ``path``, ``data`` (base64), ``url`` (a remote image, with none of the rest) or, for a
    ``Binary`` column's value, ``inline`` and ``row`` (see :func:`describe_binary`).
    """
    if folders is None:
        folders = allowed_folders(_folders_of(media, document))
    data, source = _read(
        value, document=document, limit=_limit_of(media, document), folders=folders
    )
    if data is None:
        return {"kind": "image", **source}
    return {**facts_of(data, document=document, media=media), **source}


def _limit_of(media: Media, document: bool) -> int:
    if document and media.documents:
        return media.documents.max_bytes
    return media.images.max_bytes if media.images else MAX_IMAGE_BYTES


def facts_of(
    data: bytes, *, document: bool, media: Media, sha256: str | None = None
) -> dict[str, Any]:
    """What a descriptor says of ``data`` itself: its hash, size, kind, type, and pixel size or
    pages; :class:`Unusable` when it is over the limit or not what the column sends.

    A documents column takes images too, sent as images: scanned receipts come as PDFs and as
    photos in one column."""
    scan = document and not data.startswith(b"%PDF-")
    limit = _limit_of(media, document and not scan)
    if len(data) > limit:
        raise Unusable(f"{_size(len(data))}, over the {_size(limit)} limit")
    max_pixels = media.images.max_pixels if media.images else MAX_PIXELS
    if scan:
        try:
            facts = _image(data, max_pixels)
        except NotAnImage:
            raise Unusable("neither a PDF nor an image (PNG, JPEG, WebP or GIF)") from None
    else:
        facts = _document(data, media) if document else _image(data, max_pixels)
    sha256 = sha256 or hashlib.sha256(data).hexdigest()
    return {"sha256": sha256, "bytes": len(data), **facts}


SLICE = 1_024  # Binary values turned into Python bytes at once, and let go


def describe_binary(
    series: pl.Series, *, position: int, document: bool, media: Media
) -> tuple[pl.Series, dict[str, dict[str, Any] | str]]:
    """A ``Binary`` media column read a slice at a time: each row's sha256 (null for a null
    value), and each distinct one's descriptor, or why it cannot be sent.

    The bytes are not copied into the descriptor: it says where they are (``inline``: the
    column's position among :attr:`Media.columns`; ``row``: the first row holding them), and
    :func:`attach_bytes` gathers them, without a copy, for the requests to send only. So a
    frame of photos is planned in little more memory than it holds, and a rerun the cache
    answers never encodes a photo."""
    hashes: list[str | None] = []
    described: dict[str, dict[str, Any] | str] = {}
    for offset in range(0, len(series), SLICE):
        for row, value in enumerate(series.slice(offset, SLICE).to_list(), offset):
            if value is None:
                hashes.append(None)
                continue
            sha256 = hashlib.sha256(value).hexdigest()
            hashes.append(sha256)
            if sha256 not in described:
                try:
                    facts = facts_of(value, document=document, media=media, sha256=sha256)
                    described[sha256] = {**facts, "inline": position, "row": row}
                except Unusable as exc:
                    described[sha256] = str(exc)
    return pl.Series(series.name, hashes, dtype=pl.String), described


def binary_positions(media: Media, schema: Mapping[str, pl.DataType]) -> list[int]:
    """The positions among :attr:`Media.columns` of the ``Binary`` ones."""
    return [n for n, column in enumerate(media.columns) if schema[column] == pl.Binary()]


def attach_bytes(requests: pl.DataFrame, frame: pl.DataFrame, media: Media) -> pl.DataFrame:
    """``requests`` (``REQUESTS`` with ``media``) with a column ``media_bytes_<n>`` per
    ``Binary`` media column ``n`` of ``frame``: each request's value, gathered (Polars shares
    the bytes, it does not copy them) from the row its descriptor names."""
    for position in binary_positions(media, frame.schema):
        rows = [
            None if value is None else media_of(value)[position]["row"]
            for value in requests["media"]
        ]
        gathered = frame[media.columns[position]].gather(pl.Series(rows, dtype=pl.UInt32))
        requests = requests.with_columns(gathered.alias(f"media_bytes_{position}"))
    return requests


def _read(
    value: str, *, document: bool, limit: int, folders: tuple[Path, ...]
) -> tuple[bytes | None, dict[str, Any]]:
    """The bytes a text value names (``None`` for a remote image) and where they came from."""
    scheme = urlsplit(value).scheme.lower() if ":" in value[:12] else ""
    if scheme == "data":
        header, _, payload = value.partition(",")
        if not header.endswith(";base64"):
            raise Unusable("a data: URL must be base64 (data:<type>;base64,...)")
        try:
            return base64.b64decode(payload, validate=True), {"data": payload}
        except (binascii.Error, ValueError):
            raise Unusable("a data: URL whose base64 is broken") from None
    if scheme in ("http", "https"):
        if urlsplit(value).username is not None or urlsplit(value).password is not None:
            raise Unusable(
                "a URL with a user or password in it: llm-ops keeps no credentials; use a "
                "URL that needs none, or download the image and pass its path or bytes"
            )
        if document:
            raise Unusable(
                "a remote PDF: llm-ops fetches nothing but the endpoint; download it and "
                "pass its path or bytes"
            )
        return None, {"url": value}
    if scheme == "file":
        path = Path(url2pathname(unquote(urlsplit(value).path)))
    elif scheme and len(scheme) > 1:  # not a Windows drive letter
        raise Unusable(f"a {scheme}: URL; give a path, a file:, data: or http(s): URL")
    else:
        path = Path(value).expanduser()
    try:
        resolved = path.resolve(strict=True)
    except FileNotFoundError:
        raise Unusable(f"no such file: {value}") from None
    except (OSError, RuntimeError) as exc:  # a symlink loop, a parent not searchable
        raise Unusable(f"cannot read {value}: {getattr(exc, 'strerror', None) or exc}") from None
    if not any(resolved.is_relative_to(folder) for folder in folders):
        shown = value if Path(value) == resolved else f"{value} (which is {resolved})"
        raise Unusable(
            f"{shown} is outside the folders media are read from "
            f"({', '.join(map(str, folders))}); to read it, add its folder to folders= of "
            "Images or Documents (the CLI's --media-folder, the flow's media_folders)"
        )
    return _read_regular(resolved, value, limit), {"path": str(resolved)}


class TooLarge(Unusable):
    """A file holding more bytes than it may."""


def _read_regular(path: Path, shown: str, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (resolved already), at most ``limit`` of them
    (:class:`TooLarge` past that, whatever size the file claims); :class:`Unusable` for a
    device, a FIFO, a socket or a directory, which are never read (``/dev/zero`` says it
    holds nothing and never ends, a FIFO blocks). Opened without following a symlink swapped
    in since it was resolved, and without blocking, then checked again from the open file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        _regular(os.stat(path).st_mode, shown)  # a device is not even opened
        descriptor = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Unusable(f"no such file: {shown}") from None
    except PermissionError:
        raise Unusable(f"cannot read {shown}: permission denied") from None
    except OSError as exc:
        raise Unusable(f"cannot read {shown}: {exc.strerror or exc}") from None
    with open(descriptor, "rb") as file:
        found = os.fstat(descriptor)
        _regular(found.st_mode, shown)
        if found.st_size > limit:
            raise TooLarge(f"{_size(found.st_size)}, over the {_size(limit)} limit")
        try:
            data = file.read(found.st_size + 1)
            if found.st_size < len(data) <= limit:  # it grew since: read on, to the limit
                data += file.read(limit + 1 - len(data))
        except OSError as exc:
            raise Unusable(f"cannot read {shown}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise TooLarge(f"over the {_size(limit)} limit")
    return data


def _regular(mode: int, shown: str) -> None:
    if stat.S_ISDIR(mode):
        raise Unusable(f"a directory, not a file: {shown}")
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        )
        raise Unusable(f"{kind}, not a regular file: {shown}; media are read from files only")


class NotAnImage(Unusable):
    """Bytes Pillow reads as no image at all."""


def _image(data: bytes, max_pixels: int) -> dict[str, Any]:
    try:
        kind, (width, height) = _header(data)
    except NotAnImage:
        if data.startswith(b"%PDF-"):
            raise NotAnImage("a PDF, not an image: pass its column as documents=") from None
        raise
    if kind is None or kind not in IMAGE_TYPES:
        raise Unusable(f"a {kind} image; endpoints take PNG, JPEG, WebP or GIF")
    if width * height > max_pixels:
        raise Unusable(
            f"{width:,} x {height:,} pixels, over max_pixels={max_pixels:,} (a decompression "
            "bomb?); raise Images(max_pixels=) to send it"
        )
    return {"kind": "image", "mime": IMAGE_TYPES[kind], "width": width, "height": height}


_NOT_THIS_FORMAT = (SyntaxError, IndexError, TypeError, struct.error, OSError, ValueError, EOFError)


def _header(data: bytes) -> tuple[str | None, tuple[int, int]]:
    """An image's format and pixel size, read from its header as ``Image.open`` does, but
    without Pillow's decompression-bomb check: that one raises, or warns through the global
    warning filters, on the header alone, where :func:`_image` compares the size with
    ``max_pixels`` itself. Nothing is decoded."""
    from PIL import Image

    Image.init()
    prefix = data[:16]
    for name in list(Image.ID):
        factory, accept = Image.OPEN[name]
        try:
            accepted = accept is None or accept(prefix)
            if not accepted or isinstance(accepted, str):
                continue
            with factory(io.BytesIO(data), "") as image:
                return image.format, image.size
        except _NOT_THIS_FORMAT:
            continue
    raise NotAnImage("not an image Pillow can read (PNG, JPEG, WebP or GIF)")


_PDFIUM = threading.Lock()  # pdfium is not thread-safe: one call into it at a time


def _document(data: bytes, media: Media) -> dict[str, Any]:
    import pypdfium2

    with _PDFIUM:
        try:
            pdf = pypdfium2.PdfDocument(data)
        except pypdfium2.PdfiumError as exc:
            raise Unusable(f"a damaged PDF: pdfium cannot open it ({exc})") from None
        try:
            pages = len(pdf)
        finally:
            pdf.close()
    assert media.documents is not None
    if pages > media.documents.max_pages:
        raise Unusable(f"{pages} pages, over max_pages={media.documents.max_pages}")
    return {"kind": "document", "mime": PDF, "pages": pages}


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MB" if count >= 2**20 else f"{count:,} bytes"


def describe_values(
    values: pl.DataFrame,
    media: Media,
    known: Mapping[str, Mapping[str, dict[str, Any] | str]] | None = None,
) -> pl.DataFrame:
    """For each row of ``values`` (one per group of input rows, holding the media columns):
    ``media`` (the JSON list of its descriptors, in :attr:`Media.columns` order), ``media_key``
    (the canonical JSON of its keyed parts, joined by commas) and ``media_error`` (why its row
    cannot be sent; then the other two are null). A null value leaves all three null: its row is
    skipped like a row with a null template column. A column of ``known`` holds hashes,
    described already (by :func:`describe_binary`)."""
    known = known or {}
    columns = [values[column].to_list() for column in media.columns]
    described = _described(media, columns, known)
    lists: list[str | None] = []
    keys: list[str | None] = []
    errors: list[str | None] = []
    for row in zip(*columns, strict=True):
        found: list[dict[str, Any]] = []
        error = None
        for column, value in zip(media.columns, row, strict=True):
            if value is None:
                found = []
                break
            seen = described[(column, value)]
            if isinstance(seen, str):
                error = seen
                break
            found.append(seen)
        if error is None and len(found) == len(media.columns):
            lists.append(orjson.dumps(found).decode())
            keys.append(",".join(canonical_json(part) for part in keyed_parts(found, media)))
        else:
            lists.append(None)
            keys.append(None)
        errors.append(error)
    return pl.DataFrame(
        {"media": lists, "media_key": keys, "media_error": errors},
        schema={"media": pl.String, "media_key": pl.String, "media_error": pl.String},
    )


# Files read at once: reads and sha256 release the GIL, so threads overlap a cold disk's waits;
# beyond twice the cores, on files the OS has cached, they only contend for the cores.
READERS = min(8, 2 * (os.cpu_count() or 1))


def _described(
    media: Media,
    columns: list[list[Any]],
    known: Mapping[str, Mapping[str, dict[str, Any] | str]],
) -> dict[tuple[str, str], dict[str, Any] | str]:
    """Each distinct (column, value) of ``columns`` (one list of values per media column)
    described, or why it cannot be sent, with the column named; paths and URLs are read by
    :data:`READERS` threads at once."""
    documents = set(media.document_columns)
    allowed = {kind: allowed_folders(_folders_of(media, kind)) for kind in (False, True)}

    def read(item: tuple[str, str]) -> dict[str, Any] | str:
        column, value = item
        if column in known:
            seen = known[column][value]
        else:
            try:
                document = column in documents
                seen = describe(value, document=document, media=media, folders=allowed[document])
            except Unusable as exc:
                seen = str(exc)
        return f"{column}: {seen}; row not sent" if isinstance(seen, str) else seen

    wanted = list(
        dict.fromkeys(
            (column, value)
            for column, values in zip(media.columns, columns, strict=True)
            for value in values
            if value is not None
        )
    )
    if len(wanted) < 2 * READERS:
        return {item: read(item) for item in wanted}
    with ThreadPoolExecutor(READERS, thread_name_prefix="llm-ops-media") as pool:
        return dict(zip(wanted, pool.map(read, wanted), strict=True))


# -- keyed and sent parts ---------------------------------------------------------------------
# Spelled as the canonical request spells them (``CANONICAL``), which keys hash: the endpoint's
# dialect writes them its own way as it sends them.


def _image_url(url: str, detail: str | None) -> dict[str, Any]:
    return CANONICAL.image_part(url, detail)


def keyed_parts(descriptors: Iterable[Mapping[str, Any]], media: Media) -> list[dict[str, Any]]:
    """The content parts a request key hashes (see :mod:`llm_ops._key`): bytes by sha256."""
    detail = media.images.detail if media.images else None
    pages = media.documents is not None and media.documents.send_as == "pages"
    parts = []
    for item in descriptors:
        if item["kind"] == "image":
            url = _keyed_url(item["url"]) if "url" in item else f"sha256:{item['sha256']}"
            parts.append(_image_url(url, detail))
        elif pages:
            parts += [
                _image_url(f"sha256:{item['sha256']}#page={n}", None)
                for n in range(1, item["pages"] + 1)
            ]
        else:
            parts.append(CANONICAL.file_part(f"sha256:{item['sha256']}"))
    return parts


def _keyed_url(url: str) -> str:
    """A remote image's URL as keyed: as it is, but its query as the sha256 of its text. A
    presigned URL's query holds a signature, a credential the cache must not keep; two URLs
    differing in their query stay two keys."""
    parts = urlsplit(url)
    if not parts.query:
        return url
    digest = hashlib.sha256(parts.query.encode()).hexdigest()
    return parts._replace(query=f"sha256={digest}").geturl()


def sent_parts(
    descriptors: Iterable[Mapping[str, Any]],
    media: Media,
    inline: Mapping[int, bytes | None] | None = None,
) -> list[dict[str, Any]]:
    """The content parts sent: each value's bytes read again and inlined as a ``data:`` URL
    (:class:`Unusable` when a file changed or went since it was keyed); remote images as
    their URL."""
    detail = media.images.detail if media.images else None
    pages = media.documents is not None and media.documents.send_as == "pages"
    parts = []
    for item in descriptors:
        if "url" in item:
            parts.append(_image_url(item["url"], detail))
            continue
        if item["kind"] == "document" and pages:
            assert media.documents is not None
            data = base64.b64decode(item["data"]) if "data" in item else None
            rendered = _render_pages(data or _bytes_of(item, inline or {}), media.documents)
            parts += [_image_url(f"data:image/png;base64,{page}", None) for page in rendered]
            continue
        payload = item.get("data") or base64.b64encode(_bytes_of(item, inline or {})).decode()
        if item["kind"] == "image":
            parts.append(_image_url(f"data:{item['mime']};base64,{payload}", detail))
        else:
            name = Path(item["path"]).name if "path" in item else f"{item['sha256'][:16]}.pdf"
            parts.append(CANONICAL.file_part(f"data:{PDF};base64,{payload}", name))
    return parts


def unsent(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as sent, with each inlined image or file part back to the sha256 of its
    bytes: what a request read back from a batch file is stored as, so the cache never holds
    the bytes. (A PDF sent as pages comes back as its page images' hashes.)"""
    return [
        {**message, "content": [_reference(part) for part in message["content"]]}
        if isinstance(message.get("content"), list)
        else message
        for message in messages
    ]


def _reference(part: dict[str, Any]) -> dict[str, Any]:
    inner = part.get("image_url") if part.get("type") == "image_url" else part.get("file")
    field = "url" if part.get("type") == "image_url" else "file_data"
    if not isinstance(inner, dict) or not str(inner.get(field, "")).startswith("data:"):
        return part
    payload = str(inner[field]).partition(",")[2]
    digest = hashlib.sha256(base64.b64decode(payload)).hexdigest()
    kept = {k: v for k, v in inner.items() if k not in (field, "filename")}
    return {**part, part["type"]: {**kept, field: f"sha256:{digest}"}}


def _bytes_of(item: Mapping[str, Any], inline: Mapping[int, bytes | None]) -> bytes:
    """A descriptor's bytes: a Binary column's value the request carries, or its file read
    again (and checked against the hash it was keyed by)."""
    if "inline" in item:
        data = inline.get(item["inline"])
        if data is None:  # a request that lost its bytes cannot be sent as keyed
            raise Unusable("its bytes did not travel with the request")
        return data
    path = item["path"]
    changed = f"{path} changed after the job keyed it; run the job again to key its new bytes"
    try:  # read as it was keyed: a regular file, and no more bytes than it held then
        data = _read_regular(Path(path), path, item["bytes"])
    except TooLarge:
        raise Unusable(changed) from None
    except Unusable as exc:
        raise Unusable(f"{path} could not be read again to send: {exc}") from None
    if hashlib.sha256(data).hexdigest() != item["sha256"]:
        raise Unusable(changed)
    return data


def _render_pages(data: bytes, documents: Documents) -> list[str]:
    """Each page of a PDF as base64 PNG, its longest side :data:`PAGE_PIXELS`; at most
    ``documents.max_bytes`` of PNG in all (:class:`Unusable` past that): a PDF of a few
    hundred KB can repeat one image on every page, and its pages then render to hundreds of
    MB."""
    import pypdfium2

    rendered = []
    total = 0
    with _PDFIUM:  # encoded inside too: a bitmap's image shares pdfium's memory
        pdf = pypdfium2.PdfDocument(data)
        try:
            for number, page in enumerate(pdf, 1):
                width, height = page.get_size()  # in points, 72 an inch
                bitmap = page.render(scale=PAGE_PIXELS / max(width, height, 1.0))
                buffer = io.BytesIO()
                bitmap.to_pil().save(buffer, format="PNG")
                page.close()
                total += buffer.tell()
                if total > documents.max_bytes:
                    raise Unusable(
                        f"its pages rendered as images hold over {_size(documents.max_bytes)} "
                        f"by page {number} of {len(pdf)}, the max_bytes of Documents; raise it, "
                        "or send it as a file"
                    )
                rendered.append(base64.b64encode(buffer.getbuffer()).decode())
        finally:
            pdf.close()
    return rendered


def sent_bytes(descriptors: Iterable[Mapping[str, Any]], media: Media) -> int:
    """The most bytes of media (base64, as sent) a request with ``descriptors`` carries: what
    it holds of the job's :class:`~llm_ops._outcome.InFlight` budget while it is sent. A PDF
    sent as pages counts what its pages may render to (:data:`PAGE_BYTES` a page, at most the
    ``max_bytes`` of :class:`Documents`); a remote image, nothing."""
    pages = media.documents is not None and media.documents.send_as == "pages"
    total = 0
    for item in descriptors:
        if "url" in item:
            continue
        raw = item["bytes"]
        if item["kind"] == "document" and pages:
            assert media.documents is not None
            raw = min(media.documents.max_bytes, item["pages"] * PAGE_BYTES)
        total += (raw + 2) // 3 * 4
    return total


def media_tokens(descriptors: Iterable[Mapping[str, Any]], media: Media, model: str) -> int:
    """About how many prompt tokens a request's media cost ``model`` (see
    :mod:`llm_ops._media_tokens`)."""
    detail = media.images.detail if media.images else None
    pages = media.documents is not None and media.documents.send_as == "pages"
    total = 0
    for item in descriptors:
        if item["kind"] == "image":
            width, height = (item["width"], item["height"]) if "width" in item else REMOTE_SIZE
            total += image_tokens(width, height, detail=detail, model=model)
        elif pages:
            total += item["pages"] * image_tokens(
                PAGE_PIXELS, PAGE_PIXELS * 3 // 4, detail=None, model=model
            )
        else:
            total += item["pages"] * DOCUMENT_TOKENS_PER_PAGE
    return total


def media_of(value: str | None) -> list[dict[str, Any]]:
    """The descriptors of a ``media`` value of :func:`describe_values`."""
    return [] if value is None else list(orjson.loads(value))
