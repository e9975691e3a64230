"""Benchmark: the vectorised retrieval protocol against the VSE++ reference's per-query loop.

Both run side by side on the same synthetic embeddings (5,000 images × 25,000 captions,
D = 1024, L2-normalised, fixed seed; captions are noisy copies of their image so the
numbers look like a trained model's).  The reference computes one query's scores at a
time and finds the ground truth in an ``argsort`` (as VSE++'s ``i2t``/``t2i``).  Prints
one JSON object: times, the speed-up, and whether ranks and metrics are identical.

The comparison runs in float64: with random data there are no exact ties, and float64
keeps rounding differences between the two summation orders far below the gaps between
scores, so identical ranks are expected.  ``vectorised_float32_s`` times the usual path.

    python bench/evaluate.py [--n-images 1000] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from pipeline.core.runtime import resolve_device
from pipeline.evaluation.metrics import retrieval_metrics, similarity_ranks

CAPTIONS_PER_IMAGE = 5


def synthetic_embeddings(num_images: int, dim: int, seed: int, noise: float):
    rng = np.random.default_rng(seed)
    images = _normalise(rng.standard_normal((num_images, dim)))
    captions = np.repeat(images, CAPTIONS_PER_IMAGE, axis=0)
    captions = _normalise(captions + noise * rng.standard_normal(captions.shape))
    return images, captions


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def reference_i2t(images: np.ndarray, captions: np.ndarray) -> np.ndarray:
    """VSE++ ``i2t``: per image, sort all captions and find its best ground truth."""
    ranks = np.zeros(len(images), dtype=np.int64)
    for index in range(len(images)):
        d = np.dot(images[index:index + 1], captions.T).flatten()
        inds = np.argsort(d)[::-1]
        ranks[index] = min(np.where(inds == i)[0][0]
                           for i in range(CAPTIONS_PER_IMAGE * index,
                                          CAPTIONS_PER_IMAGE * index + CAPTIONS_PER_IMAGE))
    return ranks


def reference_t2i(images: np.ndarray, captions: np.ndarray) -> np.ndarray:
    """VSE++ ``t2i``: per image, its 5 captions as queries, each sorting all images."""
    ranks = np.zeros(len(captions), dtype=np.int64)
    for index in range(len(images)):
        first = CAPTIONS_PER_IMAGE * index
        d = np.dot(captions[first:first + CAPTIONS_PER_IMAGE], images.T)
        for i in range(CAPTIONS_PER_IMAGE):
            inds = np.argsort(d[i])[::-1]
            ranks[first + i] = np.where(inds == index)[0][0]
    return ranks


def reference_metrics(i2t: np.ndarray, t2i: np.ndarray) -> dict[str, float]:
    """The VSE++ formulas, written out independently of ``retrieval_metrics``."""
    out = {}
    for name, ranks in (("i2t", i2t), ("t2i", t2i)):
        for k in (1, 5, 10):
            out[f"{name}_r{k}"] = 100.0 * len(np.where(ranks < k)[0]) / len(ranks)
        out[f"{name}_medr"] = float(np.floor(np.median(ranks)) + 1)
        out[f"{name}_meanr"] = float(ranks.mean() + 1)
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    out["mrecall"] = out["rsum"] / 6
    return out


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-images", type=int, default=5000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=0.3,
                        help="per-dimension caption noise (0.3 gives R@1 ≈ 40-70 at 5K)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    images, captions = synthetic_embeddings(args.n_images, args.dim, args.seed, args.noise)

    def vectorised(imgs, caps):
        ranks = similarity_ranks(imgs, caps, device=device)
        return ranks, retrieval_metrics(*ranks)

    (ranks, metrics), vectorised_s = timed(vectorised, images, captions)
    _, vectorised_float32_s = timed(vectorised, images.astype(np.float32),
                                    captions.astype(np.float32))
    reference_i2t_ranks, reference_i2t_s = timed(reference_i2t, images, captions)
    reference_t2i_ranks, reference_t2i_s = timed(reference_t2i, images, captions)
    reference = reference_metrics(reference_i2t_ranks, reference_t2i_ranks)
    naive_s = reference_i2t_s + reference_t2i_s
    print(json.dumps({
        "benchmark": "retrieval protocol: vectorised vs per-query argsort (VSE++ reference)",
        "images": args.n_images,
        "captions": len(captions),
        "dim": args.dim,
        "dtype": "float64",
        "device": str(device),
        "cpu_threads": os.cpu_count(),
        "vectorised_s": round(vectorised_s, 3),
        "vectorised_float32_s": round(vectorised_float32_s, 3),
        "naive_i2t_s": round(reference_i2t_s, 3),
        "naive_t2i_s": round(reference_t2i_s, 3),
        "naive_s": round(naive_s, 3),
        "speedup": round(naive_s / vectorised_s, 2),
        "identical_ranks": bool(np.array_equal(ranks[0], reference_i2t_ranks)
                                and np.array_equal(ranks[1], reference_t2i_ranks)),
        "identical_metrics": metrics == reference,
        "metrics": metrics,
    }, indent=2))


if __name__ == "__main__":
    main()
