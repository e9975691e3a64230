"""The numerical differences from the authors' code that docs/PROTOCOL.md states with an effect size,
each measured over sizes and distributions: the library's function against the authors' form
(their dtype, their random state, their formula), on the CPU. Writes, per difference, the grid and
its worst case (value, size, distribution) to bench/results/protocol_differences.json.

    taskset -c 0 env OMP_NUM_THREADS=1 .venv/bin/python experiments/protocol_differences.py   # ~2 min
    ... experiments/protocol_differences.py --tiny --out /tmp/pd.json   # seconds (the test's grid)

Measured: NCR's GMM on float64 losses (theirs float32) and its random state (theirs numpy's global
state), with the clean set's seed noise from bench/results/f8k_noisy beside them; RCL's 1 − p;
DECL's logit read-back of a sigmoid score; VSE∞'s L2 norm eps, GPO's packed weight table (and the
golden bundle's largest difference); the float16 set cache; VSRN's PyTorch 0.4.1 Adam eps; Adam's
fused kernel. Left out (no data-free measurement): DECL's cache-order division pass (a training
measurement, in PROTOCOL), the golden tolerances of SGRAF and VSRN (their code, one size).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.data.cache import SET_DTYPE
from pipeline.losses.base import build_loss
from pipeline.losses.noisy.ncr import divide, split_prob
from pipeline.networks.heads import GPO, from_vse_infty, rank_encoding
from pipeline.networks.layers import l2_normalize

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "protocol_differences.json"
NOISY = ROOT / "bench" / "results" / "f8k_noisy" / "results.csv"
F8K_TRAIN = 30_000  # Flickr8k's training captions: the pairs NCR divides


def ncr_losses(dist: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n per-pair losses (≥ 0, float32 as a network gives them), 80 % clean and 20 % noisy."""
    c = int(0.8 * n)
    if dist == "overlapping gamma":
        x = np.concatenate([rng.gamma(2, 0.05, c), rng.gamma(4, 0.05, n - c)])
    elif dist == "separated gamma":
        x = np.concatenate([rng.gamma(2, 0.02, c), rng.gamma(40, 0.02, n - c)])
    elif dist == "skewed lognormal":
        x = np.concatenate([rng.lognormal(-3, 1, c), rng.lognormal(-2, 0.5, n - c)])
    elif dist == "heavy tail":
        x = np.concatenate([rng.gamma(2, 0.05, c), 0.1 * np.abs(rng.standard_cauchy(n - c))])
    elif dist == "near uniform":
        x = rng.uniform(0, 1, n) + rng.normal(0, 1e-3, n)
    elif dist in ("ties: 30 % zeros", "ties: 1e-3 grid"):  # zeros: pairs with no violated hinge
        x = np.concatenate([rng.gamma(2, 0.05, c), rng.gamma(4, 0.05, n - c)])
        x = np.where(rng.random(n) < 0.3, 0.0, x) if "zeros" in dist else np.round(x, 3)
    else:
        raise ValueError(dist)
    return rng.permutation(x).astype(np.float32)


LOSS_DISTS = ("overlapping gamma", "separated gamma", "skewed lognormal", "heavy tail", "near uniform",
              "ties: 30 % zeros", "ties: 1e-3 grid")


