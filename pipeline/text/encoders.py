"""Frozen caption encoders: caption texts → one unit-length vector each, or a set of token
vectors each (``encode_caption_tokens``, for `vse encode-text --tokens`).

The one place both `vse relevance --method bert|cbow` and `vse encode-text --model
minilm|cbow` get caption vectors from, so a relevance file and a caption-feature file made
with the same model hold the same vectors.  ``minilm`` is all-MiniLM-L6-v2 (``bert.py``,
the relevance method called ``bert``), ``cbow`` the mean GloVe 6B-50d word vector
(``cbow.py``). The token vectors are what those vectors pool: the mean of a caption's token
vectors, normalised, is its vector.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.core.errors import VseError

ENCODERS = ("minilm", "cbow")
# What a caption's token vectors are, by encoder (written into each token file as ``tokens``).
TOKEN_DEFINITIONS = {
    "minilm": "last hidden states of all-MiniLM-L6-v2 for every token of the attention mask, "
              "[CLS] and [SEP] included (the rows its mean pooling averages); no padding",
    "cbow": "GloVe 6B-50d vector of each word pipeline.text.vocabulary.tokenize finds in GloVe, in order; "
            "one zero vector for a caption without such a word",
}


@dataclass
class EncodedCaptions:
    vectors: np.ndarray                                 # (M, d) float32, unit rows (zero: no information)
    counts: dict[str, int] = field(default_factory=dict)  # what the user should hear about


def encode_captions(captions, encoder: str, device="auto", batch_size: int = 256,
                    progress: bool = False) -> EncodedCaptions:
    """Vectors of ``captions`` (in order) by ``encoder`` (one of ``ENCODERS``)."""
    _check(encoder)
    if encoder == "cbow":
        from pipeline.text.cbow import cbow_vectors

        vectors, empty = cbow_vectors(captions)
        return EncodedCaptions(vectors, {"captions_without_known_words": empty})
    from pipeline.text.bert import bert_vectors

    return EncodedCaptions(bert_vectors(captions, device, batch_size, progress))


@dataclass
class EncodedTokens:
    tokens: np.ndarray                                  # (sum of lengths, d) float32, caption after caption
    lengths: np.ndarray                                 # (M,) int64, each at least 1
    counts: dict[str, int] = field(default_factory=dict)


def encode_caption_tokens(captions, encoder: str, device="auto", batch_size: int = 256) -> EncodedTokens:
    """Token vectors of ``captions`` (in order) by ``encoder``: ``TOKEN_DEFINITIONS[encoder]``."""
    _check(encoder)
    if encoder == "cbow":
        from pipeline.text.cbow import cbow_token_vectors

        tokens, lengths, empty = cbow_token_vectors(captions)
        return EncodedTokens(tokens, lengths, {"captions_without_known_words": empty})
    from pipeline.text.bert import bert_token_vectors

    return EncodedTokens(*bert_token_vectors(captions, device, batch_size))


def encoder_identity(encoder: str) -> dict:
    """The model, weights and packages behind ``encoder``'s vectors (no device, no path)."""
    _check(encoder)
    if encoder == "cbow":
        from pipeline.text.cbow import cbow_identity

        return cbow_identity()
    from pipeline.text.bert import bert_identity

    return bert_identity()


def _check(encoder: str) -> None:
    if encoder not in ENCODERS:
        raise VseError(f"unknown caption encoder {encoder!r} (expected {', '.join(ENCODERS)})")
