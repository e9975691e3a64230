"""The precision ablation's table (issue 53), from the runs ``bench/precision_arms.py`` wrote.

Per arm, over its seeds: dev rsum after the epoch (mean ± std, n), the share of steps whose loss sits
within 1% of MH's collapse value (2 · margin · batch), the share of hinge-active queries whose
hardest negative is tied (two or more negatives at the maximum cost), the distinct score values per
batch (of B² = 16,384), and the median gradient norm before clipping; each over the whole epoch and
its first 50 steps. Welch one-sided p-values against the two controls say whether an arm behaves
like fp32 or like bf16.

    PYTHONPATH=. python bench/precision_table.py bench/results/precision_saf_cpu

Writes DIR/table.md and DIR/summary.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from pipeline.evaluation.stats import mean_std, welch_greater

ORDER = ("fp32", "bf16", "fp32-scores-bf16", "bf16-scores-fp32", "fp32-scores-noise",
         "fp32-gemm-tf32", "fp32-gemm-bf16", "bf16-max1", "fp32-scores-bf16-max1")
EARLY = 50


def rsum(run: dict) -> float:
    last = run["validation"][-1] if run["validation"] else {}
    return float(last.get("rsum", math.nan))


def share(values, test) -> float:
    values = [v for v in values if v is not None]
    return sum(1 for v in values if test(v)) / len(values) if values else math.nan


def mean(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else math.nan


def arm_row(runs: list[dict]) -> dict:
    collapse = runs[0]["collapse_value"]
    row = {"seeds": sorted(r["seed"] for r in runs), "rsum": mean_std([rsum(r) for r in runs]),
           "rsums": [rsum(r) for r in sorted(runs, key=lambda r: r["seed"])],
           "minutes": mean([r["seconds"] / 60 for r in runs])}
    for part, cut in (("all", None), ("early", EARLY)):
        def series(key, run, cut=cut):
            return run["steps"].get(key, [])[:cut]
        row[part] = {
            "at_collapse": mean([share(series("collapse_gap", r), lambda g: abs(g) <= 0.01 * collapse)
                                 for r in runs]),
            "tied_queries": mean([mean(series("tied_queries", r)) for r in runs]),
            "ties_per_query": mean([mean(series("ties_per_query", r)) for r in runs]),
            "distinct_scores": mean([mean(series("distinct_scores", r)) for r in runs]),
            "grad_norm": mean([statistics.median(series("grad_norm", r)) for r in runs
                               if series("grad_norm", r)]),
            "loss": mean([mean(series("loss", r)) for r in runs]),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {}
    for path in sorted((args.folder / "runs").glob("*.json")):
        run = json.loads(path.read_text())
        runs.setdefault(run["arm"], []).append(run)
    arms = [a for a in ORDER if a in runs] + sorted(set(runs) - set(ORDER))
    rows = {arm: arm_row(runs[arm]) for arm in arms}
    controls = {c: [rsum(r) for r in runs.get(c, [])] for c in ("fp32", "bf16")}
    for arm in arms:
        values = [rsum(r) for r in runs[arm]]
        rows[arm]["p_above_fp32"] = welch_greater(values, controls["fp32"]) if arm != "fp32" else None
        rows[arm]["p_below_bf16"] = welch_greater(controls["bf16"], values) if arm != "bf16" else None
    options = runs[arms[0]][0]["options"]
    lines = [f"SAF, MH, embed {options.get('embed_dim')}, sim_dim "
             f"{options.get('network_options', {}).get('sim_dim')}, batch {options.get('batch_size')}, "
             f"{options.get('epochs')} epoch, full Flickr8k train; dev rsum on {options.get('val_images')} "
             "images. Shares per step; 'early': the first 50 steps.", "",
             "| arm | seeds | dev rsum | p > fp32 | p < bf16 | at collapse (early / all) | tied hardest "
             "(early / all) | distinct scores (early) | grad norm (median) | min a run |",
             "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def p(value):
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"

    for arm in arms:
        r = rows[arm]
        m, s, n = r["rsum"]
        lines.append(
            f"| {arm} | {n} | {m:.1f} ± {s:.1f} | {p(r['p_above_fp32'])} | {p(r['p_below_bf16'])} | "
            f"{r['early']['at_collapse']:.2f} / {r['all']['at_collapse']:.2f} | "
            f"{r['early']['tied_queries']:.3f} / {r['all']['tied_queries']:.3f} | "
            f"{r['early']['distinct_scores']:.0f} | {r['all']['grad_norm']:.3g} | {r['minutes']:.1f} |")
    (args.folder / "table.md").write_text("\n".join(lines) + "\n")
    (args.folder / "summary.json").write_text(json.dumps({"options": options, "arms": rows}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