def their_gmm(losses32: np.ndarray, state: np.random.RandomState) -> np.ndarray:
    """Their eval_train: a float32 torch buffer, min-max normalised in float32, the GMM fitted on
    that float32 array (scikit-learn keeps float32), the lower-mean component's posterior."""
    import warnings

    from sklearn.mixture import GaussianMixture
    x = torch.from_numpy(losses32)
    x = ((x - x.min()) / (x.max() - x.min())).reshape(-1, 1).numpy()
    gmm = GaussianMixture(n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4, random_state=state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gmm.fit(x)
        return gmm.predict_proba(x)[:, gmm.means_.argmin()]


def our_state(seed: int, epoch: int = 1, k: int = 0) -> np.random.RandomState:
    """The library's GMM state (NoisyCorrespondenceLoss.begin_epoch): from (seed, epoch, network)."""
    return np.random.RandomState(int(np.random.SeedSequence([seed, epoch, k]).generate_state(1)[0]))


def measure_ncr(sizes, draws: int, states: int) -> tuple[list, list]:
    dtype_rows, state_rows = [], []
    for n, dist in itertools.product(sizes, LOSS_DISTS):
        dw, flips = 0.0, 0
        for d in range(draws):
            losses = ncr_losses(dist, n, np.random.default_rng([n, d]))
            w_ours, clean_ours = divide(losses, 0.5, our_state(d))
            w_theirs = their_gmm(losses, our_state(d))
            dw = max(dw, float(np.abs(w_ours - w_theirs).max()))
            flips = max(flips, int((clean_ours != split_prob(w_theirs, 0.5)).sum()))
        dtype_rows.append({"n": n, "distribution": dist, "max_abs_dw": dw, "flips": flips,
                           "flip_share": flips / n})
        losses = ncr_losses(dist, n, np.random.default_rng([n, 0]))
        w0, clean0 = divide(losses, 0.5, our_state(0))
        dw, share = 0.0, 0.0
        for s in range(1, states + 1):  # another (seed, epoch) of ours, or their global state
            w1, clean1 = divide(losses, 0.5, our_state(s, epoch=1 + s))
            dw, share = max(dw, float(np.abs(w0 - w1).max())), max(share, float((clean0 != clean1).mean()))
        state_rows.append({"n": n, "distribution": dist, "max_abs_dw": dw, "flip_share": share,
                           "clean_share": float(clean0.mean())})
    return dtype_rows, state_rows


def ncr_seed_noise() -> list:
    """Per noisy configuration of bench/results/f8k_noisy's ncr rows: the rsum's spread over seeds,
    and a lower bound on the share of the 30,000 verdicts that differ between two seeds' final
    divisions: |Δ true clean judged clean| + |Δ noisy judged clean| (disjoint pairs), from each
    run's division precision and recall; the smallest over the seed pairs."""
    rows = [r for r in csv.DictReader(NOISY.open()) if r["loss"] == "ncr" and r["division_recall"]]
    out = []
    for config in sorted({r["config_id"] for r in rows}):
        runs = [r for r in rows if r["config_id"] == config]
        noisy = float(runs[0]["noise_true_rate"])
        tp = [float(r["division_recall"]) * (1 - noisy) * F8K_TRAIN for r in runs]
        fp = [t / float(r["division_precision"]) - t for t, r in zip(tp, runs, strict=True)]
        pairs = itertools.combinations(range(len(runs)), 2)
        bound = min(abs(tp[a] - tp[b]) + abs(fp[a] - fp[b]) for a, b in pairs)
        rsum = [float(r["rsum"]) for r in runs]
        out.append({"configuration": runs[0]["run"].rsplit(",seed=", 1)[0], "seeds": len(runs),
                    "rsum_std": float(np.std(rsum, ddof=1)),
                    "verdicts_differing_at_least": bound / F8K_TRAIN})
    return out


def rcl_theirs(scores: torch.Tensor, tau=0.05, eps=1e-10) -> torch.Tensor:
    """Their CCL, method log, ratio off: exp, the softmax with + eps, then log(1 − p + eps)."""
    e = (scores / tau).exp()
    mask = 1 - torch.eye(len(scores), dtype=scores.dtype)
    def crit(x):
        return -((1.0 - x + eps).log() * mask).sum(1).mean()
    return crit(e / (e.sum(1, keepdim=True) + eps)) + crit(e.t() / (e.t().sum(1, keepdim=True) + eps))


def rcl_scores(dist: str, b: int, g: torch.Generator) -> torch.Tensor:
    s = torch.rand(b, b, generator=g, dtype=torch.float64) * 0.7 - 0.1  # cosine-like
    if dist == "positive ahead":
        s += 0.3 * torch.eye(b, dtype=torch.float64)
    elif dist.startswith("dominant negative"):  # one negative per row ahead of the rest by gap
        gap = float(dist.split()[-1])
        s = 0.9 - gap - 0.2 * torch.rand(b, b, generator=g, dtype=torch.float64)
        s[torch.arange(b), (torch.arange(b) + 1) % b] = 0.9
    return s


def measure_rcl(sizes) -> list:
    rows, g = [], torch.Generator().manual_seed(0)
    loss = build_loss("rcl")
    dists = ["cosine", "positive ahead"] + [f"dominant negative, gap {x}" for x in (0.3, 0.5, 0.7, 0.9, 1.2)]
    for b, dist in itertools.product(sizes, dists):
        s = rcl_scores(dist, b, g)
        ids = torch.arange(b)
        p = torch.softmax(s / 0.05, 1).masked_fill(torch.eye(b, dtype=torch.bool), 0)
        exact = loss.scored(s, image_ids=ids).item()  # ours in float64: the reference
        row = {"n": b, "distribution": dist, "smallest_1_minus_p": float((1 - p.max()).item()),
               "rel_diff_float64": abs(rcl_theirs(s).item() - exact) / exact}
        s32 = s.float()
        row["ours_rel_error_float32"] = abs(loss.scored(s32, image_ids=ids).item() - exact) / exact
        row["theirs_rel_error_float32"] = abs(rcl_theirs(s32).item() - exact) / exact
        rows.append(row)
    return rows


def measure_decl(sizes) -> list:
    """score_is_sigmoid: σ(raw) read back as logit(S, eps=1e-7) (the library's decl.raw) before tanh."""
    loss, rows = build_loss("decl", batch_size=128, score_is_sigmoid=True), []
    for n, scale, dtype in itertools.product(sizes, (1, 4, 10, 20), (torch.float32, torch.float64)):
        raw = torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64) * scale
        raw = raw.to(dtype)
        raw.requires_grad_(True)
        ours = torch.tanh(loss.raw(torch.sigmoid(raw)))
        (g_ours,) = torch.autograd.grad(ours.sum(), raw)
        theirs = torch.tanh(raw)
        (g_theirs,) = torch.autograd.grad(theirs.sum(), raw)
        dt = float((ours - theirs).detach().abs().max())
        rows.append({"n": n, "distribution": f"raw ~ N(0, {scale}^2), {str(dtype)[6:]}", "max_abs_dtanh": dt,
                     "evidence_rel_diff": math.expm1(dt / loss.tau),
                     "max_abs_dgrad": float((g_ours - g_theirs).abs().max())})
    return rows


