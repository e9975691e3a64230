"""Set-valued heads (VSE∞, Chen et al., CVPR 2021): an image is a set of member vectors (CNN
grid cells, or precomputed regions), a caption a sequence of token states; a pool turns a
padded set into one vector.  Pure torch, no file I/O; the definitions are docs/PROTOCOL.md
("VSE∞"), pinned against the authors' code by tests/test_vse_infty_golden.py.

- Pools, one interface ``pool(x (B, K, E), lengths (B,)) → (B, E)``; members at positions
  ``>= length`` are padding whose values are never read: ``MeanPool``, ``MaxPool``, ``GPO``
  (built by name or import path with ``build_pool``; the names are ``registry.SET_POOLS``). A
  pool's options (``pool_options``) are its ``Options``, a frozen dataclass of ``values.declare``
  fields, checked by ``build_pool`` (``values.declared_options``) before it is built as
  ``Class(dim=E, **options)``; a user's pool may declare them the same way.
- ``SetImageHead``: per-member projection (fc, or fc + MLP) → pool → L2 norm
  (VSE∞'s ``EncoderImageAggr``).
- ``BiGRUTextEncoder``: words → bidirectional GRU (directions averaged) → pool → L2 norm
  (VSE∞'s BiGRU text encoder), called as VSE++'s GRU encoder (``networks.vse_model.TextEncoder``).
- ``TokenSetTextEncoder``: cached token vectors → per-token linear → pool → L2 norm.

Lengths are int64 (any integral or float tensor is rounded down), 1 <= length <= K; they may
sit on the CPU (the GRUs pack there, as ``networks.vse_model.TextEncoder``) or on the device.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from pipeline.core.errors import VseError
from pipeline.core.plugin_import import check_spec, class_file, is_import_path, plugin_class, user_code_error
from pipeline.core.registry import SET_POOLS, SET_PROJECTIONS
from pipeline.core.tokens import PAD_ID
from pipeline.core.values import NoOptions, declare, declared_options, options_of
from pipeline.networks.layers import bigru_states, l2_normalize, load_word_vectors

# VSE∞'s constants (lib/modules/aggr/gpo.py, lib/encoders.py)
GPO_PE_DIM = 32          # d_pe: sin/cos encoding of a rank
GPO_HIDDEN = 32          # d_hidden: the bidirectional GRU over ranks, directions averaged
GPO_TEMPERATURE = 0.1    # softmax(score / 0.1) over ranks
WORD_INIT = 0.1          # word embeddings ~ U(-0.1, 0.1)


def set_mask(lengths: torch.Tensor, size: int, device=None) -> torch.Tensor:
    """(B, size) bool: True at the members of each set, False at its padding."""
    device = lengths.device if device is None else device
    return torch.arange(size, device=device) < lengths.to(device=device, dtype=torch.long)[:, None]


def check_lengths(x: torch.Tensor, lengths: torch.Tensor) -> None:
    """ValueError unless ``x`` is (B, K, E) and ``lengths`` (B,) in 1..K; the range is checked
    only for lengths on the CPU (on a device it would cost a host sync every step)."""
    if x.ndim != 3 or lengths.ndim != 1 or len(lengths) != len(x):
        raise ValueError(f"expected x (B, K, E) and lengths (B,), got {tuple(x.shape)} and "
                         f"{tuple(lengths.shape)}")
    if lengths.device.type == "cpu" and len(lengths):
        low, high = int(lengths.min()), int(lengths.max())
        if low < 1 or high > x.shape[1]:
            raise ValueError(f"lengths must be in 1..{x.shape[1]} (K), got {low}..{high}")


# ---------------------------------------------------------------------------- pools


class MeanPool(nn.Module):
    """The mean of each set's members."""

    Options = NoOptions

    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        check_lengths(x, lengths)
        mask = set_mask(lengths, x.shape[1], x.device)
        total = x.masked_fill(~mask[..., None], 0).sum(1)
        return total / lengths.to(device=x.device, dtype=total.dtype)[:, None]


class MaxPool(nn.Module):
    """The largest value of each dimension over each set's members."""

    Options = NoOptions

    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        check_lengths(x, lengths)
        mask = set_mask(lengths, x.shape[1], x.device)
        return x.masked_fill(~mask[..., None], -math.inf).amax(1)


