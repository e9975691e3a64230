"""Small torch building blocks that the networks (``vse_model``: VSE++'s, ``heads``: VSE∞'s sets) share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence


def l2_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return F.normalize(x, p=2, dim=dim, eps=1e-8)


def pack_by_length(padded: torch.Tensor, lengths: torch.Tensor) -> PackedSequence:
    """``pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False)``, the
    same packed sequence, without its blocking copy of the sort order to the GPU (a host sync
    every step): the order goes there asynchronously."""
    lengths, order = torch.sort(lengths.to(torch.int64), descending=True)
    order = order.to(padded.device, non_blocking=True)
    packed = pack_padded_sequence(padded.index_select(0, order), lengths, batch_first=True)
    return PackedSequence(packed.data, packed.batch_sizes, order)


def bigru_states(x: torch.Tensor, rnn: nn.GRU, lengths: torch.Tensor, total_length: int) -> torch.Tensor:
    """(B, T, H): a bidirectional GRU's states at each position of the padded ``x`` (B, T, in),
    its two directions averaged, 0 past each length; packed (padding never read), in the GRU's
    own dtype with autocast off (a cuDNN RNN under autocast would run in fp16 or bf16)."""
    from torch.nn.utils.rnn import pad_packed_sequence

    with torch.autocast(device_type=x.device.type, enabled=False):
        packed = pack_by_length(x.to(rnn.weight_ih_l0.dtype), lengths.cpu())
        out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=total_length)
    half = out.shape[-1] // 2
    return (out[..., :half] + out[..., half:]) / 2


def load_word_vectors(embedding: nn.Embedding, vectors: torch.Tensor, mask: torch.Tensor) -> int:
    """Initialise the rows of ``embedding`` where ``mask`` is true from ``vectors`` (V, word_dim)
    (GloVe); returns how many."""
    with torch.no_grad():
        embedding.weight[mask] = vectors[mask].to(embedding.weight)
    return int(mask.sum())
