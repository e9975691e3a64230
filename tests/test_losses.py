"""Losses against hand-computed values and against slow loop implementations (PROTOCOL.md)."""

import math

import pytest
import torch
from loss_batches import pairs_with_scores, random_batch
from reference import noisy_loop

from pipeline.core import registry
from pipeline.core.similarity import is_probabilistic
from pipeline.losses.base import LOSS_NAMES, build_loss
from pipeline.losses.check import call

LOSSES = registry.LOSSES.resolved()  # name → class, the built-in losses

# A 3 × 3 score table used by several golden values: S = img @ cap.T with img = I.
S3 = [[0.9, 0.8, 0.5],
      [0.3, 0.6, 0.7],
      [0.1, 0.65, 0.8]]


# ---------------------------------------------------------------------------- slow references


def slow_scores(img, cap, order=False):
    size = len(img)
    out = [[0.0] * size for _ in range(size)]
    for i in range(size):
        for j in range(size):
            if order:
                out[i][j] = -sum(max(0.0, float(c) - float(x)) ** 2
                                 for c, x in zip(cap[j], img[i]))
            else:
                out[i][j] = sum(float(x) * float(c) for x, c in zip(img[i], cap[j]))
    return out


def same_image(i, j, ids):
    return i == j or (ids is not None and ids[i] == ids[j])


def is_negative(i, j, ids, mask):
    return i != j and not (mask and same_image(i, j, ids))


def slow_hinge(scores, ids, mask, margin, reduce, margin_of=None):
    """reduce = sum or max over each query's negatives, both directions."""
    size = len(scores)
    total = 0.0
    for q in range(size):
        to_captions = [max(0.0, (margin_of(q, j) if margin_of else margin)
                           - scores[q][q] + scores[q][j])
                       for j in range(size) if is_negative(q, j, ids, mask)]
        to_images = [max(0.0, (margin_of(i, q) if margin_of else margin)
                         - scores[q][q] + scores[i][q])
                     for i in range(size) if is_negative(i, q, ids, mask)]
        for costs in (to_captions, to_images):
            if costs:
                total += sum(costs) if reduce == "sum" else max(costs)
    return total


def slow_lseh(scores, ids, mask, relevance, margin, lam):
    def margin_of(i, j):
        return margin + lam * (0.0 if same_image(i, j, ids) else relevance[i][j])
    return slow_hinge(scores, ids, mask, margin, "max", margin_of)


def slow_ladder(scores, ids, mask, relevance, thetas, margins, betas):
    size = len(scores)
    total = betas[0] * slow_hinge(scores, ids, mask, margins[0], "max")
    for theta, margin, beta in zip(thetas, margins[1:], betas[1:]):
        for q in range(size):
            rows = [(scores[q][j], relevance[q][j]) for j in range(size)
                    if is_negative(q, j, ids, mask)]
            cols = [(scores[i][q], relevance[i][q]) for i in range(size)
                    if is_negative(i, q, ids, mask)]
            for candidates in (rows, cols):
                more = [s for s, r in candidates if r >= theta]
                less = [s for s, r in candidates if r < theta]
                if more and less:
                    total += beta * max(0.0, margin - min(more) + max(less))
    return total


def slow_csn(scores, ids, mask, tau):
    size = len(scores)
    rows = cols = 0.0
    for q in range(size):
        row = [scores[q][j] / tau for j in range(size) if j == q or is_negative(q, j, ids, mask)]
        col = [scores[i][q] / tau for i in range(size) if i == q or is_negative(i, q, ids, mask)]
        rows += -scores[q][q] / tau + math.log(sum(math.exp(v) for v in row))
        cols += -scores[q][q] / tau + math.log(sum(math.exp(v) for v in col))
    return rows / size + cols / size


def slow_cmn(scores, ids, mask, margin, tau):
    size = len(scores)
    total = 0.0
    for q in range(size):
        captions = [scores[q][j] for j in range(size) if is_negative(q, j, ids, mask)]
        images = [scores[i][q] for i in range(size) if is_negative(i, q, ids, mask)]
        for hardest in (captions, images):
            if hardest:
                total += max(0.0, (max(hardest) + margin - scores[q][q]) / tau)
    return total / size


