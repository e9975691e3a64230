"""Embed bench: `vse embed`'s images/s beside `vse extract`'s on the same images, one run.

The same ``--n`` images of a Flickr8k folder (the first of its list) go through
``extract_features`` (the code of `vse extract`) with the pipeline of the cache the checkpoint
was trained on (backbone, crops, engine), and through ``embed_files`` (the code of
`vse embed`) with that checkpoint: the same decoding, crops and engine, plus the model's image
head and the writing of unit vectors. Runs alternate (extract, embed, extract, embed, …,
``--rounds`` each) so load on the machine hits both alike; each side's compute-loop rate
(images decoded and encoded per second, model loading excluded) is the median of its rounds.
Target: embed ≥ 0.9 of extract (the head costs little).

    python bench/embed.py CHECKPOINT [--root ../shared/data/flickr8k] [--n 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from benchkit import write_report  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--root", type=Path, default=ROOT.parent / "shared" / "data" / "flickr8k")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "embed.json")
    args = parser.parse_args()

    from pipeline.core.checkpoint import load_checkpoint
    from pipeline.data.extract import ExtractOptions, extract_features
    from pipeline.data.readers import load_dataset
    from pipeline.search.embed import Embedder, embed_files

    embedder = Embedder.from_checkpoint(args.checkpoint, "cpu")
    embedder.check_images()
    pipeline = embedder.images.describe
    dataset = load_dataset("flickr8k", args.root)
    names = dataset.image_ids[:args.n]
    paths = [dataset.image_paths[dataset.image_ids.index(n)] for n in names]
    options = ExtractOptions(backbone=pipeline["backbone"], crops=int(pipeline["crops"]),
                             engine=pipeline["engine_used"], grid=bool(pipeline.get("grid")),
                             input_scale=float(pipeline.get("input_scale", 1.0)), device="cpu")
    rates = {"extract": [], "embed": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        listing = tmp / "images.txt"
        listing.write_text("".join(f"{p}\n" for p in paths))
        first = _first_images(dataset, names)
        for r in range(args.rounds):
            result = extract_features(first, tmp / f"c{r}.h5", options=options)
            rates["extract"].append(result.images_per_second)
            done = embed_files(args.checkpoint, tmp / f"e{r}.h5", listing, device="cpu")
            rates["embed"].append(done.images_per_second)
            print(f"round {r}: extract {rates['extract'][-1]:.1f} img/s, "
                  f"embed {rates['embed'][-1]:.1f} img/s", file=sys.stderr)
    extract, embed = (statistics.median(rates[k]) for k in ("extract", "embed"))
    report = {
        "bench": "embed", "images": len(names), "rounds": args.rounds,
        "checkpoint": str(args.checkpoint), "pipeline": {k: pipeline.get(k) for k in
                                                         ("backbone", "crops", "engine_used", "grid")},
        "extract_images_per_s": rates["extract"], "embed_images_per_s": rates["embed"],
        "extract_median": round(extract, 1), "embed_median": round(embed, 1),
        "ratio_embed_to_extract": round(embed / extract, 3), "target": 0.9,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "loadavg": os.getloadavg()},
        "checkpoint_epoch": load_checkpoint(args.checkpoint).get("epoch"),
    }
    write_report(report, args.out)


def _first_images(dataset, names):
    """A Dataset of just ``names`` (all in one split), so `extract` reads those images only."""
    from pipeline.data.readers import Dataset

    rows = [dataset.image_ids.index(n) for n in names]
    keep = {r: k for k, r in enumerate(rows)}
    captions = [(c, keep[i]) for c, i in zip(dataset.captions, dataset.caption_image) if i in keep]
    return Dataset(name=dataset.name, root=dataset.root, image_ids=list(names),
                   image_paths=[dataset.image_paths[r] for r in rows], captions=[c for c, _ in captions],
                   caption_image=[i for _, i in captions], splits={"test": list(range(len(rows)))})


if __name__ == "__main__":
    main()
