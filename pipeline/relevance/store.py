"""The relevance file (HDF5), written atomically and validated on read.

    <out>.h5
      vectors         (M, d) float32|float16, unit rows, row j = caption j of the feature cache
      coarse_vectors  (M, 50) cbow+bert only: the CBoW gate
      neighbours/indices (M, n) int64, neighbours/scores (M, n) float32   optional
      attrs: format="vse-relevance", format_version=1, method, params (JSON),
             identity (JSON: packages, versions, model name), features_file, num_captions,
             caption_fingerprint (cache.caption_fingerprint of the captions, in row order),
             fit_splits (JSON), num_fit_captions, cbow_threshold (cbow+bert), svd_model
             (file name of the fitted SVD, svd only), counts (JSON), created, vse_version
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np

from pipeline import __version__
from pipeline.core.errors import VseError
from pipeline.core.formats import RELEVANCE
from pipeline.core.fsutil import atomic_h5
from pipeline.text.vectors import RelevanceVectors

FORMAT = RELEVANCE.tag
DTYPES = {"float32": np.float32, "float16": np.float16}


def write_relevance(out, rv: RelevanceVectors, *, features_file, caption_fingerprint: str, fit_splits,
                    num_fit_captions: int, dtype: str = "float32", neighbours=None,
                    svd_model: str | None = None) -> Path:
    """Write ``rv`` (and optional ``(indices, scores)`` neighbours) to ``out`` atomically."""
    if dtype not in DTYPES:
        raise VseError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    attrs = {**RELEVANCE.stamp(), "method": rv.method,
             "params": json.dumps(rv.params, sort_keys=True),
             "identity": json.dumps(rv.identity, sort_keys=True),
             "features_file": str(Path(features_file).resolve()),
             "num_captions": rv.num_captions, "caption_fingerprint": caption_fingerprint,
             "fit_splits": json.dumps(list(fit_splits)),
             "num_fit_captions": int(num_fit_captions), "dtype": dtype,
             "counts": json.dumps(rv.counts, sort_keys=True),
             "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "vse_version": __version__}
    if rv.cbow_threshold is not None:
        attrs["cbow_threshold"] = float(rv.cbow_threshold)
    if svd_model is not None:
        attrs["svd_model"] = svd_model
    with atomic_h5(out) as f:
        _write_rows(f, "vectors", rv.vectors, DTYPES[dtype])
        if rv.coarse_vectors is not None:
            _write_rows(f, "coarse_vectors", rv.coarse_vectors, DTYPES[dtype])
        if neighbours is not None:
            indices, scores = neighbours
            group = f.create_group("neighbours")
            group.create_dataset("indices", data=np.asarray(indices, dtype=np.int64))
            group.create_dataset("scores", data=np.asarray(scores, dtype=np.float32))
        f.attrs.update(attrs)
    return Path(out)


def _write_rows(f: h5py.File, name: str, rows: np.ndarray, dtype) -> None:
    chunk_rows = max(1, min(len(rows), (1 << 20) // max(1, rows.shape[1] * np.dtype(dtype).itemsize)))
    f.create_dataset(name, data=np.asarray(rows, dtype=dtype), chunks=(chunk_rows, rows.shape[1]))


@dataclass
class RelevanceFile:
    """A relevance file read into memory (vectors as stored; neighbours only if asked for)."""

    path: Path
    method: str
    vectors: np.ndarray
    coarse_vectors: np.ndarray | None
    cbow_threshold: float | None
    params: dict
    identity: dict
    attrs: dict
    neighbour_indices: np.ndarray | None = None
    neighbour_scores: np.ndarray | None = None

    @property
    def num_captions(self) -> int:
        return int(self.vectors.shape[0])


def read_relevance(path, neighbours: bool = False) -> RelevanceFile:
    """Open and validate a relevance file (else ``VseError`` naming the problem)."""
    path = Path(path)
    with RELEVANCE.open(path) as f:  # found, HDF5, this format and version (written whole: atomic_h5)
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        if "vectors" not in f or f["vectors"].ndim != 2:
            raise VseError("relevance file has no 2-d 'vectors'", path)
        vectors = f["vectors"][()]
        if attrs.get("num_captions") != len(vectors):
            raise VseError(f"inconsistent relevance file: num_captions is {attrs.get('num_captions')} "
                           f"but vectors has {len(vectors)} rows", path)
        coarse, threshold = None, None
        if attrs.get("method") == "cbow+bert":
            if "coarse_vectors" not in f or "cbow_threshold" not in attrs:
                raise VseError("cbow+bert relevance file lacks coarse_vectors or cbow_threshold", path)
            coarse, threshold = f["coarse_vectors"][()], float(attrs["cbow_threshold"])
            if coarse.ndim != 2 or len(coarse) != len(vectors):
                raise VseError(f"coarse_vectors has shape {coarse.shape}, expected "
                               f"({len(vectors)}, d)", path)
        result = RelevanceFile(path, str(attrs.get("method")), vectors, coarse, threshold,
                               json.loads(attrs.get("params", "{}")),
                               json.loads(attrs.get("identity", "{}")), attrs)
        if neighbours:
            if "neighbours" not in f:
                raise VseError("relevance file has no neighbours (run vse relevance with "
                               "--neighbours N)", path)
            result.neighbour_indices = f["neighbours/indices"][()]
            result.neighbour_scores = f["neighbours/scores"][()]
    return result
