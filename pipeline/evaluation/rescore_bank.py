"""The reference bank of test-time re-scoring (``pipeline.evaluation.rescore``): its form and its
k-NN. Apart from the methods because the bank is what they read, not how they correct: the methods
import it, and it imports nothing of theirs (their checks of a bank stay on ``Rescorer``).

A bank is a score matrix (a pairwise network's, averaged checkpoints'), an iterable of its row
blocks (never held whole), or, for a dual network whose score is an inner product, its vectors
(``VectorBank``: the reference queries' and the gallery's embeddings; ``reference_bank`` chooses).
The k nearest reference queries of each gallery item (csls, nnn) are then a FAISS search over the
bank's vectors (``faiss_topk``, FAISS's own threads), exact (``IndexFlatIP``) unless
``--rescore-index`` names an approximate one (``BANK_INDEXES``: hnsw, ivf; refused for isf and
qbnorm, which read every score), the bank × gallery scores never materialised. The indexes and their
parameters: docs/PROTOCOL.md, "Re-scoring at test time".

The precision rule (``compute_dtype``: float64 stays float64, anything else float32) and the reused
scratch block (``scratch_block``) live here, as a ``VectorBank``'s blocks need them and the methods'
blocks import them from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.errors import VseError

# The bank's k-NN index (``--rescore-index``; csls and nnn, the methods whose fit is a k-NN): "flat" is
# exact (IndexFlatIP), the others approximate, FAISS's own indexes as NNN's and QB-Norm's authors use
# for large banks. The one place of the choice and of its parameters (docs/PROTOCOL.md, "Cost").
BANK_INDEXES = ("flat", "hnsw", "ivf")
BANK_INDEX = "flat"
HNSW_M = 32                 # hnsw: neighbours per node (IndexHNSWFlat's M)
HNSW_EF_CONSTRUCTION = 40   # hnsw: the build's beam (FAISS's default)
HNSW_EF_SEARCH = 64         # hnsw: the search's beam, at least k (efSearch = max(this, k))
IVF_LISTS_PER_SQRT = 1      # ivf: nlist = this x sqrt(bank size) k-means cells (at least 1)
IVF_NPROBE = 16             # ivf: the cells searched per gallery item (nprobe, at most nlist)
IVF_KMEANS_ITERATIONS = 10  # ivf: the k-means (faiss.Clustering's niter) trained on the bank itself,
IVF_TRAIN_PER_LIST = 64     # on at most this many reference queries per cell (FAISS's own sample)


@dataclass(frozen=True)
class VectorBank:
    """A dual network's reference bank as vectors: its scores are ``queries @ gallery.T`` (Nb × G,
    the inner products of the reference queries' and the gallery's embeddings), never formed whole:
    a bank's k-NN is a FAISS search, anything else reads ``blocks``. Float64 vectors give float64
    blocks, anything else float32 (as a score matrix's)."""

    queries: torch.Tensor  # (Nb, d) the reference queries' embeddings
    gallery: torch.Tensor  # (G, d) the evaluated gallery's embeddings
    index: str = BANK_INDEX  # the k-NN's FAISS index (BANK_INDEXES): flat exact, hnsw/ivf approximate

    def __post_init__(self):  # numpy arrays as tensors (views)
        object.__setattr__(self, "queries", torch.as_tensor(self.queries))
        object.__setattr__(self, "gallery", torch.as_tensor(self.gallery))
        check_bank_index(self.index)

    def scores(self) -> torch.Tensor:
        """The whole Nb × G score matrix (what averaging several models' banks needs)."""
        dtype = compute_dtype(self)
        return self.queries.to(dtype) @ self.gallery.to(dtype).T

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.queries), len(self.gallery))

    @property
    def dtype(self) -> torch.dtype:
        return self.queries.dtype

    def blocks(self, block: int) -> Iterator[torch.Tensor]:
        """The scores, ``block`` reference queries at a time, each (block, G) contiguous, written into
        one reused buffer (no new matrix per block): a block is valid until the next is drawn."""
        dtype = compute_dtype(self)
        gallery, buffer = self.gallery.to(dtype).T, None
        for start in range(0, len(self.queries), block):
            queries = self.queries[start:start + block].to(dtype)
            shape = torch.empty((), dtype=dtype).expand(len(queries), len(self.gallery))  # no memory
            buffer = scratch_block(buffer, shape)
            yield torch.matmul(queries, gallery, out=buffer)


def check_bank_index(index: str) -> str:
    """``index`` if it is one of ``BANK_INDEXES``, else a one-line VseError naming the option."""
    if index not in BANK_INDEXES:
        raise VseError(f"--rescore-index: unknown index {index!r} (known: {', '.join(BANK_INDEXES)})")
    return index


