"""VSRN's image reasoning (Li et al., "Visual Semantic Reasoning for Image-Text Matching", ICCV
2019) as a set pool: `--network vsrn` is the dual model whose image side is this pool over the
projected members, with VSE++'s GRU caption encoder. Definitions: docs/PROTOCOL.md ("VSRN").

``VSRNReasoning(x (B, K, E), lengths)`` → (B, E):

1. ``x ← x / ‖x‖`` over the members axis (the authors' ``l2norm`` runs over dim 1 of a (B, K, E)
   tensor: the region axis, with no eps), for every dataset but f30k_precomp;
2. four region-relationship GCN layers (their ``Rs_GCN``): ``R = θ(v)ᵀ φ(v) / K`` (no softmax),
   ``v ← BN(W (R g(v))) + v``; θ, φ, g, W are 1 × 1 convolutions (linear maps of each member),
   the BatchNorm1d over the E channels, initialised at γ = β = 0 (so each layer starts as the
   identity);
3. the GCN output normalised over the members axis again, then a GRU over the members in their
   stored order; the pool's output is the GRU's last hidden state (``SetImageHead`` then
   L2-normalises it over E).

Padding (members past a set's length) is never read: the affinity, its 1/K (K = the set's own
length), both member-axis norms, the BatchNorm statistics (train mode: over the members only)
and the GRU (packed) all leave it out.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.core.tokens import PAD_ID
from pipeline.models.layers import pack_by_length


def member_norm(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The authors' ``l2norm(x)`` of a (B, K, E) tensor: over dim 1, the members, no eps; padding
    left out (set to 0)."""
    x = x.masked_fill(~mask[..., None], 0.0)
    norm = x.square().sum(dim=1, keepdim=True).sqrt()
    return x / norm.masked_fill(norm == 0, 1.0)


