"""Size augmentation of set-valued image features (VSE∞): a training batch of sets loses
random members, so the pool sees sets of many sizes.  Torch-free numpy (torch tensors are
accepted and returned); one call handles the whole batch, no loop over its sets.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.registry import SIZE_AUGMENT_RULES

DROP_RATE = 0.2      # a member is dropped when its uniform draw is <= 0.2 (kept where > 0.2)
GRID_KEEP_ALL = 0.2  # grid rule: a set whose own draw u is <= 0.2 keeps every member


def size_augment(features, lengths=None, *, rng, rule: str):
    """Drop members of each set of ``features`` (B, K, D) at random; return ``(features,
    lengths)`` with the kept members compacted to the front in their order, the padding zero,
    and K cut to the longest kept set (as the authors' batches are padded).

    ``lengths`` (B,): members at positions >= length are padding and never kept (None: all K
    are members).  ``rng``: a ``numpy.random.Generator`` or ``RandomState``; the same state
    gives the same augmentation.  ``rule``:

    - ``"precomp"`` (VSE∞ over precomputed regions): each member is kept where its uniform draw
      is > 0.2.  One draw per member, set after set, so a ``RandomState`` seeded as the
      authors' ``np.random`` gives their draws (their loader draws per item);
    - ``"grid"`` (VSE∞ over CNN grids): draws r (B, K), then u (B,); a set with u <= 0.2 keeps
      all its members, else it keeps those with r > 0.2 u (a drop rate 0.2 u, u ~ U(0.2, 1)).

    Unlike the authors' code, which can drop every member of a set (probability 0.2^K per set
    under "precomp"), a set never ends empty: it keeps its member with the largest draw.
    ``features`` may be a numpy array or a torch tensor (then the result is a tensor on its
    device, lengths an int64 CPU tensor); numpy returns int64 lengths.
    """
    if rule not in SIZE_AUGMENT_RULES:
        raise ValueError(f"rule must be one of {SIZE_AUGMENT_RULES}, got {rule!r}")
    if features.ndim != 3:
        raise ValueError(f"features must be (B, K, D), got shape {tuple(features.shape)}")
    batch, size = features.shape[0], features.shape[1]
    lengths = np.full(batch, size, np.int64) if lengths is None else np.asarray(
        lengths.cpu() if hasattr(lengths, "cpu") else lengths).astype(np.int64)
    if lengths.shape != (batch,) or (batch and (lengths.min() < 1 or lengths.max() > size)):
        raise ValueError(f"lengths must be (B,) in 1..{size}, got {lengths!r}")
    valid = np.arange(size) < lengths[:, None]
    keep, draws = _keep(valid, rng, rule)
    empty = ~keep.any(axis=1)
    keep[empty, np.where(valid, draws, -1.0)[empty].argmax(axis=1)] = True  # never an empty set
    new_lengths = keep.sum(axis=1)
    width = int(new_lengths.max()) if batch else 0
    order = np.argsort(~keep, axis=1, kind="stable")[:, :width]  # kept first, in their order
    padding = np.arange(width) >= new_lengths[:, None]
    if isinstance(features, np.ndarray):
        out = np.take_along_axis(features, order[..., None], axis=1)
        out[padding] = 0
        return out, new_lengths.astype(np.int64)
    import torch

    index = torch.from_numpy(order).to(features.device)[..., None].expand(-1, -1, features.shape[2])
    out = features.gather(1, index).masked_fill(torch.from_numpy(padding).to(features.device)[..., None], 0)
    return out, torch.from_numpy(new_lengths.astype(np.int64))


def _keep(valid: np.ndarray, rng, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """(keep, draws), both (B, K): which members stay, and each member's uniform draw."""
    if rule == "precomp":
        draws = np.zeros(valid.shape)
        draws[valid] = rng.random(int(valid.sum()))  # row-major: set after set
        return valid & (draws > DROP_RATE), draws
    draws = rng.random(valid.shape)
    u = rng.random(valid.shape[0])[:, None]
    return valid & ((u <= GRID_KEEP_ALL) | (draws > DROP_RATE * u)), draws
