"""SGRAF (Diao et al., "Similarity Reasoning and Filtration for Image-Text Matching", AAAI 2021):
two pairwise networks, ``SGR`` (similarity graph reasoning) and ``SAF`` (similarity attention
filtration). The definitions are docs/PROTOCOL.md ("SGRAF"), after the authors' ``model.py``.

Per pair (image i: members v (K, E); caption c: words w (L, E), both L2-normalised per row):

1. global vectors: the image's by visual self-attention (``VisualSA``: the plain mean of the
   members as the query; the local branch's BatchNorm1d over the K member slots), the caption's
   by textual self-attention over its valid words (``TextSA``);
2. cross-attention of each word over the members: ``a = LeakyReLU_0.1(v wᵀ)``, L2-normalised over
   the caption's words, ``softmax_K(smooth · a)``; the attended context is L2-normalised;
3. similarity vectors: the node of the pair's globals ``l2n(W_g (g_v - g_w)²)`` and one node per
   word ``l2n(W_l (ctx - w)²)``, all of size ``sim_dim``;
4. SGR: ``sgr_steps`` × ``x ← ReLU(W (softmax(W_q x (W_k x)ᵀ) x))`` over the L + 1 nodes, then node
   0; SAF: node weights ``l1n(σ(BN(w·x)))`` and the L2-normalised weighted sum of the nodes;
5. the score ``σ(w_e · vector)``, in (0, 1).

Batched over blocks of images × captions: every pair of two blocks at once, in chunks of captions
that bound the memory, padding never read (the authors slice each caption to its length and loop
over captions one by one). SAF's BatchNorm in training takes its statistics per caption over the
image batch and updates its running statistics once per caption, in caption order, as the
authors' loop does.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.tokens import PAD_ID
from pipeline.networks.layers import bigru_states
from pipeline.networks.network import NetworkConfig, PairwiseNetwork
from pipeline.networks.sgraf_ops import EPS, launch_bound, similarity_nodes
from pipeline.networks.sgraf_spec import SGRAFOptions  # their declaration (torch-free)

WORD_INIT = 0.1


def l2norm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The authors' ``x / (‖x‖ + 1e-8)`` (not ``F.normalize``'s max(‖x‖, eps))."""
    return x / (torch.linalg.vector_norm(x, dim=dim, keepdim=True) + EPS)


def _squared(x: torch.Tensor) -> torch.Tensor:
    """x², as a product (on a CPU ``pow`` was a fifth of SGR's scoring time)."""
    return x * x


