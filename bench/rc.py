"""RC-mode throughput with data loading on vs. off, measured side by side in one run.

For each backbone (frozen CNN, default: tiny and efficientnet-lite0):
- loading: ``Trainer.train_epoch`` — the real loop: JPEG decode, resize, random crop and flip
  in DataLoader workers, uint8 transfer, normalisation, CNN, projection, loss, optimizer;
- in memory: ``Trainer.step`` on one batch already decoded (data loading off);
- decode only: the same loader with no training step (how fast the workers alone are).

Prints one JSON object: images/s of each, and ratio = loading / in memory (target ≥ 0.8).
The two timed loops alternate, so a drift in machine load hits both alike; the load average
is printed because a machine shared with other jobs makes every number noisy.
Usage: python bench/rc.py [--root data] [--backbones tiny,efficientnet-lite0] [--batches 6]
                         [--workers N] [--embed-dim 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(backbone: str, args, folder: Path) -> dict:
    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    batch_size = args.batch_size or (128 if backbone == "tiny" else 32)
    cfg = TrainConfig(rc=True, root=args.root, backbone=backbone, run_dir=str(folder / backbone),
                      batch_size=batch_size, embed_dim=args.embed_dim, val_every=0, workers=args.workers,
                      device=args.device, min_word_count=1)
    trainer = build_trainer(cfg, echo=lambda *a: None)
    pairs = trainer.epoch_batches(0)
    pairs.slices = pairs.slices[: args.batches]
    in_memory = pairs[0].pin_memory() if trainer.device.type == "cuda" else pairs[0]
    trainer.epoch_batches = lambda epoch: pairs
    trainer.step(in_memory)  # warm-up: allocator, kernels

    def with_loading() -> float:
        trainer.progress.batch = 0
        start = time.perf_counter()
        trainer.train_epoch()
        return time.perf_counter() - start

    def from_memory() -> float:
        start = time.perf_counter()
        for _ in range(len(pairs)):
            trainer.step(in_memory)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def decode_only() -> float:
        start = time.perf_counter()
        for _ in trainer.loader(pairs, 0):
            pass
        return time.perf_counter() - start

    times = {"loading": [], "memory": [], "decode": []}
    for _ in range(args.repeats):
        times["memory"].append(from_memory())
        times["loading"].append(with_loading())
    times["decode"].append(decode_only())
    images = len(pairs) * batch_size
    loading, memory, decode = (images / min(times[k]) for k in ("loading", "memory", "decode"))
    return {"backbone": backbone, "finetune": False, "batch_size": batch_size, "embed_dim": args.embed_dim,
            "batches": len(pairs),
            "workers": trainer.workers, "images_per_s_loading": round(loading, 1),
            "images_per_s_in_memory": round(memory, 1), "images_per_s_decode_only": round(decode, 1),
            "ratio": round(loading / memory, 3), "device": str(trainer.device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(ROOT / "data"), help="Flickr8k-layout folder")
    parser.add_argument("--backbones", default="tiny,efficientnet-lite0")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=None, help="default: 128 tiny, 32 others")
    parser.add_argument("--workers", type=int, default=None, help="default: all cores but one")
    parser.add_argument("--embed-dim", type=int, default=1024, help="joint space (and GRU) size")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(name, args, Path(tmp)) for name in args.backbones.split(",")]
    print(json.dumps({"root": args.root, "results": results, "target_ratio": 0.8,
                      "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                      "load_average_1m": round(os.getloadavg()[0], 2)}, indent=2))


if __name__ == "__main__":
    main()
