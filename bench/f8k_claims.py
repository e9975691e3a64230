"""The papers' claims, tested over seeds on a seed-grouped results.csv (`make f8k-fast`).

    python bench/f8k_claims.py bench/results/f8k_fast/results.csv > bench/results/f8k_fast/claims.json
    python bench/f8k_claims.py bench/results/f8k_sets/results.csv --claims sets
    python bench/f8k_claims.py bench/results/f8k_vse_infty/results.csv --claims vse_infty
    python bench/f8k_claims.py bench/results/f8k_saf_short/results.csv --claims saf_short
    python bench/f8k_claims.py bench/results/f8k_sgraf_short/results.csv --claims sgraf_short
    python bench/f8k_claims.py bench/results/f8k_sgraf_bf16/results.csv --claims sgraf_bf16
    python bench/f8k_claims.py bench/results/f8k_vsrn_short/results_last.csv --claims vsrn_last

A configuration is named by its loss, or by its run name without the seed (a sweep's grid
point, e.g. ``image=grid-gpo``).

Each claim compares two configurations (rows of one loss, all seeds) on one metric with
Welch's one-sided t-test over the seeds (pipeline.evaluation.stats, docs/PROTOCOL.md "Seeds and
significance"): "holds" when p < 0.05 in the claimed direction, "reversed" when p < 0.05 the
other way, otherwise "inside the seed noise".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core import precision  # noqa: E402
from pipeline.evaluation.stats import ALPHA, mean_std, welch_greater  # noqa: E402
from pipeline.reports.report import read_results, row_precision, seed_groups  # noqa: E402

# (claim, paper, better loss, worse loss, metric, lower is better)
CLAIMS = [
    ("VSE++ (max of hinges) beats VSE0 (sum of hinges)", "VSE++", "mh", "sh", "rsum", False),
    ("VSE++ beats VSE0 on caption R@1", "VSE++", "mh", "sh", "i2t_r1", False),
    ("the ladder loss raises CS@100 over VSE++", "ladder", "ladder", "mh", "i2t_cs@100", False),
    ("the ladder loss raises CS@1000 over VSE++", "ladder", "ladder", "mh", "i2t_cs@1000", False),
    ("... without lowering R@K: ladder rsum >= VSE++ rsum", "ladder", "ladder", "mh", "rsum", False),
    ("LSEH reaches its best in fewer epochs than VSE++", "LSEH", "lseh", "mh", "epochs_to_best", True),
    ("LSEH beats VSE++ on rsum", "LSEH", "lseh", "mh", "rsum", False),
    ("ConVSE++ (cmn) beats ConVSE (csn) on rsum", "ConVSE++", "cmn", "csn", "rsum", False),
    ("ladder orders judged captions more like people than VSE++ (tau)", "human", "ladder", "mh",
     "human_i2t_tau", False),
    ("LSEH orders judged captions more like people than VSE++ (tau)", "human", "lseh", "mh",
     "human_i2t_tau", False),
    ("ladder orders judged captions more like people than VSE0 (tau)", "human", "ladder", "sh",
     "human_i2t_tau", False),
    ("VSE++ orders judged captions more like people than VSE0 (tau)", "human", "mh", "sh",
     "human_i2t_tau", False),
]


# Issue 21: VSE∞'s pooling claim on a 7 × 7 Lite0 grid (experiments/f8k_sets.yaml) ...
SETS_CLAIMS = [
    ("GPO pooling of the grid beats mean pooling (VSE∞)", "VSE∞", "image=grid-gpo", "image=grid-mean",
     "rsum", False),
    ("GPO pooling of the grid beats max pooling (VSE∞)", "VSE∞", "image=grid-gpo", "image=grid-max",
     "rsum", False),
    ("a grid pooled by GPO beats the one pooled vector (1C)", "VSE∞", "image=grid-gpo", "image=1c",
     "rsum", False),
]
# ... and the LSEH paper's on the VSE∞-style model (experiments/f8k_vse_infty.yaml)
VSE_INFTY_CLAIMS = [
    ("LSEH (SVD) beats MH on rsum (LSEH on VSE∞)", "LSEH", "method=lseh-svd", "method=mh", "rsum", False),
    ("LSEH (SVD) reaches its best in fewer epochs than MH", "LSEH", "method=lseh-svd", "method=mh",
     "epochs_to_best", True),
    ("LSEH (bert) beats MH on rsum", "LSEH", "method=lseh-bert", "method=mh", "rsum", False),
    ("LSEH with SVD beats LSEH with bert relevance (LSEH §4.7)", "LSEH", "method=lseh-svd",
     "method=lseh-bert", "rsum", False),
    ("LSEH (SVD) orders judged captions more like people than MH (tau)", "human", "method=lseh-svd",
     "method=mh", "human_i2t_tau", False),
]
# Issue 31: training on noisy pairs, the fast loop (experiments/f8k_noisy.yaml) ...
NOISE_SETTINGS = ("caption20", "image20", "caption50", "image50")
NOISY_CLAIMS = [
    *((f"{method} beats mh under {noise} noise", method.upper(), f"noise={noise},method={method}",
       f"noise={noise},method=mh", "rsum", False)
      for noise in NOISE_SETTINGS for method in ("rcl", "decl", "ncr")),
    *((f"{method} beats mh without noise", method.upper(), f"noise=clean,method={method}",
       "noise=clean,method=mh", "rsum", False) for method in ("rcl", "decl", "ncr")),
    *((f"siglip beats infonce at batch 128 under {noise} noise", "SigLIP", f"noise={noise},method=siglip",
       f"noise={noise},method=infonce", "rsum", False) for noise in NOISE_SETTINGS),
]
# ... and on SGR at 20% image-level noise (experiments/f8k_noisy_sgr.yaml)
NOISY_SGR_CLAIMS = [
    ("rcl beats mh on SGR under image20 noise", "RCL", "method=rcl", "method=mh", "rsum", False),
    ("ncr beats mh on SGR under image20 noise", "NCR", "method=ncr", "method=mh", "rsum", False),
]
# Issue 28: the LSEH paper's claim on SAF, SGR, their SGRAF average and VSRN, one epoch
# (experiments/f8k_{saf,sgr,vsrn}_short.yaml). ``label``: a configuration's name, {0} = the method;
# ``schedule``: how long they trained, in the claim's words.
def _lseh_on(network: str, label: str = "method={0}", schedule: str = "one epoch") -> list:
    lseh, mh = label.format("lseh-svd"), label.format("mh")
    return [
        (f"LSEH (SVD) beats MH on {network} (rsum), {schedule}", "LSEH", lseh, mh, "rsum", False),
        (f"LSEH (SVD) beats MH on {network} (caption R@1), {schedule}", "LSEH", lseh, mh, "i2t_r1", False),
        (f"LSEH (SVD) orders judged captions more like people than MH on {network} (tau), {schedule}",
         "human", lseh, mh, "human_i2t_tau", False),
        (f"LSEH (SVD) has the higher caption mAP@R (human) on {network}, {schedule}", "human", lseh, mh,
         "human_i2t_map@r", False),
    ]


def _lseh_on_sgraf(sgr: str, saf: str, schedule: str = "one epoch") -> list:
    """The claims on SGR, SAF and their average, from `vse evaluate --runs 'SGR/*' --average-with-runs
    SAF`'s rows (``SGR/method=M,seed=S``, ``SAF/...`` and ``A + B``)."""
    return [*_lseh_on("SGR", f"{sgr}/method={{0}}", schedule),
            *_lseh_on("SAF", f"{saf}/method={{0}}", schedule),
            *_lseh_on("SGRAF (SGR and SAF scores averaged)", f"{sgr}/method={{0}} + {saf}/method={{0}}",
                      schedule)]


