"""VSRN's image side on the 7 × 7 grid: encoding throughput against a bare loop of the same
modules, a full test-split evaluation, training steps, and peak memory.

    python bench/vsrn.py --grid cache/f8k_effnet_grid7.h5

1. Encoding, images/s: ``SetImageHead(pool="vsrn")`` (linear maps over the members, masked)
   against the encoder written the authors' way (tests/reference/vsrn_loop.py: 1 × 1 Conv1d on
   (B, E, K) tensors), the same weights, eval mode without autograd, interleaved over
   ``--rounds``, the best round of each; the ratio is ours ÷ bare (target ≥ 0.8).
2. Evaluation: ``vse evaluate`` of a one-step checkpoint (``benchkit.one_step_checkpoint``) on the
   test split (wall time, peak RSS).
3. Training: ``--train-steps`` steps of the Trainer at batch 128 and the epoch at that pace.

Captions: VSE++'s GRU over word ids, as VSRN's. Writes bench/results/vsrn.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from benchkit import one_step_checkpoint, timed_command, trainer_steps, write_report  # noqa: E402


def encoding(args) -> dict:
    from reference import vsrn_loop

    from pipeline.data.cache import FeatureCache
    from pipeline.networks.heads import SetImageHead

    with FeatureCache(args.grid) as cache:
        rows, _, _ = cache.split_rows("test")
        images = torch.from_numpy(cache.read(rows[:args.block])).float()
        dim = cache.feature_dim
    torch.manual_seed(0)
    ours = SetImageHead(dim, args.embed_dim, projection="linear", pool="vsrn").eval()
    theirs = copy.deepcopy(ours)
    lengths = torch.full((len(images),), images.shape[1], dtype=torch.int64)

    def run(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    with torch.no_grad():
        difference = float((ours(images, lengths) - vsrn_loop.image_embeddings(theirs, images)).abs().max())
        times = {"ours": [], "bare": []}
        for _ in range(args.rounds):
            times["ours"].append(run(lambda: ours(images, lengths)))
            times["bare"].append(run(lambda: vsrn_loop.image_embeddings(theirs, images)))
    best = {k: len(images) / min(v) for k, v in times.items()}
    return {"images": len(images), "images_per_s": {k: round(v, 1) for k, v in best.items()},
            "ratio_ours_over_bare": round(best["ours"] / best["bare"], 3), "target_ratio": 0.8,
            "max_abs_difference_float32": difference,
            "rounds_s": {k: [round(t, 3) for t in v] for k, v in times.items()}}


def evaluation(args, work: Path) -> dict:
    checkpoint = one_step_checkpoint(ROOT, {"features": args.grid, "network": "vsrn",
                                            "embed_dim": args.embed_dim, "batch_size": 8,
                                            "run_dir": str(work / "eval")})
    vse = [sys.executable, "-m", "cli.main"]
    wall, rss = timed_command(vse + ["evaluate", "--checkpoint", str(checkpoint),
                                     "--features", args.grid, "--split", "test", "--json"], ROOT)
    return {"wall_s": round(wall, 1), "peak_rss_mb": round(rss)}


def training(args, work: Path) -> dict:
    config = {"features": args.grid, "network": "vsrn", "embed_dim": args.embed_dim, "batch_size": 128,
              "val_every": 0, "run_dir": str(work / "train")}
    if args.caption_loss_weight is not None:
        config["caption_loss_weight"] = args.caption_loss_weight
    return trainer_steps(ROOT, config, args.train_steps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", required=True)
    parser.add_argument("--embed-dim", type=int, default=1024)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--caption-loss-weight", type=float, default=None,
                        help="training: the caption branch's weight (default: vsrn's, 1; 0: off)")
    parser.add_argument("--skip", default="",
                        help="comma list of parts to skip: encoding,evaluation,training")
    parser.add_argument("--work", default="runs/bench_vsrn")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "vsrn.json"))
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "grid": args.grid,
              "embed_dim": args.embed_dim,
              "caption_loss_weight": 1.0 if args.caption_loss_weight is None else args.caption_loss_weight}
    parts = (("encoding", lambda: encoding(args)), ("evaluation", lambda: evaluation(args, work)),
             ("training", lambda: training(args, work)))
    skipped = {part for part in args.skip.split(",") if part}
    for part, measure in parts:
        if part in skipped:
            continue
        report[part] = measure()
        print(part, json.dumps(report[part]), flush=True)
    write_report(report, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
