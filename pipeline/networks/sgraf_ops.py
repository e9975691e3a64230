"""SGRAF's largest computation as one autograd node: the similarity nodes of every (image,
caption) pair, node 0 the pair's global similarity (given) and node 1 + l the local similarity of
word l, ``l2norm(W (l2norm(attn @ v) - w)² + b)``, from the cross-attention ``attn`` (Bi, Bc, L, K)
over the image members ``v`` (Bi, K, E) and the words ``w`` (Bc, L, E) (pipeline.networks.sgraf;
docs/PROTOCOL.md, "SGRAF", step 3); optionally also a linear score of every node (SAF's node
logits ``w_a · node + b_a``), which then costs no pass of its own over the nodes.

The same numbers as the ops one by one (the attended context ``attn @ v``, its l2norm, the
difference, its square, the linear, its l2norm, the concatenation, the score): only the rounding
differs. The products are summed in blocks; ``x / (‖x‖ + ε)`` is computed as ``x · (1 / (‖x‖ +
ε))`` and, in the backward, as ``(attn · (1 / (‖x‖ + ε))) @ v`` (the K-wide factor scaled instead
of the E-wide product); factors of 2 are moved between products (exact). The work goes in blocks
of the (Bi, Bc·L, E) context small enough to stay in the CPU's caches: each elementwise pass of the
forward and of the hand-written backward reads the block the previous pass left in cache, where
the ops one by one stream tensors of hundreds of MB through memory (2-core Xeon: 0.15 ns an
element in cache, 0.45 from memory). No tensor of the context's size is kept for backward: the
backward recomputes each block's context from ``attn`` and ``v`` (K = 36 multiply-adds an
element, cheaper than reading it back from memory) and keeps only the norms and the nodes.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

EPS = 1e-8                         # the authors' l2norm: x / (‖x‖ + 1e-8)
BLOCK_FLOATS_PER_THREAD = 1 << 18  # context elements a block holds per thread (1 MB in fp32). Measured
                                   # (2-core Xeon, SAF at the authors' sizes, 2 threads): 2^18 to 2^19
                                   # best; 2^16 to 2^17 pay the Python cost of each block's ops (about
                                   # 80 µs forward, 170 µs backward), 2^22 loses the cache
ACCELERATOR_BLOCK_FLOATS = 1 << 26  # off the CPU: context elements a block holds (256 MB in fp32; the
                                    # backward holds three such buffers). A GPU's passes are bound by
                                    # kernel launches, not by a cache: blocks only bound the memory
_FORCED: list[bool] = []           # ``accelerator_paths``: the paths of a GPU taken on a CPU


def launch_bound(device: torch.device | str) -> bool:
    """Whether work on ``device`` takes the paths of a GPU, where each op is a kernel launch and the
    host's dispatches bound a step (few, large ops: sgraf's training chunks, these blocks, SAF's
    running statistics) rather than the CPU's caches (cache-sized blocks). True off the CPU, and on
    it inside ``accelerator_paths`` (tests and bench/op_counts.py run the GPU's paths there)."""
    return bool(_FORCED[-1]) if _FORCED else torch.device(device).type != "cpu"


@contextlib.contextmanager
def accelerator_paths(on: bool = True):
    """Within: ``launch_bound`` is ``on`` on every device (the CPU takes a GPU's paths)."""
    _FORCED.append(on)
    try:
        yield
    finally:
        _FORCED.pop()


def work_blocks(images: int, captions: int, length: int, embed: int,
                device: torch.device | str = "cpu") -> list[tuple[slice, slice]]:
    """(image slice, caption slice) blocks of about ``BLOCK_FLOATS_PER_THREAD`` × threads context
    elements: whole images when an image's captions fit, else caption ranges of one image (so a
    block's rows are contiguous in every (Bi, Bc, L, …) tensor). Off the CPU (``launch_bound``)
    blocks of ``ACCELERATOR_BLOCK_FLOATS``, a whole chunk unless its context is larger: a GPU's
    passes are bound by kernel launches, not by a cache (an H200 ran the step host-bound already,
    bench/results/gpu/README.md), and small blocks would multiply them."""
    if launch_bound(device):
        budget = ACCELERATOR_BLOCK_FLOATS
    else:
        budget = BLOCK_FLOATS_PER_THREAD * max(1, torch.get_num_threads())
    per_caption = length * embed
    if captions * per_caption > budget:
        step = max(1, budget // per_caption)
        return [(slice(i, i + 1), slice(c, min(captions, c + step))) for i in range(images)
                for c in range(0, captions, step)]
    step = max(1, budget // (captions * per_caption))
    return [(slice(i, min(images, i + step)), slice(0, captions)) for i in range(0, images, step)]


def _buffer(flat: torch.Tensor, *shape: int) -> torch.Tensor:
    """A contiguous (shape) view of the front of a preallocated 1-D work buffer."""
    return flat[:math.prod(shape)].view(shape)


class _LocalSimilarity(torch.autograd.Function):
    """The nodes (Bi, Bc, L + 1, S) and, with ``score_weight`` (1, S), their logits (Bi, Bc, L + 1).

    Each l2norm ``y = x / (‖x‖ + ε)`` is differentiated as autograd differentiates the authors'
    form: ``(g - y (y·g) (‖x‖ + ε) / ‖x‖) / (‖x‖ + ε)`` (0 at ‖x‖ = 0, where y = 0; ``tiny``
    avoids 0 / 0). The per-row factors are computed once for the whole chunk, not per block."""

    @staticmethod
    def forward(ctx, attn, v, w, glo, weight, bias, score_weight, score_bias):
        bi, bc, length, members = attn.shape
        embed, sim = v.shape[-1], weight.shape[0]
        scoring = score_weight is not None
        nodes = attn.new_empty(bi, bc, length + 1, sim)
        nodes[:, :, 0] = glo
        local = nodes[:, :, 1:]
        local_logits = attn.new_empty(bi, bc, length) if scoring else None
        norms = attn.new_empty(bi, bc, length, 2)  # per row: ‖context‖, ‖W d² + b‖
        neg_w = -w
        blocks = work_blocks(bi, bc, length, embed, attn.device)
        size = max((ib.stop - ib.start) * (cb.stop - cb.start) for ib, cb in blocks) * length
        a_buf, x_buf = attn.new_empty(size * embed), attn.new_empty(size * sim)
        weight_t = weight.t()
        for ib, cb in blocks:
            b, rows = ib.stop - ib.start, (cb.stop - cb.start) * length
            a = torch.bmm(attn[ib, cb].reshape(b, rows, members), v[ib], out=_buffer(a_buf, b, rows, embed))
            norm_a, norm_x = norms[ib, cb].view(b, rows, 2).split(1, dim=-1)
            torch.linalg.vector_norm(a, dim=-1, keepdim=True, out=norm_a)     # of the context
            d = torch.addcmul(neg_w[cb].reshape(rows, embed), a, 1.0 / (norm_a + EPS), out=a)  # l2norm - w
            sq, x = d.mul_(d).view(-1, embed), _buffer(x_buf, b * rows, sim)
            if bias is None:
                torch.mm(sq, weight_t, out=x)
            else:
                torch.addmm(bias, sq, weight_t, out=x)
            torch.linalg.vector_norm(x.view(b, rows, sim), dim=-1, keepdim=True, out=norm_x)
            x.view(b, rows, sim).mul_(1.0 / (norm_x + EPS))                    # l2norm(x): the node
            local[ib, cb] = x.view(b, -1, length, sim)
            if scoring:
                logits = local_logits[ib, cb].view(-1)
                if score_bias is None:
                    torch.mv(x, score_weight[0], out=logits)
                else:
                    torch.addmv(score_bias, x, score_weight[0], out=logits)
        ctx.save_for_backward(attn, v, w, weight, norms, nodes, score_weight)
        ctx.bias, ctx.score_bias = bias is not None, score_bias is not None
        if not scoring:
            return nodes
        glo_logits = glo @ score_weight[0]
        if score_bias is not None:
            glo_logits = glo_logits + score_bias
        return nodes, torch.cat([glo_logits[..., None], local_logits], dim=-1)

    @staticmethod
    def backward(ctx, grad, grad_logits=None):
        attn, v, w, weight, norms, nodes, score_weight = ctx.saved_tensors
        bi, bc, length, members = attn.shape
        embed, sim = v.shape[-1], weight.shape[0]
        need_attn, need_v, need_w, need_glo, need_weight, need_bias, need_sw, need_sb = ctx.needs_input_grad
        scoring = score_weight is not None and grad_logits is not None
        grad_attn = torch.empty_like(attn) if need_attn else None
        # grad_v and grad_w: written by an image's (the first image's) first block, then accumulated
        grad_v = torch.empty_like(v) if need_v else None
        grad_w = torch.empty_like(w) if need_w else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(weight[:, 0]) if ctx.bias and need_bias else None
        grad_glo = grad_sw = grad_sb = None
        if need_glo:
            grad_glo = grad[:, :, 0].contiguous()
            if scoring:
                grad_glo.addcmul_(grad_logits[:, :, :1], score_weight)
        if scoring and need_sw:
            grad_sw = (grad_logits.reshape(1, -1) @ nodes.view(-1, sim))
        if scoring and need_sb and ctx.score_bias:
            grad_sb = grad_logits.sum().reshape(1)
        # per row: 1 / (‖·‖ + ε) and (‖·‖ + ε) / ‖·‖ of the context, then of x, and 2 / (‖a‖ + ε)
        den = norms + EPS
        inv, ratio = den.reciprocal(), den / norms.clamp(min=torch.finfo(norms.dtype).tiny)
        factors = torch.stack([inv[..., 0], ratio[..., 0], inv[..., 0] * 2.0, inv[..., 1], ratio[..., 1]],
                              dim=-1)
        grad_local, local = grad[:, :, 1:], nodes[:, :, 1:]
        local_grad_logits = grad_logits[:, :, 1:, None] if scoring else None
        blocks = work_blocks(bi, bc, length, embed, attn.device)
        size = max((ib.stop - ib.start) * (cb.stop - cb.start) for ib, cb in blocks) * length
        c_buf, d_buf, gd_buf = (attn.new_empty(size * embed) for _ in range(3))
        g_buf = attn.new_empty(size * sim)
        for ib, cb in blocks:
            b, rows = ib.stop - ib.start, (cb.stop - cb.start) * length
            block_factors = factors[ib, cb]
            inv_x, ratio_x = block_factors[..., 3:].split(1, dim=-1)                 # (b, captions, L, 1)
            inv_a, ratio_a, twice_inv_a = block_factors.view(b, rows, 5)[..., :3].split(1, dim=-1)
            # the node's gradient (with its logit's), then through its l2norm: g, that of x = W d² + b
            gy, y = grad_local[ib, cb], local[ib, cb]
            g = _buffer(g_buf, *gy.shape)
            if scoring:
                gy = torch.addcmul(gy, local_grad_logits[ib, cb], score_weight, out=g)
            dot = torch.linalg.vecdot(y, gy).unsqueeze(-1).mul_(ratio_x)
            g = torch.addcmul(gy, y, dot, value=-1.0, out=g).mul_(inv_x).view(-1, sim)
            if grad_bias is not None:
                grad_bias.add_(g.sum(0))
            block_attn, block_v = attn[ib, cb].reshape(b, rows, members), v[ib]
            scaled = block_attn * inv_a
            c = torch.bmm(scaled, block_v, out=_buffer(c_buf, b, rows, embed))  # l2norm(context)
            d = torch.sub(c, w[cb].reshape(rows, embed), out=_buffer(d_buf, b, rows, embed))  # forward's d
            # ∂/∂d of W d²: 2 (gW) d, its 2 applied where gd is read
            gd = torch.mm(g, weight, out=_buffer(gd_buf, b * rows, embed)).view(b, rows, embed).mul_(d)
            if grad_w is not None:  # the block's images summed in one pass, on any device
                block_grad_w = grad_w[cb].view(rows, embed)
                summed = gd.sum(0) if b > 1 else gd[0]
                if ib.start == 0:  # the first image's blocks write, the others add
                    torch.mul(summed, -2.0, out=block_grad_w)
                else:
                    block_grad_w.sub_(summed, alpha=2.0)
            if grad_weight is not None:
                grad_weight.addmm_(g.t(), d.mul_(d).view(-1, embed))
            if need_attn or need_v:
                # through l2norm(context): r · 2 / (‖a‖ + ε), the factor applied to the K-wide side
                dot = torch.mul(c, gd, out=d).sum(dim=-1, keepdim=True).mul_(ratio_a)  # c·gd (d is free)
                r = gd.addcmul_(c, dot, value=-1.0)
                if need_attn:
                    target = grad_attn[ib, cb].view(b, rows, members)
                    torch.bmm(r, block_v.transpose(1, 2), out=target).mul_(twice_inv_a)
                if need_v and cb.start == 0:
                    torch.bmm(scaled.transpose(1, 2), r, out=grad_v[ib]).mul_(2.0)
                elif need_v:
                    grad_v[ib].baddbmm_(scaled.transpose(1, 2), r, alpha=2.0)
        return grad_attn, grad_v, grad_w, grad_glo, grad_weight, grad_bias, grad_sw, grad_sb


def similarity_nodes(attn: torch.Tensor, v: torch.Tensor, w: torch.Tensor, glo: torch.Tensor,
                     linear: nn.Linear, scorer: nn.Linear | None = None):
    """The nodes (Bi, Bc, L + 1, S) of every (image, caption): node 0 ``glo`` (Bi, Bc, S), node
    1 + l the local similarity ``l2norm(linear((l2norm(attn @ v) - w)²))`` of word l, from ``attn``
    (Bi, Bc, L, K), ``v`` (Bi, K, E), ``w`` (Bc, L, E) (``_LocalSimilarity``); with ``scorer`` (a
    Linear S → 1) also ``scorer(nodes)`` (Bi, Bc, L + 1), else None. Under autocast, in its dtype."""
    weight, bias = linear.weight, linear.bias
    score_weight = scorer.weight if scorer is not None else None
    score_bias = scorer.bias if scorer is not None else None
    kind = attn.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        attn, v, w, glo, weight, bias, score_weight, score_bias = (
            t.to(dtype) if t is not None else None
            for t in (attn, v, w, glo, weight, bias, score_weight, score_bias))
    with torch.autocast(kind, enabled=False):
        out = _LocalSimilarity.apply(attn.contiguous(), v.contiguous(), w.contiguous(), glo, weight, bias,
                                     score_weight, score_bias)
    return out if scorer is not None else (out, None)
