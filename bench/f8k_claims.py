"""The papers' claims, tested over seeds on a seed-grouped results.csv (`make f8k-fast`).

    python bench/f8k_claims.py bench/results/f8k_fast/results.csv > bench/results/f8k_fast/claims.json

Each claim compares two configurations (rows of one loss, all seeds) on one metric with
Welch's one-sided t-test over the seeds (pipeline.stats, docs/PROTOCOL.md "Seeds and
significance"): "holds" when p < 0.05 in the claimed direction, "reversed" when p < 0.05 the
other way, otherwise "inside the seed noise".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.report import read_results, seed_groups  # noqa: E402
from pipeline.stats import ALPHA, mean_std, welch_greater  # noqa: E402

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


def main(path: str) -> dict:
    groups = {g.rows[0].get("loss"): g for g in seed_groups(read_results(path))}
    out = []
    for claim, paper, better, worse, metric, lower in CLAIMS:
        if better not in groups or worse not in groups or metric not in groups[better].samples:
            out.append({"claim": claim, "verdict": "not measured"})
            continue
        a, b = groups[better].samples[metric], groups[worse].samples[metric]
        sign = -1.0 if lower else 1.0
        p_claimed = welch_greater([sign * v for v in a], [sign * v for v in b])
        p_reverse = welch_greater([sign * v for v in b], [sign * v for v in a])
        verdict = ("holds" if p_claimed < ALPHA else "reversed" if p_reverse < ALPHA
                   else "inside the seed noise")
        (ma, sa, na), (mb, sb, nb) = mean_std(a), mean_std(b)
        out.append({"claim": claim, "paper": paper, "metric": metric,
                    better: {"mean": ma, "std": sa, "n": na}, worse: {"mean": mb, "std": sb, "n": nb},
                    "p_claimed": p_claimed, "p_reverse": p_reverse, "verdict": verdict})
    return {"results": path, "test": f"Welch one-sided over seeds, alpha {ALPHA}", "claims": out}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/f8k_fast/results.csv"),
                     indent=1))
