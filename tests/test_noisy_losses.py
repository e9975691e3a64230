"""The losses for noisy pairs (rcl, decl, ncr): hand-made cases, the batched formulas against
one-query-at-a-time loops of the papers' equations (tests/reference/noisy_loop.py, float64,
1e-9), NCR's GMM split and soft margins, the division metrics, and ncr's two networks through
train, kill + resume, and evaluate."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from conftest import QUIET, TINY_TRAIN, vse
from reference import noisy_loop

from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.data.cache import FeatureCache
from pipeline.losses.base import build_loss
from pipeline.losses.noisy.base import Phase, division_metrics
from pipeline.losses.noisy.ncr import divide, gmm_clean_probability, split_prob
from pipeline.training.trainer import PlannedBatches

TOL = 1e-9  # float64, the batched formulas against the loops: only the order of sums differs
IDS = torch.tensor([0, 0, 1, 2, 3, 3])  # pairs 0 and 1, 4 and 5 show the same image


def random_case(seed: int, size: int = 6):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(size, size, generator=gen, dtype=torch.float64) * 1.6 - 0.6
    scores += torch.eye(size, dtype=torch.float64) * 0.3
    negative = (IDS[:, None] != IDS[None, :]).tolist()
    return scores, negative


# ---------------------------------------------------------------------------- rcl


def test_rcl_by_hand():
    # S = [[1, 0], [0, 1]], tau 1: p of the one negative is 1 / (e + 1 + eps) in every row and
    # column (the authors' 1e-10 in the softmax's denominator and in the log)
    scores = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    eps = 1e-10
    p = 1 / (math.e + 1 + eps)
    assert build_loss("rcl", tau=1.0).scored(scores).item() == pytest.approx(
        2 * -math.log(1 - p + eps), rel=1e-14)
    assert build_loss("rcl", tau=1.0, eps=0.0).scored(scores).item() == pytest.approx(
        2 * -math.log(1 - 1 / (math.e + 1)), rel=1e-14)
    assert build_loss("rcl", tau=1.0, variant="abs").scored(scores).item() == pytest.approx(2 * p, rel=1e-14)
    assert build_loss("rcl", tau=1.0, variant="exp").scored(scores).item() == pytest.approx(
        2 * math.exp(p - 1), rel=1e-14)
    assert build_loss("rcl", tau=1.0, variant="tan").scored(scores).item() == pytest.approx(
        2 * math.tan(p), rel=1e-14)
    assert build_loss("rcl", tau=1.0, variant="gce").scored(scores).item() == pytest.approx(
        2 * (1 - (1 - p + eps) ** 0.2) / 0.2, rel=1e-14)  # q 0.2, their scripts' --margin
    assert build_loss("rcl", tau=1.0, variant="infonce").scored(scores).item() == pytest.approx(
        2 * -math.log(math.e / (math.e + 1 + eps)), rel=1e-14)
    # both captions of one image: theirs (the default) pushes the other caption down all the same;
    # mask_same_image=true leaves it out, and nothing is pushed
    same = torch.tensor([7, 7])
    assert build_loss("rcl", tau=1.0).scored(scores, image_ids=same).item() == \
        build_loss("rcl", tau=1.0).scored(scores).item()
    assert build_loss("rcl", tau=1.0, mask_same_image=True).scored(scores, image_ids=same).item() == 0.0


@pytest.mark.parametrize("variant", ["log", "gce", "abs", "exp", "tan", "infonce"])
@pytest.mark.parametrize("mask", [False, True])
def test_rcl_matches_the_loop(variant, mask):
    for seed in range(3):
        scores, negative = random_case(seed)
        if not mask:
            negative = (~torch.eye(len(scores), dtype=torch.bool)).tolist()
        loss = build_loss("rcl", tau=0.3, variant=variant, q=0.7, mask_same_image=mask)
        expected = noisy_loop.rcl(scores.tolist(), negative, 0.3, variant, 0.7)
        assert loss.scored(scores, image_ids=IDS).item() == pytest.approx(expected, rel=TOL)


def test_rcl_ratio_pushes_a_draw_of_negatives():
    """Equal scores over 6 pairs: every p is 1/6, so abs counts the pushed negatives, ⌊ratio · 6⌋
    per query (the draw itself: tests/test_rcl_golden.py); ratio <= 0 or >= 1 pushes all 5."""
    scores = torch.zeros(6, 6, dtype=torch.float64)
    for ratio, pushed in ((0.5, 3), (0.3, 1), (0.1, 0), (-1.0, 5), (0.0, 5), (1.0, 5)):
        loss = build_loss("rcl", variant="abs", ratio=ratio, eps=0.0)
        assert loss.scored(scores).item() == pytest.approx(2 * pushed / 6, rel=1e-14), ratio
    with pytest.raises(ValueError, match="variant must be one of"):
        build_loss("rcl", variant="tan_pi")
    with pytest.raises(ValueError, match="eps must be >= 0"):
        build_loss("rcl", eps=-1e-10)


def test_rcl_q_is_gces_exponent_in_zero_to_one():
    """GCE's q (their --margin) lies in (0, 1]: q = 1 is the mean absolute error p − eps, q → 0 tends
    to −log(1 − p)."""
    scores = torch.tensor([[0.9, 0.1, 0.3], [0.2, 0.8, 0.4], [0.5, 0.1, 0.7]], dtype=torch.float64)
    gce = build_loss("rcl", variant="gce", q=1.0, eps=0.0).scored(scores).item()
    assert gce == pytest.approx(build_loss("rcl", variant="abs", eps=0.0).scored(scores).item(), rel=1e-12)
    for q, message in ((0.0, "q must be > 0, got 0.0"), (-0.2, "q must be > 0"),
                       (1.5, "q must be <= 1, got 1.5"), (math.nan, "q must be a finite number")):
        with pytest.raises(ValueError, match=message):
            build_loss("rcl", q=q)


def test_rcl_never_pulls_a_positive_up_on_its_own():
    """The complementary loss: its gradient on S_ii comes only through the negatives' softmax."""
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=torch.float64, requires_grad=True)
    build_loss("rcl", tau=0.1).scored(scores).backward()
    assert (scores.grad.diagonal() < 0).all() and (scores.grad.fill_diagonal_(0) >= 0).all()


