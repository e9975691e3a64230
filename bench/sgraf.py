"""SGR and SAF on the 7 × 7 grid with cached MiniLM tokens: scoring throughput against a bare loop
of the same modules, a full test-split evaluation, training steps, and peak memory.

    python bench/sgraf.py --grid cache/f8k_effnet_grid7.h5 --tokens cache/f8k_minilm_tokens.h5

1. Scoring, pairs/s: the network's blocked ``score`` (an image block × a caption block, as
   evaluation runs it) against the bare loop of the same modules, one caption at a time over
   the block's images (tests/reference/sgraf_loop.py: the authors' ``EncoderSimilarity.forward``
   structure). Both in eval mode without autograd, interleaved over ``--rounds``, the best round
   of each; the ratio is ours ÷ bare (target ≥ 0.8).
2. Evaluation: ``vse evaluate`` of a freshly initialised checkpoint of each network on the test
   split of ``--grid`` (Flickr8k: 1,000 images × 5,000 captions = 5M pairs), wall time and peak
   RSS of the process.
3. Training: ``--train-steps`` optimiser steps of the Trainer at batch 128 (the authors'), and
   the time of one epoch of the cache's training split at that pace (steps × the measured
   seconds per step: a full epoch is not run), with the peak RSS.

Runs in the network's dimensions given by ``--embed-dim`` and ``--sim-dim`` (the authors': 1024
and 256; on 2 cores 256 and 64 are what a seed table can afford). Writes bench/results/sgraf.json.
"""

from __future__ import annotations

import argparse
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


def scoring(network: str, args) -> dict:
    from reference import sgraf_loop

    from pipeline.data.cache import FeatureCache
    from pipeline.data.captions import open_caption_features
    from pipeline.networks.network import NetworkConfig, build_network

    with FeatureCache(args.grid) as cache:
        rows, caption_rows, _ = cache.split_rows("test")
        images = torch.from_numpy(cache.read(rows[:args.block])).float()
        captions = open_caption_features(args.tokens, cache.captions, cache.path)
        tokens, lengths = captions.batch(caption_rows[:args.block])
        config = NetworkConfig(network, feature_dim=cache.feature_dim, set_size=cache.set_size,
                               embed_dim=args.embed_dim, text_dim=captions.file.dim,
                               options={"sim_dim": args.sim_dim})
    torch.manual_seed(0)
    model = build_network(config).eval()
    pairs = len(images) * len(tokens)

    def ours() -> float:
        start = time.perf_counter()
        model.score(model.encode_images(images), model.encode_captions(tokens, lengths))
        return time.perf_counter() - start

    def bare() -> float:
        start = time.perf_counter()
        sgraf_loop.scores(model, images, tokens, lengths)
        return time.perf_counter() - start

    with torch.no_grad():
        difference = float((model(images, tokens, lengths)
                            - sgraf_loop.scores(model, images, tokens, lengths)).abs().max())
        times = {"ours": [], "bare": []}
        for _ in range(args.rounds):
            times["ours"].append(ours())
            times["bare"].append(bare())
    best = {k: pairs / min(v) for k, v in times.items()}
    return {"block": [len(images), len(tokens)], "pairs_per_s": {k: round(v, 1) for k, v in best.items()},
            "ratio_ours_over_bare": round(best["ours"] / best["bare"], 3), "target_ratio": 0.8,
            "max_abs_difference_float32": difference,
            "rounds_s": {k: [round(t, 3) for t in v] for k, v in times.items()}}


def evaluation(network: str, args, work: Path) -> dict:
    """A checkpoint of one training step (so that it exists), then `vse evaluate` of the test split."""
    checkpoint = one_step_checkpoint(ROOT, {
        "features": args.grid, "text_features": args.tokens, "network": network, "embed_dim": args.embed_dim,
        "network_options": {"sim_dim": args.sim_dim}, "batch_size": 8,
        "run_dir": str(work / f"eval_{network}")})
    vse = [sys.executable, "-m", "cli.main"]
    wall, rss = timed_command(vse + ["evaluate", "--checkpoint", str(checkpoint),
                                     "--features", args.grid, "--split", "test", "--json"], ROOT)
    from pipeline.data.cache import FeatureCache

    with FeatureCache(args.grid) as cache:
        rows, caption_rows, _ = cache.split_rows("test")
    return {"images": len(rows), "captions": len(caption_rows), "pairs": len(rows) * len(caption_rows),
            "wall_s": round(wall, 1), "peak_rss_mb": round(rss),
            "pairs_per_s": round(len(rows) * len(caption_rows) / wall, 1)}


def training(network: str, args, work: Path) -> dict:
    """``--train-steps`` steps of the Trainer at batch 128 (the authors'), in a child process."""
    return trainer_steps(ROOT, {"features": args.grid, "text_features": args.tokens, "network": network,
                                "embed_dim": args.embed_dim, "network_options": {"sim_dim": args.sim_dim},
                                "batch_size": 128, "val_every": 0, "run_dir": str(work / f"train_{network}")},
                         args.train_steps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", required=True, help="a cache of 7 × 7 grids (vse extract --grid)")
    parser.add_argument("--tokens", required=True, help="MiniLM token vectors (vse encode-text --tokens)")
    parser.add_argument("--networks", default="sgr,saf")
    parser.add_argument("--embed-dim", type=int, default=256)
    parser.add_argument("--sim-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--skip", default="", help="comma list of parts to skip: scoring,evaluation,training")
    parser.add_argument("--work", default="runs/bench_sgraf")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sgraf.json"))
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    report = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "grid": args.grid,
              "tokens": args.tokens, "embed_dim": args.embed_dim, "sim_dim": args.sim_dim, "networks": {}}
    for network in args.networks.split(","):
        entry = report["networks"][network] = {}
        for part, measure in (("scoring", lambda: scoring(network, args)),
                              ("evaluation", lambda: evaluation(network, args, work)),
                              ("training", lambda: training(network, args, work))):
            if part not in skip:
                entry[part] = measure()
                print(network, part, json.dumps(entry[part]), flush=True)
    write_report(report, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
