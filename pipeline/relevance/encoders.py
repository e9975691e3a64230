"""Frozen caption encoders: caption texts → one unit-length vector each.

The one place both `vse relevance --method bert|cbow` and `vse encode-text --model
minilm|cbow` get caption vectors from, so a relevance file and a caption-feature file made
with the same model hold the same vectors.  ``minilm`` is all-MiniLM-L6-v2 (``bert.py``,
the relevance method called ``bert``), ``cbow`` the mean GloVe 6B-50d word vector
(``cbow.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import VseError

ENCODERS = ("minilm", "cbow")


@dataclass
class EncodedCaptions:
    vectors: np.ndarray                                 # (M, d) float32, unit rows (zero: no information)
    counts: dict[str, int] = field(default_factory=dict)  # what the user should hear about


def encode_captions(captions, encoder: str, device="auto", batch_size: int = 256,
                    progress: bool = False) -> EncodedCaptions:
    """Vectors of ``captions`` (in order) by ``encoder`` (one of ``ENCODERS``)."""
    _check(encoder)
    if encoder == "cbow":
        from .cbow import cbow_vectors

        vectors, empty = cbow_vectors(captions)
        return EncodedCaptions(vectors, {"captions_without_known_words": empty})
    from .bert import bert_vectors

    return EncodedCaptions(bert_vectors(captions, device, batch_size, progress))


def encoder_identity(encoder: str) -> dict:
    """The model, weights and packages behind ``encoder``'s vectors (no device, no path)."""
    _check(encoder)
    if encoder == "cbow":
        from .cbow import cbow_identity

        return cbow_identity()
    from .bert import bert_identity

    return bert_identity()


def _check(encoder: str) -> None:
    if encoder not in ENCODERS:
        raise VseError(f"unknown caption encoder {encoder!r} (expected {', '.join(ENCODERS)})")
