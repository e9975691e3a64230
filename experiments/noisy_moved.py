"""What moved when rcl, decl and ncr became their authors' code: each configuration's rows in the
table before (a results.csv of the earlier readings, e.g. ``git show REV:bench/results/f8k_noisy/
results.csv``) against the same configuration's rows now, per metric: mean ± std over seeds and
Welch's two-sided t-test (moved beyond the seed noise: p < 0.05).

    python experiments/noisy_moved.py OLD.csv NEW.csv --methods rcl,decl,ncr > moved.json
"""

from __future__ import annotations

import argparse
import csv
import json
import re

import numpy as np
from scipy import stats

METRICS = ("rsum", "i2t_r1", "t2i_r1", "human_i2t_map@r", "division_auc")


def rows_by_configuration(path: str) -> dict:
    with open(path, newline="") as f:
        out: dict = {}
        for row in csv.DictReader(f):
            out.setdefault(re.sub(r",?seed=\d+", "", row["run"]), []).append(row)
    return out


def values(rows: list, metric: str) -> list[float]:
    return [float(r[metric]) for r in rows if r.get(metric) not in (None, "")]


def summary(x: list[float]) -> list:
    """[mean, std (ddof 1), n]"""
    return [round(float(np.mean(x)), 3), round(float(np.std(x, ddof=1)), 3), len(x)]


def main(old_path: str, new_path: str, methods: list[str]) -> dict:
    old, new = rows_by_configuration(old_path), rows_by_configuration(new_path)
    out = {"before": old_path, "after": new_path, "test": "Welch two-sided over seeds, alpha 0.05",
           "configurations": {}}
    for label in sorted(set(old) & set(new)):
        if not any(f"method={m}" in label.split(",") for m in methods):
            continue
        entry = {}
        for metric in METRICS:
            a, b = values(old[label], metric), values(new[label], metric)
            if len(a) < 2 or len(b) < 2:
                continue
            p = float(stats.ttest_ind(b, a, equal_var=False).pvalue)
            entry[metric] = {"before": summary(a), "after": summary(b),
                             "change": round(float(np.mean(b) - np.mean(a)), 3), "p": p, "moved": p < 0.05}
        out["configurations"][label] = entry
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--methods", default="rcl,decl,ncr")
    args = parser.parse_args()
    print(json.dumps(main(args.old, args.new, args.methods.split(",")), indent=1))