def measure_l2(sizes) -> list:
    rows, g = [], torch.Generator().manual_seed(0)
    for n, norm in itertools.product(sizes, (1e-7, 1e-5, 1e-3, 1e-1, 1.0, 30.0)):
        x = torch.randn(n, 1024, generator=g)
        x = x / x.norm(dim=1, keepdim=True) * norm * torch.exp(torch.randn(n, 1, generator=g) * 0.3)
        theirs = x / (x.norm(dim=1, keepdim=True) + 1e-8)
        rel = ((l2_normalize(x) - theirs).norm(dim=1) / theirs.norm(dim=1)).max()
        rows.append({"n": n, "distribution": f"float32, norm ~ {norm:g}", "max_rel_diff": float(rel)})
    return rows


def gpo_theirs(gpo: GPO, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """VSE∞'s GPO.forward (master 29df9d6): the GRU over the batch's sets packed by their lengths,
    scores of padding -10000, features cut to the longest set and filled with -10000 to sort."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    b, m = len(lengths), int(lengths.max())
    mask = (torch.arange(m).expand(b, m) < lengths[:, None]).unsqueeze(-1)
    pes = rank_encoding(gpo.d_pe, m).unsqueeze(0).repeat(b, 1, 1).masked_fill(~mask, 0)
    out, _ = gpo.gru(pack_padded_sequence(pes, lengths, batch_first=True, enforce_sorted=False))
    out, _ = pad_packed_sequence(out, batch_first=True)
    scores = gpo.linear((out[:, :, :gpo.d_hidden] + out[:, :, gpo.d_hidden:]) / 2)
    scores[~mask] = -10000
    weights = torch.softmax(scores / 0.1, 1)
    f = x[:, :m, :].masked_fill(~mask, -10000).sort(dim=1, descending=True)[0].masked_fill(~mask, 0)
    return (f * weights).sum(1), weights.squeeze(-1)


def measure_gpo(batches, ks) -> tuple[list, dict]:
    rows = []
    torch.manual_seed(0)
    gpo = GPO()
    with torch.no_grad():
        for p in gpo.parameters():  # away from the init, as the golden bundles
            p.add_(torch.randn_like(p) * 0.5)
        dists = ("normal", "relu (ties at 0)", "lognormal", "student t2")
        for b, k, dist in itertools.product(batches, ks, dists):
            g = torch.Generator().manual_seed(b * 1000 + k)
            x = torch.randn(b, k, 1024, generator=g)
            x = {"normal": x, "relu (ties at 0)": x.clamp(min=0), "lognormal": x.exp(),
                 "student t2": x / torch.sqrt(torch.distributions.Chi2(2.0).sample((b, k, 1)) / 2)}[dist]
            lengths = torch.randint(1, k + 1, (b,), generator=g)
            lengths[0] = k
            pooled, weights = gpo.pool_with_weights(x, lengths)
            t_pooled, t_weights = gpo_theirs(gpo, x, lengths)
            scale = float(t_pooled.abs().max())
            rows.append({"n": b, "K": k, "distribution": dist,
                         "max_abs_dweights": float((weights - t_weights).abs().max()),
                         "max_rel_dpooled": float((pooled - t_pooled).abs().max()) / scale})
    bundle = np.load(ROOT / "tests" / "golden" / "vse_infty_gpo.npz")
    golden = GPO()
    golden.load_state_dict(from_vse_infty({k.split(":", 1)[1]: torch.from_numpy(np.array(bundle[k]))
                                           for k in bundle.files if k.startswith("state:")}))
    with torch.no_grad():
        x, lengths = torch.from_numpy(bundle["x"]), torch.from_numpy(bundle["lengths"])
        pooled, weights = golden.pool_with_weights(x, lengths)
    m = bundle["weights"].shape[1]
    return rows, {"max_abs_dpooled": float(np.abs(pooled.numpy() - bundle["pooled"]).max()),
                  "max_abs_dweights": float(np.abs(weights[:, :m].numpy() - bundle["weights"]).max())}


def measure_float16(sizes) -> list:
    rows, rng = [], np.random.default_rng(0)
    dists = {"relu6 map (Lite0-like)": lambda n: np.clip(rng.normal(0, 1.5, n), 0, 6),
             "lognormal, sigma 3": lambda n: rng.lognormal(-2, 3, n),
             "normal, sigma 1e3": lambda n: rng.normal(0, 1e3, n)}
    for n, (dist, draw) in itertools.product(sizes, dists.items()):
        x = draw(n).astype(np.float32)
        with np.errstate(all="ignore"):  # values above 65504 overflow to inf (counted)
            y = x.astype(SET_DTYPE).astype(np.float32)
            rel = np.abs(y - x) / np.abs(x)
        tiny = np.abs(x) < 2.0 ** -14  # below float16's normal range: subnormal or 0
        normal = ~tiny & (np.abs(x) <= 65504)
        rows.append({"n": n, "distribution": dist,
                     "max_rel_error_normal_range": float(rel[normal].max(initial=0)),
                     "max_rel_error_below_2^-14": float(rel[tiny & (x != 0)].max(initial=0)),
                     "max_abs_error_below_2^-14": float(np.abs(y - x)[tiny].max(initial=0)),
                     "share_below_2^-14": float((tiny & (x != 0)).mean()),
                     "overflow_to_inf": int(np.isinf(y).sum())})
    return rows


def adam041_step(p, g, m, v, t, lr=2e-4, b1=0.9, b2=0.999, eps=1e-8):
    """PyTorch 0.4.1's Adam: eps added to √v before the bias correction (VSRN's PyTorch)."""
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    step = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    p.addcdiv_(m, v.sqrt().add_(eps), value=-step)


def run_adam(n, steps, scale, kernel):
    """max |Δw| between two Adams fed the same gradients, relative to the largest displacement."""
    g = torch.Generator().manual_seed(n + steps)
    w0 = torch.randn(n, generator=g)
    a, b = w0.clone().requires_grad_(True), w0.clone()
    opt = torch.optim.Adam([a], lr=2e-4, **({"fused": True} if kernel == "fused" else {"foreach": False}))
    ref = torch.optim.Adam([b.requires_grad_(True)], lr=2e-4, foreach=False) if kernel == "fused" else None
    m, v = torch.zeros(n), torch.zeros(n)
    for t in range(1, steps + 1):
        grad = torch.randn(n, generator=g) * scale
        a.grad = grad.clone()
        opt.step()
        if ref is not None:
            b.grad = grad.clone()
            ref.step()
        else:
            with torch.no_grad():
                adam041_step(b, grad, m, v, t)
    with torch.no_grad():
        return float((a - b).abs().max() / (a - w0).abs().max()), float((a - b).abs().max())


def measure_adam(sizes, steps_list) -> tuple[list, list]:
    eps_rows, kernel_rows = [], []
    for n, steps in itertools.product(sizes, steps_list):
        for scale in (1e-9, 1e-8, 1e-7, 1e-6, 1e-4, 1e-2):
            rel, _ = run_adam(n, steps, scale, "0.4.1")
            eps_rows.append({"n": n, "steps": steps, "distribution": f"gradients ~ N(0, {scale:g}^2)",
                             "max_rel_dupdate": rel})
        for scale in (1e-6, 1e-3, 1.0):
            rel, absolute = run_adam(n, steps, scale, "fused")
            kernel_rows.append({"n": n, "steps": steps, "distribution": f"gradients ~ N(0, {scale:g}^2)",
                                "max_rel_dweights": rel, "max_abs_dweights": absolute})
    return eps_rows, kernel_rows


def worst(rows: list, key: str) -> dict:
    row = max(rows, key=lambda r: r[key])
    return {"value": row[key], "size": row["n"], "distribution": row["distribution"],
            **{k: row[k] for k in ("K", "steps", "smallest_1_minus_p") if k in row}}


def stated(value: float) -> str:
    """A worst case as PROTOCOL writes it: two significant digits (1.5e-9, 0.015, 3.0)."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}" if abs(value) < 1e-3 else f"{value:#.2g}"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the smallest grid, in seconds (the test's)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.time()
    if args.tiny:
        sizes, draws, states, small, adam_sizes, steps = (500,), 1, 2, (8,), (1000,), (1, 8)
        batches, ks = (4,), (8,)
    else:
        sizes, draws, states, small = (500, 2000, 10_000, 30_000, 100_000), 3, 8, (8, 32, 128)
        adam_sizes, steps = (1000, 100_000), (1, 8, 100, 1000)
        batches, ks = (4, 32, 128), (8, 36, 49, 100)
    dtype_rows, state_rows = measure_ncr(sizes, draws, states)
    seed = ncr_seed_noise()
    rcl = measure_rcl(small)
    gpo_rows, gpo_bundle = measure_gpo(batches, ks)
    eps_rows, kernel_rows = measure_adam(adam_sizes, steps)
    f16 = measure_float16([s * 10 for s in sizes])
    decl = measure_decl([s * 10 for s in sizes])
    l2 = measure_l2(small)
    out = {"grid": "tiny" if args.tiny else "full", "seconds": None, "torch": torch.__version__}
    out["differences"] = {
        "ncr_gmm_dtype": {"protocol": "ncr (2)", "ours": "divide(): float64 losses",
                          "theirs": "float32 buffer and GMM",
                          "draws_per_cell": draws, "worst": worst(dtype_rows, "max_abs_dw"),
                          "worst_flips": worst(dtype_rows, "flip_share"), "grid": dtype_rows,
                          "cells_flipping_more_than_another_state": [
                              [a["n"], a["distribution"]] for a, b in zip(dtype_rows, state_rows, strict=True)
                              if a["flip_share"] > b["flip_share"]]},
        "ncr_gmm_random_state": {"protocol": "ncr (1)", "ours": "RandomState of (seed, epoch, network)",
                                 "theirs": "numpy's global state", "other_states": states,
                                 "worst": worst(state_rows, "flip_share"),
                                 "worst_dw": worst(state_rows, "max_abs_dw"), "grid": state_rows},
        "ncr_seed_noise": {"protocol": "reference", "source": str(NOISY.relative_to(ROOT)),
                           "smallest": min(r["verdicts_differing_at_least"] for r in seed), "grid": seed},
        "rcl_one_minus_p": {"protocol": "rcl (2)", "tau": 0.05, "eps": 1e-10,
                            "worst": worst(rcl, "rel_diff_float64"),
                            "worst_where_1_minus_p_above_1e-6": worst(
                                [r for r in rcl if r["smallest_1_minus_p"] > 1e-6] or rcl,
                                "rel_diff_float64"),
                            "worst_theirs_float32": worst(rcl, "theirs_rel_error_float32"),
                            "worst_ours_float32": worst(rcl, "ours_rel_error_float32"), "grid": rcl},
        "decl_logit_readback": {"protocol": "decl (3)", "worst": worst(decl, "max_abs_dtanh"),
                                "worst_grad": worst(decl, "max_abs_dgrad"), "grid": decl},
        "vse_infty_l2_eps": {"protocol": "VSE∞ L2 norm", "worst": worst(l2, "max_rel_diff"), "grid": l2},
        "vse_infty_gpo_table": {"protocol": "VSE∞ GPO weights", "worst": worst(gpo_rows, "max_rel_dpooled"),
                                "worst_weights": worst(gpo_rows, "max_abs_dweights"),
                                "golden_bundle": gpo_bundle,
                                "grid": gpo_rows},
        "float16_sets": {"protocol": "VSE∞ features of CNN grids",
                         "worst": worst(f16, "max_rel_error_normal_range"),
                         "worst_below_2^-14": worst(f16, "max_rel_error_below_2^-14"), "grid": f16},
        "vsrn_adam_eps_041": {"protocol": "VSRN Adam", "worst": worst(eps_rows, "max_rel_dupdate"),
                              "grid": eps_rows},
        "adam_kernel": {"protocol": "Adam's kernel", "worst": worst(kernel_rows, "max_abs_dweights"),
                        "worst_rel": worst(kernel_rows, "max_rel_dweights"), "grid": kernel_rows}}
    out["seconds"] = round(time.time() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for name, d in out["differences"].items():
        print(f"{name:24s}", {k: v for k, v in d.items() if k.startswith(("worst", "smallest", "golden"))})
    print(f"{out['seconds']} s -> {args.out}")
    return out


if __name__ == "__main__":
    main()