CLAIM_SETS = {"fast": CLAIMS, "saf_short": _lseh_on("SAF"),
              "vsrn_short": [*_lseh_on("VSRN"),
                             *_lseh_on("VSRN", "method={0}-warm", "two epochs, the first warmed up")],
              # the same runs' last.pt (results_last.csv): the hardest-negative epoch, not the best one
              "vsrn_last": _lseh_on("VSRN", "method={0}-warm", "two epochs, the first warmed up, last.pt"),
              "sgraf_short": _lseh_on_sgraf("sgr_short", "saf_short"),
              # issue 43: the same claims after two epochs under CPU bf16 (experiments/f8k_sgraf_bf16.yaml)
              "sgraf_bf16": _lseh_on_sgraf("sgraf_bf16_sgr", "sgraf_bf16_saf", "two epochs"),
              # issue 53, item 2: the end-of-training table, each precision (precision_sgraf.yaml)
              **{f"precision_sgraf_{p}": _lseh_on_sgraf(f"sgr_{p}", f"saf_{p}", f"three epochs, {p}")
                 for p in ("fp32", "bf16")},
              "sets": SETS_CLAIMS, "vse_infty": VSE_INFTY_CLAIMS, "noisy": NOISY_CLAIMS,
              "noisy_sgr": NOISY_SGR_CLAIMS}


