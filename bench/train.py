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
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchkit import trainer_vs_bare  # noqa: E402


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

    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    with tempfile.TemporaryDirectory() as tmp:
        features = args.features or str(synthetic_cache(Path(tmp), 1000, 1280))
        cfg = TrainConfig(features=features, run_dir=str(Path(tmp) / "run"), loss=args.loss,
                          batch_size=args.batch_size, embed_dim=args.embed_dim, val_every=0,
                          workers=args.workers, preload=args.preload, log_every=10)
        trainer = build_trainer(cfg, echo=lambda *a: None)
        pairs = trainer.epoch_batches(0)
        pairs.slices = pairs.slices[: args.batches]
        in_memory = [pairs[b] for b in range(len(pairs))]
        ratio = trainer_vs_bare(trainer, pairs,
                                lambda: ((b.images, b.captions, b.image_ids) for b in in_memory),
                                sum(len(b.caption_ids) for b in in_memory), rounds=2, target=0.9)
        print(json.dumps({
            "features": features if args.features else "synthetic (1000 demo images' captions, 1280-d)",
            "loss": args.loss, "batch_size": args.batch_size, "embed_dim": args.embed_dim,
            "workers": args.workers, "preload": args.preload, **ratio,
            "device": str(trainer.device), "torch_threads": torch.get_num_threads(),
        }, indent=2))


if __name__ == "__main__":
    main()