def rank_encoding(d: int, length: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """(length, d) sin/cos encoding of the ranks 0..length-1 (the Transformer's):
    ``pe[k, 2i] = sin(k ω_i)``, ``pe[k, 2i+1] = cos(k ω_i)``, ``ω_i = 10000^(-2i/d)``."""
    if d % 2:
        raise ValueError(f"the sin/cos encoding needs an even size, got {d}")
    rank = torch.arange(length, dtype=torch.float32, device=device)[:, None]
    omega = torch.exp(torch.arange(0, d, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / d))
    pe = torch.stack([torch.sin(rank * omega), torch.cos(rank * omega)], dim=2).reshape(length, d)
    return pe.to(dtype)


class GPO(nn.Module):
    """VSE∞'s Generalized Pooling Operator.  Each dimension of a set of n members is sorted in
    descending order and pooled as ``Σ_k θ_k(n) x_(k)``; the weights over ranks k < n are
    ``θ(n) = softmax(w · h_k / 0.1)``, with ``h_k`` the average of the two directions of a
    bidirectional GRU (hidden 32) run over the sin/cos encodings (size 32) of the ranks
    0..n-1.  The weights depend on n only, not on the values: ``weights_for(n)``.

    One GRU pass computes the weights of every length 1..K at once (``weight_table``), K
    sequences packed; a batch gathers its rows, so no length is read on the host.  The rank
    encodings are computed on the parameters' device at each call (K × 32 values; the
    authors keep a dict of them per length on the CPU, outside the state dict).
    """

    @dataclass(frozen=True)
    class Options:
        d_pe: int = declare(GPO_PE_DIM, "The size of a rank's sin/cos encoding (even).", low=2)
        d_hidden: int = declare(GPO_HIDDEN, "The hidden size of the GRU over the ranks.", low=1)
        temperature: float = declare(GPO_TEMPERATURE, "The softmax temperature over the ranks.", above=0)

        def __post_init__(self):
            if self.d_pe % 2:
                raise ValueError(f"d_pe must be even (sin and cos of each frequency), got {self.d_pe}")

    def __init__(self, dim: int | None = None, **options):
        super().__init__()
        self.options = declared_options(self.Options, options, "pool gpo")
        self.d_pe, self.d_hidden, self.temperature = (self.options.d_pe, self.options.d_hidden,
                                                      self.options.temperature)
        self.gru = nn.GRU(self.d_pe, self.d_hidden, 1, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(self.d_hidden, 1, bias=False)
        self.largest_set = 0  # the widest batch pooled so far (a shape: no host sync); not state

    def weight_table(self, size: int) -> torch.Tensor:
        """(size, size): row n-1 holds the weights of a set of n members over the ranks
        0..size-1 (zero from rank n on).  Computed in the parameters' dtype, autocast off."""
        param = self.linear.weight
        with torch.autocast(device_type=param.device.type, enabled=False):
            pe = rank_encoding(self.d_pe, size, param.device, param.dtype)
            lengths = torch.arange(size, 0, -1)  # descending, on the CPU where packing reads them
            packed = pack_padded_sequence(pe.expand(size, size, self.d_pe), lengths, batch_first=True)
            out, _ = self.gru(packed)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=size)
            scores = self.linear((out[..., :self.d_hidden] + out[..., self.d_hidden:]) / 2).squeeze(-1)
            valid = set_mask(lengths, size, param.device)
            weights = torch.softmax(scores.masked_fill(~valid, -math.inf) / self.temperature, dim=1)
        return weights.flip(0)

    def weights_for(self, length: int) -> torch.Tensor:
        """(length,) the weights a set of ``length`` members gives its ranks (largest first)."""
        if length < 1:
            raise ValueError(f"a set has at least one member, got length {length}")
        return self.weight_table(length)[-1]

    def weights(self, lengths: torch.Tensor, size: int) -> torch.Tensor:
        """(B, size) the weights of each set over ranks (zero at ranks >= its length)."""
        table = self.weight_table(size)
        return table[lengths.to(device=table.device, dtype=torch.long) - 1]

    def pool_with_weights(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled (B, E), weights (B, K))."""
        check_lengths(x, lengths)
        self.largest_set = max(self.largest_set, x.shape[1])
        padding = ~set_mask(lengths, x.shape[1], x.device)[:, None, :]
        weights = self.weights(lengths, x.shape[1])
        # (B, E, K): each dimension sorted along its last axis, about twice as fast as along
        # the middle one.  Padding sorts last whatever its values (the authors fill -10000: a
        # member below it would sort after the padding and be zeroed), then counts as 0.
        ranked = x.transpose(1, 2).masked_fill(padding, -math.inf).sort(dim=2, descending=True).values
        ranked = ranked.masked_fill(padding, 0).to(weights.dtype)
        return torch.bmm(ranked, weights[:, :, None]).squeeze(2), weights

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.pool_with_weights(x, lengths)[0]


def pool_class(spec: str) -> type:
    """The class of a built-in pool name (``registry.SET_POOLS``) or of an import path."""
    check_spec(spec, tuple(SET_POOLS), "pool")
    if spec not in SET_POOLS:
        return plugin_class(spec, "pool")
    return SET_POOLS.get_part(spec)


def build_pool(pool: str | nn.Module, dim: int, options: dict | None = None) -> nn.Module:
    """A pool over members of size ``dim``: a module as given, or a name / import path built
    as ``Class(dim=dim, **options)``, its options checked against its ``Options`` first when it
    declares them (``values.options_of``)."""
    options = dict(options or {})
    if isinstance(pool, nn.Module):
        if options:
            raise ValueError(f"pool options {options} given with a pool module")
        return pool
    cls = pool_class(pool)
    users = is_import_path(pool)
    declared = options_of(cls, besides=("dim",))
    if declared is not None:
        try:
            declared_options(declared, options, f"pool {pool}", error=VseError)
        except VseError as exc:
            raise VseError(str(exc), class_file(cls, pool) if users else None) from None
    try:
        built = cls(dim=dim, **options)
    except Exception as exc:  # a user's class: whatever its own code raised, said in one line
        doing = f"cannot build the pool {pool} with options {options}"
        error = user_code_error(exc, doing) if users else None
        if error is not None:
            raise error from exc
        if not isinstance(exc, (TypeError, ValueError)):
            raise
        where = class_file(cls, pool) if users else None
        raise VseError(f"cannot build the pool {pool} with options {options} ({exc})", where) from exc
    if users:
        built.register_forward_hook(functools.partial(_check_pooled, pool, class_file(cls, pool), dim))
    return built


def _check_pooled(spec: str, where: str, dim: int, module, args, pooled) -> None:
    """A forward hook on a user's pool: ``pool(x (B, K, E), lengths)`` gives (B, E); anything else
    is a VseError naming the pool and what it returned."""
    batch = len(args[0]) if args and isinstance(args[0], torch.Tensor) else None
    if isinstance(pooled, torch.Tensor) and tuple(pooled.shape) == (batch, dim):
        return
    got = f"shape {tuple(pooled.shape)}" if isinstance(pooled, torch.Tensor) else type(pooled).__name__
    raise VseError(f"the pool {spec} returned {got} for {batch} sets of members of size {dim}; "
                   f"pool(x, lengths) must give ({batch}, {dim})", where)


# ---------------------------------------------------------------------------- image side


class MemberMLP(nn.Module):
    """VSE∞'s MLP over set members (lib/modules/mlp.py, 2 layers): Linear → BatchNorm1d →
    ReLU → Linear on the B·K rows of a (B, K, D) batch.  PyTorch's default init (the authors'
    MLP does not re-initialise).

    In training its BatchNorm statistics include the padded rows, as the authors' (the
    default: their trained models are ones with that).  ``masked_bn=True`` takes them over the
    valid rows only (one host sync a step: the count of valid rows).  In eval mode both are
    the running statistics.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, masked_bn: bool = False):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(in_dim, hidden), nn.Linear(hidden, out_dim)])
        self.bns = nn.ModuleList([nn.BatchNorm1d(hidden)])  # the authors' names, for their weights
        self.masked_bn = masked_bn

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, size, _ = x.shape
        hidden = self.layers[0](x.reshape(batch * size, -1))
        if self.masked_bn and self.training and mask is not None:
            rows = mask.reshape(-1, 1).expand_as(hidden)
            hidden = hidden.masked_scatter(rows, self.bns[0](hidden[mask.reshape(-1)]))
        else:
            hidden = self.bns[0](hidden)
        return self.layers[1](F.relu(hidden)).view(batch, size, -1)