def _peaked_last(row: dict) -> bool:
    """True when a run's best epoch is its last one, so it might have gone on improving."""
    try:
        return int(float(row["epochs_to_best"])) >= int(float(row["epochs"]))
    except (KeyError, TypeError, ValueError):
        return False


def claim_groups(rows) -> dict:
    """Each configuration of ``rows`` (a results table's rows, over seeds) by the names a claim may
    give it: its loss (the first configuration of that loss) and its label (the run name without
    the seed)."""
    groups = {}
    for g in seed_groups(rows):
        groups.setdefault(g.rows[0].get("loss"), g)
        groups[g.label] = g
    return groups


def verdicts(groups: dict, claims) -> list[dict]:
    """The verdict of each claim of ``claims`` ((claim, paper, better, worse, metric, lower is
    better), as in CLAIM_SETS) on ``groups`` (``claim_groups``: configuration name → SeedGroup)."""
    out = []
    for claim, paper, better, worse, metric, lower in claims:
        if better not in groups or worse not in groups or metric not in groups[better].samples:
            out.append({"claim": claim, "verdict": "not measured"})
            continue
        labels = {name: row_precision(groups[name].rows[0]) for name in (better, worse)}
        if line := precision.mixed(labels):  # two precisions are two methods (core/precision)
            out.append({"claim": claim, "verdict": f"not compared: {line}"})
            continue
        a, b = groups[better].samples[metric], groups[worse].samples[metric]
        if min(len(a), len(b)) < 2:
            out.append({"claim": claim, "verdict": f"not testable: {len(a)} and {len(b)} seeds (one seed is "
                                                   "an anecdote)"})
            continue
        sign = -1.0 if lower else 1.0
        p_claimed = welch_greater([sign * v for v in a], [sign * v for v in b])
        p_reverse = welch_greater([sign * v for v in b], [sign * v for v in a])
        verdict = ("holds" if p_claimed < ALPHA else "reversed" if p_reverse < ALPHA
                   else "inside the seed noise")
        if metric == "epochs_to_best" and all(_peaked_last(r) for g in (better, worse)
                                              for r in groups[g].rows):
            verdict = "not measurable: every run was best at its last epoch (still improving)"
        (ma, sa, na), (mb, sb, nb) = mean_std(a), mean_std(b)
        out.append({"claim": claim, "paper": paper, "metric": metric,
                    better: {"mean": ma, "std": sa, "n": na}, worse: {"mean": mb, "std": sb, "n": nb},
                    "p_claimed": p_claimed, "p_reverse": p_reverse, "verdict": verdict,
                    **({"precision": labels[better]} if labels[better] != precision.UNRECORDED else {})})
    return out