def slow_mvn(img, cap, ids, mask, tau):
    size = len(img)
    items = [list(map(float, v)) for v in list(img) + list(cap)]

    def sim(a, b):
        return sum(x * y for x, y in zip(items[a], items[b])) / tau

    total = 0.0
    for anchor in range(2 * size):
        positive = anchor + size if anchor < size else anchor - size
        pair = anchor % size
        allowed = [t for t in range(2 * size) if t != anchor and (
            t == positive or not (t % size == pair
                                  or (mask and ids is not None and ids[t % size] == ids[pair])))]
        total += -sim(anchor, positive) + math.log(sum(math.exp(sim(anchor, t)) for t in allowed))
    return total / (2 * size)


def _float32(value: float) -> float:
    """A learned parameter's start, as its float32 tensor holds it."""
    return float(torch.tensor(value, dtype=torch.float32))


def slow_infonce(scores, ids, mask):
    scale = math.exp(_float32(math.log(1 / 0.07)))
    return slow_csn([[scale * v for v in row] for row in scores], ids, mask, 1.0) / 2


def slow_siglip(scores, ids, mask):
    scale, bias = math.exp(_float32(math.log(10.0))), -10.0
    size, total = len(scores), 0.0
    for i in range(size):
        for j in range(size):
            if i == j or is_negative(i, j, ids, mask):
                z = 1.0 if i == j else -1.0
                total += math.log1p(math.exp(-z * (scale * scores[i][j] + bias)))  # -log σ(z · logit)
    return total / size


def slow_poly(scores, ids, mask, margin=0.2, epsilon=1e-5):
    """PolyLoss: per query with p < 1 - epsilon and max negative n, n + margin > p:
    [0.2 p² − 0.7 p + 0.5]_+ + [0.9 n² − 0.4 n + 0.03]_+; both directions, / B."""
    size, total = len(scores), 0.0
    for q in range(size):
        p = scores[q][q]
        for negs in ([scores[q][j] for j in range(size) if is_negative(q, j, ids, mask)],
                     [scores[i][q] for i in range(size) if is_negative(i, q, ids, mask)]):
            if p < 1 - epsilon and negs and max(negs) + margin > p:
                n = max(negs)
                total += max(0.0, 0.2 * p * p - 0.7 * p + 0.5) + max(0.0, 0.9 * n * n - 0.4 * n + 0.03)
    return total / size


def slow_selhn(scores, ids, mask, margin=0.2, epsilon=0.01):
    """SelHN: per query, the mean of its hinges over its negatives when |p − max negative| <
    epsilon, else their max; the mean over queries, the two directions averaged."""
    size, total = len(scores), 0.0
    for q in range(size):
        p = scores[q][q]
        for negs in ([scores[q][j] for j in range(size) if is_negative(q, j, ids, mask)],
                     [scores[i][q] for i in range(size) if is_negative(i, q, ids, mask)]):
            if negs:
                hinges = [max(0.0, margin - p + n) for n in negs]
                close = abs(p - max(negs)) < epsilon
                total += sum(hinges) / len(hinges) if close else max(hinges)
    return total / size / 2


def slow_crcl(scores, ids, mask, tau=0.05, weight=5.0, eps=1e-10):
    """CRCL with every label 1 (no caption ids): per query, −log p_ii + weight · Σ_{j neg} tan p_ij
    over its softmax of S / tau (positive and negatives, + eps); the mean over queries, both
    directions added."""
    size, total = len(scores), 0.0
    for row_of in (lambda q, j: scores[q][j], lambda q, j: scores[j][q]):
        for q in range(size):
            negs = [j for j in range(size) if is_negative(q, j, ids, mask)]  # symmetric in (q, j)
            z = sum(math.exp(row_of(q, j) / tau) for j in [q, *negs]) + eps
            total += (-math.log(math.exp(row_of(q, q) / tau) / z)
                      + weight * sum(math.tan(math.exp(row_of(q, j) / tau) / z) for j in negs)) / size
    return total


