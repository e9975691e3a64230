"""The cached dual trainer against a bare PyTorch loop of the same model (issue 50): ``ours_over_bare``
= steps/s of `vse train`'s Trainer (``train_epoch``: its loader, batches, autocast as the run
chooses, loss, clipping, fused Adam, the loss read back each step) ÷ steps/s of bench/bare_loop.py
(the same heads, loss and optimizer, the cache on the device), side by side in one process,
interleaved rounds, medians. On a GPU also ``host_fraction`` of each: 1 − (the kernels' busy time ÷
the steps' wall time), from torch.profiler; on a CPU it does not apply (the host is the device).

    python bench/dual_step.py                      # bench/results/dual_step.json (CPU)
    python bench/dual_step.py --device cuda        # bench/results/dual_step_cuda.json

Sizes: the fast loop's (bench/fast_train.py): 1,280-d image vectors, 384-d caption vectors, embed
1024, batch 128, over a synthetic cache of ``--images`` images (5 captions each; random vectors:
the timings of real ones, metrics meaningless).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))


def small_pair(folder: Path, num_images: int = 300, dim: int = 64, text_dim: int = 32):
    """A feature cache of ``num_images`` random image vectors (100 of them dev and test) with 5 demo
    captions each, and a caption-vector file of random unit vectors for them (fast_train's maker)."""
    from fast_train import synthetic_pair

    return synthetic_pair(folder, num_images, dim, text_dim, held_out=50, stem="pair")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def host_fraction(run, device: str, wall_s: float | None = None) -> float | None:
    """1 − kernels' busy time ÷ wall time of ``run()``, the busy time from torch.profiler and the
    wall time ``wall_s`` measured without it (the profiler's own host cost left out; default: the
    profiled run's); None on a CPU."""
    if not device.startswith("cuda"):
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        wall = time.perf_counter() - start
    return host_share(sum(e.self_device_time_total for e in prof.key_averages()) / 1e6, wall_s or wall)


def host_share(busy_s: float, wall_s: float) -> float:
    """The share of ``wall_s`` the device was not busy: the host's (kernels on one stream)."""
    return round(1 - min(busy_s, wall_s) / wall_s, 3)


def measure(args) -> dict:
    from bare_loop import bare_loop

    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    with tempfile.TemporaryDirectory() as tmp:
        features, text = small_pair(Path(tmp), args.images, 1280, 384)
        cfg = TrainConfig(features=str(features), text_features=str(text), run_dir=str(Path(tmp) / "run"),
                          loss="mh", batch_size=args.batch, embed_dim=1024, workers=0, val_every=0,
                          log_every=10 ** 6, preload=True, device=args.device)
        trainer = build_trainer(cfg, echo=lambda *a, **k: None)
        pairs = trainer.epoch_batches(0)
        pairs.slices = pairs.slices[:args.steps]
        trainer.epoch_batches = lambda epoch: pairs
        device = str(trainer.device)
        index = trainer.index
        images = torch.as_tensor(np.asarray(trainer.source.inputs._array), device=device)
        vectors = torch.as_tensor(trainer.captions.vectors, device=device)
        caption_image = torch.as_tensor(np.asarray(index.caption_image), device=device)
        bare = bare_loop(images, vectors, caption_image, args.batch, 1024, trainer.train_dtype)
        steps = len(pairs.slices)

        def ours():
            trainer.progress.batch = 0
            trainer.train_epoch()

        def theirs():
            bare(steps)
        times = {"ours": [], "bare": []}
        for run in (ours, theirs):  # warm-up
            run()
        for _ in range(args.rounds):
            for name, run in (("ours", ours), ("bare", theirs)):
                sync(device)
                start = time.perf_counter()
                run()
                sync(device)
                times[name].append((time.perf_counter() - start) / steps)
        median = {k: statistics.median(v) for k, v in times.items()}
        gpu = device.startswith("cuda")
        return {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "torch": torch.__version__,
                "threads": torch.get_num_threads(), "train_dtype": str(trainer.train_dtype),
                "sizes": {"images": args.images, "image_dim": 1280, "text_dim": 384, "embed": 1024,
                          "batch": args.batch, "steps_a_round": steps},
                "steps_per_s": {k: round(1 / v, 2) for k, v in median.items()},
                "ours_over_bare": round(median["bare"] / median["ours"], 3), "goal_ours_over_bare": 0.9,
                "host_fraction": ({"ours": host_fraction(ours, device, median["ours"] * steps),
                                   "bare": host_fraction(theirs, device, median["bare"] * steps),
                                   "goal": 0.15} if gpu else
                                  "not applicable: on a CPU the host is the device"),
                "step_s": {k: [round(t, 5) for t in v] for k, v in times.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, default=1000, help="of the synthetic cache (5 captions each)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="steps a round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    from benchkit import write_report

    report = measure(args)
    report["load"] = os.getloadavg()
    name = "dual_step_cuda.json" if args.device.startswith("cuda") else "dual_step.json"
    write_report(report, Path(args.out or ROOT / "bench" / "results" / name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
