"""RCL's, DECL's and NCR's formulas written one query at a time in plain Python (math on floats),
from the papers' equations: a reference for the batched ``pipeline.models.noisy_losses``. It is
NOT the authors' code (XLearning-SCU/2023-TPAMI-RCL, QinYang79/DECL, XLearning-SCU/2021-NeurIPS-NCR
were not reachable from this machine; docs/PROTOCOL.md, "Differences from the authors' code
(noisy correspondence)"). ``S`` is a list of rows, ``negative[i][j]`` says whether (i, j) counts
as a negative.
"""

from __future__ import annotations

import math


def rcl(S, negative, tau, variant="log", q=0.5):
    n = len(S)
    total = 0.0
    for direction in ("i2t", "t2i"):
        per_query = []
        for i in range(n):
            row = [S[i][j] if direction == "i2t" else S[j][i] for j in range(n)]
            neg = [negative[i][j] if direction == "i2t" else negative[j][i] for j in range(n)]
            candidates = [j for j in range(n) if j == i or neg[j]]
            z = sum(math.exp(row[j] / tau) for j in candidates)
            p = {j: math.exp(row[j] / tau) / z for j in candidates}
            if variant == "infonce":
                per_query.append(-math.log(p[i]))
                continue
            cost = 0.0
            for j in candidates:
                if j == i:
                    continue
                if variant == "log":
                    cost += -math.log(max(1 - p[j], 1e-10))
                elif variant == "gce":
                    cost += (1 - (1 - p[j]) ** q) / q
                elif variant == "abs":
                    cost += p[j]
                elif variant == "exp":
                    cost += math.exp(p[j]) - 1
                else:
                    cost += math.tan(p[j] * math.pi / 2)
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


def decl(S, negative, tau, margin, epoch, anneal_epochs, warmup_epochs, decay, evidence_loss="log",
         hinge_weight=1.0):
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

    weight = min(1.0, epoch / anneal_epochs)
    total = 0.0
    for direction in ("i2t", "t2i"):
        terms = []
        for i in range(n):
            alpha = alpha_row(i, direction)
            s = sum(alpha.values())
            if evidence_loss == "log":
                fit = math.log(s) - math.log(alpha[i])
            else:
                fit = _digamma(s) - _digamma(alpha[i])
            if weight:
                wrong = [1.0 if j == i else a for j, a in alpha.items()]
                fit += weight * _kl_dirichlet_to_uniform(wrong)
            terms.append(fit)
        total += sum(terms) / n
    if not hinge_weight:
        return total
    u = []
    for i in range(n):
        a_i2t, a_t2i = alpha_row(i, "i2t"), alpha_row(i, "t2i")
        u.append((len(a_i2t) / sum(a_i2t.values()) + len(a_t2i) / sum(a_t2i.values())) / 2)
    clean = [True] * n if epoch < warmup_epochs else [ui < sum(u) / n for ui in u]
    k = max(1, math.floor((n - 1) * decay ** epoch))
    hinge = 0.0
    for direction in ("i2t", "t2i"):
        per_query = []
        for i in range(n):
            costs = []
            for j in range(n):
                a, b = (i, j) if direction == "i2t" else (j, i)
                if negative[a][b]:
                    costs.append(max(0.0, margin - S[i][i] + S[a][b]))
                else:
                    costs.append(0.0)
            per_query.append(sum(sorted(costs, reverse=True)[:k]) if clean[i] else 0.0)
        hinge += sum(per_query) / n
    return total + hinge_weight * hinge


def ncr_soft_margin(label, margin, base):
    return margin * (base ** label - 1) / (base - 1)


def ncr_network_loss(S, negative, margins):
    """Σ_i [m_i − S_ii + max_j S_ij]_+ + [m_i − S_ii + max_j S_ji]_+ over negatives."""
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