def reference_bank(queries, gallery, similarity, direction: str = "i2t", index: str = BANK_INDEX):
    """A dual network's bank of ``direction`` from embeddings: ``queries`` the reference queries
    (``"i2t"``: bank images, ``"t2i"``: bank captions), ``gallery`` the evaluated gallery (captions,
    images). The one place choosing the bank's form: a ``VectorBank`` when the similarity is the
    inner product (cosine: FAISS's k-NN with ``index``, no bank × gallery matrix), else the score
    matrix (order embeddings, csd: ``pipeline.core.similarity``; an approximate ``index`` refused)."""
    from pipeline.core.similarity import caption_image_scores, image_caption_scores, similarity_name

    if direction not in ("i2t", "t2i"):
        raise VseError(f"reference bank: direction must be i2t or t2i, got {direction!r}")
    if similarity_name(similarity) == "cosine":
        return VectorBank(queries, gallery, index)
    if check_bank_index(index) != BANK_INDEX:
        raise VseError(f"--rescore-index {index}: the {similarity_name(similarity)} similarity is not an "
                       "inner product, so its bank is a score matrix with no vector index (use flat)")
    queries, gallery = torch.as_tensor(queries), torch.as_tensor(gallery)
    if direction == "i2t":
        return image_caption_scores(queries, gallery, similarity)
    return caption_image_scores(queries, gallery, similarity)


def faiss_topk(bank: VectorBank, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, k) each gallery item's k largest scores over the bank's reference queries, and their rows:
    the bank's index (``_bank_index``) over the reference queries' vectors searched with the gallery's,
    in float32, on FAISS's own threads (no bank × gallery matrix). Flat: exact (its BLAS blocks and a
    k-heap per item); among scores tied at the k-th the rows FAISS keeps are its own choice, the values,
    and so their mean, the same whichever it keeps. hnsw, ivf: approximate, the k best found (each a
    true score); an item for which fewer than k were found is a one-line VseError."""
    queries, items = (np.ascontiguousarray(vectors.detach().to(torch.float32).numpy())
                      for vectors in (bank.queries, bank.gallery))
    index = _bank_index(queries, bank.index, k)
    values, rows = index.search(items, k)
    if (rows < 0).any():
        raise VseError(f"--rescore-index {bank.index}: {int((rows < 0).any(axis=1).sum())} gallery items "
                       f"found fewer than k={k} reference queries in the bank of {len(queries)} (use flat, "
                       "or a larger bank)")
    return torch.from_numpy(values), torch.from_numpy(rows)


def _bank_index(queries: np.ndarray, kind: str, k: int):
    """The FAISS inner-product index of ``kind`` over ``queries`` (float32, contiguous), built, trained
    and set for a k-NN of ``k``: the parameters are the module's constants (the one place)."""
    import faiss

    dim = queries.shape[1]
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.add(queries)
        index.hnsw.efSearch = max(HNSW_EF_SEARCH, k)
        return index
    if kind == "ivf":
        lists = ivf_lists(len(queries))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = IVF_KMEANS_ITERATIONS
        index.cp.spherical = True  # unit centroids: the inner product assigns by angle, not by norm
        index.cp.min_points_per_centroid = 1  # a small bank: no FAISS warning, the same cells
        index.cp.max_points_per_centroid = IVF_TRAIN_PER_LIST
        index.train(queries)
        index.add(queries)
        index.nprobe = min(IVF_NPROBE, lists)
        return index
    index = faiss.IndexFlatIP(dim)
    index.add(queries)
    return index


def ivf_lists(bank: int) -> int:
    """ivf's k-means cells for a bank of ``bank`` reference queries: ``IVF_LISTS_PER_SQRT`` x sqrt."""
    return max(1, min(bank, round(IVF_LISTS_PER_SQRT * bank ** 0.5)))


# ---------------------------------------------------------------------------- blocks

def compute_dtype(matrix) -> torch.dtype:
    """float64 for a float64 matrix (numpy or tensor), float32 for anything else."""
    return torch.float64 if str(matrix.dtype) in ("float64", "torch.float64") else torch.float32


def scratch_block(buffer: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A scratch block shaped as ``like`` (its precision), reusing ``buffer``'s memory when it fits."""
    if buffer is None or buffer.dtype != like.dtype or buffer.numel() < like.numel():
        buffer = torch.empty(like.numel(), dtype=like.dtype)
    return buffer.view(-1)[:like.numel()].view(like.shape)
