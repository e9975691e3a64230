"""Test-time re-scoring against hubness (issue 61): ``isf``, ``csls``, ``qbnorm``, ``dsl``, ``nnn``,
each one small class over ``Rescorer`` (the checks, the options, the blocks), and the hubness of a
ranking (``k_occurrence``, ``hubness``: the skewness of N_k).

Every method corrects a score matrix ``S`` of Q queries × G gallery items (rows are queries: for
image→text pass the images × captions matrix, for text→image its transpose) and is used as
``RESCORERS[name](**options)(scores, bank)``. ``bank`` (Nb × G) holds the scores of Nb *reference
queries* against the same gallery: the queries of the same modality from another split.

What a correction may see (the bank from the training split, never the evaluated one; transductive
corrections only with ``--transductive``, recorded), each method's formula, source and differences
from its authors' code, and the hubness: docs/PROTOCOL.md, "Re-scoring at test time" (the one place;
``plan_rescore`` enforces the rule). Every correction of an inductive method is
``S'_ij = a * S_ij - c_j`` (csls adds a per-query term that leaves each query's ranking unchanged):
``fit(bank)`` returns that per-gallery-item part (``ItemCorrection``: ``scale`` a, ``bias`` c, and
for qbnorm its activation set ``active``) so that a search index can store it and stay exact; with a
fixed bank qbnorm's is per item too: a search answers a query with one raw search (its top-1) and,
when that item is in the activation set, one corrected one.

A bank is a score matrix, an iterable of its row blocks, or a dual network's vectors
(``VectorBank``), whose k nearest reference queries (csls, nnn) are a FAISS search with the bank's
index (``--rescore-index``): its forms, its k-NN and its indexes are
``pipeline.evaluation.rescore_bank``'s. What needs every score (isf's and qbnorm's log-sum-exp,
qbnorm's activation set from the same pass) reads them a block of reference queries at a time. A
score matrix's k largest are ``torch.topk`` over row blocks, merged as the blocks stream (one pass
over the bank). Which path a bank takes is ``_bank_topk_mean``'s choice alone: float64 with the
exact index stays on the torch path (FAISS is float32; the golden tests compare in float64). The
corrected matrix is one output array (``out=scores`` corrects in place), written a block of rows at a time,
in place in the output (no temporary matrix per block but one reused buffer).

Precision: each step computes in its input's precision, float64 stays float64 (the golden tests
compare in float64, to 1e-10), anything else runs in float32 (a score matrix of a float32 model:
the fast path, several times cheaper than float64 blocks; bench/rescore.py). A fit's ``bias`` is
float64 whatever it was computed in; ``apply`` casts it once to the scores' precision. The float32
path equals the float64 goldens to 1e-5 of the matrix's scale, with the same rankings
(tests/test_rescore.py, the bound justified there).
The k largest are ``topk(sorted=False)`` over contiguous rows (the bank's blocks transposed once),
never a sort; finiteness is checked by one ``aminmax`` per block (no mask).

Hubness: ``k_occurrence`` (N_k) and ``hubness`` (its skewness), k = 10, of one direction's matrix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from pipeline.core import values
from pipeline.core.errors import VseError
from pipeline.core.registry import RESCORERS as _REGISTRY
from pipeline.core.values import declare
from pipeline.evaluation.rescore_bank import (
    BANK_INDEX,
    VectorBank,
    check_bank_index,
    compute_dtype,
    faiss_topk,
    scratch_block,
)

BLOCK = 1024        # rows of a score matrix or a bank handled at once
HUBNESS_K = 10      # N_10: the k of the k-occurrence whose skewness is the hubness

@dataclass(frozen=True)
class ItemCorrection:
    """The per-gallery-item part of an inductive correction: ``S'_ij = scale * S_ij - bias[j]`` for
    every query (qbnorm: for a query whose top-1 item ``j*`` has ``active[j*]``; any other keeps
    ``S_i.``). What a search index stores to apply the correction exactly."""

    scale: float
    bias: torch.Tensor                  # (G,) float64 (computed in the bank's precision)
    active: torch.Tensor | None = None  # (G,) bool, qbnorm's activation set
    bank_size: int = 0                  # the reference queries it was fitted on


class Rescorer:
    """One re-scoring method: its ``name``, whether it reads the test queries themselves
    (``transductive``; then it takes no bank), its ``Options`` (a frozen dataclass of
    ``values.declare`` fields, as a loss's, checked by ``values.declared_options``: one-line
    ``VseError`` naming ``--rescore NAME`` and the option), and the checks every method shares:
    2-D finite scores and bank with the same gallery, each ``k`` no larger than what it picks from.

    ``method(scores, bank)`` is the corrected matrix (numpy in, numpy out; a tensor in, a tensor out;
    float64 stays float64, anything else float32, computed in that precision). An inductive method
    is ``fit(bank)`` (its ``ItemCorrection``) then ``apply(scores, correction)``."""

    name: ClassVar[str] = ""
    transductive: ClassVar[bool] = False
    knn: ClassVar[bool] = False  # its fit is each gallery item's k nearest reference queries alone

    @dataclass(frozen=True)
    class Options:
        pass

    def __init__(self, **options):
        self.options = values.declared_options(self.Options, options, self.owner, error=VseError)
        for field in dataclasses.fields(self.Options):
            setattr(self, field.name, getattr(self.options, field.name))

    @property
    def owner(self) -> str:
        return f"--rescore {self.name}"

    def record(self) -> dict:
        """What a result records of the correction: the method, its options, whether transductive
        (the bank's split and size are the caller's to add)."""
        return {"method": self.name, "options": dataclasses.asdict(self.options),
                "transductive": self.transductive}

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(self.options).items())
        return f"{type(self).__name__}({given})"

    def __call__(self, scores, bank=None, *, out=None, block: int = BLOCK):
        scores = self._scores(scores)
        if self.transductive:
            if bank is not None:
                raise VseError(f"{self.owner} is transductive: it normalises over the test queries "
                               "themselves and takes no bank")
            return self._transductive(scores, out, block)
        if bank is None:
            raise VseError(f"{self.owner} needs a reference bank (the scores of reference queries "
                           "against the same gallery)")
        return self.apply(scores, self.fit(bank, scores.shape[1], block=block), out=out, block=block)

    # ------------------------------------------------------------------ what a method defines
    def fit(self, bank, gallery: int | None = None, *, block: int = BLOCK) -> ItemCorrection:
        """The per-gallery-item correction from ``bank`` (Nb × G, or an iterable of row blocks)."""
        raise VseError(f"{self.owner} is transductive: it has no per-item correction")

    def apply(self, scores, correction: ItemCorrection, *, out=None, block: int = BLOCK):
        """``scores`` corrected by a ``fit`` of this method."""
        scores = self._scores(scores)
        if len(correction.bias) != scores.shape[1]:
            raise VseError(f"{self.owner}: the correction has {len(correction.bias)} gallery items, "
                           f"the scores {scores.shape[1]}")
        self._check_gallery_k(scores.shape[1])
        cast = dataclasses.replace(correction, bias=correction.bias.to(compute_dtype(scores)))  # once
        return _by_rows(scores, out, block, lambda rows, into: self._corrected(rows, cast, into))

    def _corrected(self, rows: torch.Tensor, c: ItemCorrection, into: torch.Tensor) -> torch.Tensor:
        """The corrected ``rows``, written into ``into`` (a block of the output, of the compute
        precision; it may be ``rows`` itself: read a row's values before writing them) or returned."""
        return torch.mul(rows, c.scale, out=into).sub_(c.bias)

    def _transductive(self, scores, out, block):
        raise NotImplementedError

    def _check_gallery_k(self, gallery: int) -> None:
        """A k picked from each query's gallery row is no larger than the gallery."""

    def check_index(self, index: str) -> None:
        """An approximate bank index (``--rescore-index``, not flat) only for a method whose fit is a
        k-NN (csls, nnn); isf's and qbnorm's log-sum-exp reads every bank score: one-line VseError."""
        if check_bank_index(index) != BANK_INDEX and not self.knn:
            raise VseError(f"--rescore-index {index}: {self.owner} needs every bank score (its log-sum-exp "
                           f"over the bank), not a k-NN; only {_knn_names()} take an approximate index")

    # ------------------------------------------------------------------ shared checks
    def _scores(self, scores):
        if isinstance(scores, np.ndarray):
            shape = scores.shape
        elif isinstance(scores, torch.Tensor):
            shape = tuple(scores.shape)
        else:
            scores = np.asarray(scores)
            shape = scores.shape
        if len(shape) != 2 or 0 in shape:
            raise VseError(f"{self.owner}: scores must be a non-empty queries × gallery matrix, "
                           f"got shape {tuple(shape)}")
        stored = _as_stored(scores)  # finiteness has no order: read the memory in its own order
        for start in range(0, stored.shape[0], BLOCK):
            if not _finite(torch.as_tensor(stored[start:start + BLOCK])):
                raise VseError(f"{self.owner}: scores contain NaN or infinite values")
        return scores

    def _bank_blocks(self, bank, gallery: int | None, block: int,
                     k: int | None = None) -> Iterator[torch.Tensor]:
        """The bank's row blocks (float64 stays float64, anything else float32), checked: 2-D,
        ``gallery`` columns, finite, non-empty, at least ``k`` rows (checked before the first block
        when the bank is a matrix, else once it has streamed)."""
        if isinstance(bank, VectorBank):
            self.check_index(bank.index)
            self._check_vectors(bank, gallery)
            blocks = bank.blocks(block)
        else:
            blocks = _row_blocks(bank, block) if hasattr(bank, "shape") else iter(bank)
        if hasattr(bank, "shape") and len(bank.shape) == 2 and k is not None and 0 < bank.shape[0] < k:
            raise self._small_bank(k, bank.shape[0])
        rows = 0
        for part in blocks:
            part = torch.as_tensor(part)
            part = part.to(compute_dtype(part))
            if part.ndim != 2 or (gallery is not None and part.shape[1] != gallery):
                raise VseError(f"{self.owner}: the bank must be reference queries × {gallery or 'G'} "
                               f"gallery items, got a block of shape {tuple(part.shape)}")
            if not _finite(part):
                raise VseError(f"{self.owner}: the bank contains NaN or infinite values")
            gallery = part.shape[1]
            rows += len(part)
            yield part
        if rows == 0:
            raise VseError(f"{self.owner}: the bank is empty")
        if k is not None and rows < k:
            raise self._small_bank(k, rows)

    def _check_vectors(self, bank: VectorBank, gallery: int | None, k: int | None = None) -> None:
        """A ``VectorBank``'s checks, those of a score matrix: 2-D vectors of one width, ``gallery``
        items, finite (then so are their inner products), non-empty, at least ``k`` reference queries."""
        queries, items = bank.queries, bank.gallery
        if queries.ndim != 2 or items.ndim != 2 or queries.shape[1] != items.shape[1]:
            raise VseError(f"{self.owner}: the bank's vectors must be reference queries × d and gallery "
                           f"× d, got {tuple(queries.shape)} and {tuple(items.shape)}")
        if gallery is not None and len(items) != gallery:
            raise VseError(f"{self.owner}: the bank must be reference queries × {gallery} gallery items, "
                           f"got {len(items)} gallery vectors")
        if not (_finite(queries) and _finite(items)):
            raise VseError(f"{self.owner}: the bank contains NaN or infinite values")
        if len(queries) == 0:
            raise VseError(f"{self.owner}: the bank is empty")
        if k is not None and len(queries) < k:
            raise self._small_bank(k, len(queries))

    def _bank_topk_mean(self, bank, gallery: int | None, block: int, k: int) -> tuple[torch.Tensor, int]:
        """The mean of each gallery item's k largest bank scores, and the bank's rows: the one place
        choosing the path. A float32 ``VectorBank``, or one with an approximate index: a FAISS search
        with its index (``faiss_topk``), no bank × gallery matrix; anything else (a score matrix or its
        blocks, float64 vectors with the flat index): the streamed blocks' ``torch.topk``
        (``_column_topk_mean``)."""
        searched = isinstance(bank, VectorBank) and (compute_dtype(bank) == torch.float32
                                                     or bank.index != BANK_INDEX)
        if searched:
            self._check_vectors(bank, gallery, k)
            return faiss_topk(bank, k)[0].mean(dim=1), len(bank.queries)
        return _column_topk_mean(self._bank_blocks(bank, gallery, block, k), k)

    def _small_bank(self, k: int, rows: int) -> VseError:
        return VseError(f"{self.owner}: k={k} is larger than the bank ({rows} reference queries)")

    def _gallery_k(self, k: int, gallery: int) -> None:
        if k > gallery:
            raise VseError(f"{self.owner}: k={k} is larger than the gallery ({gallery} items)")


# ---------------------------------------------------------------------------- the methods

class InvertedSoftmax(Rescorer):
    name = "isf"

    @dataclass(frozen=True)
    class Options:
        beta: float = declare(30.0, "Inverse temperature of the softmax over the bank's queries "
                                    "(MUSE's invsm_beta_30).", above=0)

    def fit(self, bank, gallery=None, *, block=BLOCK) -> ItemCorrection:
        lse, rows = _column_logsumexp(self._bank_blocks(bank, gallery, block), self.beta)
        return ItemCorrection(self.beta, lse.to(torch.float64), bank_size=rows)


class CSLS(Rescorer):
    name = "csls"
    knn = True

    @dataclass(frozen=True)
    class Options:
        k: int = declare(10, "Neighbours averaged on each side: each query's k nearest gallery "
                             "items, each item's k nearest reference queries.", low=1)

    def fit(self, bank, gallery=None, *, block=BLOCK) -> ItemCorrection:
        mean, rows = self._bank_topk_mean(bank, gallery, block, self.k)
        if gallery is not None:
            self._check_gallery_k(gallery)
        return ItemCorrection(2.0, mean.to(torch.float64), bank_size=rows)

    def _check_gallery_k(self, gallery):
        self._gallery_k(self.k, gallery)

    def _corrected(self, rows, c, into):
        query = rows.topk(self.k, dim=1, sorted=False).values.mean(dim=1, keepdim=True)  # before into
        return torch.mul(rows, 2.0, out=into).sub_(c.bias).sub_(query)


class QBNorm(Rescorer):
    name = "qbnorm"

    @dataclass(frozen=True)
    class Options:
        beta: float = declare(20.0, "Inverse temperature of the inverted softmax over the bank.", above=0)
        k: int = declare(1, "The activation set: the gallery items among some reference query's "
                            "top k.", low=1)

    def fit(self, bank, gallery=None, *, block=BLOCK) -> ItemCorrection:
        if gallery is not None:
            self._check_gallery_k(gallery)
        lse, active, rows, buffer = None, None, 0, None
        for part in self._bank_blocks(bank, gallery, block):  # one pass: both from each block
            self._check_gallery_k(part.shape[1])
            if active is None:
                active = torch.zeros(part.shape[1], dtype=torch.bool)
            active |= _top_mask(part, self.k).any(dim=0)
            buffer = scratch_block(buffer, part)
            lse = _merged_logsumexp(lse, part, self.beta, buffer)
            rows += len(part)
        return ItemCorrection(self.beta, lse.to(torch.float64), active, bank_size=rows)

    def _check_gallery_k(self, gallery):
        self._gallery_k(self.k, gallery)

    def apply(self, scores, correction, *, out=None, block=BLOCK):
        if correction.active is None:
            raise VseError(f"{self.owner}: the correction has no activation set (not a qbnorm fit)")
        return super().apply(scores, correction, out=out, block=block)

    def _corrected(self, rows, c, into):
        hit = c.active[rows.argmax(dim=1)].nonzero().flatten()
        fixed = rows[hit].mul_(c.scale).sub_(c.bias)  # only the active queries' rows
        if into.data_ptr() != rows.data_ptr():
            into.copy_(rows)
        into[hit] = fixed
        return into


class DualSoftmax(Rescorer):
    name = "dsl"
    transductive = True

    @dataclass(frozen=True)
    class Options:
        temperature: float = declare(1000.0, "Divides the logits in the softmax over the test queries "
                                             "(CAMoE's DSL.py).", above=0)
        logit_scale: float = declare(100.0, "The scores times this are the logits (CLIP's 100, the "
                                            "scale of CAMoE's matrix).", above=0)

    def _transductive(self, scores, out, block):
        factor = self.logit_scale / self.temperature
        stored = _as_stored(scores)
        if stored is scores:
            lse, queries = _column_logsumexp(_row_blocks(scores, block), factor)
        else:  # S.T: its columns' log-sum-exp is S's rows', read in S's own order (no transpose)
            lse, queries, buffer = [], scores.shape[0], None
            for part in _row_blocks(stored, block):
                buffer = scratch_block(buffer, part)
                lse.append(_merged_logsumexp(None, part.T, factor, buffer.T))
            lse = torch.cat(lse)
        buffer = None

        def corrected(rows, into):  # L * exp(L / temperature - lse) * Q, in one reused buffer
            nonlocal buffer
            buffer = scratch_block(buffer, rows)
            prior = torch.mul(rows, factor, out=buffer).sub_(lse).exp_().mul_(rows)
            return torch.mul(prior, self.logit_scale * queries, out=into)

        return _by_rows(scores, out, block, corrected)


class NNN(Rescorer):
    name = "nnn"
    knn = True

    @dataclass(frozen=True)
    class Options:
        k: int = declare(256, "Reference queries averaged per gallery item (nnn-retrieval's "
                              "alternate_ks).", low=1)
        alpha: float = declare(0.5, "Weight of the subtracted bias (nnn-retrieval's alternate_weight).",
                               low=0)

    def fit(self, bank, gallery=None, *, block=BLOCK) -> ItemCorrection:
        mean, rows = self._bank_topk_mean(bank, gallery, block, self.k)
        return ItemCorrection(1.0, self.alpha * mean.to(torch.float64), bank_size=rows)


# the names are the registry's (pipeline.core.registry.RESCORERS); each class says its own name too
RESCORERS: dict[str, type[Rescorer]] = _REGISTRY.resolved()
RESCORE_NAMES = _REGISTRY.names
assert all(cls.name == name for name, cls in RESCORERS.items())


def _knn_names() -> str:
    """The methods whose fit is a k-NN of the bank (``Rescorer.knn``), for a message."""
    return ", ".join(name for name, cls in RESCORERS.items() if cls.knn)


def build_rescorer(name: str, **options) -> Rescorer:
    """The method ``name`` (one of ``RESCORE_NAMES``) with its options; one-line VseError for an
    unknown name or option, or a wrong value."""
    if name not in RESCORERS:
        raise VseError(f"--rescore: unknown method {name!r} (known: {', '.join(RESCORE_NAMES)})")
    return RESCORERS[name](**options)


# ---------------------------------------------------------------------------- hubness

def k_occurrence(scores, k: int = HUBNESS_K, *, block: int = BLOCK) -> np.ndarray:
    """``N_k``: for each gallery item (column), how many queries (rows) rank it among their top k."""
    shape = tuple(scores.shape)
    if len(shape) != 2 or 0 in shape:
        raise VseError(f"hubness: scores must be a non-empty queries × gallery matrix, got shape {shape}")
    if not values.is_int(k) or not 1 <= k <= shape[1]:
        raise VseError(f"hubness: k must be an integer in [1, {shape[1]}] (the gallery), got {k!r}")
    counts = torch.zeros(shape[1], dtype=torch.long)
    for rows in _row_blocks(scores, block):
        if not _finite(rows):
            raise VseError("hubness: scores contain NaN or infinite values")
        counts += _top_mask(rows, k).sum(dim=0)
    return counts.numpy()


def hubness(scores, k: int = HUBNESS_K, *, block: int = BLOCK) -> float:
    """The skewness of the k-occurrence distribution ``N_k`` over the gallery (0: no hub)."""
    counts = k_occurrence(scores, k, block=block).astype(np.float64)
    centred = counts - counts.mean()
    spread = float(np.mean(centred ** 2))
    return 0.0 if spread == 0.0 else float(np.mean(centred ** 3) / spread ** 1.5)


# ---------------------------------------------------------------------------- blocks

def _finite(block: torch.Tensor) -> bool:
    """Whether every value is finite: one min/max pass (NaN propagates into both), no mask."""
    if block.numel() == 0:
        return True
    low, high = torch.aminmax(block)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def _as_stored(matrix):
    """``matrix`` or, when it is the transpose of a row-major matrix (``S.T``: text→image), that
    matrix: the same values in their memory's order, whose row blocks are contiguous."""
    if isinstance(matrix, torch.Tensor):
        return matrix.T if not matrix.is_contiguous() and matrix.T.is_contiguous() else matrix
    if isinstance(matrix, np.ndarray) and not matrix.flags.c_contiguous and matrix.flags.f_contiguous:
        return matrix.T
    return matrix


def _row_blocks(matrix, block: int) -> Iterator[torch.Tensor]:
    """``matrix``'s row blocks as contiguous tensors, views where they can be: float64 stays float64,
    anything else float32. A block of a transposed matrix (``S.T``) is copied contiguous once, tile
    by tile (``_contiguous``), as every step after it would read it strided, several times slower;
    into one scratch matrix reused for every block: a block is valid until the next is drawn."""
    if not values.is_int(block) or block < 1:
        raise VseError(f"block must be a positive integer, got {block!r}")
    dtype = compute_dtype(matrix)
    scratch: list = [None]
    for start in range(0, matrix.shape[0], block):
        yield _contiguous(torch.as_tensor(np.asarray(matrix[start:start + block])
                                          if not isinstance(matrix, torch.Tensor)
                                          else matrix[start:start + block]).to(dtype), scratch)


TILE = 512  # columns of a strided block copied at once: its rows then stay in cache


def _contiguous(rows: torch.Tensor, scratch: list) -> torch.Tensor:
    """``rows`` contiguous; a strided block (a row block of ``S.T`` is a column slab of ``S``) copied
    ``TILE`` columns at a time, about four times faster than ``.contiguous()`` of the whole slab,
    into ``scratch[0]`` (reused, replaced when too small)."""
    if rows.is_contiguous():
        return rows
    copy = scratch[0] = scratch_block(scratch[0], rows)
    for start in range(0, rows.shape[1], TILE):
        copy[:, start:start + TILE] = rows[:, start:start + TILE]
    return copy


def _by_rows(scores, out, block: int, correct) -> np.ndarray | torch.Tensor:
    """``correct(rows, into)`` applied a block of rows at a time into ``out`` (a new array like
    ``scores``: numpy or tensor, float64 or float32; or one given, e.g. ``scores`` itself): ``into`` is
    the output's block (a view) when it has the compute precision, else a scratch block; what
    ``correct`` returns is copied there unless it is ``into``."""
    numpy = not isinstance(scores, torch.Tensor)
    dtype = compute_dtype(scores)
    if out is None:
        out = (np.empty(scores.shape, dtype=np.float64 if dtype == torch.float64 else np.float32) if numpy
               else torch.empty(tuple(scores.shape), dtype=dtype))
    elif tuple(out.shape) != tuple(scores.shape):
        raise VseError(f"out has shape {tuple(out.shape)}, the scores {tuple(scores.shape)}")
    target = torch.from_numpy(out) if isinstance(out, np.ndarray) else out
    scratch = None
    for start, rows in zip(range(0, scores.shape[0], block), _row_blocks(scores, block)):
        view = target[start:start + len(rows)]
        direct = view.dtype == dtype and view.is_contiguous()
        if not direct:
            scratch = scratch_block(scratch, rows)
        into = view if direct else scratch
        fixed = correct(rows, into)
        if fixed is not view:
            view.copy_(fixed)
    return out


def _merged_logsumexp(lse: torch.Tensor | None, part: torch.Tensor, factor: float = 1.0,
                      buffer: torch.Tensor | None = None) -> torch.Tensor:
    """``lse`` merged with ``log sum_b exp(factor * part_bj)`` per column, computed in ``buffer`` (a
    scratch block of ``part``'s shape) in place: max, subtract, exp, sum, no other temporary."""
    scaled = part * factor if buffer is None else torch.mul(part, factor, out=buffer)
    peak = scaled.amax(dim=0)
    column = scaled.sub_(peak).exp_().sum(dim=0).log_().add_(peak)
    return column if lse is None else torch.logaddexp(lse, column)


def _column_logsumexp(blocks: Iterable[torch.Tensor], factor: float) -> tuple[torch.Tensor, int]:
    """``log sum_b exp(factor * B_bj)`` per column over the streamed row blocks, and their row count."""
    lse, rows, buffer = None, 0, None
    for part in blocks:
        buffer = scratch_block(buffer, part)
        lse, rows = _merged_logsumexp(lse, part, factor, buffer), rows + len(part)
    return lse, rows


def _column_topk_mean(blocks: Iterable[torch.Tensor], k: int) -> tuple[torch.Tensor, int]:
    """The mean of each column's k largest values over the streamed row blocks (the blocks' k largest
    merged as they come), and the row count. Each block is transposed once into a scratch matrix
    beside the k kept so far (columns as contiguous rows: topk along a strided axis costs about
    twice), then ``topk(sorted=False)``: the k largest, unordered, as the mean needs."""
    top, rows, merged = None, 0, None
    for part in blocks:
        rows += len(part)
        kept = 0 if top is None else top.shape[1]
        width = kept + len(part)
        if merged is None or merged.dtype != part.dtype or merged.shape[1] < width:
            merged = torch.empty(part.shape[1], width, dtype=part.dtype)
        now = merged[:, :width]
        if kept:
            now[:, :kept] = top
        now[:, kept:] = part.T
        top = now.topk(min(k, width), dim=1, sorted=False).values
    return top.mean(dim=1), rows


def _top_mask(rows: torch.Tensor, k: int) -> torch.Tensor:
    """(b, G) bool: each row's k largest columns, exactly k, ties at the k-th value to the lowest
    indices (topk's own choice among ties is unspecified; a full sort costs three times more). A row
    whose (k+1)-th largest value is below its k-th has one top-k set, topk's own (no pass over the row
    to count ties); only the other rows are resolved by the cumulative count of their ties."""
    top = rows.topk(min(k + 1, rows.shape[1]), dim=1)
    kth = top.values[:, k - 1:k]
    mask = torch.zeros(rows.shape, dtype=torch.bool).scatter_(1, top.indices[:, :k], True)
    if k == rows.shape[1]:
        return mask
    ties = (top.values[:, k] == kth[:, 0]).nonzero().flatten()
    if len(ties):
        part, at = rows[ties], kth[ties]
        above = part > at
        tied = part == at
        mask[ties] = above | (tied & (tied.cumsum(dim=1) <= k - above.sum(dim=1, keepdim=True)))
    return mask


# ---------------------------------------------------------------------------- `vse evaluate --rescore`

BANK_SPLIT = "train"  # the reference bank's default split (docs/PROTOCOL.md, "Re-scoring at test time")


@dataclass(frozen=True)
class RescorePlan:
    """The corrections one evaluation of ``split`` applies (``plan_rescore``): each method with its
    options, the reference bank's split and size (``bank_size`` images and their captions, the first
    of the split in the cache's order; None: the whole split), whether a transductive correction
    was asked for by name (``--transductive``), and the bank's k-NN index (``BANK_INDEXES``: flat
    exact, hnsw or ivf approximate; recorded with the result when not flat)."""

    methods: tuple[Rescorer, ...]
    split: str = "test"
    bank_split: str = BANK_SPLIT
    bank_size: int | None = None
    transductive: bool = False
    index: str = BANK_INDEX

    @property
    def uses_bank(self) -> bool:
        return any(not method.transductive for method in self.methods)

    def is_transductive(self, method: Rescorer) -> bool:
        """Whether ``method`` here reads the evaluated queries: by its nature, or through its bank."""
        return method.transductive or self.bank_split == self.split

    def check_bank(self, available: int) -> int:
        """The bank's images out of the ``available`` of its split, refused in one line when the split
        is smaller than ``--rescore-bank-size`` or a method's k is over the bank."""
        if not self.uses_bank:
            return 0
        if available == 0:
            raise VseError(f"--rescore-bank-split {self.bank_split}: the split has no images")
        if self.bank_size is not None and self.bank_size > available:
            raise VseError(f"--rescore-bank-size {self.bank_size} is larger than the {self.bank_split} split "
                           f"({available} images)")
        images = min(self.bank_size or available, available)
        for method in self.methods:  # the bank's image side is its smaller one (captions: about 5 each)
            k = getattr(method.options, "k", None)
            if not method.transductive and k is not None and k > images:
                raise VseError(f"--rescore-option {method.name}.k={k} is larger than the bank ({images} "
                               f"{self.bank_split} images)")
        return images

    def label(self, method: Rescorer, bank_images: int) -> str:
        """The ``rescore`` column of a re-scored results row: the method, its options and what it saw."""
        options = " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in dataclasses.asdict(method.options).items())
        seen = ("test queries" if method.transductive else
                f"bank {self.bank_split}:{bank_images}" + ("" if self.index == BANK_INDEX
                                                           else f" {self.index} index"))
        return f"{method.name} {options}, {seen}" + (", transductive" if self.is_transductive(method) else "")

    def row_name(self, method: Rescorer) -> str:
        """What a re-scored row adds to the raw row's name: ``+ METHOD``, and ``(transductive)`` when it
        reads the evaluated queries, so that a report, a comparison or a claim names it as such."""
        return f"+ {method.name}" + (" (transductive)" if self.is_transductive(method) else "")

    def record(self, method: Rescorer, bank_images: int) -> dict:
        """What a result records of one correction (``--json``): ``Rescorer.record`` with the bank."""
        index = {} if self.index == BANK_INDEX else {"index": self.index}  # absent: exact (flat)
        bank = None if method.transductive else {"split": self.bank_split, "images": bank_images, **index}
        return {**method.record(), "transductive": self.is_transductive(method), "bank": bank}


def plan_rescore(names, options: dict | None = None, *, split: str = "test", bank_split: str = BANK_SPLIT,
                 bank_size: int | None = None, transductive: bool = False,
                 index: str = BANK_INDEX) -> RescorePlan:
    """The plan of ``--rescore NAME ...`` with ``--rescore-option NAME.KEY=VALUE`` (or ``KEY=VALUE``
    with one method), checked before anything is embedded: an unknown method or option, a repeated
    method, a transductive method or a bank of the evaluated split without ``transductive``, an
    approximate ``index`` (``--rescore-index``) with a method whose fit is not a k-NN."""
    names = list(names)
    if len(set(names)) != len(names):
        raise VseError(f"--rescore: {next(n for n in names if names.count(n) > 1)} given twice (one row "
                       "per method)")
    for name in names:
        if name not in RESCORERS:
            raise VseError(f"--rescore: unknown method {name!r} (known: {', '.join(RESCORE_NAMES)})")
    given: dict[str, dict] = {name: {} for name in names}
    for key, value in (options or {}).items():
        name, dot, option = key.rpartition(".")
        if not dot:
            if len(names) != 1:
                raise VseError(f"--rescore-option {key}: name the method, as METHOD.{key}=VALUE "
                               f"(given: {', '.join(names)})")
            name = names[0]
        if name not in given:
            raise VseError(f"--rescore-option {key}: {name!r} is not a --rescore method here "
                           f"(given: {', '.join(names) or 'none'})")
        given[name][option] = value
    methods = tuple(build_rescorer(name, **given[name]) for name in names)
    for method in methods:
        if not method.transductive:
            method.check_index(index)
    if check_bank_index(index) != BANK_INDEX and not any(method.knn for method in methods):
        raise VseError(f"--rescore-index {index}: no method here searches the bank ({_knn_names()})")
    if not transductive:
        for method in methods:
            if method.transductive:
                raise VseError(f"--rescore {method.name} is transductive (it normalises over the test "
                               "queries themselves): give --transductive to run it")
        if bank_split == split and any(not m.transductive for m in methods):
            raise VseError(f"--rescore-bank-split {bank_split} is the evaluated split: a bank of the test "
                           "queries is transductive (give --transductive, or a bank of another split)")
    return RescorePlan(methods, split, bank_split, bank_size, transductive, index)


def split_scores(emb) -> torch.Tensor:
    """The N × M image→caption score matrix of split embeddings (``inference.SplitEmbeddings``): a
    pairwise network's S as it is, a dual network's similarity of its embeddings (float32)."""
    from pipeline.core.similarity import image_caption_scores

    if emb.pairwise:
        return torch.from_numpy(np.ascontiguousarray(emb.captions.T))
    return image_caption_scores(torch.from_numpy(emb.images), torch.from_numpy(emb.captions), emb.similarity)
