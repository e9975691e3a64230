"""Does search reproduce evaluation? (issue 22, "Consistency"; bench/results/search_consistency.json)

With one checkpoint trained on a Flickr8k feature cache:
1. `vse embed` the test split's image files (as a list of paths) and its 5,000 captions (a text
   file), and compare the vectors with `vse evaluate`'s embeddings of the same checkpoint
   (``encode_split``): the largest absolute difference (target ≤ 1e-5);
2. `vse index --kind flat` over the images, queried with the 5,000 captions: text→image R@1/5/10
   from the ranks of each caption's own image, against `vse evaluate`'s t2i R@K (target:
   equal);
3. `vse index --kind hnsw` (a small ``--ef-search`` so it is approximate here) and its stored
   recall@10 beside the R@K it gives.

    python bench/search_consistency.py RUN/best.pt --features cache/f8k_effnet_1c.h5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from benchkit import write_report  # noqa: E402


def recall_at(ranks: np.ndarray) -> dict:
    return {f"t2i_r{k}": round(100.0 * float(np.mean(ranks < k)), 2) for k in (1, 5, 10)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--features", type=Path, required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--ef-search", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "search_consistency.json")
    args = parser.parse_args()

    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.evaluate import evaluate_split_embeddings
    from pipeline.evaluation.inference import encode_split, load_model
    from pipeline.search.embed import embed_files
    from pipeline.search.faiss_index import IndexOptions, SearchIndex, build_index

    device = torch.device("cpu")
    loaded = load_model(args.checkpoint, device)
    with FeatureCache(args.features) as cache:
        split = encode_split(loaded.model, cache, loaded.captions(cache), args.split, device)
        root = Path(cache.attrs["dataset_root"])
        names = [cache.image_ids[r] for r in split.image_rows]
        captions = [cache.captions[r] for r in split.caption_rows]
    evaluated = evaluate_split_embeddings(split)
    from pipeline.data.readers import load_dataset

    dataset = load_dataset(cache.attrs.get("dataset", "flickr8k"), root)
    path_of = dict(zip(dataset.image_ids, dataset.image_paths))
    report = {"bench": "search_consistency", "checkpoint": str(args.checkpoint),
              "features": str(args.features), "split": args.split, "images": len(names),
              "captions": len(captions)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        listing, texts = tmp / "images.txt", tmp / "captions.txt"
        listing.write_text("".join(f"{path_of[n]}\n" for n in names))
        texts.write_text("".join(f"{c}\n" for c in captions), encoding="utf-8")
        started = time.perf_counter()
        result = embed_files(args.checkpoint, tmp / "e.h5", listing, texts, device="cpu")
        report["embed_seconds"] = round(time.perf_counter() - started, 1)
        import h5py

        with h5py.File(tmp / "e.h5", "r") as f:
            images, cap_vectors = f["images/vectors"][()], f["captions/vectors"][()]
        reference = split.images / np.linalg.norm(split.images, axis=1, keepdims=True)
        report["embeddings"] = {
            "images_max_abs_diff": float(np.abs(images - reference).max()),
            "captions_max_abs_diff": float(np.abs(cap_vectors - split.captions).max()),
            "target": 1e-5, "failed_images": len(result.failed)}
        truth = split.caption_image  # each caption's image, as a row of the images
        report["evaluate"] = {k: round(float(evaluated[k]), 2) for k in ("t2i_r1", "t2i_r5", "t2i_r10")}
        for kind, extra in (("flat", {}), ("hnsw", {"ef_search": args.ef_search})):
            out = tmp / f"index_{kind}"
            build_index(tmp / "e.h5", out, IndexOptions(kind=kind, of="images", **extra))
            index = SearchIndex(out)
            scores, rows = index.search(cap_vectors, len(names) if kind == "flat" else 10)
            hit = rows == truth[:, None]
            ranks = np.where(hit.any(axis=1), hit.argmax(axis=1), len(names))
            report[kind] = {"recall_at_10_stored": index.meta.get("recall", {}).get("value"),
                            "params": index.meta.get("params"), **recall_at(ranks)}
    report["flat_equals_evaluate"] = all(report["flat"][k] == v for k, v in report["evaluate"].items())
    write_report(report, args.out)


if __name__ == "__main__":
    main()
