"""RCL's, DECL's and NCR's formulas written one query at a time in plain Python (math on floats),
from the papers' equations (RCL's: from the authors' CCL, see ``rcl``; DECL's: from the authors'
model/DECL.py, see ``decl``): a reference for the batched ``pipeline.losses.noisy.base``. It is
NOT the authors' code (NCR's ``ncr_*``: their model.py's ContrastiveLoss, one entry at a time;
tests/test_ncr_golden.py compares ncr with their files themselves). ``S`` is a list of rows,
``negative[i][j]`` says whether (i, j) counts as a negative.
"""

from __future__ import annotations

import math


def rcl(S, negative, tau, variant="log", q=0.2, eps=1e-10):
    """The authors' CCL (penghu-cs/RCL, RCL-SGRAF/model.py) one query at a time, its 1e-10
    terms as ``eps``; ``negative`` also says which entries enter each softmax (the negatives and
    the positive). tests/test_rcl_golden.py compares ``rcl`` with their file itself."""
    n = len(S)
    total = 0.0
    for direction in ("i2t", "t2i"):
        per_query = []
        for i in range(n):
            row = [S[i][j] if direction == "i2t" else S[j][i] for j in range(n)]
            neg = [negative[i][j] if direction == "i2t" else negative[j][i] for j in range(n)]
            candidates = [j for j in range(n) if j == i or neg[j]]
            z = sum(math.exp(row[j] / tau) for j in candidates) + eps
            p = {j: math.exp(row[j] / tau) / z for j in candidates}
            if variant == "infonce":
                per_query.append(-math.log(p[i]))
                continue
            cost = 0.0
            for j in candidates:
                if j == i:
                    continue
                if variant == "log":
                    cost += -math.log(1 - p[j] + eps)
                elif variant == "gce":
                    cost += (1 - (1 - p[j] + eps) ** q) / q
                elif variant == "abs":
                    cost += p[j]
                elif variant == "exp":
                    cost += math.exp(-(1 - p[j]))
                else:
                    cost += math.tan(p[j])
            per_query.append(cost)
        total += sum(per_query) / n
    return total


def _kl_dirichlet_to_uniform(alpha):
    """KL(Dir(alpha) || Dir(1, ..., 1)), alpha a list."""
    s, k = sum(alpha), len(alpha)
    value = math.lgamma(s) - math.lgamma(k) - sum(math.lgamma(a) for a in alpha)
    return value + sum((a - 1) * (_digamma(a) - _digamma(s)) for a in alpha)


def _digamma(x):
    """ψ(x) by recurrence and the asymptotic series (x > 0), to ~1e-13."""
    value = 0.0
    while x < 8:
        value -= 1 / x
        x += 1
    inv, inv2 = 1 / x, 1 / (x * x)
    return value + math.log(x) - inv / 2 - inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 / 240)))


def decl(S, negative, tau, margin, hinge_weight, kl_weight, neg, clean, evidence_loss="mse"):
    """DECL's loss (the authors' model/DECL.py: mse_loss, KL, RDH_loss, train_batch) one query at
    a time: ``S`` the raw scores, ``clean[i]`` the division's verdict on pair i (all True in the
    warm-up), ``neg`` the hardest negatives each query sums."""
    n = len(S)

    def counted(i, j, direction):
        a, b = (i, j) if direction == "i2t" else (j, i)
        return a == b or negative[a][b]

    def alpha_row(i, direction):
        """{j: α} of query i over its counted candidates."""
        out = {}
        for j in range(n):
            if counted(i, j, direction):
                s = S[i][j] if direction == "i2t" else S[j][i]
                out[j] = math.exp(math.tanh(s) / tau) + 1
        return out

    total = 0.0
    for direction in ("i2t", "t2i"):
        for i in range(n):
            alpha = alpha_row(i, direction)
            label = {j: 1.0 if j == i and clean[i] else 0.0 for j in alpha}
            s = sum(alpha.values())
            if evidence_loss == "mse":
                fit = sum((label[j] - a / s) ** 2 + a * (s - a) / (s * s * (s + 1)) for j, a in alpha.items())
            elif evidence_loss == "log":
                fit = label[i] * (math.log(s) - math.log(alpha[i]))
            else:
                fit = label[i] * (_digamma(s) - _digamma(alpha[i]))
            wrong = [(a - 1) * (1 - label[j]) + 1 for j, a in alpha.items()]
            total += (fit + kl_weight * _kl_dirichlet_to_uniform(wrong)) / n
    if not hinge_weight or neg == 0:
        return total
    T = [[math.tanh(x) for x in row] for row in S]
    hinge = 0.0
    for i in range(n):
        if not clean[i]:
            continue
        row = [max(0.0, margin - T[i][i] + T[i][j]) if negative[i][j] else 0.0 for j in range(n)]
        col = [max(0.0, margin - T[i][i] + T[j][i]) if negative[j][i] else 0.0 for j in range(n)]
        hinge += (sum(sorted(row, reverse=True)[:neg]) + sum(sorted(col, reverse=True)[:neg])) / neg
    return total + hinge_weight * hinge


