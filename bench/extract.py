"""Extraction throughput: end to end (``extract_features``: decode, crops, forward, cache
writes) against the backbone's forward alone on the same batches preloaded on the device.

    .venv/bin/python bench/extract.py [--root ../shared/data/flickr8k] [--n 256]

Prints one JSON object; ``ratio_*`` = end-to-end images/s ÷ forward-only images/s
(target ≥ 0.85: the loading pipeline hides behind the compute).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pipeline import runtime
from pipeline.backbones import load_backbone
from pipeline.crops import CropPlan
from pipeline.datasets import Dataset, open_image
from pipeline.extract import ExtractOptions, extract_features


def first_images(root: Path, n: int) -> Dataset:
    paths = sorted((root / "images").glob("*.jpg"))[:n]
    return Dataset(name="flickr8k", root=root, image_ids=[p.name for p in paths], image_paths=paths,
                   captions=[], caption_image=np.zeros(0, dtype=np.int64),
                   splits={"all": np.arange(len(paths))})


def end_to_end(dataset: Dataset, options: ExtractOptions) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        result = extract_features(dataset, Path(tmp) / "bench.h5", options=options)
        wall = time.perf_counter() - started
    return {"images_per_s": dataset.num_images / wall, "loop_images_per_s": result.images_per_second}


def forward_only(dataset: Dataset, options: ExtractOptions) -> float:
    """The ceiling: the same batches, already prepared and on the device."""
    device = runtime.resolve_device(options.device)
    backbone = load_backbone(options.backbone, options.weights)
    plan = CropPlan(options.crops, backbone.preprocessing)
    model = backbone.module.to(device, memory_format=torch.channels_last)
    prepared = torch.stack([plan.prepare(open_image(p)) for p in dataset.image_paths]).to(device)
    batches = prepared.split(options.batch_size)

    def run(batch):
        with runtime.autocast(device):
            output = model(plan.network_input(batch, channels_last=True))
        return plan.average(output).cpu()

    with torch.inference_mode():
        run(batches[0])  # warm-up (kernel selection, allocator)
        started = time.perf_counter()
        for batch in batches:
            run(batch)
        return dataset.num_images / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "flickr8k")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--backbone", default="efficientnet-lite0")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    dataset = first_images(args.root, args.n)
    report = {"backbone": args.backbone, "n_images": dataset.num_images, "batch_size": args.batch_size,
              "device": str(runtime.resolve_device(args.device)), "torch_threads": torch.get_num_threads(),
              "workers": runtime.default_workers() if args.workers is None else args.workers}
    for crops in (1, 10):
        options = ExtractOptions(backbone=args.backbone, crops=crops, batch_size=args.batch_size,
                                 workers=args.workers, device=args.device, shard_size=1000)
        e2e = end_to_end(dataset, options)
        ceiling = forward_only(dataset, options)
        report[f"{crops}c"] = {"end_to_end_images_per_s": round(e2e["images_per_s"], 2),
                               "end_to_end_loop_images_per_s": round(e2e["loop_images_per_s"], 2),
                               "forward_only_images_per_s": round(ceiling, 2),
                               "ratio": round(e2e["images_per_s"] / ceiling, 3),
                               "ratio_loop": round(e2e["loop_images_per_s"] / ceiling, 3)}
    report["cost_10c_over_1c"] = round(report["1c"]["end_to_end_images_per_s"]
                                       / report["10c"]["end_to_end_images_per_s"], 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
