"""Set-valued image features (issue 21): trainer speed, a full run's wall time, and memory.

- ``ratio``: pairs/s of ``Trainer.train_epoch`` on a set cache (batches gathered from the
  shards, the GPO head with its size augmentation, loss, clipping, Adam) against a bare loop
  of the same model's steps over the same batches already in memory (target ≥ 0.8).
- ``full``: wall time of ``Trainer.fit`` (set-up and a validation after every epoch
  included) for ``--epochs`` (6) epochs on the 7 × 7 EfficientNet-Lite0 grid of the full
  Flickr8k with cached MiniLM caption vectors, GPO on the image side (aim: ≤ 5 min on 2
  cores), and the test metrics of its best.pt.
- ``rss``: peak resident memory of `vse train --image-pool gpo` on a synthetic SCAN/VSE∞
  precomp folder of COCO's size, ``train_ims.npy`` of 113,287 × 36 × 2048 float32 (33 GB,
  a sparse file: one member of each image holds random values, the rest reads as zeros),
  imported by `vse extract --dataset vsepp-precomp` (HDF5 external storage, no copy), then
  the same with a tenth of the images: the trainer runs ``--rss-seconds`` (120 s) and is
  stopped; VmHWM is read from /proc (target ≤ 4 GB, flat in the number of images).

Prints one JSON object and writes it to ``--out`` (bench/results/sets.json).

    python bench/sets.py --features cache/f8k_effnet_grid7.h5 --text-features cache/f8k_minilm_text.h5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from benchkit import trainer_vs_bare, write_report  # noqa: E402

COCO_TRAIN_IMAGES, REGIONS, REGION_DIM = 113_287, 36, 2048
VAL_EVERY = 50


def measure_ratio(cfg, batches: int, rounds: int) -> dict:
    from pipeline.training.build import build_trainer

    trainer = build_trainer(cfg, echo=lambda *a: None)
    pairs = trainer.epoch_batches(0)
    pairs.slices = pairs.slices[:batches]
    loaded = [pairs[b] for b in range(len(pairs.slices))]  # the same batches, read once, in memory
    return trainer_vs_bare(trainer, pairs, lambda: ((b.images, b.captions, b.image_ids) for b in loaded),
                           sum(len(b.image_ids) for b in loaded), rounds, target=0.8)


def measure_full_run(cfg) -> dict:
    from fast_train import measure_full_run as full_run

    out = full_run(cfg)
    out["target_wall_s"] = 300
    return out


def precomp_folder(folder: Path, images: int) -> Path:
    """A SCAN/VSE∞ precomp folder: train_ims.npy (images, 36, 2048) float32 as a sparse file
    (member 0 of each image random, the rest zeros), train_caps.txt with 5 captions each, and
    a small dev split so training validates nothing (val_every 0) but the reader is complete."""
    from conftest import demo_captions

    folder.mkdir(parents=True, exist_ok=True)
    _, captions = demo_captions(1000)
    rng = np.random.default_rng(0)
    for split, n in (("train", images), ("dev", 100)):
        array = np.lib.format.open_memmap(folder / f"{split}_ims.npy", mode="w+", dtype=np.float32,
                                          shape=(n, REGIONS, REGION_DIM))
        for start in range(0, n, 4096):
            stop = min(start + 4096, n)
            array[start:stop, 0] = rng.standard_normal((stop - start, REGION_DIM), dtype=np.float32)
        array.flush()
        del array
        with open(folder / f"{split}_caps.txt", "w", encoding="utf-8") as f:
            for j in range(5 * n):
                f.write(captions[j % len(captions)] + "\n")
    return folder


def peak_rss(cache: Path, run: Path, seconds: float) -> dict:
    """`vse train` on ``cache`` for ``seconds`` after its first validation (every ``VAL_EVERY``
    steps, on the 100 dev images: a line to count steps by); VmHWM sampled every second."""
    command = [sys.executable, "-m", "cli.main", "train", "--features", str(cache), "--run-dir", str(run),
               "--image-pool", "gpo", "--loss", "mh", "--epochs", "1", "--val-every", str(VAL_EVERY),
               "--workers", "0", "--device", "cpu"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)
    reader.start()
    started, first_step, hwm = time.perf_counter(), None, 0
    while process.poll() is None:
        time.sleep(1.0)
        if first_step is None and any(line.startswith("[epoch") for line in lines):
            first_step = time.perf_counter()
        hwm = max(hwm, _status_kb(process.pid, "VmHWM"))
        if first_step is not None and time.perf_counter() - first_step >= seconds:
            break
    process.terminate()
    process.wait(timeout=60)
    steps = sum(line.startswith("[epoch") for line in lines)
    buffer = "".join(lines)
    return {"peak_rss_mb": round(hwm / 1024, 1), "steps_at_least": steps * VAL_EVERY,
            "seconds_after_first_step": round(time.perf_counter() - (first_step or started), 1),
            "output_tail": buffer.strip().splitlines()[-2:]}


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure_rss(workdir: Path, seconds: float, sizes) -> dict:
    from pipeline.data.extract import import_precomputed
    from pipeline.data.readers import load_dataset

    out = {}
    for images in sizes:
        folder = precomp_folder(workdir / f"precomp_{images}", images)
        cache = workdir / f"precomp_{images}.h5"
        started = time.perf_counter()
        import_precomputed(load_dataset("vsepp-precomp", folder), cache)
        imported = time.perf_counter() - started
        out[str(images)] = {"train_ims_npy_bytes": (folder / "train_ims.npy").stat().st_size,
                            "import_s": round(imported, 1), "cache_bytes": cache.stat().st_size,
                            **peak_rss(cache, workdir / f"run_{images}", seconds)}
        for p in folder.glob("*_ims.npy"):
            p.unlink()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", default="cache/f8k_effnet_grid7.h5")
    parser.add_argument("--text-features", default="cache/f8k_minilm_text.h5")
    parser.add_argument("--parts", default="ratio,full,rss")
    parser.add_argument("--batches", type=int, default=20, help="batches per ratio round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rss-seconds", type=float, default=120)
    parser.add_argument("--rss-sizes", default=f"{COCO_TRAIN_IMAGES},{COCO_TRAIN_IMAGES // 10}")
    parser.add_argument("--workdir", type=Path, default=None, help="for the 33 GB sparse file (default: tmp)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sets.json")
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    from pipeline.core.config import TrainConfig

    report = {"bench": "sets", "features": args.features, "text_features": args.text_features,
              "torch_threads": torch.get_num_threads(),
              "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}}
    if args.out.is_file():  # parts run separately add to one report
        report = {**json.loads(args.out.read_text()), **report}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        common = dict(features=args.features, text_features=args.text_features, image_pool="gpo", loss="mh",
                      batch_size=128, embed_dim=1024, workers=0, log_every=10)
        if "ratio" in parts:
            report["ratio"] = measure_ratio(TrainConfig(run_dir=str(tmp / "ratio"), val_every=0, **common),
                                            args.batches, args.rounds)
            report["ratio"]["loadavg"] = os.getloadavg()
            print(json.dumps(report["ratio"]), file=sys.stderr)
        if "full" in parts:
            report["full_run"] = measure_full_run(TrainConfig(
                run_dir=str(tmp / "full"), epochs=args.epochs, val_every=0,
                lr_decay_epoch=max(1, args.epochs // 2), **common))
            report["full_run"]["loadavg"] = os.getloadavg()
            print(json.dumps(report["full_run"]), file=sys.stderr)
        if "rss" in parts:
            sizes = [int(s) for s in args.rss_sizes.split(",")]
            report["rss"] = {"images": measure_rss(tmp, args.rss_seconds, sizes), "target_mb": 4096,
                             "members": REGIONS, "dim": REGION_DIM}
    write_report(report, args.out)


if __name__ == "__main__":
    main()
