"""Losses against faithful re-implementations of the authors' code (docs/PROTOCOL.md, "Differences
from the authors' code"), each against ours on the smallest case that shows the difference."""

import math

import pytest
import torch
from loss_batches import pairs_with_scores, random_batch

from pipeline.losses.base import build_loss


def reference_simclr_loss(im, s, temperature):
    """ConVSE's code (anuragjain96/ConVsepp, ContrastiveLoss.SimCLR_loss)."""
    out = torch.cat([im, s], dim=0)
    batch_size = im.size(0)
    sim_matrix = torch.exp(torch.mm(out, out.t().contiguous()) / temperature)
    mask = (torch.ones_like(sim_matrix) - torch.eye(2 * batch_size)).bool()
    sim_matrix = sim_matrix.masked_select(mask).view(2 * batch_size, -1)
    pos_sim = torch.exp(torch.sum(im * s, dim=-1) / temperature)
    pos_sim = torch.cat([pos_sim, pos_sim], dim=0)
    return (-torch.log(pos_sim / sim_matrix.sum(dim=-1))).mean()


@pytest.mark.parametrize("seed", [0, 1])
def test_mvn_equals_the_reference_simclr_loss(seed):
    img, cap, _, _ = random_batch(seed)
    ours = build_loss("mvn", tau=0.1, mask_same_image=False)(img, cap)
    assert ours.item() == pytest.approx(reference_simclr_loss(img, cap, 0.1).item(), rel=1e-12)


def reference_order_sim(im, s):
    """VSE++'s code (fartashf/vsepp model.py, order_sim): no square."""
    ymx = (s.unsqueeze(1).expand(s.size(0), im.size(0), s.size(1))
           - im.unsqueeze(0).expand(s.size(0), im.size(0), s.size(1)))
    return -ymx.clamp(min=0).pow(2).sum(2).sqrt().t()


def reference_vsepp_loss(scores, margin, max_violation):
    """VSE++'s ContrastiveLoss on a score table (no same-image mask)."""
    diagonal = scores.diag().view(-1, 1)
    cost_s = (margin + scores - diagonal.expand_as(scores)).clamp(min=0)
    cost_im = (margin + scores - diagonal.t().expand_as(scores)).clamp(min=0)
    eye = torch.eye(len(scores), dtype=torch.bool)
    cost_s, cost_im = cost_s.masked_fill(eye, 0), cost_im.masked_fill(eye, 0)
    if max_violation:
        cost_s, cost_im = cost_s.max(1)[0], cost_im.max(0)[0]
    return cost_s.sum() + cost_im.sum()