def test_rcl_is_exact_where_a_negative_takes_almost_all():
    """1 − p of a negative with p ≈ 1 − 1e-12 comes from the row's other entries, not 1 − p: the
    float64 gradient passes gradcheck for every variant, with and without their 1e-10 terms."""
    scores = torch.tensor([[0.2, 1.6, 0.1], [0.0, 0.3, -0.2], [0.1, 0.4, 0.5]], dtype=torch.float64)
    for variant in ("log", "gce", "abs", "exp", "tan", "infonce"):
        for eps in (1e-10, 0.0):
            loss = build_loss("rcl", tau=0.05, variant=variant, eps=eps)
            assert torch.autograd.gradcheck(loss.scored, (scores.clone().requires_grad_(True),))


# ---------------------------------------------------------------------------- decl


def _decl_after_warmup(clean, **options):
    """decl past its warm-up, with the division ``clean`` (one verdict per pair, ids 0..B-1)."""
    loss = build_loss("decl", warmup_epochs=1, **options)
    loss.prepare(len(clean))
    loss.clean.copy_(torch.tensor(clean))
    loss.set_epoch(1)
    return loss


@pytest.mark.parametrize("evidence", ["mse", "log", "digamma"])
@pytest.mark.parametrize("mask", [False, True])
def test_decl_matches_the_loop(evidence, mask):
    """Their formulas (the default's values: tests/test_decl_golden.py) and the named variants,
    with same-image pairs left out (mask) or not (theirs), clean and noisy pairs, neg = B − 1."""
    clean = [True, False, True, True, False, True]
    for seed in range(3):
        scores, negative = random_case(seed)
        if not mask:
            negative = (~torch.eye(len(scores), dtype=torch.bool)).tolist()
        loss = _decl_after_warmup(clean, tau=0.5, evidence_loss=evidence, mask_same_image=mask)
        expected = noisy_loop.decl(scores.tolist(), negative, 0.5, 0.2, 0.8, 0.1, 5, clean, evidence)
        got = loss.scored(scores, image_ids=IDS, sample_ids=torch.arange(6)).item()
        assert got == pytest.approx(expected, rel=TOL)
        warm = build_loss("decl", tau=0.5, evidence_loss=evidence, mask_same_image=mask)  # epoch 0
        expected = noisy_loop.decl(scores.tolist(), negative, 0.5, 0.2, 0.8, 0.1, 5, [True] * 6, evidence)
        assert warm.scored(scores, image_ids=IDS, sample_ids=torch.arange(6)).item() == pytest.approx(
            expected, rel=TOL)


def test_decl_by_hand_two_pairs():
    # S = 0, tau 1: every e = 1, α = 2, S = 4, α/S = 1/2. Per query: Σ (y − 1/2)² = 1/2, the variance
    # term 2 · 2·2 / (16 · 5) = 1/10, KL(Dir(1, 2) ‖ Dir(1, 1)) = log 2 − 1/2 (× 0.1); two
    # directions. The hinge on tanh 0 = 0: [0.2]_+ per negative, neg = B − 1 = 1, both pairs × 0.8
    scores = torch.zeros(2, 2, dtype=torch.float64)
    loss = build_loss("decl", tau=1.0)
    edl = 2 * (0.5 + 0.1 + 0.1 * (math.log(2) - 0.5))
    assert loss.scored(scores).item() == pytest.approx(edl + 0.8 * 2 * 0.4, abs=1e-14)
    # anneal_epochs: the KL weight × min(1, epoch / anneal_epochs) (0 at epoch 0)
    annealed = build_loss("decl", tau=1.0, anneal_epochs=10)
    assert annealed.scored(scores).item() == pytest.approx(2 * 0.6 + 0.64, abs=1e-14)


def test_decl_hardness_follows_their_step_counter():
    """neg = max(int(batch_size − eta · step), mu), B − 1 when B < neg (their B == neg keeps B)."""
    loss = build_loss("decl", batch_size=128)
    steps = (1, 40, 41, 4800, 4841, 4921, 10**6)
    assert [loss.hardness(128, s) for s in steps] == [127, 127, 126, 8, 6, 5, 5]
    assert loss.hardness(6, 4841) == 6 and loss.hardness(8, 1) == 7 and loss.hardness(3, 10**6) == 2
    assert loss.hardness(1, 1) == 0  # a single pair: no hinge (their loop never trains one)
    assert math.isfinite(loss.scored(torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)).item())
    seen = build_loss("decl")  # batch_size None: the largest batch of its training calls
    seen.scored(torch.zeros(8, 8, requires_grad=True))
    assert seen.largest_batch == 8 and seen.hardness(5, 2) == 4


