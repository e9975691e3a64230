"""The precision ablation's table (issue 53), from the runs ``experiments/precision_arms.py`` wrote.

Per arm, over its seeds: dev rsum after the epoch (mean ± std, n), the share of steps whose loss sits
within 1% of MH's collapse value (2 · margin · batch), the share of hinge-active queries whose
hardest negative is tied (two or more negatives at the maximum cost), the distinct score values per
batch (of B² = 16,384), and the median gradient norm before clipping; each over the whole epoch and
its first 50 steps. Welch one-sided p-values against the two controls, and the gaps to each control
seed by seed (an arm's run of seed k starts from the controls' initialisation and batch order), say
whether an arm behaves like fp32 or like bf16.

    PYTHONPATH=. python experiments/precision_table.py bench/results/precision_saf_cpu

Writes DIR/table.md and DIR/summary.json. ``--fast DIR`` reads DIR/results*.csv instead (`vse
evaluate --runs` of experiments/precision_fast.yaml's or precision_sgraf.yaml's sweeps) and writes
DIR/precision.md and DIR/precision.json: per configuration (the run name without its seed and its
precision), test rsum and R@1 in fp32 and under bf16 (the rows' ``precision`` column), the gaps seed
by seed, the two-sided Welch p-value of the gap, and whether bf16 is inside the fp32 seed noise
(p >= 0.05).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

from pipeline.evaluation.stats import ALPHA, mean_std, welch_greater
from pipeline.reports.report import read_results, row_precision, without_seed

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


FAST_METRICS = ("rsum", "i2t_r1", "t2i_r1")


def configuration(run: str) -> str:
    """A results row's configuration without its seed and its precision: the name both precisions'
    runs of one configuration share ("method=mh,cpu_amp=true,seed=0" -> "method=mh";
    "sgr_bf16/method=mh,seed=2 + saf_bf16/method=mh,seed=2" -> "sgr/method=mh + saf/method=mh")."""
    name = without_seed(run)
    name = re.sub(r"_(fp32|bf16|fp16)(?=/|$)", "", name)
    return ",".join(part for part in name.split(",") if not re.fullmatch(r"\s*(cpu_)?amp=\w+", part))


def seed_of(row: dict) -> int:
    """A results row's training seed (its ``seed`` column; an averaged row's is its first run's)."""
    return int(float(row["seed"]))


