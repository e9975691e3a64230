"""Issue 50's fewer, larger kernels off the CPU (``sgraf_ops.launch_bound``), run on the CPU under
``accelerator_paths``: SGR's and SAF's training step with the GPU's chunks (a few chunks, padded
within each, masks keeping padding out), the GPU's blocks of the similarity stage, and SAF's
running statistics updated at once (the closed form of the per-caption loop) gives the numbers of
the CPU's path: scores, loss, every gradient and the BatchNorm buffers, float64, 1e-10 relative;
SAF's closed form against its loop in float32 at float32 rounding. (Relative to the larger of the
tensor's magnitude and 1e-4: gradients 0 in exact arithmetic are ~1e-16 on either path.) Plus
what it is for: fewer operators dispatched (bench/op_counts.py's counter)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_sgraf import inputs, randomised

from pipeline.losses.hinge import MaxHingeLoss
from pipeline.networks import sgraf_ops
from pipeline.networks.sgraf import SAF, SGR, AttentionFiltration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
TOL = 1e-10


def step(model, images, captions, lengths):
    """Scores, loss and gradients of one training step (dropout 0: the same on both paths)."""
    model.zero_grad(set_to_none=True)
    scores = model(images, captions, lengths)
    loss = MaxHingeLoss(margin=0.2, mask_same_image=False).scored(scores, image_ids=torch.arange(len(images)))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    return scores.detach(), loss.detach(), grads, buffers


def close(a, b, tol=TOL, floor=1e-4) -> bool:
    """Within ``tol`` of the larger of ``b``'s largest magnitude and ``floor``: gradients that are 0
    in exact arithmetic (a bias before a BatchNorm, the edges' key bias) are rounding, ~1e-16."""
    scale = max(float(b.abs().max()), floor)
    return float((a - b).abs().max()) / scale <= tol


@pytest.mark.parametrize("cls", [SGR, SAF])
@pytest.mark.parametrize("vocab", [False, True])
def test_the_gpu_paths_give_the_cpu_paths_numbers(cls, vocab, monkeypatch):
    images, captions, lengths = inputs(vocab=vocab, n_images=6)
    per_word = 6 * 16  # images × max(members, embed)
    runs = []
    for accelerated in (False, True):
        model = randomised(cls, vocab=vocab).train()
        model.train_pair_budget = per_word * 9 * 2  # the CPU: chunks of 2 captions (widths 9, 7, 3 ...)
        model.launch_bound_train_pair_budget = per_word * 9 * 4  # off it: 2 chunks of 4 and 2
        monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
        monkeypatch.setattr(sgraf_ops, "BLOCK_FLOATS_PER_THREAD", 9 * 16)  # one caption's context
        monkeypatch.setattr(sgraf_ops, "ACCELERATOR_BLOCK_FLOATS", 2 * 4 * 9 * 16)  # 2 images of a chunk
        with sgraf_ops.accelerator_paths(accelerated):
            runs.append(step(model, images, captions, lengths))
    (s0, l0, g0, b0), (s1, l1, g1, b1) = runs
    assert close(s1, s0) and close(l1, l0)
    assert set(g1) == set(g0) and all(close(g1[n], g0[n]) for n in g0)
    assert set(b1) == set(b0) and all(close(b1[n].double(), b0[n].double()) for n in b0)
    if cls is SAF:
        assert int(b1["SAF_module.bn.num_batches_tracked"]) == len(lengths)


def test_the_paths_cut_different_chunks():
    """The test above compares two cuts, not one cut twice."""
    from op_counts import _chunks

    widths = sorted(inputs()[2].tolist(), reverse=True)
    assert _chunks(widths, 96, 96 * 9 * 2) == [2, 3, 1] and _chunks(widths, 96, 96 * 9 * 4) == [4, 2]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-13), (torch.float32, 1e-6)])
def test_running_statistics_at_once_equal_the_loop(dtype, tol):
    g = torch.Generator().manual_seed(0)
    means = torch.randn(128, generator=g, dtype=dtype)
    variances = torch.rand(128, generator=g, dtype=dtype) + 0.5
    order = torch.randperm(128, generator=g)
    results = []
    for accelerated in (False, True):
        saf = AttentionFiltration(4).to(dtype)
        with torch.no_grad():
            saf.bn.running_mean.fill_(0.3)
            saf.bn.running_var.fill_(1.7)
        saf.pending = [(means[:50], variances[:50]), (means[50:], variances[50:])]
        with sgraf_ops.accelerator_paths(accelerated):
            saf.update_running(order)
        results.append((saf.bn.running_mean.clone(), saf.bn.running_var.clone(),
                        int(saf.bn.num_batches_tracked)))
    (m0, v0, n0), (m1, v1, n1) = results
    assert m1.dtype == dtype and close(m1, m0, tol, 0) and close(v1, v0, tol, 0) and n1 == n0 == 128


def test_the_gpu_path_dispatches_fewer_ops():
    from op_counts import count_ops

    images, captions, lengths = inputs(vocab=True, n_images=6)
    counts = []
    for accelerated in (False, True):
        model = randomised(SAF, vocab=True).train()
        model.train_pair_budget = 6 * 16 * 9 * 2
        model.launch_bound_train_pair_budget = 6 * 16 * 9 * 8

        def run():
            with sgraf_ops.accelerator_paths(accelerated):
                model(images, captions, lengths).sum().backward()
        counts.append(count_ops(run)["dispatched"])
    assert counts[1] < 0.75 * counts[0]


def test_clipping_a_list_with_twice_listed_gradients_in_batched_calls(monkeypatch):
    """VSRN's list holds its caption model twice: each such gradient is scaled twice, as the
    authors' loop scales it, now in two batched (foreach) calls, not one call a gradient; with
    CUDA's foreach taken on the CPU, bit for bit the one-by-one loop, and fewer ops."""
    import torch.utils._foreach_utils as foreach_utils
    from op_counts import count_ops

    from pipeline.training.trainer import clip_gradients

    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3, generator=g)) for _ in range(6)]
    listed = params + params[2:5] + params[3:4]  # one of them three times
    grads = [torch.randn(q.shape, generator=g) * 10 for q in params]

    def clip(foreach: bool):
        for q, grad in zip(params, grads):
            q.grad = grad.clone()
        if foreach:
            with monkeypatch.context() as m:
                m.setattr(foreach_utils, "_get_foreach_kernels_supported_devices", lambda: ["cuda", "cpu"])
                clip_gradients(listed, 2.0)
        else:
            total = torch.nn.utils.get_total_norm([q.grad for q in listed])
            coef = torch.clamp(2.0 / (total + 1e-6), max=1.0)
            for q in listed:
                q.grad.mul_(coef)
        return [q.grad.clone() for q in params]
    for a, b in zip(clip(True), clip(False)):
        assert torch.equal(a, b)
    with monkeypatch.context() as m:
        m.setattr(foreach_utils, "_get_foreach_kernels_supported_devices", lambda: ["cuda", "cpu"])
        counts = count_ops(lambda: clip(True))  # gradients set afresh: above the norm each time
    top = counts["top_dispatched"]
    assert top.get("aten::_foreach_mul_") == 3 and "aten::mul_" not in top  # 3 listings, not 10 calls