def test_decl_counts_its_training_calls_and_resumes_the_count():
    """Only calls with a gradient count (their self.step counts warmup_batch and train_batch);
    the count and the largest batch are in the state dict, so a loaded loss continues them."""
    loss = build_loss("decl")
    scores = random_case(0)[0]
    with torch.no_grad():
        loss.scored(scores.clone().requires_grad_(True))
    loss.scored(scores)  # no gradient wanted: an evaluation, not a step
    assert loss.step == 0
    for _ in range(3):
        loss.scored(scores.clone().requires_grad_(True))
    assert (loss.step, loss.largest_batch) == (3, 6)
    loss.prepare(6)
    again = build_loss("decl")
    again.prepare(6)
    again.load_state_dict(loss.state_dict())
    assert (again.step, again.largest_batch) == (3, 6)


def test_decl_learns_only_from_the_pairs_judged_clean():
    """A noisy pair's row: no hinge, and its positive's label 0 (theirs): the loss no longer pulls
    its positive up (the gradient on S_ii of the noisy pair pushes it down, as any negative)."""
    scores = random_case(1)[0].requires_grad_(True)
    clean = [True, False, True, True, True, True]
    _decl_after_warmup(clean).scored(scores, sample_ids=torch.arange(6)).backward()
    assert scores.grad[1, 1] > 0 and (scores.grad.diagonal()[[0, 2, 3, 4, 5]] < 0).all()
    with pytest.raises(ValueError, match=r"sample_ids must be caption ids in \[0, 6\)"):
        _decl_after_warmup(clean).scored(scores, sample_ids=torch.arange(1, 7))


def test_decl_division_by_hand():
    """Their rule: pair i is clean when the argmax of row i of e + eᵀ is i. In a cache-order pass an
    image's captions share a batch: the other pairs of its image are left out of the argmax."""
    raw = torch.tensor([[0.9, 0.8, 0.0], [0.85, 0.9, 0.1], [0.95, 0.0, 0.2]], dtype=torch.float64)
    loss = build_loss("decl", tau=0.1)
    e = torch.exp(torch.tanh(raw) / 0.1)
    joint = e + e.T
    score, judged = loss.sample_statistic(raw[None])
    assert judged.tolist() == [1.0, 1.0, 0.0]  # row 2: e_20 + e_02 beats 2 e_22
    assert score.tolist() == pytest.approx((joint.diagonal() / joint.sum(1)).tolist(), rel=1e-14)
    score, judged = loss.sample_statistic(raw[None], image_ids=torch.tensor([0, 1, 0]))
    assert judged.tolist() == [1.0, 1.0, 1.0]  # pairs 0 and 2 show one image: not each other's rival
    loss.prepare(5)
    assert loss.begin_epoch(4, np.array([4, 0, 2]), np.array([[0.1, 0.2, 0.3], [1.0, 0.0, 1.0]]), 0) is None
    score, judged = loss.begin_epoch(5, np.array([4, 0, 2]), np.array([[0.1, 0.2, 0.3], [1.0, 0.0, 1.0]]), 0)
    assert judged.tolist() == [True, False, True] and loss.clean.tolist() == [False, True, True, True, True]


def test_decl_refuses_bad_options():
    for options, message in (({"evidence_loss": "kl"}, "evidence_loss must be one of mse, log, digamma"),
                             ({"clean_rule": "loss"}, "clean_rule must be one of evidence, uncertainty"),
                             ({"mu": 0}, "mu must be an integer >= 1"),
                             ({"batch_size": 0}, "batch_size must be an integer >= 1 or null"),
                             ({"tau": 0.0}, "tau must be > 0"),
                             ({"margin": -0.2}, "margin must be >= 0, got -0.2"),
                             ({"hinge_weight": -0.8}, "hinge_weight must be >= 0"),
                             ({"kl_weight": -0.1}, "kl_weight must be >= 0"),
                             ({"eta": -0.025}, "eta must be >= 0")):
        with pytest.raises(ValueError, match=message):
            build_loss("decl", **options)
    # zero turns a term off (their lambda1 / lambda2 = 0; the golden test runs hinge_weight 0)
    zero = build_loss("decl", margin=0, hinge_weight=0, kl_weight=0, eta=0)
    assert (zero.margin, zero.hinge_weight, zero.kl_weight, zero.eta) == (0.0, 0.0, 0.0, 0.0)


# ---------------------------------------------------------------------------- ncr


def test_ncr_refuses_bad_options():
    """margin α >= 0 (every soft margin is α·s(y), s in [0, 1]); p_threshold is compared with a
    probability, so in [0, 1]."""
    for options, message in (({"margin": -0.2}, "margin must be >= 0, got -0.2"),
                             ({"p_threshold": 1.5}, r"p_threshold must be in \[0, 1\], got 1.5"),
                             ({"p_threshold": -0.1}, r"p_threshold must be in \[0, 1\]"),
                             ({"warmup_epochs": -1}, "warmup_epochs must be an integer >= 0"),
                             ({"soft_margin_base": 1.0}, "soft_margin_base must not be 1")):
        with pytest.raises(ValueError, match=message):
            build_loss("ncr", **options)
    assert [build_loss("ncr", p_threshold=p).p_threshold for p in (0, 1)] == [0.0, 1.0]


