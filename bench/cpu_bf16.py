"""fp32 against bf16 autocast (--cpu-amp) on a CPU with native bf16, side by side in one run.

For each workload, every seed is trained in fp32 and in bf16, the two precisions interleaved
(fp32 seed 0, bf16 seed 0, fp32 seed 1, ...) so they share any drift in machine load; then all
runs are evaluated on the test split by one `vse evaluate --runs`. Reported per workload: the
wall time of each run, the bf16 ÷ fp32 speed ratio of the medians, test rsum mean ± std per
precision and Welch's t-test of the two (bf16 "inside the fp32 seed noise" when p ≥ 0.05 and
the mean gap is below two fp32 standard deviations).

    python bench/cpu_bf16.py --features cache/f8k_effnet_1c.h5 --text-features cache/f8k_minilm_text.h5 \\
        --grid cache/f8k_effnet_grid7.h5 --tokens cache/f8k_minilm_tokens.h5 --seeds 3

Workloads: ``fast`` (30 epochs of 1C + MiniLM vectors, the fast loop), ``grid-gpo`` (6 epochs of
the 7 × 7 grid pooled by GPO with MiniLM token sets pooled by GPO), ``sgr`` and ``saf`` (SGRAF's
two networks over the same grid and tokens, embed 256, sim_dim 64, ``--sgraf-epochs``). A CPU
without native bf16 is refused: emulated bf16 measures nothing about this question
(``--allow-emulated`` runs the script anyway, to test it, and says so in the JSON).
Writes bench/results/cpu_bf16.json (``--out``).

``--micro`` measures SGR and SAF alone, without data or training runs (seconds to minutes): at
``--micro-sizes`` (``table``: the 2-core table's embed 256, sim_dim 64 over a 49-cell grid;
``authors``: 36 regions × 2048, embed 1024, sim_dim 256), interleaved over ``--rounds``, medians:
a training step (bench/train_pairwise.py's ``ours``) and scoring, a slice of the 5M-pair
evaluation (a block of 128 images × ``--micro-captions`` captions, encoded and scored in eval
mode without autograd, as ``vse evaluate`` runs each block), in fp32 and under bf16 autocast;
plus how far bf16's scores are from fp32's (largest difference, and the share of captions whose
best image is the same). Writes bench/results/cpu_bf16_sgraf.json unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchkit import cpu_name, write_report  # noqa: E402

from pipeline.core.runtime import EMULATED_BF16_ENV, cpu_native_bf16  # noqa: E402

PRECISIONS = {"fp32": [], "bf16": ["--cpu-amp"]}


def workloads(args) -> dict:
    loads = {}
    if args.features and args.text_features:
        loads["fast"] = ["--features", args.features, "--text-features", args.text_features, "--loss", "mh",
                         "--epochs", str(args.fast_epochs), "--lr-decay-epoch", str(args.fast_epochs // 2),
                         "--val-every", "0"]
    if args.grid and args.tokens:
        loads["grid-gpo"] = ["--features", args.grid, "--text-features", args.tokens, "--image-pool", "gpo",
                             "--text-pool", "gpo", "--loss", "mh", "--epochs", str(args.grid_epochs),
                             "--val-every", "0"]
        for network in ("sgr", "saf"):  # SGRAF at the 2-core table's sizes (experiments/f8k_sgraf.yaml)
            loads[network] = ["--features", args.grid, "--text-features", args.tokens, "--network", network,
                              "--embed-dim", "256", "--network-option", "sim_dim=64", "--loss", "mh",
                              "--epochs", str(args.sgraf_epochs), "--val-every", "0"]
    if not loads:
        raise SystemExit("give --features with --text-features, and/or --grid with --tokens")
    return loads


def run(command: list[str], env=None) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - started


def welch(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import ttest_ind

    return float(ttest_ind(a, b, equal_var=False).pvalue)


MICRO_SIZES = {"table": dict(batch=128, members=49, feature_dim=1280, embed=256, sim_dim=64, word_dim=300,
                              vocab=8000),
               "tiny": dict(batch=4, members=5, feature_dim=8, embed=8, sim_dim=4, word_dim=4, vocab=20)}


def micro(args) -> dict:
    """fp32 against bf16 autocast of SGR's and SAF's training step and scoring (see the module text)."""
    import contextlib

    import torch
    from train_pairwise import SIZES, batch, ours_step

    from pipeline.networks.network import NetworkConfig, build_network

    size = {**SIZES, **MICRO_SIZES}[args.micro_sizes]
    casts = {"fp32": contextlib.nullcontext, "bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}
    out = {"sizes": size, "scoring_block": [size["batch"], args.micro_captions], "networks": {}}
    images, _, _ = batch(size)
    _, captions, lengths = batch({**size, "batch": args.micro_captions}, seed=1)
    for network in args.networks.split(","):
        torch.manual_seed(0)
        config = NetworkConfig(network, feature_dim=size["feature_dim"], set_size=size["members"],
                               embed_dim=size["embed"], vocab_size=size["vocab"], word_dim=size["word_dim"],
                               options={"sim_dim": size["sim_dim"]})
        model = build_network(config).eval()
        steps = {"fp32": ours_step(network, size), "bf16": ours_step(network, size, torch.bfloat16)}
        scores = {}

        def score(precision):
            with torch.no_grad(), casts[precision]():
                scores[precision] = model.score(model.encode_images(images),
                                                model.encode_captions(captions, lengths)).float()

        times = {f"{part}_{p}": [] for part in ("train_step", "scoring") for p in casts}
        for precision in casts:  # warm-up
            steps[precision]()
            score(precision)
        for _ in range(args.rounds):
            for precision in casts:
                for part, fn in (("train_step", steps[precision]), ("scoring", lambda: score(precision))):
                    started = time.perf_counter()
                    fn()
                    times[f"{part}_{precision}"].append(time.perf_counter() - started)
        median = {k: statistics.median(v) for k, v in times.items()}
        pairs = size["batch"] * args.micro_captions
        best = {p: s.argmax(dim=0) for p, s in scores.items()}
        out["networks"][network] = {
            "median_s": {k: round(v, 3) for k, v in median.items()},
            "max_over_min": {k: round(max(v) / min(v), 3) for k, v in times.items()},
            "train_speed_ratio_bf16_over_fp32": round(median["train_step_fp32"] / median["train_step_bf16"],
                                                      3),
            "scoring_pairs_per_s": {p: round(pairs / median[f"scoring_{p}"]) for p in casts},
            "scoring_speed_ratio_bf16_over_fp32": round(median["scoring_fp32"] / median["scoring_bf16"], 3),
            "evaluation_5M_pairs_s_at_this_pace": {p: round(5e6 * median[f"scoring_{p}"] / pairs)
                                                   for p in casts},
            "bf16_scores_max_abs_difference": float((scores["bf16"] - scores["fp32"]).abs().max()),
            "bf16_same_best_image_share": float((best["bf16"] == best["fp32"]).float().mean()),
        }
        print(network, out["networks"][network], file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features")
    parser.add_argument("--text-features")
    parser.add_argument("--grid")
    parser.add_argument("--tokens")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--fast-epochs", type=int, default=30)
    parser.add_argument("--grid-epochs", type=int, default=6)
    parser.add_argument("--sgraf-epochs", type=int, default=1)
    parser.add_argument("--runs-dir", default="runs/bench_cpu_bf16")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu_bf16.json"))
    parser.add_argument("--allow-emulated", action="store_true")
    parser.add_argument("--micro", action="store_true", help="SGR/SAF steps and scoring alone (no data)")
    parser.add_argument("--micro-sizes", default="table", choices=["table", "authors", "small", "tiny"])
    parser.add_argument("--micro-captions", type=int, default=640)
    parser.add_argument("--networks", default="sgr,saf")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    native = cpu_native_bf16()
    if not native and not args.allow_emulated:
        raise SystemExit("this CPU has no native bf16 (avx512_bf16 / amx_bf16): nothing to measure here")
    if args.micro:
        report = {"cpu": cpu_name(), "native_bf16": native, "cores": os.cpu_count(),
                  "load_before": os.getloadavg(), **micro(args), "load_after": os.getloadavg()}
        if not native:
            report["note"] = "emulated bf16 (--allow-emulated): a test of this script, not a measurement"
        out = args.out if args.out != parser.get_default("out") else str(ROOT / "bench" / "results"
                                                                          / "cpu_bf16_sgraf.json")
        write_report(report, Path(out))
        return 0
    vse = [sys.executable, "-m", "cli.main"]
    env = {**os.environ, EMULATED_BF16_ENV: "1"} if args.allow_emulated else None
    report = {"cpu": cpu_name(), "native_bf16": native,
              "seeds": args.seeds, "workloads": {}}
    for name, options in workloads(args).items():
        runs_dir = Path(args.runs_dir) / name
        times = {p: [] for p in PRECISIONS}
        for seed in range(args.seeds):
            for precision, flags in PRECISIONS.items():
                run_dir = runs_dir / f"{precision}-seed{seed}"
                times[precision].append(run(vse + ["train", *options, *flags, "--seed", str(seed),
                                                   "--run-dir", str(run_dir), "--overwrite"], env))
        results = runs_dir / "results.csv"
        run(vse + ["evaluate", "--runs", str(runs_dir / "*"), "--split", "test", "--out", str(results),
                   "--overwrite"])
        import csv

        rsum = {p: [] for p in PRECISIONS}
        with open(results, newline="") as fh:
            for row in csv.DictReader(fh):
                rsum[row["run"].split("/")[-1].split("-")[0]].append(float(row["rsum"]))
        fp32, bf16 = rsum["fp32"], rsum["bf16"]
        spread = statistics.stdev(fp32) if len(fp32) > 1 else float("nan")
        p = welch(fp32, bf16)
        report["workloads"][name] = {
            "wall_s": times, "speed_ratio_bf16_over_fp32": statistics.median(times["fp32"])
            / statistics.median(times["bf16"]),
            "test_rsum": {k: {"mean": statistics.mean(v), "std": statistics.stdev(v) if len(v) > 1 else None,
                              "runs": v} for k, v in rsum.items()},
            "welch_p": p,
            "inside_fp32_noise": (p is not None and p >= 0.05
                                  and abs(statistics.mean(bf16) - statistics.mean(fp32)) < 2 * spread),
        }
    if not native:
        report["note"] = "emulated bf16 (--allow-emulated): a test of this script, not a measurement"
    write_report(report, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
