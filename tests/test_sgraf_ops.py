"""pipeline.networks.sgraf_ops: the similarity nodes computed in blocks with a hand-written backward
equal the ops one by one under autograd (float64, 1e-12), for every way the work is cut into
blocks (caption ranges of one image, several whole images, a partial last block), with and
without the node scorer and the biases; the gradient also passes torch's gradcheck."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from pipeline.networks import sgraf_ops
from pipeline.networks.sgraf_ops import EPS, similarity_nodes

TOL = 1e-12


def l2norm(x, dim=-1):
    return x / (torch.linalg.vector_norm(x, dim=dim, keepdim=True) + EPS)


def reference(attn, v, w, glo, linear, scorer):
    """The ops one by one, as sgraf.py made them before sgraf_ops."""
    context = torch.einsum("iclk,ike->icle", attn, v)
    local = l2norm(linear((l2norm(context) - w) ** 2))
    nodes = torch.cat([glo[:, :, None], local], dim=2)
    return nodes, (scorer(nodes).squeeze(-1) if scorer is not None else None)


def inputs(bi=5, bc=4, length=3, members=6, embed=8, sim=5, seed=0, bias=True, scored=True):
    g = torch.Generator().manual_seed(seed)
    attn = torch.softmax(torch.randn(bi, bc, length, members, generator=g, dtype=torch.float64) * 3, dim=-1)
    v = l2norm(torch.randn(bi, members, embed, generator=g, dtype=torch.float64))
    w = l2norm(torch.randn(bc, length, embed, generator=g, dtype=torch.float64))
    glo = l2norm(torch.randn(bi, bc, sim, generator=g, dtype=torch.float64))
    torch.manual_seed(seed)
    linear = torch.nn.Linear(embed, sim, bias=bias).double()
    scorer = torch.nn.Linear(sim, 1, bias=bias).double() if scored else None
    leaves = [t.requires_grad_() for t in (attn, v, w, glo)]
    return leaves, linear, scorer


def compare(leaves, linear, scorer, seed=1):
    params = list(linear.parameters()) + (list(scorer.parameters()) if scorer is not None else [])
    results = []
    for fn in (similarity_nodes, reference):
        for t in leaves + params:
            t.grad = None
        nodes, logits = fn(*leaves, linear, scorer)
        g = torch.Generator().manual_seed(seed)
        loss = (nodes * torch.randn(nodes.shape, generator=g, dtype=nodes.dtype)).sum()
        if logits is not None:
            loss = loss + (logits * torch.randn(logits.shape, generator=g, dtype=logits.dtype)).sum()
        loss.backward()
        results.append([nodes.detach(), logits] + [t.grad.clone() for t in leaves + params])
    for ours, theirs in zip(*results):
        if theirs is None:
            assert ours is None
            continue
        theirs = theirs.detach()
        scale = max(float(theirs.abs().max()), 1e-300)
        assert float((ours.detach() - theirs.detach()).abs().max()) / scale <= TOL


@pytest.mark.parametrize("captions_or_images", [(1, 0), (3, 0), (0, 2), (0, 5)])
@pytest.mark.parametrize("bias,scored", [(True, True), (False, True), (True, False)])
def test_nodes_and_gradients_equal_the_ops_one_by_one(monkeypatch, captions_or_images, bias, scored):
    """Blocks of one caption of one image, of 3 of its 4 captions (a partial last block), of 2
    whole images of 5 (a partial last block), of all 5 images."""
    captions, images = captions_or_images
    per_caption = 3 * 8  # length × embed
    total = captions * per_caption or images * 4 * per_caption
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(sgraf_ops, "BLOCK_FLOATS_PER_THREAD", total)
    blocks = sgraf_ops.work_blocks(5, 4, 3, 8)
    assert len(blocks) == (5 * -(-4 // captions) if captions else -(-5 // images))
    compare(*inputs(bias=bias, scored=scored))


def test_a_zero_context_keeps_the_gradient_finite_and_equal():
    (attn, v, w, glo), linear, scorer = inputs()
    with torch.no_grad():
        attn[1, 2, 0] = 0.0  # no member attended: a zero context, ‖·‖ = 0
    compare([attn, v, w, glo], linear, scorer)


def test_gradcheck():
    (attn, v, w, glo), linear, scorer = inputs(bi=2, bc=3, length=2, members=3, embed=4, sim=3)
    params = [p.detach().clone().requires_grad_()
              for p in (linear.weight, linear.bias, scorer.weight, scorer.bias)]

    def fn(attn, v, w, glo, weight, bias, score_weight, score_bias):
        return similarity_nodes(attn, v, w, glo, SimpleNamespace(weight=weight, bias=bias),
                                SimpleNamespace(weight=score_weight, bias=score_bias))

    assert torch.autograd.gradcheck(fn, (attn, v, w, glo, *params))


def test_off_the_cpu_the_chunk_is_one_block_and_runs(monkeypatch):
    """A GPU gets one block per chunk (its passes are launch-bound; bench/results/gpu/README.md):
    checked without a GPU on the meta device, which runs every op of the forward and the
    backward for their shapes only (the values are the CPU tests' above; autocast knows no meta
    device, so its two calls are stood in for)."""
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: False)
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(sgraf_ops, "BLOCK_FLOATS_PER_THREAD", 3 * 8)  # one caption's context
    assert len(sgraf_ops.work_blocks(5, 4, 3, 8, "cpu")) == 20
    assert sgraf_ops.work_blocks(5, 4, 3, 8, "cuda") == [(slice(0, 5), slice(0, 4))]
    (attn, v, w, glo), linear, scorer = inputs()
    meta = [t.detach().to("meta").requires_grad_() for t in (attn, v, w, glo)]
    linear, scorer = linear.to("meta"), scorer.to("meta")
    nodes, logits = similarity_nodes(*meta, linear, scorer)
    assert nodes.device.type == "meta" and nodes.shape == (5, 4, 4, 5) and logits.shape == (5, 4, 4)
    (nodes.sum() + logits.sum()).backward()
    for t in meta + list(linear.parameters()) + list(scorer.parameters()):
        assert t.grad is not None and t.grad.shape == t.shape
