"""The embeddings file of `vse embed`, read for `vse index` (docs/ARCHITECTURE.md, "Embeddings
file"): ``EmbeddingsFile`` checks it on opening (through ``core.formats.EMBEDDINGS.open``: found,
HDF5, its format and version, complete; then its groups, shapes and ``checkpoint_sha256``) and
reads its items and vectors, ``CHUNK_ROWS`` at a time, each chunk checked to be finite unit rows
(an inner product of them is a cosine).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.core.formats import EMBEDDINGS
from pipeline.core.similarity import is_probabilistic

GROUPS = ("images", "captions")
# A probabilistic model's (PCME, PCME++: similarity csd) log-variance of each row of a group's
# "vectors" (its unit means), (N, dim): the variance of a Gaussian embedding, beside its mean.
LOG_VARIANCE = "log_variance"
GROUP_FIELD = {"images": "paths", "captions": "texts"}  # what a result shows besides its id
UNIT_TOLERANCE = 1e-3  # |norm - 1| above this: not a unit row, inner product would not be cosine
CHUNK_ROWS = 65536  # vectors read, added and compared at a time (256 MB at 1024-d)


class EmbeddingsFile:
    """A validated embeddings file of `vse embed` (docs/ARCHITECTURE.md, "Search index")."""

    def __init__(self, path):
        self.path = Path(path)
        with EMBEDDINGS.open(self.path) as f:  # found, HDF5, this format and version, complete
            try:
                self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
                self.shapes = {g: f[g]["vectors"].shape for g in GROUPS if g in f and "vectors" in f[g]}
                self.spread_shapes = {g: f[g][LOG_VARIANCE].shape for g in GROUPS
                                      if g in f and LOG_VARIANCE in f[g]}
                self.groups = tuple(g for g in GROUPS if g in f)
            except OSError as exc:
                reason = (str(exc).splitlines() or ["unreadable"])[0][:120]
                raise VseError(f"cannot read the embeddings file ({reason})", self.path) from exc
        if not self.groups:
            raise VseError("embeddings file has neither images nor captions", self.path)
        self.checkpoint_sha256 = str(self.attrs.get("checkpoint_sha256", ""))
        if len(self.checkpoint_sha256) != 64:
            raise VseError("embeddings file has no checkpoint_sha256 attribute", self.path)
        self.similarity = str(self.attrs.get("similarity", ""))
        self.dim = int(self.attrs.get("dim", -1))
        for group in self.groups:
            shape = self.shapes.get(group)
            if shape is None or len(shape) != 2 or shape[1] != self.dim:
                raise VseError(f"/{group}/vectors has shape {shape}, not (N, {self.dim}) as dim says",
                               self.path)
            if is_probabilistic(self.similarity) and self.spread_shapes.get(group) != shape:
                raise VseError(f"/{group}/{LOG_VARIANCE} has shape {self.spread_shapes.get(group)}, not "
                               f"{shape} as /{group}/vectors (similarity {self.similarity})", self.path)

    def log_variances(self, group: str) -> np.ndarray:
        """(N, dim) float32: the log-variance of each row of ``group`` (a probabilistic model's)."""
        import h5py

        if group not in self.spread_shapes:
            raise VseError(f"/{group} has no {LOG_VARIANCE} (similarity {self.similarity!r})", self.path)
        with h5py.File(self.path, "r") as f:
            return np.asarray(f[group][LOG_VARIANCE][()], dtype=np.float32)

    def count(self, group: str) -> int:
        return int(self.shapes[group][0])

    def captions_of(self, image_ids) -> list[str] | None:
        """Each image's first caption, where the captions name their images (a CSV embedded as
        both); None when they do not."""
        import h5py

        with h5py.File(self.path, "r") as f:
            if "captions" not in f or "image_ids" not in f["captions"]:
                return None
            owners = f["captions"]["image_ids"].asstr()[()]
            texts = f["captions"][GROUP_FIELD["captions"]].asstr()[()]
        first: dict[str, str] = {}
        for owner, caption in zip(owners.tolist(), texts.tolist()):
            first.setdefault(owner, caption)
        return [first.get(i, "") for i in image_ids.tolist()]

    def items(self, group: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids, paths or texts) of ``group``, checked: as many as vectors, ids unique."""
        import h5py

        name = GROUP_FIELD[group]
        try:
            with h5py.File(self.path, "r") as f:
                ids = f[group]["ids"].asstr()[()]
                shown = f[group][name].asstr()[()]
        except (KeyError, OSError, TypeError, ValueError) as exc:
            raise VseError(f"cannot read /{group}/ids and /{group}/{name} ({exc})", self.path) from exc
        n = self.count(group)
        if ids.shape != (n,) or shown.shape != (n,):
            raise VseError(f"/{group}: {len(ids)} ids and {len(shown)} {name} for {n} vectors", self.path)
        if len(set(ids.tolist())) != n:
            raise VseError(f"/{group}/ids are not unique", self.path)
        return ids, shown

    def chunks(self, group: str, rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, vectors) of ``group`` in order, ``rows`` (``CHUNK_ROWS``) at a time, each
        checked to be finite unit rows."""
        import h5py

        rows = rows or CHUNK_ROWS
        with h5py.File(self.path, "r") as f:
            vectors = f[group]["vectors"]
            for start in range(0, vectors.shape[0], rows):
                chunk = np.ascontiguousarray(vectors[start:start + rows], dtype=np.float32)
                self._check_unit(group, start, chunk)
                yield start, chunk

    def rows(self, group: str, indices) -> np.ndarray:
        """The vectors of rows ``indices`` (in that order), read in one sequential pass: HDF5
        point selections of many scattered rows are far slower than reading everything."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(indices), self.dim), dtype=np.float32)
        order = np.argsort(indices, kind="stable")
        wanted = indices[order]
        for start, chunk in self.chunks(group):
            lo, hi = np.searchsorted(wanted, [start, start + len(chunk)])
            out[order[lo:hi]] = chunk[wanted[lo:hi] - start]
        return out

    def _check_unit(self, group, start, chunk) -> None:
        if not np.isfinite(chunk).all():
            raise VseError(f"/{group}/vectors hold NaN or Inf", self.path)
        norms = np.linalg.norm(chunk, axis=1)
        bad = np.flatnonzero(np.abs(norms - 1) > UNIT_TOLERANCE)
        if bad.size:
            raise VseError(f"/{group}/vectors row {start + int(bad[0])} has norm {norms[bad[0]]:.4f}, not 1: "
                           "inner product would not be cosine", self.path)