def xavier_(module: nn.Module) -> None:
    """The authors' init of every Linear (uniform ±√6/√(in+out), bias 0) and BatchNorm (1, 0)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            bound = math.sqrt(6.0) / math.sqrt(m.in_features + m.out_features)
            nn.init.uniform_(m.weight, -bound, bound)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm1d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class ImageBlock(NamedTuple):
    local: torch.Tensor        # (B, K, E) members, L2-normalised
    glo: torch.Tensor          # (B, E) the global vector (VisualSA)


class CaptionBlock(NamedTuple):
    words: torch.Tensor        # (B, L, E) words, L2-normalised (0 past the length)
    mask: torch.Tensor         # (B, L) bool: the valid words
    glo: torch.Tensor          # (B, E) the global vector (TextSA)
    lengths: torch.Tensor      # (B,) int64 on the host: how chunks are cut


class VisualSA(nn.Module):
    """The image's global vector by self-attention (the authors' ``VisualSA``)."""

    def __init__(self, embed_dim: int, dropout: float, set_size: int):
        super().__init__()
        self.embedding_local = nn.Sequential(nn.Linear(embed_dim, embed_dim), nn.BatchNorm1d(set_size),
                                             nn.Tanh(), nn.Dropout(dropout))
        self.embedding_global = nn.Sequential(nn.Linear(embed_dim, embed_dim), nn.BatchNorm1d(embed_dim),
                                              nn.Tanh(), nn.Dropout(dropout))
        self.embedding_common = nn.Sequential(nn.Linear(embed_dim, 1))
        xavier_(self)

    def forward(self, local: torch.Tensor) -> torch.Tensor:
        l_emb = self.embedding_local(local)
        g_emb = self.embedding_global(local.mean(dim=1))
        weights = torch.softmax(self.embedding_common(l_emb * g_emb[:, None]).squeeze(-1), dim=1)
        return l2norm((weights[..., None] * local).sum(dim=1))


class TextSA(nn.Module):
    """The caption's global vector by self-attention over its valid words (``TextSA``)."""

    def __init__(self, embed_dim: int, dropout: float):
        super().__init__()
        self.embedding_local = nn.Sequential(nn.Linear(embed_dim, embed_dim), nn.Tanh(), nn.Dropout(dropout))
        self.embedding_global = nn.Sequential(nn.Linear(embed_dim, embed_dim), nn.Tanh(), nn.Dropout(dropout))
        self.embedding_common = nn.Sequential(nn.Linear(embed_dim, 1))
        xavier_(self)

    def forward(self, words: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        counts = mask.sum(dim=1, keepdim=True).to(words.dtype)
        mean = (words * mask[..., None]).sum(dim=1) / counts
        l_emb = self.embedding_local(words)
        g_emb = self.embedding_global(mean)
        logits = self.embedding_common(l_emb * g_emb[:, None]).squeeze(-1).masked_fill(~mask, -math.inf)
        weights = torch.softmax(logits, dim=1)
        return l2norm((weights[..., None] * words.masked_fill(~mask[..., None], 0)).sum(dim=1))


class GraphReasoning(nn.Module):
    """One SGR step over the nodes: ReLU(W_g · softmax(W_q x (W_k x)ᵀ) · x), padding as no key."""

    def __init__(self, sim_dim: int):
        super().__init__()
        self.graph_query_w = nn.Linear(sim_dim, sim_dim)
        self.graph_key_w = nn.Linear(sim_dim, sim_dim)
        self.sim_graph_w = nn.Linear(sim_dim, sim_dim)
        xavier_(self)

    def forward(self, nodes: torch.Tensor, key_mask: torch.Tensor, first_only: bool = False) -> torch.Tensor:
        """The step's nodes (..., N, S); ``first_only``: node 0 alone (..., 1, S), all the last step
        is read for (the other rows of a step feed only later steps).

        The edges ``q(x)·k(y)`` as one product: ``(Wq x + bq)·(Wk y + bk)`` is ``(x Wqᵀ Wk + bq Wk)·y``
        plus ``q(x)·bk``, the same for every key of a row, so softmax over the keys cancels it (kept:
        N·S, and bk keeps its gradient, 0 in exact arithmetic). One S × S product a node, not two;
        the scores equal the two products' to rounding."""
        query, key = self.graph_query_w, self.graph_key_w
        rows = nodes[..., :1, :] if first_only else nodes
        folded = F.linear(rows, key.weight.t() @ query.weight, query.bias @ key.weight)
        row_constant = rows @ (query.weight.t() @ key.bias) + query.bias @ key.bias
        edges = torch.baddbmm(row_constant.flatten(0, -2)[..., None], folded.flatten(0, -3),
                              nodes.flatten(0, -3).transpose(-1, -2)).view(*rows.shape[:-1], -1)
        edges = torch.softmax(edges.masked_fill(~key_mask, -math.inf), dim=-1)
        return torch.relu(self.sim_graph_w(edges @ nodes))


class AttentionFiltration(nn.Module):
    """SAF: node weights l1n(σ(BN(w · x))) over the valid nodes; the weighted sum, L2-normalised.

    The BatchNorm1d(1) in training takes its statistics per caption (over the images and that
    caption's valid nodes) and updates its running statistics once per caption in order."""

    def __init__(self, sim_dim: int):
        super().__init__()
        self.attn_sim_w = nn.Linear(sim_dim, 1)
        self.bn = nn.BatchNorm1d(1)
        self.pending = []  # per-caption statistics of the chunks of one score() in training
        xavier_(self)

    def forward(self, nodes: torch.Tensor, node_mask: torch.Tensor,
                logits: torch.Tensor | None = None) -> torch.Tensor:
        """``nodes`` (Bi, Bc, N, S), ``node_mask`` (Bc, N); ``logits`` (Bi, Bc, N): ``attn_sim_w(nodes)``
        when already computed."""
        if logits is None:
            logits = self.attn_sim_w(nodes).squeeze(-1)  # (Bi, Bc, N)
        logits = self._batch_norm(logits, node_mask)
        weights = torch.sigmoid(logits).masked_fill(~node_mask[None], 0.0)
        weights = weights / (weights.abs().sum(dim=-1, keepdim=True) + EPS)
        # Σ_n weights_n · nodes_n as one product per pair (1 × N by N × S): no (Bi, Bc, N, S) product
        # tensor forward nor backward (the same sums, to rounding)
        return l2norm(torch.matmul(weights.unsqueeze(-2), nodes).squeeze(-2))

    def _batch_norm(self, logits: torch.Tensor, node_mask: torch.Tensor) -> torch.Tensor:
        bn = self.bn
        if not bn.training:
            mean, var = bn.running_mean, bn.running_var
            return (logits - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias
        valid = node_mask[None].expand_as(logits).to(logits.dtype)
        count = valid.sum(dim=(0, 2))  # per caption: images × its nodes
        mean = (logits * valid).sum(dim=(0, 2)) / count
        var = ((logits - mean[None, :, None]).square() * valid).sum(dim=(0, 2)) / count
        out = (logits - mean[None, :, None]) / torch.sqrt(var[None, :, None] + bn.eps)
        unbiased = var * count / (count - 1).clamp(min=1)
        self.pending.append((mean.detach(), unbiased.detach()))  # ``update_running`` applies them
        return out * bn.weight + bn.bias

    def update_running(self, order: torch.Tensor) -> None:
        """The running statistics of the chunks just scored (captions in ``order``), one update per
        caption in the captions' own order, as the authors' loop over captions makes them."""
        if not self.pending:
            return
        bn, momentum = self.bn, self.bn.momentum
        own_order = torch.argsort(order).to(bn.running_mean.device)
        means = torch.cat([m for m, _ in self.pending])[own_order]
        variances = torch.cat([v for _, v in self.pending])[own_order]
        self.pending = []
        with torch.no_grad():
            if momentum is not None and launch_bound(means.device):
                # the n updates at once: r (1 - m)^n + Σ_i m (1 - m)^(n-1-i) x_i, in float64 (a loop
                # of 4 ops a caption would be 4 kernel launches a caption); equal to the loop's
                # float32 updates to rounding (tests/test_op_reduction.py)
                n = len(means)
                weights = momentum * (1 - momentum) ** torch.arange(n - 1, -1, -1, dtype=torch.float64,
                                                                   device=means.device)
                for stat, values in ((bn.running_mean, means), (bn.running_var, variances)):
                    stat.copy_(stat.double() * (1 - momentum) ** n + weights @ values.double())
                bn.num_batches_tracked.add_(n)
                return
            for mean, var in zip(means, variances):
                bn.running_mean.mul_(1 - momentum).add_(momentum * mean)
                bn.running_var.mul_(1 - momentum).add_(momentum * var)
            bn.num_batches_tracked.add_(len(means))


class SGRAF(PairwiseNetwork):
    """The SGRAF network without its reasoning module (``SGR`` and ``SAF`` add theirs)."""

    Options = SGRAFOptions
    module_name = ""
    train_pair_budget = 1 << 25  # floats of a training chunk's largest intermediate (128 MB; measured:
                                 # bench/results/train_pairwise_profile.json)
    launch_bound_train_pair_budget = 1 << 28  # the same off the CPU (``launch_bound``): each chunk's ops
                                 # are kernel launches, so few chunks (2 at the authors' sizes, not 9:
                                 # bench/results/op_counts.json); sgraf_ops bounds its own blocks
    score_activation = "sigmoid"  # scores are σ(raw): decl reads raw back (training.factories)

    def __init__(self, config: NetworkConfig):
        super().__init__(config)
        o, embed = self.options, config.embed_dim
        self.img_fc = nn.Linear(config.feature_dim, embed)   # EncoderImagePrecomp
        xavier_(self.img_fc)
        self.word_dropout = nn.Dropout(o.dropout)
        if config.vocab_size:  # EncoderText: embedding → dropout → BiGRU, directions averaged
            self.embed = nn.Embedding(config.vocab_size, config.word_dim, padding_idx=PAD_ID)
            nn.init.uniform_(self.embed.weight, -WORD_INIT, WORD_INIT)
            self.rnn = nn.GRU(config.word_dim, embed, 1, batch_first=True, bidirectional=True)
        else:  # cached token vectors: a per-token linear (this toolkit's fast loop)
            self.text_fc = nn.Linear(config.text_dim, embed)
            xavier_(self.text_fc)
        self.v_global_w = VisualSA(embed, o.dropout, config.set_size)
        self.t_global_w = TextSA(embed, o.dropout)
        self.sim_tranloc_w = nn.Linear(embed, o.sim_dim)
        self.sim_tranglo_w = nn.Linear(embed, o.sim_dim)
        self.sim_eval_w = nn.Linear(o.sim_dim, 1)
        xavier_(self.sim_tranloc_w)
        xavier_(self.sim_tranglo_w)
        xavier_(self.sim_eval_w)

    # ---- encoders
    def encode_images(self, images: torch.Tensor) -> ImageBlock:
        local = l2norm(self.img_fc(images.to(self.img_fc.weight.dtype)))
        return ImageBlock(local, self.v_global_w(local))

    def encode_captions(self, captions: torch.Tensor, lengths: torch.Tensor) -> CaptionBlock:
        lengths = lengths.to(torch.int64)
        width = int(lengths.max())
        if self.config.vocab_size:
            words = bigru_states(self.word_dropout(self.embed(captions[:, :width])), self.rnn, lengths, width)
        else:
            x = captions[:, :width].to(self.text_fc.weight.dtype)
            words = self.text_fc(self.word_dropout(x))
        mask = torch.arange(width, device=words.device)[None, :] < lengths.to(words.device)[:, None]
        padding = ~mask[..., None]  # normalised as ones, then zeroed: no √0 for autograd to differentiate
        words = l2norm(words.masked_fill(padding, 1.0)).masked_fill(padding, 0.0)
        return CaptionBlock(words, mask, self.t_global_w(words, mask), lengths.cpu())

    # ---- scoring
    def score(self, image_block: ImageBlock, caption_block: CaptionBlock) -> torch.Tensor:
        """Captions longest first, in chunks each cut to its own longest caption (no work on the
        block's padding) and sized so a chunk's largest intermediate stays within the budget (in
        training ``train_pair_budget``: autograd keeps every chunk's tensors anyway, and each chunk
        adds a gradient of the whole image block). Off the CPU (``sgraf_ops.launch_bound``) training
        takes ``launch_bound_train_pair_budget``: fewer, larger chunks (more padding, masked as
        within any chunk), as each op is a kernel launch there (issue 50)."""
        lengths = caption_block.lengths
        order = torch.argsort(lengths, descending=True, stable=True)
        bi, members, embed = image_block.local.shape  # per word: the attention's K, the context's E
        per_word = max(1, bi * max(members, embed))
        budget = self.train_pair_budget if torch.is_grad_enabled() else self.eval_pair_budget
        if torch.is_grad_enabled() and launch_bound(image_block.local.device):
            budget = self.launch_bound_train_pair_budget
        sizes, start = [], 0
        while start < len(order):
            width = int(lengths[order[start]])
            size = self.options.caption_chunk or max(1, budget // (per_word * width))
            sizes.append(min(size, len(order) - start))
            start += sizes[-1]
        rows = order.to(caption_block.words.device)
        # the block gathered once in that order, then split: the chunks' gradients meet in one
        # concatenation, not in a block-sized scatter per chunk
        words, mask, glo = (t.index_select(0, rows).split(sizes) for t in caption_block[:3])
        parts = [self._score_chunk(image_block, CaptionBlock(w[:, :int(n[0])], m[:, :int(n[0])], g, n))
                 for w, m, g, n in zip(words, mask, glo, lengths[order].split(sizes))]
        self.after_chunks(order)
        inverse = torch.argsort(order).to(caption_block.words.device)
        return torch.cat(parts, dim=1)[:, inverse]

    def after_chunks(self, order: torch.Tensor) -> None:
        """Called once the chunks of one ``score`` are done; ``order``: the captions as scored."""

    def _score_chunk(self, img: ImageBlock, cap: CaptionBlock) -> torch.Tensor:
        v, w, mask = img.local, cap.words, cap.mask
        # cross-attention of every word of every caption over every member of every image
        attn = F.leaky_relu(torch.einsum("ike,cle->iclk", v, w), 0.1)          # (Bi, Bc, L, K)
        attn = attn.masked_fill(~mask[None, :, :, None], 0.0)
        attn = l2norm(attn, dim=2)                                             # over the words
        attn = torch.softmax(attn * self.options.smooth, dim=-1)               # over the members
        sim_glo = l2norm(self.sim_tranglo_w(_squared(img.glo[:, None] - cap.glo[None])))  # (Bi, Bc, S)
        # node 0 sim_glo, then per word l2norm(W_l (l2norm(context) - w)² + b_l) over the attended
        # context (Bi, Bc, L, E) = attn @ v, computed in cache-sized blocks (sgraf_ops)
        nodes, logits = similarity_nodes(attn, v, w, sim_glo, self.sim_tranloc_w, self.node_scorer())
        node_mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)    # (Bc, L + 1)
        vector = self.reason(nodes, node_mask, logits)
        return self.score_of(vector)

    def score_of(self, vector: torch.Tensor) -> torch.Tensor:
        """σ(w_e · vector) (Bi, Bc), in the parameters' precision with autocast off. Under bf16 the
        sigmoid's outputs would take a few dozen values a batch, MH's hardest negatives would tie and
        its gradient spread over them: another method than the authors' (docs/PROTOCOL.md, "Numeric
        precision"). One Linear S → 1: its cost is nothing beside the similarity stage."""
        head = self.sim_eval_w
        with torch.autocast(device_type=vector.device.type, enabled=False):
            return torch.sigmoid(head(vector.to(head.weight.dtype))).squeeze(-1)

    def node_scorer(self) -> nn.Linear | None:
        """A Linear S → 1 that ``reason`` reads every node through (its ``logits``), if any."""
        return None

    def reason(self, nodes: torch.Tensor, node_mask: torch.Tensor,
               logits: torch.Tensor | None) -> torch.Tensor:
        """The pair's similarity vector from its nodes (Bi, Bc, N, S) (``logits``: ``node_scorer``'s)."""
        raise NotImplementedError

    def load_word_vectors(self, vectors: torch.Tensor, mask: torch.Tensor) -> int:
        from pipeline.networks.layers import load_word_vectors

        return load_word_vectors(self.embed, vectors, mask)


class SGR(SGRAF):
    """SGRAF's similarity graph reasoning: ``sgr_steps`` graph steps, then the global node."""

    def __init__(self, config: NetworkConfig):
        super().__init__(config)
        self.SGR_module = nn.ModuleList(GraphReasoning(self.options.sim_dim)
                                        for _ in range(self.options.sgr_steps))

    def reason(self, nodes: torch.Tensor, node_mask: torch.Tensor,
               logits: torch.Tensor | None) -> torch.Tensor:
        key_mask = node_mask[None, :, None, :]
        *steps, last = self.SGR_module
        for step in steps:
            nodes = step(nodes, key_mask)
        return last(nodes, key_mask, first_only=True)[:, :, 0]


class SAF(SGRAF):
    """SGRAF's similarity attention filtration."""

    def __init__(self, config: NetworkConfig):
        super().__init__(config)
        self.SAF_module = AttentionFiltration(self.options.sim_dim)

    def node_scorer(self) -> nn.Linear:
        return self.SAF_module.attn_sim_w  # its logits made with the nodes (sgraf_ops): no pass of their own

    def reason(self, nodes: torch.Tensor, node_mask: torch.Tensor,
               logits: torch.Tensor | None) -> torch.Tensor:
        return self.SAF_module(nodes, node_mask, logits)

    def after_chunks(self, order: torch.Tensor) -> None:
        self.SAF_module.update_running(order)


def from_sgraf(img_enc: dict | None = None, txt_enc: dict | None = None, sim_enc: dict | None = None) -> dict:
    """The state dicts of the authors' ``img_enc`` (EncoderImage), ``txt_enc`` (EncoderText, the
    BiGRU) and ``sim_enc`` (EncoderSimilarity, SGR or SAF) — their checkpoint's ``model`` list —
    as an ``SGR``'s or ``SAF``'s state dict (word ids: the BiGRU; same tensors, renamed)."""
    out = {"img_fc." + k[len("fc."):]: v for k, v in (img_enc or {}).items()}
    out.update({k.replace("cap_rnn.", "rnn.", 1): v for k, v in (txt_enc or {}).items()})
    out.update(sim_enc or {})
    return out