def ncr_soft_margin(label, margin, base):
    return margin * (base ** label - 1) / (base - 1)


def ncr_network_loss(S, negative, margins):
    """``joint``: Σ_i [m_i − S_ii + max_j S_ij]_+ + [m_i − S_ii + max_j S_ji]_+ over negatives."""
    n = len(S)
    total = 0.0
    for i in range(n):
        row = [S[i][j] for j in range(n) if negative[i][j]]
        col = [S[j][i] for j in range(n) if negative[j][i]]
        if row:
            total += max(0.0, margins[i] - S[i][i] + max(row))
        if col:
            total += max(0.0, margins[i] - S[i][i] + max(col))
    return total


# NCR's ContrastiveLoss (their model.py), one entry at a time: M_s[i][j], M_im[i][j] are the margins
# of image i's row entry j and of caption j's column entry i; off the negatives an entry is 0.


def ncr_costs(S, negative, M_s, M_im):
    n = len(S)
    c_s = [[max(0.0, M_s[i][j] + S[i][j] - S[i][i]) if negative[i][j] else 0.0 for j in range(n)]
           for i in range(n)]
    c_im = [[max(0.0, M_im[i][j] + S[i][j] - S[j][j]) if negative[i][j] else 0.0 for j in range(n)]
            for i in range(n)]
    return c_s, c_im


def _constant(n, m):
    return [[m] * n for _ in range(n)]


def ncr_warmup(S, negative, margin, summed=False):
    """Mode "warmup": Σ_i mean_j c_s[i][j] + Σ_j mean_i c_im[i][j] (``summed``: the plain sums)."""
    n = len(S)
    c_s, c_im = ncr_costs(S, negative, _constant(n, margin), _constant(n, margin))
    div = 1 if summed else n
    return sum(sum(row) / div for row in c_s) + sum(sum(c_im[i][j] for i in range(n)) / div for j in range(n))


def ncr_eval_loss(S, negative, margin):
    """Mode "eval_loss": pair i's mean row hinge plus its mean column hinge."""
    n = len(S)
    c_s, c_im = ncr_costs(S, negative, _constant(n, margin), _constant(n, margin))
    return [sum(c_s[i]) / n + sum(c_im[j][i] for j in range(n)) / n for i in range(n)]


def ncr_predict(S, negative, margin):
    """SGRAF.predict: margin − (mean row + mean column hinge)/2 in [0, margin], over the mean of the
    n // 10 + 1 largest, in [0, 1]."""
    n = len(S)
    p = [min(margin, max(0.0, margin - v / 2)) for v in ncr_eval_loss(S, negative, margin)]
    top = sorted(p)[-(n // 10 + 1):]
    mean = sum(top) / len(top)
    return [min(1.0, max(0.0, v / mean)) if mean > 0 else 0.0 for v in p]


def ncr_hardest(S, negative, M_s, M_im):
    """Mode "train", hard_negative: Σ_i max_j c_s[i][j] + Σ_j max_i c_im[i][j]."""
    n = len(S)
    c_s, c_im = ncr_costs(S, negative, M_s, M_im)
    return sum(max(row) for row in c_s) + sum(max(c_im[i][j] for i in range(n)) for j in range(n))
