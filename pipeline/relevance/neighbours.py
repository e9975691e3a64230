"""Top-n most relevant captions of every caption, in blocks (memory linear in the corpus).

Each block of queries is scored against the whole pool (``block × pool`` matmul) and only
its top-n survive, so the n × n table is never built. On a GPU the pool sits on the device
and a COCO-sized search (616k × 566k × 400) takes seconds; on a CPU it is the costly part
of the stage (about an hour for COCO on 2 cores), hence optional.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.core import runtime
from pipeline.core.errors import VseError
from pipeline.text.vectors import relevance_matrix

BLOCK_BYTES = {"cpu": 256 << 20, "cuda": 2 << 30}  # the block × pool score matrix (float32)


def top_neighbours(vectors: np.ndarray, pool: np.ndarray, n: int, *,
                   coarse_vectors: np.ndarray | None = None, threshold: float | None = None,
                   device="auto", block_bytes: int | None = None):
    """For every row of ``vectors``: the ``n`` pool captions of highest relevance, itself
    excluded. Returns (indices (M, n) int64 — caption indices from ``pool`` — and scores
    (M, n) float32), best first."""
    pool = np.asarray(pool, dtype=np.int64)
    num = len(vectors)
    if n < 1 or n > len(pool) - 1:
        raise VseError(f"--neighbours must be between 1 and {len(pool) - 1} (the training "
                       f"captions minus the caption itself), not {n}")
    device = runtime.resolve_device(device)
    candidates = _to(vectors[pool], device)
    coarse_candidates = None if coarse_vectors is None else _to(coarse_vectors[pool], device)
    position = torch.full((num,), -1, dtype=torch.int64, device=device)
    position[torch.from_numpy(pool).to(device)] = torch.arange(len(pool), device=device)
    pool_t = torch.from_numpy(pool).to(device)
    block_bytes = block_bytes or BLOCK_BYTES.get(device.type, BLOCK_BYTES["cpu"])
    block = int(max(1, min(num, block_bytes // (4 * len(pool)))))

    indices = np.empty((num, n), dtype=np.int64)
    scores = np.empty((num, n), dtype=np.float32)
    for start in range(0, num, block):
        stop = min(start + block, num)
        rel = relevance_matrix(
            _to(vectors[start:stop], device), candidates,
            None if coarse_vectors is None else _to(coarse_vectors[start:stop], device),
            coarse_candidates, threshold)
        own = position[start:stop]  # where each query sits in the pool (-1: not in it)
        inside = torch.nonzero(own >= 0).squeeze(1)
        rel[inside, own[inside]] = float("-inf")
        top_scores, top_at = rel.topk(n, dim=1)
        indices[start:stop] = pool_t[top_at].cpu().numpy()
        scores[start:stop] = top_scores.cpu().numpy()
    return indices, scores


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)