def _matrix(values, n, by="row"):
    return [[(values[i] if by == "row" else values[j]) for j in range(n)] for i in range(n)]


@pytest.mark.parametrize("soft", ["exponential", "linear", "sin"])
def test_ncr_soft_margins(soft):
    loss = build_loss("ncr", margin=0.2, soft_margin=soft)
    labels = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    expected = {"exponential": [noisy_loop.ncr_soft_margin(y, 0.2, 10.0) for y in labels.tolist()],
                "linear": [0.2 * y for y in labels.tolist()],
                "sin": [0.2 * (math.sin(math.pi * y - math.pi / 2) / 2 + 0.5) for y in labels.tolist()]}[soft]
    assert loss.soft_margins(labels).tolist() == pytest.approx(expected, abs=1e-15)
    assert expected[0] == pytest.approx(0, abs=1e-15) and expected[2] == pytest.approx(0.2)


@pytest.mark.parametrize("mask", [False, True])
def test_ncr_formulas_match_the_loops(mask):
    """Their ContrastiveLoss modes, batched, against one-entry-at-a-time loops: the warm-up (mean and
    summed), the per-pair loss, predict, and the hardest-negative hinge with each label layout."""
    for seed in range(3):
        scores, negative = random_case(seed)
        if not mask:
            negative = [[i != j for j in range(6)] for i in range(6)]
        S, n = scores.tolist(), 6
        loss = build_loss("ncr", mask_same_image=mask)
        negatives = loss.pair_masks(n, IDS, "cpu")[1]
        assert loss.phase_loss(Phase(0, "warmup"), scores, None, image_ids=IDS).item() == pytest.approx(
            noisy_loop.ncr_warmup(S, negative, 0.2), rel=TOL)
        summed = build_loss("ncr", mask_same_image=mask, warmup_sum=True)
        assert summed.phase_loss(Phase(0, "warmup"), scores, None, image_ids=IDS).item() == pytest.approx(
            noisy_loop.ncr_warmup(S, negative, 0.2, summed=True), rel=TOL)
        assert loss.per_pair_loss(scores, negatives).tolist() == pytest.approx(
            noisy_loop.ncr_eval_loss(S, negative, 0.2), rel=TOL)
        assert loss.predict(scores, negatives).tolist() == pytest.approx(
            noisy_loop.ncr_predict(S, negative, 0.2), rel=TOL, abs=1e-15)
        gen = torch.Generator().manual_seed(seed)
        w, p = torch.rand(2, n, generator=gen, dtype=torch.float64)
        m = [[noisy_loop.ncr_soft_margin(w[i].item() + (1 - w[i].item()) * p[j].item(), 0.2, 10.0)
              for j in range(n)] for i in range(n)]
        y = w[:, None] + (1 - w[:, None]) * p[None, :]  # their clean batch: w by row, prediction by column
        assert loss.phase_loss(Phase(0, "clean"), scores, (y, y), image_ids=IDS).item() == pytest.approx(
            noisy_loop.ncr_hardest(S, negative, m, m), rel=TOL)
        own = [noisy_loop.ncr_soft_margin(v, 0.2, 10.0) for v in (w + (1 - w) * p).tolist()]
        t = w + (1 - w) * p  # per_pair_labels: row i at its own label, column j at its own
        expected = noisy_loop.ncr_hardest(S, negative, _matrix(own, n), _matrix(own, n, "col"))
        assert loss.phase_loss(Phase(0, "clean"), scores, (t[:, None], t[None, :]), image_ids=IDS).item() == \
            pytest.approx(expected, rel=TOL)


def test_ncr_targets_of_a_clean_and_a_noisy_batch():
    """A's step: its clean batch's labels mix B's w with A's own prediction (their (B, 1) × (B,)
    broadcast), the noisy batch's are the two networks' mean prediction, by row (their view(-1, 1));
    ``per_pair_labels``: each pair's own label. Noisy pairs enter only in a "clean+noisy" phase."""
    a, b = random_case(0)[0], random_case(1)[0]
    ids = torch.tensor([0, 1, 2, 3, 4, 5])
    for per_pair in (False, True):
        loss = build_loss("ncr", per_pair_labels=per_pair)
        loss.prepare(10)
        loss.clean_probability[1, :6] = torch.linspace(0.1, 0.9, 6, dtype=torch.float64)
        scores = {(0, 0): a, (0, 1): b, (1, 1): a.T.contiguous()}
        negatives = ~torch.eye(6, dtype=torch.bool)
        updates = loss.phase_targets(Phase(0, "clean+noisy"), [(ids, IDS), (ids, IDS)],
                                     lambda k, s: scores[k, s])
        w, own = loss.clean_probability[1, :6], loss.predict(a, negatives)
        mixed = (loss.predict(b, negatives) + loss.predict(a.T.contiguous(), negatives)) / 2
        (s0, clean), (s1, noisy) = updates
        assert (s0, s1) == (0, 1)
        if per_pair:
            y = w + (1 - w) * own
            torch.testing.assert_close(clean[0].expand(6, 6), y[:, None].expand(6, 6), rtol=TOL, atol=0)
            torch.testing.assert_close(clean[1].expand(6, 6), y[None, :].expand(6, 6), rtol=TOL, atol=0)
            torch.testing.assert_close(noisy[1].expand(6, 6), mixed[None, :].expand(6, 6), rtol=TOL, atol=0)
        else:
            y = w[:, None] + (1 - w[:, None]) * own[None, :]
            torch.testing.assert_close(clean[0], y, rtol=TOL, atol=0)
            torch.testing.assert_close(clean[1], y, rtol=TOL, atol=0)
            torch.testing.assert_close(noisy[1].expand(6, 6), mixed[:, None].expand(6, 6), rtol=TOL, atol=0)
        torch.testing.assert_close(noisy[0].expand(6, 6), mixed[:, None].expand(6, 6), rtol=TOL, atol=0)
        early = loss.phase_targets(Phase(0, "clean"), [(ids, IDS), (ids, IDS)], lambda k, s: scores[k, s])
        assert len(early) == 1