def slow_bicro_warmup(scores, ids, mask, margin=0.2, rate=0.5):
    """BiCro's warm-up (their warmup_sele) on two identical networks: twice the sum of the
    ⌊rate · B⌋ smallest per-pair losses (NCR's mean row hinge + mean column hinge)."""
    losses = sorted(noisy_loop.ncr_eval_loss(scores, negatives(scores, ids, mask), margin))
    return 2 * sum(losses[:int(rate * len(scores))])


def _logsumexp(values):
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _halves(rows):
    """[mean, log-variance] rows (an even width) as two lists of lists."""
    half = len(rows[0]) // 2
    return [r[:half] for r in rows], [r[half:] for r in rows]


def _vib_kl(means, log_scales):
    """-½ mean(1 + s - μ² - e^s) over every entry; 0 above the authors' ceiling 10000."""
    terms = [1 + s - m * m - math.exp(s)
             for mu, ls in zip(means, log_scales) for m, s in zip(mu, ls)]
    kl = -0.5 * sum(terms) / len(terms)
    return 0.0 if kl > 10000.0 else kl


def slow_pcmepp(img, cap, ids, mask, shift=5.0, scale=5.0, beta=1e-4, alpha=0.1):
    """PCME++: logit l_ic = -a·(||μ_i - μ_c||² + Σ e^v_i + Σ e^v_c) + b; BCE(l, t) = softplus(l) - t·l
    averaged over the counted pairs (the diagonal and the negatives); 2·BCE(l, eye) + β·(KL_img +
    KL_cap) (KL of v = log σ²) + α·(BCE with pseudo-positives per image row + per caption column:
    a pair whose logit reaches its row's (column's) positive's has target 1)."""
    size = len(img)
    img_mean, img_var = _halves(img)
    cap_mean, cap_var = _halves(cap)
    logit = [[-scale * (sum((x - y) ** 2 for x, y in zip(img_mean[i], cap_mean[c]))
                        + sum(math.exp(v) for v in img_var[i]) + sum(math.exp(v) for v in cap_var[c]))
              + shift for c in range(size)] for i in range(size)]
    counted = [(i, c) for i in range(size) for c in range(size) if i == c or is_negative(i, c, ids, mask)]

    def bce(target):
        return sum(_softplus(logit[i][c]) - target(i, c) * logit[i][c] for i, c in counted) / len(counted)

    matched = bce(lambda i, c: 1.0 if i == c else 0.0)
    by_image = bce(lambda i, c: 1.0 if logit[i][c] >= logit[i][i] else 0.0)  # i == c reaches itself
    by_caption = bce(lambda i, c: 1.0 if logit[i][c] >= logit[c][c] else 0.0)
    return (2 * matched + beta * (_vib_kl(img_mean, img_var) + _vib_kl(cap_mean, cap_var))
            + alpha * (by_image + by_caption))


