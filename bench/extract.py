"""Extraction throughput per engine: end to end (``extract_features``: decode in loader workers,
crops, forward, cache writes) against the fastest forward alone on the same batches, 1C and 10C.

    .venv/bin/python bench/extract.py [--root ../shared/data/flickr8k] [--n1 1024] [--n10 128]

For each crop count and engine (torch, onnxruntime): ``forward_only`` = the engine on the same
batches already decoded and in memory (crops and normalisation included: they are part of
the engine's work in ``extract_features`` too); ``end_to_end`` = ``extract_features`` wall
time (``loop``: its compute loop only, without the one-off start of backbone and workers).
``workers``: the loader processes ``extract_features`` used (with ONNX Runtime each runs a
one-thread session beside its decoding: pipeline.data.extract).  The image counts are large
enough for the sessions' first calls (their memory arenas grow) to weigh a few per cent, as
in a real extraction; with 256 images they weighed up to a third.
``ratio_to_fastest_forward`` = end-to-end ÷ the fastest engine's forward-only (target for
onnxruntime on a CPU: ≥ 0.8, i.e. decoding keeps the engine fed); ``speedup_over_torch``
compares onnxruntime with torch on the same measure.

The engines are timed side by side, round-robin, ``--rounds`` times, keeping each one's best
round: on a shared machine the ratios mean something, the absolute rates less so (the JSON
records the load average).  ``cpu_bound_ratio`` does not depend on the load: the engine's
CPU time per image (all its threads; the warm-up batch counted) ÷ (that + the decode and
resize CPU time per image), the end-to-end ratio reached when the engine keeps every core
busy and the loader workers use the rest.  Prints one JSON object and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.backbones.cnns import load_backbone
from pipeline.backbones.crops import CropPlan
from pipeline.backbones.engines import build_engine, onnxruntime_installed
from pipeline.core import runtime
from pipeline.core.fsutil import write_atomic
from pipeline.data.extract import ExtractOptions, extract_features, loader_workers
from pipeline.data.readers import Dataset, open_image

ROOT = Path(__file__).resolve().parents[1]


def first_images(root: Path, n: int) -> Dataset:
    paths = sorted((root / "images").glob("*.jpg"))[:n]
    return Dataset(name="flickr8k", root=root, image_ids=[p.name for p in paths], image_paths=paths,
                   captions=[], caption_image=np.zeros(0, dtype=np.int64),
                   splits={"all": np.arange(len(paths))})


def end_to_end(dataset: Dataset, options: ExtractOptions, workdir: Path) -> dict:
    out = Path(tempfile.mkdtemp(dir=workdir)) / "bench.h5"
    started = time.perf_counter()
    result = extract_features(dataset, out, options=options)
    wall = time.perf_counter() - started
    return {"wall": dataset.num_images / wall, "loop": result.images_per_second}


def forward_only(engine, plan: CropPlan, batches: list[torch.Tensor]) -> float:
    """The ceiling: the same batches, decoded and resized beforehand, through crops + engine."""
    def run(batch):
        x = plan.network_input(batch.to(engine.device), channels_last=engine.channels_last)
        return plan.average(engine(x)).cpu()

    run(batches[0])  # warm-up (kernel selection, allocator)
    started = time.perf_counter()
    for batch in batches:
        run(batch)
    return sum(len(b) for b in batches) / (time.perf_counter() - started)


def measure(args, crops: int, n: int, engines: list[str], workdir: Path) -> dict:
    dataset = first_images(args.root, n)
    device = runtime.resolve_device(args.device)
    backbone = load_backbone(args.backbone)
    plan = CropPlan(crops, backbone.preprocessing)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    cpu = time.process_time()
    prepared = torch.stack([plan.prepare(open_image(p)) for p in dataset.image_paths])
    decode_cpu_ms = (time.process_time() - cpu) / n * 1e3
    torch.set_num_threads(threads)
    batches = list(prepared.split(args.batch_size))
    onnx_dir = workdir / "onnx"  # exported before any timing, reused by the end-to-end runs
    built = {name: build_engine(name, load_backbone(args.backbone), device, onnx_dir) for name in engines}
    rounds = {name: {"forward_only": [], "end_to_end": [], "end_to_end_loop": []} for name in engines}
    forward_cpu_ms = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name in engines:
            cpu = time.process_time()  # every thread of this process (the engine's included)
            rounds[name]["forward_only"].append(forward_only(built[name], plan, batches))
            forward_cpu_ms[name].append((time.process_time() - cpu) / (n + len(batches[0])) * 1e3)
            options = ExtractOptions(backbone=args.backbone, crops=crops, batch_size=args.batch_size,
                                     workers=args.workers, device=args.device, shard_size=n,
                                     engine=name, onnx_dir=str(onnx_dir))
            e2e = end_to_end(dataset, options, workdir)
            rounds[name]["end_to_end"].append(e2e["wall"])
            rounds[name]["end_to_end_loop"].append(e2e["loop"])
    best = {name: {k: max(v) for k, v in r.items()} for name, r in rounds.items()}
    fastest = max(engines, key=lambda name: best[name]["forward_only"])
    report = {"n_images": dataset.num_images, "fastest_forward_engine": fastest,
              "decode_cpu_ms_per_image": round(decode_cpu_ms, 2)}
    for name in engines:
        b = best[name]
        report[name] = {f"{k}_images_per_s": round(v, 2) for k, v in b.items()}
        report[name]["rounds_images_per_s"] = {k: [round(x, 2) for x in v] for k, v in rounds[name].items()}
        report[name]["workers"] = loader_workers(
            ExtractOptions(workers=args.workers, engine=name), built[name])
        report[name]["ratio_to_own_forward"] = round(b["end_to_end"] / b["forward_only"], 3)
        report[name]["ratio_to_fastest_forward"] = round(b["end_to_end"] / best[fastest]["forward_only"], 3)
        report[name]["loop_ratio_to_fastest_forward"] = round(
            b["end_to_end_loop"] / best[fastest]["forward_only"], 3)
        # load-independent: the share of the CPU work that is the engine's, i.e. the ratio
        # end-to-end could reach if the engine alone kept every core busy
        forward_ms = min(forward_cpu_ms[name])
        report[name]["forward_cpu_ms_per_image"] = round(forward_ms, 2)
        report[name]["cpu_bound_ratio"] = round(forward_ms / (forward_ms + decode_cpu_ms), 3)
    if {"torch", "onnxruntime"} <= set(engines):
        report["speedup_onnxruntime_over_torch"] = {
            k: round(best["onnxruntime"][k] / best["torch"][k], 2) for k in best["torch"]}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT.parent / "shared" / "data" / "flickr8k")
    parser.add_argument("--n1", type=int, default=1024, help="images for the 1-crop runs")
    parser.add_argument("--n10", type=int, default=128, help="images for the 10-crop runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backbone", default="efficientnet-lite0")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--engines", default=None, help="comma-separated (default: torch, and "
                                                        "onnxruntime on a CPU when installed)")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. what else ran)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "extract.json")
    args = parser.parse_args()

    device = runtime.resolve_device(args.device)
    if args.engines:
        engines = args.engines.split(",")
    else:
        engines = ["torch"] + (["onnxruntime"] if device.type == "cpu" and onnxruntime_installed() else [])
    load_before = os.getloadavg()
    report = {"backbone": args.backbone, "batch_size": args.batch_size, "device": str(device),
              "cpu_cores": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
              "workers": args.workers,  # None: each engine's default (its "workers" below)
              "rounds": args.rounds, "engines": engines}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for crops, n in ((1, args.n1), (10, args.n10)):
            report[f"{crops}c"] = measure(args, crops, n, engines, Path(tmp))
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["load_average"] = {"before": [round(x, 2) for x in load_before],
                              "after": [round(x, 2) for x in os.getloadavg()]}
    report["note"] = args.note
    text = json.dumps(report)
    print(text)
    write_atomic(args.out, (text + "\n").encode())


if __name__ == "__main__":
    main()