def test_ncr_plans_warm_up_then_co_training_passes():
    """Warm-up epochs: A's pass over every pair, then B's. Then A over B's clean pairs (its noisy
    ones the second stream), B over A's; noisy pairs train from co-training epoch
    (epochs − warmup_epochs) // 2 (their epoch >= num_epochs // 2). ``joint``: no plan."""
    loss = build_loss("ncr", warmup_epochs=2)
    loss.prepare(8)
    ids = np.array([1, 2, 4, 5, 7])
    loss.judged_clean[0, ids] = torch.tensor([True, False, True, True, False])
    loss.judged_clean[1, ids] = torch.tensor([False, True, True, False, True])
    for epoch in (0, 1):
        plan = loss.epoch_plan(epoch, 7, ids)
        assert [(p.member, p.kind) for p in plan] == [(0, "warmup"), (1, "warmup")]
        assert all(np.array_equal(p.streams[0], np.arange(5)) for p in plan)
    kinds = [loss.epoch_plan(epoch, 7, ids)[0].kind for epoch in range(2, 7)]
    assert kinds == ["clean", "clean", "clean+noisy", "clean+noisy", "clean+noisy"]  # 5 co-training: from 2
    a, b = loss.epoch_plan(2, 7, ids)
    assert (a.member, b.member) == (0, 1)
    assert a.streams[0].tolist() == [1, 2, 4] and a.streams[1].tolist() == [0, 3]  # B's division
    assert b.streams[0].tolist() == [0, 2, 3] and b.streams[1].tolist() == [1, 4]  # A's division
    assert build_loss("ncr", schedule="joint").epoch_plan(0, 7, ids) is None


def test_ncr_split_prob_fallback_and_equal_losses():
    w = np.array([0.9, 0.7, 0.7, 0.95])
    assert split_prob(w, 0.5).tolist() == [True, False, False, True]  # none below: the smallest (ties too)
    assert split_prob(np.array([0.2, 0.8]), 0.5).tolist() == [False, True]
    w, judged = divide(np.full(5, 0.3), 0.5)
    assert np.all(w == 1) and judged.all()  # nothing to rank: every pair clean (theirs: 0/0)


def test_planned_batches_stop_at_a_batch_of_one_pair():
    class Stream:
        def __init__(self, sizes):
            self.slices = [slice(0, size) for size in sizes]

        def __len__(self):
            return len(self.slices)

    phase = Phase(0, "clean+noisy")
    assert len(PlannedBatches([phase], [[Stream([6, 6, 2]), Stream([6, 6, 6])]])) == 3
    assert len(PlannedBatches([phase], [[Stream([6, 6, 1]), Stream([6, 6, 6])]])) == 2  # the last clean one
    assert len(PlannedBatches([phase], [[Stream([6, 6, 2]), Stream([6, 1, 6])]])) == 1  # a noisy one
    assert len(PlannedBatches([phase], [[Stream([6, 2]), None]])) == 2  # no noisy pairs: clean only
    assert len(PlannedBatches([phase, phase], [[None, None], [Stream([3]), None]])) == 1


def test_ncr_joint_reading_trains_each_network_on_the_other_ones_division():
    """``schedule="joint"`` (vse's earlier reading): both networks in one step on one batch."""
    loss = build_loss("ncr", margin=0.2, warmup_epochs=0, p_threshold=0.5, schedule="joint",
                      mask_same_image=True)
    loss.prepare(10)
    w = torch.tensor([[0.9, 0.2, 0.7, 0.1, 0.95, 0.6, 0, 0, 0, 0],    # network 0's division
                      [0.3, 0.8, 0.55, 0.99, 0.4, 0.05, 0, 0, 0, 0]], dtype=torch.float64)
    loss.clean_probability.copy_(w)
    a, negative = random_case(2)
    b, _ = random_case(3)
    ids = torch.tensor([0, 1, 2, 3, 4, 5])
    value = loss.scored(torch.stack([a, b]), image_ids=IDS, sample_ids=ids).item()
    predicted = [(min(max(a[i, i].item(), 0), 1) + min(max(b[i, i].item(), 0), 1)) / 2 for i in range(6)]
    expected = 0.0
    for k, scores in enumerate((a, b)):
        other = w[1 - k, :6].tolist()
        labels = [o if o > 0.5 else predicted[i] for i, o in enumerate(other)]
        margins = [noisy_loop.ncr_soft_margin(y, 0.2, 10.0) for y in labels]
        expected += noisy_loop.ncr_network_loss(scores.tolist(), negative, margins)
    assert value == pytest.approx(expected, rel=TOL)
    # its warm-up: each network's warm-up loss (their mean hinges; warmup_sum: the sums), added
    warm = build_loss("ncr", schedule="joint", mask_same_image=True)
    value = warm.scored(torch.stack([a, b]), image_ids=IDS, sample_ids=ids).item()
    expected = sum(noisy_loop.ncr_warmup(s.tolist(), negative, 0.2) for s in (a, b))
    assert value == pytest.approx(expected, rel=TOL)


