"""Benchmark: `vse evaluate --runs` (one cache open, captions tokenised once per vocabulary)
against evaluating the same runs one by one (`vse evaluate --checkpoint` per run).

Builds a feature cache with ``--images`` images (5 captions each, drawn with replacement
from the bundled demo captions, random 1280-d features) whose last ``--test-images`` form
the test split, and ``--runs`` untrained checkpoints sharing one vocabulary (evaluation
costs the same as for trained ones). Both ways run ``--repeats`` times, interleaved, and
the fastest of each is kept (the machine may be shared). What batching saves is the
tokenisation of every caption of the cache (``tokenise_s``, paid once instead of per run)
and the cache opening; the forward passes are the same. The model is small by default
(``--embed-dim 64``) so that on a CPU the forward pass weighs about what it does on a GPU
with the full model; ``--embed-dim 1024`` gives the VSE++ size. Prints one JSON object.

    python bench/batch_eval.py [--images 20000] [--test-images 1000] [--runs 4] [--embed-dim 64]
                               [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.core.checkpoint import load_checkpoint, save_checkpoint
from pipeline.core.runtime import resolve_device
from pipeline.data.cache import FeatureCache, write_cache
from pipeline.evaluation.evaluate import embed_checkpoint, evaluate_split_embeddings
from pipeline.networks.vse_model import ModelConfig, VSEModel
from pipeline.reports.batch_eval import evaluate_runs
from pipeline.text.vocabulary import TokenizedCaptions, Vocabulary

ROOT = Path(__file__).resolve().parents[1]
FEATURE_DIM = 1280


def demo_captions() -> list[str]:
    lines = (ROOT / "data" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines()
    return [line.split("\t", 1)[1] for line in lines]


def build(tmp: Path, num_images: int, num_test: int, num_runs: int, embed_dim: int,
          seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    pool = demo_captions()
    captions = [pool[i] for i in rng.integers(0, len(pool), 5 * num_images)]
    test = min(num_test, num_images // 2)
    cache = write_cache(tmp / "cache.h5", rng.standard_normal((num_images, FEATURE_DIM)).astype(np.float32),
                        [f"img{i}" for i in range(num_images)], captions, np.repeat(np.arange(num_images), 5),
                        {"train": np.arange(num_images - test),
                         "test": np.arange(num_images - test, num_images)},
                        attrs={"backbone": "synthetic"})
    vocab = Vocabulary.build(captions[: 5 * (num_images - test)], 4)
    run_dirs = []
    for run in range(num_runs):
        torch.manual_seed(run)
        config = ModelConfig(vocab_size=len(vocab), feature_dim=FEATURE_DIM, embed_dim=embed_dim,
                             word_dim=min(300, embed_dim))
        model = VSEModel(config)
        run_dir = tmp / f"run{run}"
        save_checkpoint({"model": model.state_dict(), "model_config": config.to_dict(), "vocab": vocab.words,
                         "train_config": {"features": str(cache), "loss": "mh", "seed": run},
                         "feature_source": {"backbone": "synthetic"}, "epoch": 1, "iteration": 1},
                        run_dir / "best.pt")
        run_dirs.append(run_dir)
    return run_dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: steadier on a shared machine)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        run_dirs = build(Path(tmp), args.images, args.test_images, args.runs, args.embed_dim)
        cache = run_dirs[0].parent / "cache.h5"
        embed_checkpoint(run_dirs[0] / "best.pt", cache, "test", device)  # warm-up: imports, page cache
        with FeatureCache(cache) as opened:
            vocab = Vocabulary(load_checkpoint(run_dirs[0] / "best.pt")["vocab"])
            start = time.perf_counter()
            TokenizedCaptions.encode(vocab, opened.captions, 100)
            tokenise_s = time.perf_counter() - start

        one_by_one_s, batched_s = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            one_by_one = [evaluate_split_embeddings(embed_checkpoint(r / "best.pt", cache, "test", device),
                                                    device=device) for r in run_dirs]
            one_by_one_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            batched = evaluate_runs(run_dirs, device=device, echo=lambda m: None).rows
            batched_s.append(time.perf_counter() - start)

    identical = all(row[k] == single[k] for row, single in zip(batched, one_by_one) for k in single)
    print(json.dumps({"device": str(device), "cache_captions": 5 * args.images,
                      "test_images": min(args.test_images, args.images // 2), "runs": args.runs,
                      "embed_dim": args.embed_dim,
                      "tokenise_s": round(tokenise_s, 3), "one_by_one_s": round(min(one_by_one_s), 3),
                      "batched_s": round(min(batched_s), 3),
                      "speedup": round(min(one_by_one_s) / min(batched_s), 2),
                      "identical_metrics": identical}))


if __name__ == "__main__":
    main()
