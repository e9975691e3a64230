"""Attention pooling over a set (the attention-based MIL pooling of Ilse et al., ICML 2018,
without its gate): an example of a `vse` set-pool plug-in.

    vse check-pool examples/attention_pool.py:AttentionPool
    vse check-pool examples/attention_pool.py:AttentionPool --pool-option hidden=64

A pool is any torch.nn.Module built as ``Class(dim=E, **options)`` and called as
``pool(x, lengths)``: x (B, K, E) the members of B sets, padded to K; lengths (B,) how many
members each set has (1..K).  It returns (B, E).  Positions >= length are padding whose values
are arbitrary, so a pool must mask them before reading (here: zeroed, and left out of the
softmax).  Its parameters are trained with the model and saved in the checkpoints.
"""

import math

import torch
from torch import nn


class AttentionPool(nn.Module):
    """sum_k a_k x_k with a = softmax over the set's members of w · tanh(V x_k)."""

    def __init__(self, dim: int, hidden: int = 128):
        super().__init__()
        self.score = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x, lengths):
        padding = torch.arange(x.shape[1], device=x.device) >= lengths.to(x.device)[:, None]
        x = x.masked_fill(padding[..., None], 0)
        scores = self.score(x).squeeze(-1).masked_fill(padding, -math.inf)
        return torch.einsum("bk,bke->be", scores.softmax(dim=1), x)