def test_the_gmm_split_finds_the_low_loss_mode():
    rng = np.random.default_rng(0)
    losses = np.concatenate([rng.normal(0.1, 0.03, 800), rng.normal(0.7, 0.1, 200)])
    w = gmm_clean_probability(losses, random_state=1)
    assert (w[:800] > 0.5).mean() > 0.97 and (w[800:] < 0.5).mean() > 0.97
    assert np.array_equal(w, gmm_clean_probability(losses, random_state=1))  # seeded: the same split again
    assert np.all(gmm_clean_probability(np.full(5, 0.3)) == 1)  # equal losses: nothing to divide


def test_division_metrics_by_hand():
    truth = np.array([True, True, True, False, False])
    judged = np.array([True, True, False, True, False])
    score = np.array([0.9, 0.8, 0.3, 0.6, 0.1])
    m = division_metrics(score, judged, truth)
    assert m["division_precision"] == pytest.approx(2 / 3) and m["division_recall"] == pytest.approx(2 / 3)
    assert m["division_auc"] == pytest.approx(5 / 6)  # of 6 (clean, noisy) pairs, (0.3, 0.6) is misordered
    assert division_metrics(score, judged, np.ones(5, bool))["division_auc"] is None  # no noise: undefined


def test_a_two_network_loss_takes_stacked_scores_only():
    loss = build_loss("ncr")
    with pytest.raises(ValueError, match=r"\(2, B, B\)"):
        loss.scored(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="stacked scores"):
        loss(torch.zeros(3, 4), torch.zeros(3, 4))


def test_ncr_refuses_sample_ids_outside_its_per_sample_state():
    loss = build_loss("ncr", warmup_epochs=0)
    stacked = torch.stack([random_case(0)[0], random_case(1)[0]])
    with pytest.raises(ValueError, match=r"prepare\(num_captions\)"):
        loss.scored(stacked, sample_ids=torch.arange(6))  # no buffers yet
    loss.prepare(6)
    with pytest.raises(ValueError, match=r"caption ids in \[0, 6\)"):
        loss.scored(stacked, sample_ids=torch.arange(1, 7))
    with pytest.raises(ValueError, match=r"sample_ids must have shape \(6,\)"):
        loss.scored(stacked, sample_ids=torch.arange(5))


def test_a_call_keeps_no_state_from_the_one_before():
    """The ids and stacked scores travel in the call's Batch: a call without ids after one with
    them is the plain (fixed-margin) loss, never the last batch's labels."""
    loss = build_loss("ncr", warmup_epochs=0, mask_same_image=True)
    loss.prepare(6)
    loss.clean_probability.fill_(0.0)  # every pair judged noisy: labels from the predictions
    a, b = random_case(0)[0], random_case(1)[0]
    with_ids = loss.scored(torch.stack([a, b]), image_ids=IDS, sample_ids=torch.arange(6)).item()
    without = loss.scored(torch.stack([a, b]), image_ids=IDS).item()
    mh = build_loss("mh", margin=0.2)
    plain = mh.scored(a, image_ids=IDS) + mh.scored(b, image_ids=IDS)
    assert without == pytest.approx(plain.item(), rel=TOL)
    assert with_ids != pytest.approx(without, rel=1e-3)


# ---------------------------------------------------------------------------- through the trainer


def _noisy_config(tiny_cache, run_dir, **over):
    return TrainConfig(features=str(tiny_cache), run_dir=str(run_dir), noise_rate=0.5, noise_mode="caption",
                       **{**TINY_TRAIN, "batch_size": 8, "epochs": 3, **over})


