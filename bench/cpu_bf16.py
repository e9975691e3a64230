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
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchkit import write_report  # noqa: E402

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
    args = parser.parse_args(argv)
    native = cpu_native_bf16()
    if not native and not args.allow_emulated:
        raise SystemExit("this CPU has no native bf16 (avx512_bf16 / amx_bf16): nothing to measure here")
    vse = [sys.executable, "-m", "cli.main"]
    env = {**os.environ, EMULATED_BF16_ENV: "1"} if args.allow_emulated else None
    report = {"cpu": platform.processor() or platform.machine(), "native_bf16": native,
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