class SetImageHead(nn.Module):
    """A set of image members (B, K, D) → (B, embed): per-member projection, pool, L2 norm
    (VSE∞'s ``EncoderImageAggr``).

    ``projection``: "linear" = fc(x) (VSE∞ over CNN grids); "linear+mlp" = fc(x) + MLP(x), MLP
    hidden embed/2 (VSE∞ over precomputed regions).  fc: uniform Xavier weight, zero bias.
    ``pool``: a name of ``registry.SET_POOLS``, an import path, or a pool module.
    ``no_imgnorm``: skip the L2 norm; ``use_abs``: absolute values (order embeddings).
    """

    def __init__(self, in_dim: int, embed_dim: int, *, projection: str, pool: str | nn.Module,
                 pool_options: dict | None = None, no_imgnorm: bool = False, masked_bn: bool = False,
                 use_abs: bool = False):
        super().__init__()
        if projection not in SET_PROJECTIONS:
            raise ValueError(f"projection must be one of {SET_PROJECTIONS}, got {projection!r}")
        self.fc = nn.Linear(in_dim, embed_dim)
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)
        self.mlp = (MemberMLP(in_dim, embed_dim // 2, embed_dim, masked_bn)
                    if projection == "linear+mlp" else None)
        self.pool = build_pool(pool, embed_dim, pool_options)
        self.no_imgnorm, self.use_abs = no_imgnorm, use_abs

    def members(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, K, embed): the projected members (padding rows included, values arbitrary)."""
        x = features.to(self.fc.weight.dtype)
        projected = self.fc(x)
        if self.mlp is not None:
            mask = set_mask(lengths, x.shape[1], x.device) if self.mlp.masked_bn else None
            projected = self.mlp(x, mask) + projected
        return projected

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        emb = self.pool(self.members(features, lengths), lengths)
        if not self.no_imgnorm:
            emb = l2_normalize(emb)
        return emb.abs() if self.use_abs else emb


# ---------------------------------------------------------------------------- caption side


class BiGRUTextEncoder(nn.Module):
    """Word ids (B, T) → embeddings → bidirectional GRU (hidden = embed, the two directions
    averaged) → pool over the tokens → L2 norm: VSE∞'s BiGRU caption encoder with ``pool="gpo"``.

    Called as ``networks.vse_model.TextEncoder``: ``forward(tokens, lengths)``, lengths best on the CPU
    (packing reads them there), id 0 the padding; the GRU runs in fp32 with autocast off.
    """

    def __init__(self, vocab_size: int, word_dim: int, embed_dim: int, num_layers: int = 1, *,
                 pool: str | nn.Module, pool_options: dict | None = None, no_txtnorm: bool = False,
                 use_abs: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=PAD_ID)
        nn.init.uniform_(self.embed.weight, -WORD_INIT, WORD_INIT)
        self.rnn = nn.GRU(word_dim, embed_dim, num_layers, batch_first=True, bidirectional=True)
        self.pool = build_pool(pool, embed_dim, pool_options)
        self.no_txtnorm, self.use_abs = no_txtnorm, use_abs

    def states(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, embed): the GRU's states at each token, directions averaged (0 past the end)."""
        return bigru_states(self.embed(tokens), self.rnn, lengths, tokens.shape[1])

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        emb = self.pool(self.states(tokens, lengths), lengths)
        if not self.no_txtnorm:
            emb = l2_normalize(emb)
        return emb.abs() if self.use_abs else emb

    def load_word_vectors(self, vectors: torch.Tensor, mask: torch.Tensor) -> int:
        """GloVe init of the word embeddings (``layers.load_word_vectors``)."""
        return load_word_vectors(self.embed, vectors, mask)


class TokenSetTextEncoder(nn.Module):
    """Cached token vectors (B, T, d) → per-token linear → pool → L2 norm (the head of VSE∞'s
    BERT encoder, over a frozen token-level sentence encoder).  PyTorch's default Linear init,
    as theirs.  ``forward(vectors, lengths)``."""

    def __init__(self, text_dim: int, embed_dim: int, *, pool: str | nn.Module,
                 pool_options: dict | None = None, no_txtnorm: bool = False, use_abs: bool = False):
        super().__init__()
        self.proj = nn.Linear(text_dim, embed_dim)
        self.pool = build_pool(pool, embed_dim, pool_options)
        self.no_txtnorm, self.use_abs = no_txtnorm, use_abs

    def forward(self, vectors: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        emb = self.pool(self.proj(vectors.to(self.proj.weight.dtype)), lengths)
        if not self.no_txtnorm:
            emb = l2_normalize(emb)
        return emb.abs() if self.use_abs else emb


def from_vse_infty(state: dict) -> dict:
    """The state dict of an authors' image or BiGRU text encoder (``img_enc`` / ``txt_enc`` of
    their checkpoints) with this module's names: ``gpool.`` → ``pool.``; their MLP's second
    BatchNorm (``mlp.bns.1``), built but never applied, dropped."""
    return {("pool." + k[len("gpool."):] if k.startswith("gpool.") else k): v
            for k, v in state.items() if not k.startswith("mlp.bns.1.")}