def main(path: str, claims: str = "fast") -> dict:
    out = verdicts(claim_groups(read_results(path)), CLAIM_SETS[claims])
    return {"results": path, "test": f"Welch one-sided over seeds, alpha {ALPHA}", "claims": out}


def same_ranking(fast_path: str, sgr_path: str, noise: str = "image20", methods=("mh", "rcl", "ncr")) -> dict:
    """Do the methods rank alike on the fast loop and on SGR (rsum)? For every pair of methods,
    its order on each network and whether Welch's test separates it there (an order inside the
    seed noise is no evidence either way)."""
    def groups(path, label):
        return {g.label: g for g in seed_groups(read_results(path)) if g.label in
                {label.format(m) for m in methods}}

    labels = {"fast": f"noise={noise},method={{}}", "sgr": "method={}"}
    tables = {"fast": groups(fast_path, labels["fast"]), "sgr": groups(sgr_path, labels["sgr"])}
    pairs = []
    for i, a in enumerate(methods):
        for b in methods[i + 1:]:
            entry = {"pair": f"{a} vs {b}"}
            for name, table in tables.items():
                ga, gb = table.get(labels[name].format(a)), table.get(labels[name].format(b))
                if ga is None or gb is None:
                    entry[name] = "not measured"
                    continue
                sa, sb = ga.samples["rsum"], gb.samples["rsum"]
                p = min(welch_greater(sa, sb), welch_greater(sb, sa))
                entry[name] = {"order": f"{a} > {b}" if mean_std(sa)[0] > mean_std(sb)[0] else f"{b} > {a}",
                               "p": p, "separated": p < ALPHA}
            pairs.append(entry)
    measured = [e for e in pairs if isinstance(e.get("fast"), dict) and isinstance(e.get("sgr"), dict)]
    both = [e for e in measured if e["fast"]["separated"] and e["sgr"]["separated"]]
    verdict = ("not measured" if not measured else "inside the seed noise" if not both else
               "holds" if all(e["fast"]["order"] == e["sgr"]["order"] for e in both) else "reversed")
    return {"claim": f"the ranking of {', '.join(methods)} is the same on the fast loop and on SGR ({noise})",
            "pairs": pairs, "verdict": verdict,
            "rule": "holds/reversed over the pairs Welch separates (p < 0.05) on both networks"}


def epoch_times(path: str) -> dict:
    """Seconds per epoch of each configuration (mean over seeds), from its runs' validation times
    (metrics.jsonl: the time of each epoch-end validation; an epoch includes its validation and,
    for a dividing method, its pass over the training pairs), and the ratio to mh's."""
    import numpy as np

    out = {}
    for g in seed_groups(read_results(path)):
        per_run = []
        for row in g.rows:
            log = Path(row["checkpoint"]).parent / "metrics.jsonl"
            times = [json.loads(line)["time"] for line in log.read_text().splitlines()]
            if len(times) > 1:
                per_run.append((times[-1] - times[0]) / (len(times) - 1))
        out[g.label] = float(np.mean(per_run)) if per_run else None
    ratios = {}
    for label, seconds in out.items():
        mh = out.get(label.rsplit("method=", 1)[0] + "method=mh")
        ratios[label] = {"s_per_epoch": seconds, "vs_mh": seconds / mh if seconds and mh else None}
    return ratios


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="bench/results/f8k_fast/results.csv")
    parser.add_argument("--claims", choices=sorted(CLAIM_SETS), default="fast")
    parser.add_argument("--ranking-with", metavar="SGR_RESULTS", help="noisy: also compare the ranking of "
                        "mh, rcl, ncr with this SGR results.csv (image20)")
    parser.add_argument("--epoch-times", action="store_true", help="add each configuration's s/epoch vs mh")
    args = parser.parse_args()
    result = main(args.results, args.claims)
    if args.ranking_with:
        result["ranking"] = same_ranking(args.results, args.ranking_with)
    if args.epoch_times:
        result["epoch_times"] = epoch_times(args.results)
    print(json.dumps(result, indent=1))
