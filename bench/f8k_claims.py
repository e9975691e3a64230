"""The papers' claims, tested over seeds on a seed-grouped results.csv (`make f8k-fast`).

    python bench/f8k_claims.py bench/results/f8k_fast/results.csv > bench/results/f8k_fast/claims.json
    python bench/f8k_claims.py bench/results/f8k_sets/results.csv --claims sets
    python bench/f8k_claims.py bench/results/f8k_vse_infty/results.csv --claims vse_infty

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

from pipeline.evaluation.stats import ALPHA, mean_std, welch_greater  # noqa: E402
from pipeline.reports.report import read_results, seed_groups  # noqa: E402

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
CLAIM_SETS = {"fast": CLAIMS, "sets": SETS_CLAIMS, "vse_infty": VSE_INFTY_CLAIMS}


def _peaked_last(row: dict) -> bool:
    """True when a run's best epoch is its last one, so it might have gone on improving."""
    try:
        return int(float(row["epochs_to_best"])) >= int(float(row["epochs"]))
    except (KeyError, TypeError, ValueError):
        return False


def main(path: str, claims: str = "fast") -> dict:
    groups = {}
    for g in seed_groups(read_results(path)):
        groups.setdefault(g.rows[0].get("loss"), g)
        groups[g.label] = g
    out = []
    for claim, paper, better, worse, metric, lower in CLAIM_SETS[claims]:
        if better not in groups or worse not in groups or metric not in groups[better].samples:
            out.append({"claim": claim, "verdict": "not measured"})
            continue
        a, b = groups[better].samples[metric], groups[worse].samples[metric]
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
                    "p_claimed": p_claimed, "p_reverse": p_reverse, "verdict": verdict})
    return {"results": path, "test": f"Welch one-sided over seeds, alpha {ALPHA}", "claims": out}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="bench/results/f8k_fast/results.csv")
    parser.add_argument("--claims", choices=sorted(CLAIM_SETS), default="fast")
    args = parser.parse_args()
    print(json.dumps(main(args.results, args.claims), indent=1))
