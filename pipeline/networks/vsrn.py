"""VSRN (Li et al., "Visual Semantic Reasoning for Image-Text Matching", ICCV 2019) as the authors'
code (github.com/KunpengLi1994/VSRN, model.py, GCN_lib/Rs_GCN.py, models/, misc/utils.py) has
it: `--network vsrn` is the dual model whose image side is the set pool ``VSRNReasoning`` over
the projected members, with VSE++'s GRU caption encoder, and whose caption-generation branch
(``CaptionDecoder``) trains with it. Definitions: docs/PROTOCOL.md ("VSRN"); pinned against their
code by tests/test_vsrn_golden.py (scripts/golden_vsrn.py made the bundles).

``VSRNReasoning(x (B, K, E), lengths)`` → (B, E):

1. ``x ← x / ‖x‖`` over the members axis (their ``l2norm`` runs over dim 1 of a (B, K, E)
   tensor: the region axis, with no eps), unless ``region_norm=False`` (their f30k_precomp);
2. four region-relationship GCN layers (their ``Rs_GCN``): ``R = θ(v)ᵀ φ(v) / K`` (no softmax),
   ``v ← BN(W (R g(v))) + v``; θ, φ, g, W are 1 × 1 convolutions (linear maps of each member),
   the BatchNorm1d over the E channels, initialised at γ = β = 0 (so each layer starts as the
   identity);
3. the GCN output normalised over the members axis again, then a GRU over the members in their
   stored order; the pool's output is the GRU's last hidden state, through a BatchNorm1d when
   ``image_bn=True`` (their f30k_precomp) (``SetImageHead`` then L2-normalises it over E).

Padding (members past a set's length) is never read: the affinity, its 1/K (K = the set's own
length), both member-axis norms, the BatchNorm statistics (train mode: over the members only)
and the GRUs (packed) all leave it out. The authors' sets are always full (36 regions).
"""

from __future__ import annotations

import dataclasses
import types

import torch
from torch import nn

from pipeline.core.tokens import END, PAD_ID, SPECIALS
from pipeline.networks.layers import pack_by_length
from pipeline.networks.vsrn_spec import VARIANTS, VSRNOptions  # its declaration (torch-free)

END_ID = SPECIALS.index(END)


def vsrn_options(given: dict | None) -> VSRNOptions:
    """``VSRNOptions`` from ``--network-option`` values, checked (VseError naming the options)."""
    from pipeline.networks.network import network_options

    return network_options(types.SimpleNamespace(Options=VSRNOptions, __name__="vsrn"), given, "vsrn")


def resolve_variant(variant: str, set_kind: str | None, dataset_names=()) -> str:
    """The image encoder of ``variant`` for this data. ``auto``: the authors choose by their data
    name (``data_name == 'f30k_precomp'``: f30k; coco_precomp and every other: coco). A cache
    does not hold that name, so: precomputed region sets (``set_kind`` "regions", SCAN's precomp
    folders) get f30k unless one of ``dataset_names`` (the cache's dataset and the folder it was
    imported from) contains "coco"; CNN grids (no data name of theirs) get coco, their rule for
    every name but f30k_precomp."""
    if variant != "auto":
        return variant
    if set_kind == "regions" and not any("coco" in str(name).lower() for name in dataset_names):
        return "f30k"
    return "coco"


def model_fields(given: dict | None, set_kind: str | None, dataset_names=()) -> dict:
    """The ``ModelConfig`` fields `--network vsrn` sets: its pool options (the variant's) and its
    network options with the variant resolved (kept in checkpoints)."""
    options = vsrn_options(given)
    variant = resolve_variant(options.variant, set_kind, dataset_names)
    return {"pool_options": dict(VARIANTS[variant]),
            "network_options": dataclasses.asdict(dataclasses.replace(options, variant=variant))}