def pcme_draws(size, dim, samples=8, seed=0):
    """The standard normal draws ``pcme`` makes in a call seeded with ``seed`` (check.call): its own
    ``noise`` function, called for the draws only (images', then captions', as the loss), as lists
    [item row][sample][dim]. Which row goes to which item is the slow loop's business."""
    noise = build_loss("pcme", num_samples=samples).noise
    like = torch.zeros((), dtype=torch.float64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return noise(size, dim, like).tolist(), noise(size, dim, like).tolist()


def slow_pcme(img, cap, ids, mask, shift=5.0, scale=5.0, beta=1e-3, samples=8, squared=False):
    """PCME, Monte-Carlo on the loss's own draws (``pcme_draws``): the rows are dealt to a side's
    items by the rank of their log-variance sums (the item with the k-th smallest sum gets row k);
    z_ik = μ_i + ε_ik·exp(v_i / 2) (log σ = v / 2); over the K² sample pairs of a counted pair,
    l = -a·d + b, d the (squared) distance; NLL_ic = log K² - logsumexp_kl(m·l - log(e^l + e^-l)),
    m = +1 on the diagonal, -1 elsewhere; 2·Σ NLL + β·(KL_img + KL_cap) (KL of log σ)."""
    size = len(img)
    noise_img, noise_cap = pcme_draws(size, len(img[0]) // 2, samples)

    def sampled(rows, noise):
        mean, log_var = _halves(rows)
        order = sorted(range(size), key=lambda i: sum(log_var[i]))
        row_of = {item: k for k, item in enumerate(order)}
        points = [[[m + e * math.exp(v / 2) for m, e, v in zip(mean[i], noise[row_of[i]][k], log_var[i])]
                   for k in range(samples)] for i in range(size)]
        return points, mean, [[v / 2 for v in r] for r in log_var]

    img_z, img_mean, img_log_sigma = sampled(img, noise_img)
    cap_z, cap_mean, cap_log_sigma = sampled(cap, noise_cap)
    total = 0.0
    for i in range(size):
        for c in range(size):
            if not (i == c or is_negative(i, c, ids, mask)):
                continue
            sign = 1.0 if i == c else -1.0
            evidence = []
            for zi in img_z[i]:
                for zc in cap_z[c]:
                    d2 = sum((x - y) ** 2 for x, y in zip(zi, zc))
                    logit = -scale * (d2 if squared else math.sqrt(d2)) + shift
                    evidence.append(sign * logit - _logsumexp([logit, -logit]))
            total += math.log(samples * samples) - _logsumexp(evidence)
    return 2 * total + beta * (_vib_kl(img_mean, img_log_sigma) + _vib_kl(cap_mean, cap_log_sigma))


# Each built-in loss's slow reference at its default options: (img, cap, scores, ids, rel, mask).
SLOW_REFERENCES = {
    "sh": lambda i, c, s, ids, r, m: slow_hinge(s, ids, m, 0.2, "sum"),
    "mh": lambda i, c, s, ids, r, m: slow_hinge(s, ids, m, 0.2, "max"),
    "order": lambda i, c, s, ids, r, m: slow_hinge(s, ids, m, 0.05, "sum"),
    "lseh": lambda i, c, s, ids, r, m: slow_lseh(s, ids, m, r, 0.185, 0.025),
    "ladder": lambda i, c, s, ids, r, m: slow_ladder(s, ids, m, r, [0.63], [0.2, 0.01], [1.0, 0.25]),
    "csn": lambda i, c, s, ids, r, m: slow_csn(s, ids, m, 0.1),
    "cmn": lambda i, c, s, ids, r, m: slow_cmn(s, ids, m, 0.2, 0.1),
    "mvn": lambda i, c, s, ids, r, m: slow_mvn(i, c, ids, m, 0.1),
    "infonce": lambda i, c, s, ids, r, m: slow_infonce(s, ids, m),
    "siglip": lambda i, c, s, ids, r, m: slow_siglip(s, ids, m),
    # the noisy-pair losses' loops (tests/reference/noisy_loop.py); ncr at epoch 0 (its warm-up) on
    # two identical networks: each one's mean hinges (their mode "warmup")
    "rcl": lambda i, c, s, ids, r, m: noisy_loop.rcl(s, negatives(s, ids, m), 0.05),
    # decl at its first step: neg = int(B − 0.025) = B − 1, every pair clean (its warm-up)
    "decl": lambda i, c, s, ids, r, m: noisy_loop.decl(s, negatives(s, ids, m), 0.1, 0.2, 0.8, 0.1,
                                                       len(s) - 1, [True] * len(s)),
    "ncr": lambda i, c, s, ids, r, m: 2 * noisy_loop.ncr_warmup(s, negatives(s, ids, m), 0.2),
    "crcl": lambda i, c, s, ids, r, m: slow_crcl(s, ids, m),
    "bicro": lambda i, c, s, ids, r, m: slow_bicro_warmup(s, ids, m),
    "poly": lambda i, c, s, ids, r, m: slow_poly(s, ids, m),
    "selhn": lambda i, c, s, ids, r, m: slow_selhn(s, ids, m),
    # probabilistic: embeddings [mean, log-variance], shift and scale at their start 5 and 5
    "pcme": lambda i, c, s, ids, r, m: slow_pcme(i, c, ids, m),
    "pcmepp": lambda i, c, s, ids, r, m: slow_pcmepp(i, c, ids, m),
}


def negatives(scores, ids, mask):
    return [[is_negative(i, j, ids, mask) for j in range(len(scores))] for i in range(len(scores))]


def slow_loss(name, img, cap, ids, relevance, mask):
    if name not in SLOW_REFERENCES:  # never a silent fallback to another loss's formula
        raise AssertionError(f"loss {name!r} has no slow reference in tests/test_losses.py")
    img, cap, relevance = img.tolist(), cap.tolist(), relevance.tolist()
    ids = None if ids is None else ids.tolist()
    scores = slow_scores(img, cap, order=LOSSES[name].similarity == "order")
    return SLOW_REFERENCES[name](img, cap, scores, ids, relevance, mask)


def test_every_registered_loss_has_a_slow_reference():
    assert set(SLOW_REFERENCES) == set(LOSS_NAMES)
    with pytest.raises(AssertionError, match="has no slow reference"):
        slow_loss("triplet", *random_batch(0), True)


def loss_batch(name, seed, size=7, dim=5):
    """``random_batch`` as the loss ``name`` takes it: absolute values for an order loss, and for a
    probabilistic one ([mean, log-variance] halves) the width made even (5 → 6, 3 → 4)."""
    if is_probabilistic(LOSSES[name].similarity):
        dim += dim % 2
    return random_batch(seed, size, dim, order=LOSSES[name].similarity == "order")


# ---------------------------------------------------------------------------- against slow loops


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mask", [True, False])
def test_loss_matches_slow_loop(name, seed, mask):
    img, cap, ids, rel = loss_batch(name, seed)
    loss = build_loss(name, mask_same_image=mask)
    got = call(loss, img, cap, ids, rel, 0)  # ncr's two networks: the same pair of embeddings each
    assert got.shape == () and got.dtype == torch.float64
    assert got.item() == pytest.approx(slow_loss(name, img, cap, ids, rel, mask), rel=1e-9,
                                       abs=1e-12)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_without_image_ids_only_the_diagonal_is_positive(name):
    img, cap, _, rel = loss_batch(name, 3)
    got = call(build_loss(name), img, cap, None, rel, 0)
    assert got.item() == pytest.approx(slow_loss(name, img, cap, None, rel, True), rel=1e-9)


def test_same_image_masking_changes_the_value():
    img, cap, ids, _ = random_batch(0)
    masked = build_loss("sh")(img, cap, ids)
    unmasked = build_loss("sh", mask_same_image=False)(img, cap, ids)
    assert unmasked > masked  # the unmasked one also pushes same-image captions apart


# ---------------------------------------------------------------------------- golden values


def test_sum_and_max_hinge_golden():
    img, cap = pairs_with_scores(S3)
    # Hinges 0.2 - S_ii + S_ij, rows (image queries): 0.1 | 0.3 | 0.05;
    # columns (caption queries): 0 | 0.4 and 0.25 | 0.1.
    assert build_loss("sh")(img, cap).item() == pytest.approx(1.2)
    assert build_loss("mh")(img, cap).item() == pytest.approx(0.95)
    # Pairs 0 and 1 show the same image: S01 and S10 are no longer negatives.
    assert build_loss("mh")(img, cap, torch.tensor([7, 7, 3])).item() == pytest.approx(0.7)


def test_order_golden():
    img = torch.tensor([[1.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    cap = torch.tensor([[0.5, 0.5], [1.0, 3.0]], dtype=torch.float64)
    loss = build_loss("order")
    # s(i, c) = -||max(0, c - i)||^2 → S = [[0, -4], [-0.25, -2]].
    assert loss.score_matrix(img, cap).tolist() == [[0.0, -4.0], [-0.25, -2.0]]
    # Only query image 1 vs caption 0 violates: 0.05 + 2 - 0.25.
    assert loss(img, cap).item() == pytest.approx(1.8)
    assert build_loss("order", reduction="max")(img, cap).item() == pytest.approx(1.8)


def test_lseh_golden():
    img, cap = pairs_with_scores(S3)
    rel = torch.tensor([[1.0, 0.1, 0.0], [0.1, 1.0, 0.2], [0.0, 0.2, 1.0]])
    # Per-pair margin 0.1 + rel: rows 0.1 | 0.4 | 0.15, columns 0 | 0.4 | 0.2.
    loss = build_loss("lseh", margin=0.1, lambda_=1.0)
    assert loss(img, cap, relevance=rel).item() == pytest.approx(1.25)


def test_ladder_golden():
    img, cap = pairs_with_scores(S3)
    rel = torch.tensor([[1.0, 0.2, 0.7], [0.2, 1.0, 0.6], [0.7, 0.6, 1.0]], dtype=torch.float64)
    loss = build_loss("ladder", thetas=[0.6], margins=[0.2, 0.1], betas=[1.0, 0.5])
    # Level 1 = mh = 0.95.  Level 2 (theta 0.6; relevance 0.6 counts as more relevant):
    # row 0: 0.1 - S02 + S01 = 0.4; row 1: 0.1 - 0.7 + 0.3 < 0; row 2: nothing less
    # relevant (skipped); column 0: 0.1 - S20 + S10 = 0.3; column 1: 0.1 - S21 + S01 = 0.25;
    # column 2 skipped.  Total 0.95 + 0.5 * 0.95.
    assert loss(img, cap, relevance=rel).item() == pytest.approx(1.425)


def test_csn_golden():
    img, cap = pairs_with_scores([[0.9, 0.8], [0.3, 0.6]])
    tau = 0.5
    rows = math.log1p(math.exp((0.8 - 0.9) / tau)) + math.log1p(math.exp((0.3 - 0.6) / tau))
    cols = math.log1p(math.exp((0.3 - 0.9) / tau)) + math.log1p(math.exp((0.8 - 0.6) / tau))
    assert build_loss("csn", tau=tau)(img, cap).item() == pytest.approx(rows / 2 + cols / 2)
    # Both pairs show the same image: no negatives at all.
    assert build_loss("csn", tau=tau)(img, cap, torch.tensor([1, 1])).item() == 0.0


def test_cmn_golden():
    img, cap = pairs_with_scores(S3)
    # Hardest captions 0.8, 0.7, 0.65 → (x + 0.2 - S_ii) / 0.1 = 1, 3, 0.5;
    # hardest images 0.3, 0.8, 0.7 → 0 (negative), 4, 1.
    assert build_loss("cmn")(img, cap).item() == pytest.approx(9.5 / 3)


def test_mvn_golden():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    cap = torch.tensor([[0.6, 0.8], [0.8, -0.6]], dtype=torch.float64)
    # img0·img1 = 0, img0·cap0 = .6, img0·cap1 = .8, img1·cap0 = .8, img1·cap1 = -.6,
    # cap0·cap1 = 0; tau = 1.
    e = math.exp
    terms = [-0.6 + math.log(1 + e(0.6) + e(0.8)),   # anchor img0
             0.6 + math.log(1 + e(0.8) + e(-0.6)),   # anchor img1
             -0.6 + math.log(e(0.6) + e(0.8) + 1),   # anchor cap0
             0.6 + math.log(e(0.8) + e(-0.6) + 1)]   # anchor cap1
    assert build_loss("mvn", tau=1.0)(img, cap).item() == pytest.approx(sum(terms) / 4)


# ---------------------------------------------------------------------------- options


def test_negative_set_size_covering_all_negatives_is_plain_mh():
    img, cap, ids, _ = random_batch(4)
    full = build_loss("mh")(img, cap, ids)
    assert build_loss("mh", negative_set_size=6)(img, cap, ids).item() == pytest.approx(
        full.item())


def test_negative_set_size_draws_only_negatives():
    # Every negative has hinge 0.2; the same-image pair (0, 1) would have 4.8.
    scores = [[0.5, 5.0, 0.5], [5.0, 0.5, 0.5], [0.5, 0.5, 0.5]]
    img, cap = pairs_with_scores(scores)
    ids = torch.tensor([0, 0, 1])
    loss = build_loss("mh", negative_set_size=1)
    unmasked = build_loss("mh", negative_set_size=1, mask_same_image=False)
    seen_unmasked = set()
    for seed in range(20):
        torch.manual_seed(seed)
        assert loss(img, cap, ids).item() == pytest.approx(6 * 0.2)
        seen_unmasked.add(round(unmasked(img, cap, ids).item(), 6))
    assert len(seen_unmasked) > 1  # without the mask the random draw matters


def test_negative_set_size_is_at_most_mh_and_reproducible():
    img, cap, ids, _ = random_batch(5)
    full = build_loss("mh")(img, cap, ids).item()
    loss = build_loss("mh", negative_set_size=1)
    torch.manual_seed(3)
    first = loss(img, cap, ids).item()
    torch.manual_seed(3)
    assert loss(img, cap, ids).item() == first
    assert 0 <= first <= full


def test_warmup_uses_sum_of_hinges_for_the_first_epochs():
    img, cap, ids, _ = random_batch(6)
    sh = build_loss("sh")(img, cap, ids).item()
    mh = build_loss("mh")(img, cap, ids).item()
    assert sh > mh
    loss = build_loss("mh", warmup_epochs=2)
    assert loss(img, cap, ids).item() == pytest.approx(sh)  # epoch 0 before any set_epoch
    loss.set_epoch(1)
    assert loss(img, cap, ids).item() == pytest.approx(sh)
    loss.set_epoch(2)
    assert loss(img, cap, ids).item() == pytest.approx(mh)


def test_lseh_warmup_sums_the_hinges_with_their_semantic_margins():
    """By hand: S = [[.5, .4, .45], [.1, .3, 0], [0, 0, .6]], margin 0.1, lambda 0.2, relevance
    0.5 between captions 0-1 and 1-2, 0 between 0-2 (margins 0.2, 0.2 and 0.1). Hinges to
    captions: row 0 [0.1, 0.05], to images: column 1 [0.3], all others 0. Sum 0.45, hardest 0.4."""
    scores = torch.tensor([[0.5, 0.4, 0.45], [0.1, 0.3, 0.0], [0.0, 0.0, 0.6]], dtype=torch.float64)
    img, cap = torch.eye(3, dtype=torch.float64), scores.T.clone()  # img @ cap.T = scores
    rel = torch.tensor([[1.0, 0.5, 0.0], [0.5, 1.0, 0.5], [0.0, 0.5, 1.0]], dtype=torch.float64)
    ids = torch.tensor([0, 1, 2])
    loss = build_loss("lseh", margin=0.1, lambda_=0.2, warmup_epochs=1)
    assert loss(img, cap, ids, rel).item() == pytest.approx(0.45, abs=1e-12)
    loss.set_epoch(1)
    assert loss(img, cap, ids, rel).item() == pytest.approx(0.4, abs=1e-12)
    assert build_loss("lseh", margin=0.1, lambda_=0.2)(img, cap, ids, rel).item() == pytest.approx(0.4)


def test_ladder_three_levels_defaults():
    img, cap, ids, rel = random_batch(7)
    got = build_loss("ladder", levels=3)(img, cap, ids, rel).item()
    scores = slow_scores(img.tolist(), cap.tolist())
    expected = slow_ladder(scores, ids.tolist(), True, rel.tolist(), [0.63, 0.56],
                           [0.2, 0.01, 0.01], [1.0, 0.25, 0.125])
    assert got == pytest.approx(expected, rel=1e-9)


def test_uses_relevance_flags():
    assert {n for n in LOSS_NAMES if build_loss(n).uses_relevance} == {"lseh", "ladder"}


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("name, options, message", [
    ("triplet", {}, "unknown loss 'triplet'"),
    ("mh", {"marg": 0.1}, "loss mh has no option marg (its options: mask_same_image, warmup_epochs, margin"),
    ("csn", {"tau": 0.0}, "tau must be > 0"),
    ("order", {"reduction": "mean"}, "reduction must be one of sum, max, got 'mean'"),
    ("mh", {"negative_set_size": 0}, "negative_set_size must be an integer >= 1 or null"),
    ("mh", {"warmup_epochs": -1}, "warmup_epochs must be an integer >= 0"),
    ("lseh", {"warmup_epochs": 0.5}, "warmup_epochs must be an integer >= 0"),
    ("ladder", {"levels": 4}, "levels=4 has no defaults"),
    ("ladder", {"thetas": [0.6, 0.5]}, "levels=2 needs 1 thetas"),
    ("ladder", {"margins": 0.2}, "margins must be a list"),
    ("sh", {"margin": float("nan")}, "margin must be a finite number"),
])
def test_bad_names_and_options_raise(name, options, message):
    with pytest.raises(ValueError) as info:
        build_loss(name, **options)
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["lseh", "ladder"])
def test_relevance_losses_need_relevance(name):
    img, cap, ids, _ = random_batch(0)
    with pytest.raises(ValueError, match="needs the batch relevance"):
        build_loss(name)(img, cap, ids)
    with pytest.raises(ValueError, match="relevance must be 7 × 7"):
        build_loss(name)(img, cap, ids, torch.zeros(6, 6))


def test_bad_shapes_raise():
    img, cap, ids, _ = random_batch(0)
    with pytest.raises(ValueError, match="must both be"):
        build_loss("mh")(img, cap[:5])
    with pytest.raises(ValueError, match="image_ids must have shape"):
        build_loss("mh")(img, cap, ids[:3])


# ---------------------------------------------------------------------------- gradients, precision


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_gradcheck(name):
    # pcme: call seeds every evaluation alike, so its draws are the same at each point; which row
    # goes to which item follows the order of the log-variance sums, constant near the point (no
    # two sums within gradcheck's step), so the value is smooth there and gradcheck applies.
    img, cap, ids, rel = loss_batch(name, 8, size=5, dim=3)
    if is_probabilistic(LOSSES[name].similarity):  # the premise above: sums far apart (here > 0.03)
        for side in (img, cap):
            sums = side[:, side.shape[1] // 2:].sum(-1).sort().values
            assert (sums.diff() > 1e-3).all()
    img.requires_grad_(True)
    cap.requires_grad_(True)
    loss = build_loss(name)
    assert torch.autograd.gradcheck(lambda a, b: call(loss, a, b, ids, rel, 0), (img, cap))


def test_gradients_reach_both_modalities():
    img, cap, ids, rel = random_batch(9)
    img = img.float().requires_grad_(True)
    cap = cap.float().requires_grad_(True)
    build_loss("ladder")(img, cap, ids, rel).backward()
    assert img.grad.abs().sum() > 0 and cap.grad.abs().sum() > 0
    assert torch.isfinite(img.grad).all() and torch.isfinite(cap.grad).all()


@pytest.mark.parametrize("name", ["cmn", "csn", "ladder", "mvn"])
def test_no_nan_gradient_when_a_query_has_no_negatives(name):
    img, cap, _, rel = random_batch(10, size=3)
    img = img.float().requires_grad_(True)
    ids = torch.tensor([0, 0, 0])  # nothing is a negative
    value = build_loss(name)(img, cap.float(), ids, rel)
    value.backward()
    assert value.item() == 0.0
    assert torch.isfinite(img.grad).all()


def test_autocast_does_not_lower_the_loss_precision():
    img, cap, ids, rel = random_batch(11)
    img, cap = img.float(), cap.float()
    plain = build_loss("lseh")(img, cap, ids, rel)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = build_loss("lseh")(img, cap, ids, rel)
    assert mixed.dtype == torch.float32
    assert mixed.item() == plain.item()