def test_order_unsquared_golden_and_reference():
    from pipeline.core.similarity import order_scores

    img = torch.tensor([[1.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    cap = torch.tensor([[0.5, 0.5], [1.0, 3.0]], dtype=torch.float64)
    # max(0, c - i): (0, 0), (0, 2) | (0.5, 0), (1, 1).
    assert order_scores(img, cap).tolist() == [[0.0, -4.0], [-0.25, -2.0]]
    unsquared = build_loss("order", squared=False)
    assert unsquared.similarity == "order-norm" and build_loss("order").similarity == "order"
    got = unsquared.score_matrix(img, cap)  # sqrt(2): a stated tolerance, any norm routine
    torch.testing.assert_close(got, torch.tensor([[0.0, -2.0], [-0.5, -math.sqrt(2)]],
                                                 dtype=torch.float64), rtol=1e-15, atol=0)
    torch.testing.assert_close(got, reference_order_sim(img, cap), rtol=1e-15, atol=0)
    # Only query image 1 vs caption 0 violates: 0.05 + sqrt(2) - 0.5 (squared: 1.8).
    assert unsquared(img, cap).item() == pytest.approx(math.sqrt(2) - 0.45)
    for seed in (0, 1):  # Order++ as VSE++ trains it
        img, cap, _, _ = random_batch(seed, order=True)
        ours = build_loss("order", squared=False, reduction="max", mask_same_image=False)
        expected = reference_vsepp_loss(reference_order_sim(img, cap), 0.05, True)
        assert ours(img, cap).item() == pytest.approx(expected.item(), rel=1e-12)


def reference_ladder(scores, rdmat, margins, thresholds, betas):
    """The ladder-loss code (cdluminate/ladderloss, LadderLoss.forward, not cumulative)."""
    diagonal = scores.diag().view(-1, 1)
    eye = torch.eye(len(scores), dtype=torch.bool)
    cost_x2v = (margins[0] + scores - diagonal.expand_as(scores)).clamp(min=0).masked_fill(eye, 0)
    cost_v2x = (margins[0] + scores - diagonal.t().expand_as(scores)).clamp(min=0).masked_fill(eye, 0)
    total = cost_x2v.max(1)[0].sum() + cost_v2x.max(0)[0].sum()
    for level, theta in enumerate(thresholds):
        simmask, dismask = (rdmat >= theta).double(), (rdmat < theta).double()
        gt_sim = scores * simmask + 1.0 * dismask
        gt_dis = scores * dismask
        xvld = (margins[1 + level] - gt_sim.min(dim=1)[0] + gt_dis.max(dim=1)[0]).clamp(min=0)
        vxld = (margins[1 + level] - gt_sim.min(dim=0)[0] + gt_dis.max(dim=0)[0]).clamp(min=0)
        total = total + betas[level] * (xvld.sum() + vxld.sum())
    return total.item()


def at_angles(*degrees):
    return torch.tensor([[math.cos(math.radians(d)), math.sin(math.radians(d))] for d in degrees],
                        dtype=torch.float64)


LADDER_REFERENCE = dict(margins=[0.2, 0.01], thresholds=[0.63], betas=[0.25])
REL_02 = torch.tensor([[1.0, 0.2], [0.2, 1.0]], dtype=torch.float64)


def test_ladder_positive_in_more_relevant_reproduces_the_reference():
    # B = 2, all four embeddings (1, 0): every score is 1, no negative is more relevant.
    img = cap = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    reference = reference_ladder(img @ cap.T, REL_02, **LADDER_REFERENCE)
    assert reference == pytest.approx(0.81)  # 4 × 0.2 + 0.25 × 4 × 0.01
    assert build_loss("ladder")(img, cap, relevance=REL_02).item() == pytest.approx(0.80)
    option = build_loss("ladder", positive_in_more_relevant=True)
    assert option(img, cap, relevance=REL_02).item() == pytest.approx(reference)


def test_ladder_reference_bug_max_of_masked_zeros_is_not_reproduced():
    # Images at 0° and 15°, captions at 195° and 180°: every score is negative.  The
    # reference takes max(scores * less_mask) = 0 (a masked zero), not the less-relevant -1.
    img, cap = at_angles(0, 15), at_angles(195, 180)
    reference = reference_ladder(img @ cap.T, REL_02, **LADDER_REFERENCE)
    assert reference == pytest.approx(1.6396, abs=5e-5)
    ours = build_loss("ladder")(img, cap, relevance=REL_02).item()
    assert ours == pytest.approx(0.6637, abs=5e-5)  # level 1 only: 4 × (0.2 + cos 15° - 1)
    assert ours == pytest.approx(4 * (0.2 + math.cos(math.radians(15)) - 1), rel=1e-12)
    option = build_loss("ladder", positive_in_more_relevant=True)
    assert option(img, cap, relevance=REL_02).item() == pytest.approx(ours, rel=1e-12)


def test_ladder_option_equals_the_reference_where_no_score_is_negative():
    gen = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.rand(6, 4, generator=gen, dtype=torch.float64), dim=1)
    cap = torch.nn.functional.normalize(img + 0.3 * torch.rand(6, 4, generator=gen,
                                                               dtype=torch.float64), dim=1)
    rel = torch.rand(6, 6, generator=gen, dtype=torch.float64) * 0.5 + 0.4
    rel = (rel + rel.T) / 2
    rel.fill_diagonal_(1.0)
    assert (rel < 0.63).any(dim=1).all()  # every query has a less-relevant negative
    ours = build_loss("ladder", positive_in_more_relevant=True, mask_same_image=False)
    assert ours(img, cap, relevance=rel).item() == pytest.approx(
        reference_ladder(img @ cap.T, rel, **LADDER_REFERENCE), rel=1e-12)


def reference_lseh(scores, sem, same_image, margin, lam):
    """LSEH's code (yangong23/VSEnetworksLSEH, ContrastiveLossLSEH) given the semantic
    matrix: the margin (margin + lam * sem) times a map that is 0 on same-image pairs."""
    margins = (sem * lam + margin) * (~same_image).double()
    margins = margins.masked_fill(torch.eye(len(scores), dtype=torch.bool), 0)
    diagonal = scores.diag().view(-1, 1)
    eye = torch.eye(len(scores), dtype=torch.bool)
    cost_s = (margins + scores - diagonal.expand_as(scores)).clamp(min=0).masked_fill(eye, 0)
    cost_im = (margins + scores - diagonal.t().expand_as(scores)).clamp(min=0).masked_fill(eye, 0)
    return (cost_s.max(1)[0].sum() + cost_im.max(0)[0].sum()).item()


def test_lseh_same_image_pairs_as_the_reference():
    # Both pairs show one image: S = [[.5, .75], [.25, .5]], margin .25, lambda .5, rel .5.
    img, cap = pairs_with_scores([[0.5, 0.75], [0.25, 0.5]])
    ids, rel = torch.tensor([0, 0]), torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    options = dict(margin=0.25, lambda_=0.5)
    assert build_loss("lseh", **options)(img, cap, ids, rel).item() == 0.0  # no negatives
    # As negatives with margin .25 (semantic part zeroed): row 0 .5, column 1 .5.
    kept = build_loss("lseh", mask_same_image=False, **options)
    assert kept(img, cap, ids, rel).item() == 1.0
    # The reference zeroes the whole margin: row 0 .25, column 1 .25.
    reference = build_loss("lseh", mask_same_image=False, zero_margin_same_image=True, **options)
    assert reference(img, cap, ids, rel).item() == 0.5
    same = ids[:, None] == ids[None, :]
    assert reference_lseh(img @ cap.T, rel, same, 0.25, 0.5) == 0.5
    img, cap, ids, rel = random_batch(0)  # pairs 0-1 and 3-4-5 share images
    same = ids[:, None] == ids[None, :]
    assert reference(img, cap, ids, rel).item() == pytest.approx(
        reference_lseh(img @ cap.T, rel, same, 0.25, 0.5), rel=1e-12)
    with pytest.raises(ValueError, match="needs mask_same_image=false"):
        build_loss("lseh", zero_margin_same_image=True)


def test_tied_hardest_negatives_split_the_subgradient():
    # Query image 0 has two hardest negatives tied at 0.25 (hinge 0.5 - 0.5 + 0.25); every
    # other hinge is negative.  Ours (amax) gives each half the subgradient; the reference
    # (max(1)[0]) gives all of it to the first.
    scores = [[0.5, 0.25, 0.25], [-0.25, 1.0, 0.0], [-0.25, 0.0, 1.0]]
    img, cap = pairs_with_scores(scores)
    cap.requires_grad_(True)
    value = build_loss("mh", margin=0.5)(img, cap)
    assert value.item() == 0.25
    value.backward()
    # cap[j, i] = S[i, j]: the gradient on row 0 of S is column 0 of cap.grad.
    assert cap.grad[:, 0].tolist() == [-1.0, 0.5, 0.5]
    cap.grad = None
    reference_vsepp_loss(img @ cap.T, 0.5, True).backward()
    assert cap.grad[:, 0].tolist() == [-1.0, 1.0, 0.0]