def member_norm(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The authors' ``l2norm(x)`` of a (B, K, E) tensor: over dim 1, the members, no eps; padding
    left out (set to 0). ``mask`` None: every set full."""
    if mask is not None:
        x = x.masked_fill(~mask[..., None], 0.0)
    norm = x.square().sum(dim=1, keepdim=True).sqrt()
    return x / norm.masked_fill(norm == 0, 1.0)


def folds(dim: int, rows: int, inter: int | None = None) -> bool:
    """Whether ``RegionGCN`` multiplies its maps' weights first (θ's with φ's, W's with g's: E × E
    products) instead of mapping each of the ``rows`` members (padding included) twice per pair:
    ``rows·E² + E²·I`` multiply-adds per pair against ``2·rows·E·I`` (I = ``inter``), three times
    that with the backward; for I = E: when E < rows. Both ways give the same values to rounding
    (tests/test_vsrn_fold.py)."""
    inter = inter or dim
    return dim * (rows + inter) < 2 * rows * inter


class RegionGCN(nn.Module):
    """One ``Rs_GCN`` layer over the members of each set (channels = E, inter = E).

    Where ``folds`` says so, the four maps run as two: ``R = θ(v) φ(v)ᵀ`` is
    ``(v Wθᵀ Wφ + bθᵀ Wφ) vᵀ + θ(v) bφ`` (the last term constant along each row), and
    ``W (R g(v)) + b_W`` is ``R (v (W W_g)ᵀ + W b_g) + b_W``: the same values to rounding, each
    member mapped twice instead of four times, the weights multiplied in its place."""

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

    def forward(self, v: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor,
                full: bool = False) -> torch.Tensor:
        """``full``: every set has all K members (nothing to mask)."""
        fold = folds(v.shape[2], v.shape[0] * v.shape[1], self.g.out_features)
        if fold:
            theta, phi, g, W = self.theta, self.phi, self.g, self.W
            u = nn.functional.linear(v, phi.weight.t() @ theta.weight, phi.weight.t() @ theta.bias)
            row_term = nn.functional.linear(v, (theta.weight.t() @ phi.bias)[None],   # θ(v)·bφ: (B, K, 1)
                                            (theta.bias @ phi.bias)[None])
            relation = torch.baddbmm(row_term, u, v.transpose(1, 2))     # (B, K, K)
        else:
            relation = self.theta(v) @ self.phi(v).transpose(1, 2)
        if full:
            relation = relation / v.shape[1]
        else:
            keep = mask[..., None].to(v.dtype)
            relation = relation * keep * keep.transpose(1, 2) / lengths.to(v)[:, None, None]
        if fold:
            mapped = nn.functional.linear(v, W.weight @ g.weight, W.weight @ g.bias)
            y = torch.baddbmm(W.bias, relation, mapped)                    # (B, K, E)
        else:
            y = self.W(relation @ self.g(v))
        return self._batch_norm(y, None if full else mask) + v

    def _batch_norm(self, y: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """BatchNorm1d over E of the (B·K) members; in training its statistics are the valid
        members' (with sets of one length K: the authors' (B, E, K) BatchNorm exactly). ``mask``
        None: every set full."""
        bn = self.bn
        flat = y.reshape(-1, y.shape[2]) if mask is None else y[mask]      # (members, E)
        if bn.training:
            out = torch.nn.functional.batch_norm(flat, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                                                 True, bn.momentum, bn.eps)
            if bn.num_batches_tracked is not None:
                bn.num_batches_tracked.add_(1)
        else:
            out = torch.nn.functional.batch_norm(flat, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                                                 False, 0.0, bn.eps)
        if mask is None:
            return out.view_as(y)
        full = torch.zeros_like(y)
        full[mask] = out
        return full


class VSRNReasoning(nn.Module):
    """VSRN's GCN reasoning then GRU over the members: a set pool (``registry.SET_POOLS``).
    ``region_norm`` / ``image_bn``: the two image encoders of theirs (``VARIANTS``); the
    defaults are their coco_precomp one."""

    def __init__(self, dim: int, layers: int = 4, region_norm: bool = True, image_bn: bool = False):
        super().__init__()
        self.region_norm = bool(region_norm)
        self.gcn = nn.ModuleList(RegionGCN(dim) for _ in range(int(layers)))
        self.rnn = nn.GRU(dim, dim, 1, batch_first=True)
        self.image_bn = nn.BatchNorm1d(dim) if image_bn else None
        self.last_regions = None  # (GCN output, member mask, lengths) of the last call: the caption branch's

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        lengths = lengths.to(torch.int64)
        counts = lengths.cpu()
        mask = torch.arange(x.shape[1], device=x.device)[None] < lengths.to(x.device)[:, None]
        full = bool((counts == x.shape[1]).all())  # the authors' sets: no mask to apply, nothing to pack
        kept = None if full else mask
        if self.region_norm:
            v = member_norm(x, kept)
        else:
            v = x if full else x.masked_fill(~mask[..., None], 0.0)
        for layer in self.gcn:
            v = layer(v, mask, lengths.to(x.device), full)
        v = member_norm(v, kept)
        self.last_regions = (v, mask, counts)
        dtype = self.rnn.weight_ih_l0.dtype  # the GRU in its own precision, autocast off (as the text GRU)
        with torch.autocast(device_type=x.device.type, enabled=False):
            # full sets unpacked: the same last states, without the packed backward's zeroed
            # (members, 3E) gradient at every step (15 % of a step: bench/results/vsrn_step_profile.json)
            _, hidden = self.rnn(v.to(dtype) if full else pack_by_length(v.to(dtype), counts))
            out = hidden[-1]
            if self.image_bn is not None:
                out = self.image_bn(out)
        return out.to(x.dtype)


class CaptionDecoder(nn.Module):
    """VSRN's caption-generation branch, their ``S2VTAttModel(EncoderRNN, DecoderRNN)``: the
    reasoned regions (B, K, E) → ``vid2hid`` (E → ``hidden``, Xavier-normal weight) → dropout →
    a GRU encoder; then a GRU decoder over the caption's words, teacher-forced, whose input at
    each step is ``dropout([embedding of the word; attention context])`` — the context
    ``Σ_k softmax_k(w · tanh(A [enc_k; h]))·enc_k`` over the encoder's outputs, h the decoder's
    state — and a linear map to the vocabulary (Xavier-normal weight). The decoder starts from
    the encoder's last state. Captions are cut to ``max_len`` tokens (the last one made <end>),
    as their data.py; at most ``max_len - 1`` words are predicted.

    Its loss is their ``LanguageModelCriterion``: the cross-entropy of each next word after
    <start>, through <end> and the one <pad> after it (their data.py's mask covers it), summed
    and divided by the batch size (not by the number of words). Padding regions are never read
    (their sets have none)."""

    def __init__(self, vocab_size: int, region_dim: int, hidden: int = VSRNOptions.caption_hidden,
                 word_dim: int = VSRNOptions.caption_word_dim, max_len: int = VSRNOptions.caption_max_len,
                 dropout: float = VSRNOptions.caption_dropout):
        super().__init__()
        self.max_len = int(max_len)
        self.vid2hid = nn.Linear(region_dim, hidden)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.GRU(hidden, hidden, 1, batch_first=True)
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.attend = nn.Linear(2 * hidden, hidden)
        self.score = nn.Linear(hidden, 1, bias=False)
        self.decoder = nn.GRU(word_dim + hidden, hidden, 1, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)
        nn.init.xavier_normal_(self.vid2hid.weight)  # EncoderRNN._init_hidden
        nn.init.xavier_normal_(self.out.weight)      # DecoderRNN._init_weights (Attention: torch's init)

    def cut(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions longer than ``max_len`` tokens cut to ``max_len``, the last one <end> (their
        PrecompDataset.__getitem__)."""
        if tokens.shape[1] <= self.max_len:
            return tokens, lengths
        long = (lengths > self.max_len).to(tokens.device)
        tokens = tokens[:, :self.max_len].clone()
        tokens[:, -1] = torch.where(long, torch.full_like(tokens[:, -1], END_ID), tokens[:, -1])
        return tokens, lengths.clamp(max=self.max_len)

    def forward(self, regions: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor,
                lengths: torch.Tensor, region_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The loss of writing each caption (``tokens``: <start>…<end>, ``lengths`` real ones,
        padded) from its regions (B, K, E) with their mask (and their counts on the CPU,
        ``region_lengths``; else counted from the mask)."""
        from torch.nn.utils.rnn import pad_packed_sequence

        if region_lengths is None:
            region_lengths = mask.sum(dim=1).cpu()
        full = bool((region_lengths == regions.shape[1]).all())  # the authors' sets: no padding
        tokens, lengths = self.cut(tokens, lengths)
        with torch.autocast(device_type=regions.device.type, enabled=False):
            # in the decoder's own precision (float32 under autocast, as the GRUs here; float64 in tests),
            # packed: the encoder's last state is each set's own, after its last real region
            inputs = self.dropout(self.vid2hid(regions.to(self.vid2hid.weight.dtype)))
            if full:
                encoded, state = self.encoder(inputs)
            else:
                packed, state = self.encoder(pack_by_length(inputs, region_lengths))
                encoded, _ = pad_packed_sequence(packed, batch_first=True, total_length=regions.shape[1])
            # one <pad> column more: every caption, the longest too, has its <pad> after <end> to predict
            tokens = torch.nn.functional.pad(tokens, (0, 1), value=PAD_ID)
            steps = min(tokens.shape[1] - 1, self.max_len - 1)
            words = self.embed(tokens[:, :steps])                            # (B, T, word_dim)
            # A [h_enc; h_dec] + a = (A_enc h_enc + a) + A_dec h_dec: the regions' half once, not per word
            hidden = encoded.shape[2]
            keys = torch.nn.functional.linear(encoded, self.attend.weight[:, :hidden], self.attend.bias)
            states = []
            for t in range(steps):
                query = torch.nn.functional.linear(state[-1], self.attend.weight[:, hidden:])  # (B, H)
                weights = self.score(torch.tanh(keys + query[:, None]))[..., 0]
                if not full:
                    weights = weights.masked_fill(~mask, -torch.inf)
                weights = torch.softmax(weights, dim=1)
                context = torch.bmm(weights[:, None], encoded)[:, 0]         # (B, H)
                step_input = self.dropout(torch.cat([words[:, t], context], dim=1))
                step, state = self.decoder(step_input[:, None], state)
                states.append(step)
            states = torch.cat(states, dim=1)                               # (B, T, H)
            position = torch.arange(steps, device=tokens.device)[None]
            lengths = lengths.to(tokens.device)[:, None]
            counted = position < lengths                          # the words after <start>, then a <pad>
            # the <pad> after <end> as PAD_ID, never what the batch's padding holds
            target = tokens[:, 1:steps + 1].masked_fill(position >= lengths - 1, PAD_ID)
            # the vocabulary map and its softmax once, over the predicted words only (no row past a
            # caption's <pad> is read): one product instead of one per step
            logits = self.out(states[counted])                              # (words, vocab)
            return torch.nn.functional.cross_entropy(logits, target[counted], reduction="sum") / len(tokens)


class AdamListingTwice(torch.optim.Adam):
    """Adam as the authors' list makes it (model.py:456-460: the caption encoder and decoder are
    in it twice): every parameter takes Adam's step, then those of ``twice`` take a second one
    with the same gradient and the state the first left — what PyTorch's Adam does, one tensor
    at a time, with a parameter listed twice — here in any of its kernels, each parameter once
    in the groups (the state dict, the loss scaler's unscaling)."""

    def __init__(self, params, twice, **kwargs):
        super().__init__(params, **kwargs)
        self.twice = list(twice)
        self._step_supports_amp_scaling = False  # a GradScaler unscales first, then calls step()

    def step(self, closure=None):
        loss = super().step(closure)
        twice = {id(q) for q in self.twice}
        held = [(q, q.grad) for group in self.param_groups for q in group["params"]
                if id(q) not in twice and q.grad is not None]
        for q, _ in held:
            q.grad = None
        try:
            super().step()
        finally:
            for q, grad in held:
                q.grad = grad
        return loss


def listed_twice(params: list) -> tuple[list, list]:
    """(each parameter once, in order; those that ``params`` lists twice)."""
    seen, twice = {}, {}
    for q in params:
        if id(q) in seen:
            twice[id(q)] = q
        seen.setdefault(id(q), q)
    return list(seen.values()), list(twice.values())


def from_vsrn(img_enc: dict | None = None, txt_enc: dict | None = None,
              caption_model: dict | None = None) -> dict:
    """The state dicts of their ``img_enc`` (EncoderImagePrecompAttn), ``txt_enc`` (EncoderText)
    and ``caption_model`` (S2VTAttModel) — a checkpoint of theirs holds the first two — as a
    ``VSEModel``'s state dict (1 × 1 convolutions as linear maps)."""
    out = {}
    head, pool = "image_encoder.head.", "image_encoder.head.pool."
    for key, value in (img_enc or {}).items():
        if key.startswith("Rs_GCN_"):
            layer, rest = key[len("Rs_GCN_"):].split(".", 1)
            rest = rest.replace("W.0.", "W.").replace("W.1.", "bn.")
            if value.ndim == 3:
                value = value[..., 0]
            out[f"{pool}gcn.{int(layer) - 1}.{rest}"] = value
        elif key.startswith("img_rnn."):
            out[pool + "rnn." + key[len("img_rnn."):]] = value
        elif key.startswith("bn."):
            out[pool + "image_bn." + key[len("bn."):]] = value
        else:
            out[head + key] = value
    out.update({"text_encoder." + k: v for k, v in (txt_enc or {}).items()})
    names = {"encoder.vid2hid.": "vid2hid.", "encoder.rnn.": "encoder.", "decoder.embedding.": "embed.",
             "decoder.attention.linear1.": "attend.", "decoder.attention.linear2.": "score.",
             "decoder.rnn.": "decoder.", "decoder.out.": "out."}
    for key, value in (caption_model or {}).items():
        prefix = next(p for p in names if key.startswith(p))
        out["caption_decoder." + names[prefix] + key[len(prefix):]] = value
    return out
