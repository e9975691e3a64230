"""Trainer throughput vs. its ceiling, measured side by side in one run.

- trainer: ``Trainer.train_epoch`` — the real loop (HDF5 reads, tokens, batches, loss,
  optimizer, progress bar) over a feature cache;
- ceiling: a bare forward + backward + step loop of the same model and loss over the same
  batches, already in memory.

Prints one JSON object (pairs/s of both and their ratio; target ≥ 0.9).
Usage: python bench/train.py [--features cache/X.h5] [--batches 40] [--embed-dim 1024]
Without --features, a cache of real demo captions with random 1280-d features is made.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def synthetic_cache(folder: Path, num_images: int, dim: int) -> Path:
    from conftest import demo_captions, write_feature_cache

    ids, captions = demo_captions(num_images)
    n = len(ids)
    feats = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    return write_feature_cache(folder / "bench.h5", feats, captions, np.repeat(np.arange(n), 5),
                               {"train": np.arange(n - 50), "dev": np.arange(n - 50, n)}, image_ids=ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--embed-dim", type=int, default=1024)
    parser.add_argument("--loss", default="mh")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--preload", action="store_true")
    args = parser.parse_args()

    from pipeline.train import TrainConfig, Trainer

    with tempfile.TemporaryDirectory() as tmp:
        features = args.features or str(synthetic_cache(Path(tmp), 1000, 1280))
        cfg = TrainConfig(features=features, run_dir=str(Path(tmp) / "run"), loss=args.loss,
                          batch_size=args.batch_size, embed_dim=args.embed_dim, val_every=0,
                          workers=args.workers, preload=args.preload, log_every=10)
        trainer = Trainer(cfg, echo=lambda *a: None)
        pairs = trainer.epoch_batches(0)
        pairs.slices = pairs.slices[: args.batches]
        in_memory = [pairs[b] for b in range(len(pairs))]

        # warm-up both paths once (allocator, kernels)
        for batch in in_memory[:2]:
            trainer.step(batch)

        def bare_loop() -> float:
            model, loss_fn, opt = trainer.model, trainer.loss, trainer.optimizer
            start = time.perf_counter()
            for batch in in_memory:
                img, cap = model(batch.images, *batch.captions)
                loss = loss_fn(img, cap, image_ids=batch.image_ids)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
            return time.perf_counter() - start

        def trainer_loop() -> float:
            trainer.progress.batch = 0
            trainer.epoch_batches = lambda epoch: pairs  # the same batches, read from the cache
            start = time.perf_counter()
            trainer.train_epoch()
            return time.perf_counter() - start

        n_pairs = sum(len(b.caption_ids) for b in in_memory)
        # interleave to share any drift in machine load between the two
        times = {"trainer": [], "bare": []}
        for _ in range(2):
            times["bare"].append(bare_loop())
            times["trainer"].append(trainer_loop())
        bare, full = min(times["bare"]), min(times["trainer"])
        print(json.dumps({
            "features": features if args.features else "synthetic (1000 demo images' captions, 1280-d)",
            "loss": args.loss, "batch_size": args.batch_size, "embed_dim": args.embed_dim,
            "batches": len(in_memory), "pairs": n_pairs, "workers": args.workers, "preload": args.preload,
            "trainer_pairs_per_s": round(n_pairs / full, 1),
            "bare_loop_pairs_per_s": round(n_pairs / bare, 1),
            "ratio": round(bare / full, 3),
            "target_ratio": 0.9,
            "device": str(trainer.device), "torch_threads": torch.get_num_threads(),
        }, indent=2))


if __name__ == "__main__":
    main()