class RegionGCN(nn.Module):
    """One ``Rs_GCN`` layer over the members of each set (channels = E, inter = E)."""

    def __init__(self, dim: int, inter: int | None = None):
        super().__init__()
        inter = inter or dim
        self.g = nn.Linear(dim, inter)
        self.theta = nn.Linear(dim, inter)
        self.phi = nn.Linear(dim, inter)
        self.W = nn.Linear(inter, dim)
        self.bn = nn.BatchNorm1d(dim)
        nn.init.zeros_(self.bn.weight)  # Rs_GCN.py: W's BatchNorm starts at γ = β = 0
        nn.init.zeros_(self.bn.bias)

    def forward(self, v: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        keep = mask[..., None].to(v.dtype)
        relation = self.theta(v) @ self.phi(v).transpose(1, 2)            # (B, K, K)
        relation = relation * keep * keep.transpose(1, 2) / lengths.to(v)[:, None, None]
        y = self.W(relation @ self.g(v))                                   # (B, K, E)
        return self._batch_norm(y, mask) + v

    def _batch_norm(self, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """BatchNorm1d over E of the (B·K) members; in training its statistics are the valid
        members' (with sets of one length K: the authors' (B, E, K) BatchNorm exactly)."""
        bn = self.bn
        flat = y[mask]                                                     # (members, E)
        if bn.training:
            out = torch.nn.functional.batch_norm(flat, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                                                 True, bn.momentum, bn.eps)
            if bn.num_batches_tracked is not None:
                bn.num_batches_tracked.add_(1)
        else:
            out = torch.nn.functional.batch_norm(flat, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                                                 False, 0.0, bn.eps)
        full = torch.zeros_like(y)
        full[mask] = out
        return full


class VSRNReasoning(nn.Module):
    """VSRN's GCN reasoning then GRU over the members: a set pool (``registry.SET_POOLS``)."""

    def __init__(self, dim: int, layers: int = 4, region_norm: bool = True):
        super().__init__()
        self.region_norm = bool(region_norm)
        self.gcn = nn.ModuleList(RegionGCN(dim) for _ in range(int(layers)))
        self.rnn = nn.GRU(dim, dim, 1, batch_first=True)
        self.last_regions = None  # (GCN output, member mask, lengths) of the last call: the caption branch's

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        lengths = lengths.to(torch.int64)
        mask = torch.arange(x.shape[1], device=x.device)[None] < lengths.to(x.device)[:, None]
        v = member_norm(x, mask) if self.region_norm else x.masked_fill(~mask[..., None], 0.0)
        for layer in self.gcn:
            v = layer(v, mask, lengths.to(x.device))
        v = member_norm(v, mask)
        self.last_regions = (v, mask, lengths.cpu())
        dtype = self.rnn.weight_ih_l0.dtype  # the GRU in its own precision, autocast off (as the text GRU)
        with torch.autocast(device_type=x.device.type, enabled=False):
            _, hidden = self.rnn(pack_by_length(v.to(dtype), lengths.cpu()))
        return hidden[-1].to(x.dtype)


class CaptionDecoder(nn.Module):
    """VSRN's caption-generation branch: the caption written from the reasoned regions, S2VT-style
    (their ``S2VTAttModel``): a GRU encoder over the regions (E → ``hidden``), then a GRU decoder
    over the caption's words (teacher forcing) whose input at each step is the previous word's
    embedding (``word_dim``) and an attention context over the encoder's outputs
    (``softmax(w · tanh(A [h_enc; h_dec]))``), and a linear map to the vocabulary. Its loss is
    their ``LanguageModelCriterion``: the cross-entropy of each next word after ``<start>``, through
    ``<end>`` and one ``<pad>`` after it (their mask covers it), summed and divided by the batch
    size (not by the number of words). Padding regions are never attended to."""

    def __init__(self, vocab_size: int, region_dim: int, hidden: int = 512, word_dim: int = 300):
        super().__init__()
        self.encoder = nn.GRU(region_dim, hidden, 1, batch_first=True)
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.attend = nn.Linear(2 * hidden, hidden)
        self.score = nn.Linear(hidden, 1, bias=False)
        self.decoder = nn.GRU(word_dim + hidden, hidden, 1, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, regions: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor,
                lengths: torch.Tensor, region_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The summed cross-entropy of each caption's words after <start>, <end> and one <pad>
        included, each given the words before it (``tokens``: <start>…<end>, ``lengths`` real ones,
        padded with <pad>), over the batch size; the regions (B, K, E) with their mask (and their
        counts on the CPU, ``region_lengths``; else counted from the mask)."""
        from torch.nn.utils.rnn import pad_packed_sequence

        if region_lengths is None:
            region_lengths = mask.sum(dim=1).cpu()
        with torch.autocast(device_type=regions.device.type, enabled=False):
            # in the decoder's own precision (float32 under autocast, as the GRUs here; float64 in tests),
            # packed: the encoder's last state is each set's own, after its last real region
            packed, state = self.encoder(pack_by_length(regions.to(self.encoder.weight_ih_l0.dtype),
                                                        region_lengths))
            encoded, _ = pad_packed_sequence(packed, batch_first=True, total_length=regions.shape[1])
            # one <pad> column more: every caption, the longest too, has its <pad> after <end> to predict
            tokens = torch.nn.functional.pad(tokens, (0, 1), value=PAD_ID)
            words = self.embed(tokens[:, :-1])                              # (B, T, word_dim)
            # A [h_enc; h_dec] + a = (A_enc h_enc + a) + A_dec h_dec: the regions' half once, not per word
            hidden = encoded.shape[2]
            keys = torch.nn.functional.linear(encoded, self.attend.weight[:, :hidden], self.attend.bias)
            logits = []
            for t in range(words.shape[1]):
                query = torch.nn.functional.linear(state[-1], self.attend.weight[:, hidden:])  # (B, H)
                weights = self.score(torch.tanh(keys + query[:, None]))[..., 0]
                weights = torch.softmax(weights.masked_fill(~mask, -torch.inf), dim=1)
                context = (weights[..., None] * encoded).sum(dim=1)         # (B, H)
                step, state = self.decoder(torch.cat([words[:, t], context], dim=1)[:, None], state)
                logits.append(self.out(step[:, 0]))
            logits = torch.stack(logits, dim=1)                             # (B, T, vocab)
            steps = torch.arange(tokens.shape[1] - 1, device=tokens.device)
            lengths = lengths.to(tokens.device)[:, None]
            counted = steps[None] < lengths                       # the words after <start>, then a <pad>
            target = tokens[:, 1:].masked_fill(steps[None] >= lengths - 1, PAD_ID)  # never what padding holds
            nll = -torch.log_softmax(logits, dim=2).gather(2, target[..., None])[..., 0]
            return (nll * counted).sum() / len(tokens)