def test_ncr_co_trains_two_networks_divides_and_evaluates_their_mean(tiny_cache, tmp_path):
    from pipeline.evaluation.inference import encode_split, load_model
    from pipeline.networks.cotrain import CoTrained
    from pipeline.training.build import build_trainer

    trainer = build_trainer(_noisy_config(tiny_cache, tmp_path / "ncr", loss="ncr",
                                          loss_options={"warmup_epochs": 1}), **QUIET)
    assert isinstance(trainer.model, CoTrained) and len(trainer.model.members) == 2
    a, b = (dict(m.named_parameters()) for m in trainer.model.members)
    assert not torch.equal(a["image_encoder.proj.weight"], b["image_encoder.proj.weight"])  # two inits
    trainer.fit()
    lines = (tmp_path / "ncr" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert "division_auc" not in records[0]  # epoch 1 is the warm-up: no division yet
    for record in records[1:]:
        assert 0 <= record["division_auc"] <= 1 and 0 <= record["division_precision"] <= 1
        assert record["noise_true_rate"] == pytest.approx(trainer.noise.true_rate())
    state = load_checkpoint(tmp_path / "ncr" / "last.pt")
    assert state["model_config"]["co_trained"] == 2
    assert state["loss"]["clean_probability"].shape == (2, 200)  # one entry per caption of the cache
    trained = state["loss"]["clean_probability"][:, trainer.train_captions]
    assert not torch.all(trained == 1)  # the division wrote the training captions' entries
    # evaluate: the mean of the two networks' scores
    loaded = load_model(tmp_path / "ncr" / "best.pt", torch.device("cpu"))
    cache = FeatureCache(tiny_cache)
    captions = loaded.captions(cache)
    split = encode_split(loaded.model, cache, captions, "test", torch.device("cpu"))
    assert split.pairwise
    members = []
    for member in loaded.model.members:
        member.eval()
        feats = torch.from_numpy(cache.read(split.image_rows)).float()
        with torch.no_grad():
            img = member.image_encoder(feats)
            cap = captions.embed(member.text_encoder, split.caption_rows, torch.device("cpu"))
        members.append((img @ cap.T).numpy())
    np.testing.assert_allclose(split.captions.T, (members[0] + members[1]) / 2, atol=1e-6)
    # evaluate --runs: the true rate and the division at the best epoch; report --columns noisy
    result = vse("evaluate", "--runs", tmp_path / "ncr", "--split", "test", "--out", tmp_path / "results.csv")
    assert result.exit_code == 0, result.output
    row = next(csv.DictReader(open(tmp_path / "results.csv", encoding="utf-8")))
    best = max(records, key=lambda r: r["rsum"])
    assert float(row["noise_true_rate"]) == pytest.approx(trainer.noise.true_rate())
    assert row.get("division_auc", "") == ("" if "division_auc" not in best else str(best["division_auc"]))
    (tmp_path / "captions.txt").write_text("a dog runs on the grass\n")
    refused = vse("embed", tmp_path / "ncr" / "best.pt", "--captions", tmp_path / "captions.txt",
                  "--out", tmp_path / "e.h5")
    assert refused.exit_code == 1 and "2 networks trained together" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and not (tmp_path / "e.h5").exists()
    table = vse("report", tmp_path / "results.csv", "--columns", "noisy")
    assert table.exit_code == 0 and "| rsum |" in table.output.splitlines()[0]
    assert ("| Division AUC |" in table.output.splitlines()[0]) == ("division_auc" in best)


@pytest.mark.parametrize("kill_at", [46, 58])
def test_ncr_killed_then_resumed_equals_the_uninterrupted_run(tiny_cache, tmp_path, monkeypatch, kill_at):
    """120 training captions / 8: the warm-up epoch is A's 15 steps, then B's 15; each later epoch
    A's pass over B's clean pairs, then B's over A's (here 13 + 5 steps, then 15 + 4 with the noisy
    stream cycled alongside); a checkpoint every 4 steps and at each epoch's end. Killed at step 46
    (B's pass of epoch 2, after the checkpoint at 44: the division and the plan made at epoch 2's
    start come from the checkpoint) or at 58 (A's pass of epoch 3, noisy batches cycling);
    resumed, it ends as the run that was never killed: both networks' weights, the per-sample
    state and the division."""
    from test_train import _kill_after

    from pipeline.training.build import build_trainer

    options = {"loss": "ncr", "loss_options": {"warmup_epochs": 1}, "val_every": 4}
    build_trainer(_noisy_config(tiny_cache, tmp_path / "a", **options), **QUIET).fit()
    with monkeypatch.context() as m:
        _kill_after(m, kill_at)
        with pytest.raises(KeyboardInterrupt):
            build_trainer(_noisy_config(tiny_cache, tmp_path / "b", **options), **QUIET).fit()
    saved = load_checkpoint(tmp_path / "b" / "last.pt")
    assert saved["iteration"] == kill_at - kill_at % 4 and "division" in saved  # mid-epoch, divided
    build_trainer(_noisy_config(tiny_cache, tmp_path / "b", **options), resume=True, **QUIET).fit()
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    assert a["iteration"] == b["iteration"] > 60
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for name in ("clean_probability", "judged_clean"):
        assert torch.equal(a["loss"][name], b["loss"][name])
    assert a["division"] == b["division"]
    assert torch.equal(a["optimizer"]["state"][0]["exp_avg"], b["optimizer"]["state"][0]["exp_avg"])


def test_ncr_phase_step_moves_only_the_trained_network(tiny_cache, tmp_path):
    """A step of A's warm-up pass: A's weights move, B's (eval mode, no gradient) and its Adam state
    do not; one optimizer, each network its own clipping (only the grads of the trained one)."""
    from pipeline.training.build import build_trainer

    trainer = build_trainer(_noisy_config(tiny_cache, tmp_path / "ncr", loss="ncr"), **QUIET)
    plan = trainer.epoch_plan()
    assert [(p.member, p.kind) for p in plan] == [(0, "warmup"), (1, "warmup")]
    steps = trainer.planned_batches(plan)
    assert len(steps) == 30  # 15 batches of 8, twice
    a, b = ({n: p.detach().clone() for n, p in m.named_parameters()} for m in trainer.model.members)
    trainer.step(steps[0])
    moved = {n: not torch.equal(p, a[n]) for n, p in trainer.model.members[0].named_parameters()}
    assert any(moved.values())
    for n, p in trainer.model.members[1].named_parameters():
        assert torch.equal(p, b[n]) and p.grad is None, n
    assert all(trainer.optimizer.state.get(p, {}) == {} for p in trainer.model.members[1].parameters())


def test_decl_killed_then_resumed_continues_its_step_counter(tiny_cache, tmp_path, monkeypatch):
    """120 training captions / 8 = 15 steps per epoch, 45 in all, the first epoch the warm-up.
    neg = max(int(8 − 0.025 · step), 5) is 7 up to step 40 and 6 from 41 on: killed at step 22
    (after the checkpoint at 20) and resumed, the run counts on from 20 and ends as the run that
    was never killed; a count restarted at 0 would train steps 41-45 with neg 7."""
    from test_train import _kill_after

    from pipeline.training.build import build_trainer

    options = {"loss": "decl", "loss_options": {"warmup_epochs": 1}, "val_every": 4}
    build_trainer(_noisy_config(tiny_cache, tmp_path / "a", **options), **QUIET).fit()
    with monkeypatch.context() as m:
        _kill_after(m, 22)
        with pytest.raises(KeyboardInterrupt):
            build_trainer(_noisy_config(tiny_cache, tmp_path / "b", **options), **QUIET).fit()
    assert load_checkpoint(tmp_path / "b" / "last.pt")["loss"]["_extra_state"]["step"] == 20
    build_trainer(_noisy_config(tiny_cache, tmp_path / "b", **options), resume=True, **QUIET).fit()
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    assert a["loss"]["_extra_state"] == b["loss"]["_extra_state"] == {"step": 45, "largest_batch": 8}
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert torch.equal(a["loss"]["clean"], b["loss"]["clean"]) and a["division"] == b["division"]


@pytest.mark.parametrize("loss", ["rcl", "decl"])
def test_rcl_and_decl_train_a_dual_network_on_noisy_pairs(tiny_cache, tmp_path, loss):
    """Two epochs at 50% caption noise: every record states the true noise rate of the index the
    run kept; decl's division before epoch 1 is the one a fresh trainer (same seed, same weights)
    makes, measured against that saved index (warm-up 0: it divides before epoch 0), and its loss
    on the first batch's clean pairs falls (6.5 → 1.3 here). rcl's is not checked so: at tau 0.05,
    lr 5e-3 and batches of 8 its loss on the first batch first rises (2.2 → 4.3 → 3.9 → 1.9 over
    4 epochs; 2.2 → 2.9 → 2.0 without noise)."""
    from pipeline.data.noise import NOISE_FILE, NoiseIndex
    from pipeline.training.build import build_trainer

    options = {"loss_options": {"warmup_epochs": 0}} if loss == "decl" else {}  # decl: divide at once
    fresh = build_trainer(_noisy_config(tiny_cache, tmp_path / "fresh", loss=loss, epochs=2, **options),
                          **QUIET)
    first = fresh.epoch_batches(0)[0]
    ids = first.caption_ids.numpy()
    clean = torch.from_numpy(fresh.train_caption_image[ids] == fresh.index.caption_image[ids])
    assert 3 <= int(clean.sum()) < len(ids)  # a batch with clean and noisy pairs

    def batch_loss(trainer) -> float:
        trainer.model.eval()
        with torch.no_grad():
            img, cap = trainer.model(first.images, *first.captions)
            return trainer.loss(img[clean], cap[clean], image_ids=first.image_ids[clean],
                                sample_ids=first.caption_ids[clean]).item()

    before = batch_loss(fresh)
    if loss == "decl":
        score, judged = fresh.loss.begin_epoch(0, fresh.train_captions, fresh.sample_statistics(), 0)
    trainer = build_trainer(_noisy_config(tiny_cache, tmp_path / loss, loss=loss, epochs=2, **options),
                            **QUIET)
    assert math.isfinite(trainer.fit()["best_rsum"])
    if loss == "decl":
        assert batch_loss(trainer) < 0.7 * before
    kept = NoiseIndex.read(tmp_path / loss / NOISE_FILE, trainer.noise.caption_image,
                           int(trainer.noise.caption_image.max()) + 1)
    assert 0.4 < kept.true_rate() < 0.5  # ⌊0.5 · 120⌋ captions drawn; a few keep their own image
    records = [json.loads(line) for line in (tmp_path / loss / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["noise_true_rate"] == kept.true_rate() for r in records)
    if loss == "rcl":  # no division
        assert not any(key.startswith("division") for key in records[0] | records[1])
        return
    expected = division_metrics(score, judged, ~kept.noisy())
    for name, value in expected.items():
        assert records[0][name] == pytest.approx(value, abs=1e-12), name
    assert records[1]["division_auc"] != records[0]["division_auc"]  # made again from the trained weights


def test_decl_reads_the_raw_score_of_a_sigmoid_network():
    """SGR and SAF score σ(raw); DECL's authors take tanh and the evidence of raw: the factory tells
    the loss, unless the run's options say otherwise (tests/test_networks.py checks it through
    build_trainer, where dropping the call fails)."""
    from types import SimpleNamespace

    from pipeline.losses.noisy.decl import EvidentialLoss
    from pipeline.networks.sgraf import SGR
    from pipeline.training.factories import tell_loss_the_scores

    sgr = SimpleNamespace(score_activation=SGR.score_activation)
    for options, network, expected in [({}, sgr, True), ({"score_is_sigmoid": False}, sgr, False),
                                       ({}, SimpleNamespace(), False)]:
        loss = EvidentialLoss(**options)
        tell_loss_the_scores(SimpleNamespace(loss_options=options), loss, network)
        assert loss.score_is_sigmoid is expected