def precision_pairs(folder: Path, files: list[Path]) -> dict:
    """fp32 against bf16 for each configuration of ``files`` (results.csv files of `vse evaluate
    --runs`, the precision read from each row's ``precision`` column): mean ± std over seeds, the
    gap of means, the gaps seed by seed (a seed's runs share their initialisation and batch order in
    both precisions) and the two-sided Welch p-value. Writes DIR/precision.md and DIR/precision.json."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for path in files:
        for row in read_results(path):
            key = (configuration(str(row["run"])), row_precision(row).split("/")[0])
            groups.setdefault(key, []).append(row)
    out, lines = {}, ["| configuration | metric | fp32 | bf16 | bf16 − fp32 | by seed | p (two-sided) "
                      "| verdict |", "|:---|:---|---:|---:|---:|---:|---:|:---|"]
    for config in dict.fromkeys(c for c, _ in groups):
        fp32, bf16 = groups.get((config, "fp32"), []), groups.get((config, "bf16"), [])
        if not fp32 or not bf16:
            continue
        by_seed = {seed_of(r): r for r in fp32}
        for metric in FAST_METRICS:
            a, b = [r[metric] for r in fp32], [r[metric] for r in bf16]
            (ma, sa, na), (mb, sb, nb) = mean_std(a), mean_std(b)
            p = min(1.0, 2 * min(welch_greater(a, b), welch_greater(b, a)))
            verdict = "inside the seed noise" if p >= ALPHA else "beyond the seed noise"
            paired = dict(sorted((seed_of(r), r[metric] - by_seed[seed_of(r)][metric])
                                 for r in bf16 if seed_of(r) in by_seed))
            out.setdefault(config, {})[metric] = {"fp32": {"mean": ma, "std": sa, "n": na},
                                                  "bf16": {"mean": mb, "std": sb, "n": nb},
                                                  "difference": mb - ma,
                                                  "by_seed": {str(k): v for k, v in paired.items()},
                                                  "p_two_sided": p, "verdict": verdict}
            lines.append(f"| {config} | {metric} | {ma:.1f} ± {sa:.1f} ({na}) | {mb:.1f} ± {sb:.1f} ({nb}) | "
                         f"{mb - ma:+.1f} | {' '.join(f'{v:+.1f}' for v in paired.values())} | {p:.3g} | "
                         f"{verdict} |")
    if not out:
        raise SystemExit(f"{folder}: no configuration has rows in both fp32 and bf16")
    (folder / "precision.md").write_text("\n".join(lines) + "\n")
    (folder / "precision.json").write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(lines))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--fast", action="store_true",
                        help="fp32 against bf16 over the folder's results*.csv (the fast loop's, the "
                             "end-of-training table's), not the ablation's runs")
    args = parser.parse_args()
    if args.fast:
        precision_pairs(args.folder, sorted(args.folder.glob("results*.csv")))
        return
    runs: dict[str, list[dict]] = {}
    for path in sorted((args.folder / "runs").glob("*.json")):
        run = json.loads(path.read_text())
        runs.setdefault(run["arm"], []).append(run)
    arms = [a for a in ORDER if a in runs] + sorted(set(runs) - set(ORDER))
    rows = {arm: arm_row(runs[arm]) for arm in arms}
    controls = {c: [rsum(r) for r in runs.get(c, [])] for c in ("fp32", "bf16")}
    by_seed = {c: {r["seed"]: rsum(r) for r in runs.get(c, [])} for c in ("fp32", "bf16")}
    for arm in arms:  # the arms share each seed's initialisation and batch order: paired by seed
        for control in ("fp32", "bf16"):
            gaps = [rsum(r) - by_seed[control][r["seed"]] for r in runs[arm] if r["seed"] in by_seed[control]]
            rows[arm][f"paired_vs_{control}"] = gaps
        values = [rsum(r) for r in runs[arm]]
        rows[arm]["p_above_fp32"] = welch_greater(values, controls["fp32"]) if arm != "fp32" else None
        rows[arm]["p_below_bf16"] = welch_greater(controls["bf16"], values) if arm != "bf16" else None
    options = runs[arms[0]][0]["options"]
    lines = [f"SAF, MH, embed {options.get('embed_dim')}, sim_dim "
             f"{options.get('network_options', {}).get('sim_dim')}, batch {options.get('batch_size')}, "
             f"{options.get('epochs')} epoch, full Flickr8k train; dev rsum on {options.get('val_images')} "
             "images. Shares per step; 'early': the first 50 steps.", "",
             "| arm | seeds | dev rsum | − fp32, by seed | p > fp32 | − bf16, by seed | p < bf16 | "
             "at collapse (early / all) | tied hardest (early / all) | distinct scores (early) | "
             "grad norm (median) | min a run |",
             "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def gaps(values):
        return " ".join(f"{v:+.0f}" for v in values) if values else ""

    def p(value):
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"

    for arm in arms:
        r = rows[arm]
        m, s, n = r["rsum"]
        lines.append(
            f"| {arm} | {n} | {m:.1f} ± {s:.1f} | {gaps(r['paired_vs_fp32']) if arm != 'fp32' else ''} | "
            f"{p(r['p_above_fp32'])} | {gaps(r['paired_vs_bf16']) if arm != 'bf16' else ''} | "
            f"{p(r['p_below_bf16'])} | "
            f"{r['early']['at_collapse']:.2f} / {r['all']['at_collapse']:.2f} | "
            f"{r['early']['tied_queries']:.3f} / {r['all']['tied_queries']:.3f} | "
            f"{r['early']['distinct_scores']:.0f} | {r['all']['grad_norm']:.3g} | {r['minutes']:.1f} |")
    (args.folder / "table.md").write_text("\n".join(lines) + "\n")
    (args.folder / "summary.json").write_text(json.dumps({"options": options, "arms": rows}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
