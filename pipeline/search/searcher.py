"""Queries against a search index: the model that embeds them, and their checks.

``open_searcher(index, checkpoint)`` opens an index (``pipeline.search.index_reader``) and the
model it was made with, refusing a checkpoint whose sha256 is not the index's; a
``Searcher`` then answers text and image queries with ranked hits. `vse search` and
`vse serve` share it, so both check a query the same way (``QueryLimits``).

``load_embedder`` is the one place where the model behind the queries is made: the
``Embedder`` of `vse embed` (pipeline/search/embed.py; docs/ARCHITECTURE.md, "Queries").
"""

from __future__ import annotations

import io
import re
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.core.fsutil import file_sha256
from pipeline.data.readers.base import image_shape_problem
from pipeline.search.index_reader import SearchIndex


@dataclass(frozen=True)
class QueryLimits:
    """What a query may be (the one place of these limits; `vse search` and `vse serve`)."""

    max_chars: int = 1000                  # a text query's length
    max_k: int = 100                       # results asked for
    max_upload_bytes: int = 10 * 2 ** 20   # an uploaded image's file size
    max_pixels: int = 40_000_000           # an image's width × height once decoded

    # the option that sets each limit (`vse serve`), as messages name it
    FLAGS = {"max_chars": "--max-query-chars", "max_k": "--max-k", "max_upload_bytes": "--max-upload-mb",
             "max_pixels": "max_pixels"}

    def check(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or value < 1:
                raise VseError(f"{self.FLAGS[name]} must be a positive integer, not {value!r}")


class QueryError(VseError):
    """A query the service answers with a 4xx: ``status`` says which."""

    def __init__(self, message: str, status: int = 400):
        self.status = status
        super().__init__(message)


def load_embedder(checkpoint, device: str = "auto", digest: str | None = None):
    """The model that embeds queries: `vse embed`'s, from the checkpoint (imported here, as it
    loads torch and the encoders, which an index-only search does not need)."""
    from pipeline.search.embed import Embedder

    return Embedder.from_checkpoint(checkpoint, device=device, digest=digest)


def check_text(text, limits: QueryLimits) -> str:
    if not isinstance(text, str):
        raise QueryError("the query must be a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON "\ud800", or bytes a terminal could not decode
        raise QueryError("the query is not valid Unicode text (it holds a lone surrogate or undecodable "
                         "bytes)") from None
    text = text.strip()
    if not text:
        raise QueryError("the query is empty")
    if len(text) > limits.max_chars:
        raise QueryError(f"the query is {len(text)} characters long; at most {limits.max_chars}")
    return text


def check_k(k, limits: QueryLimits) -> int:
    """One rule wherever k comes from (a JSON number, a URL's text, a flag): an integer, written
    as one. 2.9, 3.0, true, 1e400 and "1.5" are all refused the same way."""
    if isinstance(k, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,6}\s*", k):
        k = int(k)
    if not isinstance(k, int) or isinstance(k, bool):
        shown = repr(k) if not isinstance(k, str) else repr(k[:40])
        raise QueryError(f"k must be an integer from 1 to {limits.max_k}, not {shown}")
    if k < 1:
        raise QueryError(f"k must be at least 1, not {k}")
    if k > limits.max_k:
        raise QueryError(f"k must be at most {limits.max_k}, not {k}")
    return k


def decode_image(data: bytes, limits: QueryLimits, name: str = "the upload"):
    """An RGB PIL image from an image file's bytes, or a ``QueryError`` (413: too large, 415:
    not an image, 400: an image that cannot be decoded)."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > limits.max_upload_bytes:
        raise QueryError(f"{name} is {len(data)} bytes; at most {limits.max_upload_bytes}", 413)
    if not data:
        raise QueryError(f"{name} is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > limits.max_pixels:
                raise QueryError(f"{name} is {width}x{height} pixels; at most {limits.max_pixels} pixels",
                                 413)
            problem = image_shape_problem(width, height)
            if problem:
                raise QueryError(f"{name} {problem}", 413)
            image.load()
    except QueryError:
        raise
    except UnidentifiedImageError:
        raise QueryError(f"{name} is not an image (PNG, JPEG, WebP, ...)", 415) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise QueryError(f"{name} is larger than {Image.MAX_IMAGE_PIXELS} pixels (a decompression bomb?)",
                         413) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise QueryError(f"{name} cannot be decoded as an image ({str(exc)[:120]})", 400) from None
    return image.convert("RGB")


class Searcher:
    """An index and the model of its vectors; one per process, used by every query.

    Queries are answered one at a time (a lock): the model and FAISS each use every core for
    one query, and an ``Embedder`` need not be thread-safe."""

    def __init__(self, index: SearchIndex, embedder, limits: QueryLimits = QueryLimits(), checkpoint=None):
        self.index, self.embedder, self.limits = index, embedder, limits
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        self._lock = threading.Lock()

    def _answer(self, embed, k: int) -> dict:
        started = time.perf_counter()
        with self._lock:
            vector = np.asarray(embed(), dtype=np.float32)
            scores, rows = self.index.search(vector, k)
        return {"k": k, "results": self.index.hits(scores[0], rows[0]),
                "took_ms": round(1000 * (time.perf_counter() - started), 2)}

    def text(self, text, k=10) -> dict:
        text, k = check_text(text, self.limits), check_k(k, self.limits)
        return {"query": text, **self._answer(lambda: self.embedder.embed_texts([text]), k)}

    def image(self, image, k=10) -> dict:
        """``image``: a PIL image (already checked, see ``decode_image``)."""
        k = check_k(k, self.limits)
        return {"query": "image", **self._answer(lambda: self.embedder.embed_images([image]), k)}

    def info(self) -> dict:
        return {**self.index.info(), "checkpoint": self.checkpoint, "max_k": self.limits.max_k,
                "max_chars": self.limits.max_chars, "max_upload_bytes": self.limits.max_upload_bytes}


def open_searcher(index_path, checkpoint=None, device: str = "auto",
                  limits: QueryLimits = QueryLimits()) -> Searcher:
    """The index at ``index_path`` with its model: ``checkpoint`` or the one its metadata names,
    refused unless its sha256 is the index's ``checkpoint_sha256``."""
    limits.check()
    index = SearchIndex(index_path)
    recorded = index.meta.get("checkpoint")
    if checkpoint is None:
        if not recorded:
            raise VseError("the index names no checkpoint: give --checkpoint", index.path)
        if not Path(recorded).is_file():
            raise VseError(f"the index's checkpoint {recorded} is not there: give --checkpoint", index.path)
        checkpoint = recorded
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise VseError("checkpoint not found", checkpoint)
    digest = file_sha256(checkpoint)
    if digest != index.checkpoint_sha256:
        raise VseError(f"is another model (sha256 {digest[:12]}…) than the one the index was made with "
                       f"({index.checkpoint_sha256[:12]}…)", checkpoint)
    embedder = load_embedder(checkpoint, device, digest)
    check_embedder(embedder, index, checkpoint)
    return Searcher(index, embedder, limits, checkpoint)


def check_embedder(embedder, index: SearchIndex, checkpoint) -> None:
    """The model must be the index's (digest), of its dimension, with cosine similarity."""
    if embedder.checkpoint_sha256 != index.checkpoint_sha256:
        raise VseError(f"the model reports sha256 {embedder.checkpoint_sha256[:12]}…, the index was made "
                       f"with {index.checkpoint_sha256[:12]}…", checkpoint)
    if embedder.similarity != "cosine":
        raise VseError(f"the model's similarity is {embedder.similarity!r}; an index searches by cosine",
                       checkpoint)
    if int(embedder.dim) != index.dim:
        raise VseError(f"the model embeds in {embedder.dim}-d, the index is {index.dim}-d", checkpoint)
